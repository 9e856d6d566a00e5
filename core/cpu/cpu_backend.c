/* cpu_backend.c: the CPU backend's table, creation and memory.
 *
 * Host memory is the device memory here: copies are memcpy, "pinned" memory is ordinary
 * 64-byte-aligned memory, and every op completes before it returns (sync is a no-op). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/cpu/cpu_internal.h"

/* 64-byte-aligned host memory; 0 bytes still yields a unique pointer (aligned_alloc wants a
 * multiple of the alignment). */
static void *aligned_block(size_t bytes) {
    size_t rounded = (bytes + 63) / 64 * 64;
    return aligned_alloc(64, rounded ? rounded : 64);
}

/* Blocks carry a 64-byte header with their size and category, for mem_stats. */
typedef struct block_header {
    size_t bytes;
    ct_mem_cat cat;
    bool uncounted;              /* the capped device's 16-bit scratch (ct_cpu_scratch_alloc) */
} block_header;
#define HEADER 64

/* false (nothing counted) when adding would pass the limit (ct_cpu_backend_set_limit; the host
 * counts, pinned memory, have none). */
static bool count(ct_cpu *cpu, ct_mem_cat cat, size_t bytes, bool add, bool host) {
    ct_mem_stats *m = &cpu->mem;
    size_t *cur = host ? m->host_current : m->current, *peak = host ? m->host_peak : m->peak;
    size_t *total = host ? &m->host_current_total : &m->current_total;
    size_t *peak_total = host ? &m->host_peak_total : &m->peak_total;
    pthread_mutex_lock(&cpu->mem_mu);
    if (add && !host && cpu->limit && (bytes > cpu->limit || *total > cpu->limit - bytes)) {
        pthread_mutex_unlock(&cpu->mem_mu);
        return false;
    }
    if (add) {
        cur[cat] += bytes, *total += bytes;
        if (cur[cat] > peak[cat]) peak[cat] = cur[cat];
        if (*total > *peak_total) *peak_total = *total;
    } else {
        cur[cat] -= bytes, *total -= bytes;
    }
    pthread_mutex_unlock(&cpu->mem_mu);
    return true;
}

/* Pinned memory is plain memory here (the loader's slots, offloaded activations, ZeRO-Offload's
 * host state on the capped device), counted in the host figures of mem_stats. */
static void *cpu_alloc_pinned(ct_backend *be, size_t bytes, ct_mem_cat cat) {
    if ((unsigned)cat >= CT_MEM_CAT_COUNT) cat = CT_MEM_WORKSPACE;
    char *p = aligned_block(HEADER + bytes);
    if (!p) return NULL;
    *(block_header *)p = (block_header){bytes, cat, false};
    count(be->impl, cat, bytes, true, true);
    return p + HEADER;
}

static void cpu_free_pinned(ct_backend *be, void *p) {
    if (!p) return;
    char *base = (char *)p - HEADER;
    block_header h = *(block_header *)base;
    count(be->impl, h.cat, h.bytes, false, true);
    free(base);
}

void ct_cpu_backend_set_limit(ct_backend *be, size_t bytes) {
    ct_cpu *cpu = be->impl;
    /* the capped device's cap stays the ceiling */
    if (be->memory_bytes && (bytes == 0 || bytes > be->memory_bytes)) bytes = be->memory_bytes;
    pthread_mutex_lock(&cpu->mem_mu);
    cpu->limit = bytes;
    pthread_mutex_unlock(&cpu->mem_mu);
}

/* A large block (parameters, gradients, optimizer state, activations of a big model) on 2 MiB
 * boundaries with transparent huge pages asked for: its first touch takes one page fault per
 * 2 MiB instead of one per 4 KiB (a 124M-parameter model's 2 GiB of state: a second of kernel
 * time less at start), and the optimizer's and GEMMs' sweeps miss the TLB less. Small blocks stay
 * on 64 bytes. A kernel without THP (or with it off) ignores the advice. */
#define HUGE_MIN ((size_t)4 << 20)
#define HUGE_ALIGN ((size_t)2 << 20)

