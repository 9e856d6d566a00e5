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

/* Pinned memory is plain memory here (the loader's slots; not counted in mem_stats). */
static void *cpu_alloc_pinned(ct_backend *be, size_t bytes) {
    /* aligned_alloc wants a multiple of the alignment; 0 bytes still yields a unique pointer */
    size_t rounded = (bytes + 63) / 64 * 64;
    return aligned_alloc(64, rounded ? rounded : 64);
}

static void cpu_free_pinned(ct_backend *be, void *p) { free(p); }

/* Backend memory carries a 64-byte header with its size and category, for mem_stats. */
typedef struct block_header {
    size_t bytes;
    ct_mem_cat cat;
} block_header;
#define HEADER 64

/* false (nothing counted) when adding would pass the limit (ct_cpu_backend_set_limit). */
static bool count(ct_cpu *cpu, ct_mem_cat cat, size_t bytes, bool add) {
    ct_mem_stats *m = &cpu->mem;
    pthread_mutex_lock(&cpu->mem_mu);
    if (add && cpu->limit && (bytes > cpu->limit || m->current_total > cpu->limit - bytes)) {
        pthread_mutex_unlock(&cpu->mem_mu);
        return false;
    }
    if (add) {
        m->current[cat] += bytes, m->current_total += bytes;
        if (m->current[cat] > m->peak[cat]) m->peak[cat] = m->current[cat];
        if (m->current_total > m->peak_total) m->peak_total = m->current_total;
    } else {
        m->current[cat] -= bytes, m->current_total -= bytes;
    }
    pthread_mutex_unlock(&cpu->mem_mu);
    return true;
}

void ct_cpu_backend_set_limit(ct_backend *be, size_t bytes) {
    ct_cpu *cpu = be->impl;
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
    if (bytes < HUGE_MIN) return cpu_alloc_pinned(NULL, bytes);
    size_t rounded = (bytes + HUGE_ALIGN - 1) / HUGE_ALIGN * HUGE_ALIGN;
    void *p = aligned_alloc(HUGE_ALIGN, rounded);
#ifdef MADV_HUGEPAGE
    if (p) madvise(p, rounded, MADV_HUGEPAGE);
#endif
    return p;
}

static void *cpu_alloc(ct_backend *be, size_t bytes, ct_mem_cat cat) {
    if ((unsigned)cat >= CT_MEM_CAT_COUNT) cat = CT_MEM_WORKSPACE;
    if (!count(be->impl, cat, bytes, true)) return NULL;   /* over train.memory_limit_gb */
    char *p = alloc_block(HEADER + bytes);
    if (!p) {
        count(be->impl, cat, bytes, false);
        return NULL;
    }
    *(block_header *)p = (block_header){bytes, cat};
    return p + HEADER;
}

static void cpu_free(ct_backend *be, void *p) {
    if (!p) return;
    char *base = (char *)p - HEADER;
    block_header h = *(block_header *)base;
    count(be->impl, h.cat, h.bytes, false);
    free(base);
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
    for (int i = 0; i < CT_CPU_SLOTS; i++) cpu_free(be, cpu->slot[i]);
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
    be->mem.alloc = cpu_alloc;
    be->mem.free = cpu_free;
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