static void *alloc_block(size_t bytes) {
    if (bytes < HUGE_MIN) return aligned_block(bytes);
    size_t rounded = (bytes + HUGE_ALIGN - 1) / HUGE_ALIGN * HUGE_ALIGN;
    void *p = aligned_alloc(HUGE_ALIGN, rounded);
#ifdef MADV_HUGEPAGE
    if (p) madvise(p, rounded, MADV_HUGEPAGE);
#endif
    return p;
}

void *ct_cpu_mem_alloc(ct_backend *be, size_t bytes, ct_mem_cat cat) {
    if ((unsigned)cat >= CT_MEM_CAT_COUNT) cat = CT_MEM_WORKSPACE;
    /* over train.memory_limit_gb, or the capped device's cap */
    if (!count(be->impl, cat, bytes, true, false)) return NULL;
    char *p = alloc_block(HEADER + bytes);
    if (!p) {
        count(be->impl, cat, bytes, false, false);
        return NULL;
    }
    *(block_header *)p = (block_header){bytes, cat, false};
    return p + HEADER;
}

void ct_cpu_mem_free(ct_backend *be, void *p) {
    if (!p) return;
    char *base = (char *)p - HEADER;
    block_header h = *(block_header *)base;
    if (!h.uncounted) count(be->impl, h.cat, h.bytes, false, false);
    free(base);
}

/* The fp32 copies of 16-bit arguments are how the CPU computes 16-bit ops: on the CPU they are
 * workspace like any other (counted, under train.memory_limit_gb); on the capped device, which
 * stands for a GPU that needs no such copies, they are host memory outside its pool. */
void *ct_cpu_scratch_alloc(ct_backend *be, size_t bytes) {
    if (!((ct_cpu *)be->impl)->capped) return be->mem.alloc(be, bytes, CT_MEM_WORKSPACE);
    char *p = alloc_block(HEADER + bytes);
    if (!p) return NULL;
    *(block_header *)p = (block_header){bytes, CT_MEM_WORKSPACE, true};
    return p + HEADER;
}

static void cpu_mem_stats(ct_backend *be, ct_mem_stats *out) {
    ct_cpu *cpu = be->impl;
    pthread_mutex_lock(&cpu->mem_mu);
    *out = cpu->mem;
    out->reserved = cpu->mem.current_total;
    pthread_mutex_unlock(&cpu->mem_mu);
}

/* Uploads and downloads are copies that are done when they return; they still take tickets
 * from one sequence, as they do on a device. */
static uint64_t cpu_compute_mark(ct_backend *be) { return 0; }

static uint64_t cpu_async_copy(ct_backend *be, void *dst, const void *src, size_t bytes,
                               uint64_t after) {
    if (bytes && dst != src) memcpy(dst, src, bytes);
    return ++((ct_cpu *)be->impl)->copies;
}

static bool cpu_copy_done(ct_backend *be, uint64_t ticket, bool wait) { return true; }

/* Every op has finished when it returns, so the host clock at the call is the queue's position. */
static uint64_t cpu_timer_mark(ct_backend *be) {
    ct_cpu *cpu = be->impl;
    uint64_t m = ++cpu->timer_last;
    cpu->timer_at[m % CT_TIMER_MARKS] = ct_now();
    return m;
}

static double cpu_timer_elapsed(ct_backend *be, uint64_t a, uint64_t b) {
    ct_cpu *cpu = be->impl;
    if (!ct_timer_mark_live(a, cpu->timer_last) || !ct_timer_mark_live(b, cpu->timer_last))
        return NAN;
    return cpu->timer_at[b % CT_TIMER_MARKS] - cpu->timer_at[a % CT_TIMER_MARKS];
}

static void cpu_copy(ct_backend *be, void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src) memmove(dst, src, bytes);
}

static void cpu_memset0(ct_backend *be, void *p, size_t bytes) {
    if (bytes) memset(p, 0, bytes);
}

static void cpu_sync(ct_backend *be) {}

static size_t cpu_peak_bytes(ct_backend *be) { return 0; }

static void cpu_destroy(ct_backend *be) {
    if (!be) return;
    ct_cpu *cpu = be->impl;
    ct_cpu_pool_destroy(cpu->pool);
    for (int i = 0; i < CT_CPU_SLOTS; i++) ct_cpu_mem_free(be, cpu->slot[i]);
    pthread_mutex_destroy(&cpu->mem_mu);
    free(cpu);
    free(be);
}

/* "Intel(R) Xeon(R) Processor" from /proc/cpuinfo, or the architecture when unavailable. */
static void cpu_model(char *buf, size_t n) {
    snprintf(buf, n, "%s", "CPU");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "model name", 10) != 0) continue;
        const char *v = strchr(line, ':');
        if (!v) break;
        v++;
        while (*v == ' ' || *v == '\t') v++;
        snprintf(buf, n, "%s", v);
        buf[strcspn(buf, "\n")] = '\0';
        break;
    }
    fclose(f);
}

int ct_cpu_threads_for(int threads) {
    if (threads > 0) return threads;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    return online > 0 ? (int)online : 1;
}

ct_backend *ct_cpu_backend_create(int threads) {
    ct_err why = {0};
    if (ct_cpu_blas_load(&why)) {
        errno = ELIBACC;
        return NULL;
    }
    threads = ct_cpu_threads_for(threads);
    ct_backend *be = ct_xcalloc(1, sizeof *be);
    ct_cpu *cpu = ct_xcalloc(1, sizeof *cpu);
    cpu->threads = threads;
    pthread_mutex_init(&cpu->mem_mu, NULL);
    cpu->pool = ct_cpu_pool_create(threads);
    if (!cpu->pool) {
        int why = errno; /* the caller's message says why the pool did not start */
        pthread_mutex_destroy(&cpu->mem_mu);
        free(cpu);
        free(be);
        errno = why;
        return NULL;
    }
    be->name = "cpu";
    be->impl = cpu;
    be->threads = threads;

    char model[96];
    cpu_model(model, sizeof model);
    const char *blas = ct_cpu_blas_config();
    snprintf(be->device_desc, sizeof be->device_desc, "%s, %d thread%s, %s", model, threads,
             threads == 1 ? "" : "s", blas ? blas : "OpenBLAS");

    be->destroy = cpu_destroy;
    be->mem.alloc = ct_cpu_mem_alloc;
    be->mem.free = ct_cpu_mem_free;
    be->mem.alloc_host_pinned = cpu_alloc_pinned;
    be->mem.free_host_pinned = cpu_free_pinned;
    be->mem.mem_stats = cpu_mem_stats;
    be->queue.compute_mark = cpu_compute_mark;
    be->queue.upload = cpu_async_copy;
    be->queue.upload_done = cpu_copy_done;
    be->queue.download = cpu_async_copy;
    be->queue.download_done = cpu_copy_done;
    be->queue.timer_mark = cpu_timer_mark;
    be->queue.timer_elapsed = cpu_timer_elapsed;
    be->mem.copy_h2d = cpu_copy;
    be->mem.copy_d2h = cpu_copy;
    be->mem.copy_d2d = cpu_copy;
    be->mem.memset0 = cpu_memset0;
    be->queue.sync = cpu_sync;
    be->mem.peak_bytes = cpu_peak_bytes;

    ct_cpu_gemm_install(be);
    ct_cpu_eltwise_install(be);
    ct_cpu_conv_install(be);
    ct_cpu_pooling_install(be);
    ct_cpu_norm_install(be);
    ct_cpu_loss_install(be);
    ct_cpu_optim_install(be);
    ct_cpu_reduce_install(be);
    ct_cpu_dtype_install(be);
    ct_cpu_init_install(be);
    /* CTRAIN_CPU_FUSE=0: no fused conv + activation (+ max-pool), so the graph runs them as
     * layers of their own (for comparisons; the results are the same bits either way) */
    const char *fuse = getenv("CTRAIN_CPU_FUSE");
    if (fuse && strcmp(fuse, "0") == 0) {
        be->conv.conv2d_act_forward = NULL;
        be->conv.conv2d_act_backward = NULL;
        be->conv.conv2d_act_pool_forward = NULL;
        be->conv.conv2d_act_pool_backward = NULL;
    }
    return be;
}

const char *ct_cpu_backend_precision_note(ct_dtype dt) {
    if (dt == CT_BF16) return ct_cpu_bf16_note();
    if (dt == CT_F16)
        return "fp16 is computed in fp32 on the CPU (ctrain has no native fp16 path): 16-bit storage "
               "halves activation memory but costs time; fp32 trains faster on a CPU";
    return NULL;
}
