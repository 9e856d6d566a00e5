/* cpu_capped.c: the capped device, the CPU backend behaving as a separate device (backend.h,
 * ct_capped_backend_create): what ZeRO-Offload moves between host and device is built and tested
 * against it without a GPU.
 *
 * Memory: mem.alloc is the CPU backend's counted pool with its limit set to the cap, so an
 * allocation past it returns NULL as cudaMalloc's failure does, and the caller's out-of-memory
 * path is the one a GPU run takes. Pinned memory is the CPU's counted host blocks.
 *
 * Copies: upload and download append a job to a queue that one copy thread works through in
 * ticket order, copying (and, with gbps > 0, sleeping so that the bytes move no faster than that).
 * A copy is therefore really in flight while the caller goes on: a destination read before its
 * done(ticket) says so, or a source changed before, gives wrong bytes.
 *
 * Ordering: a GPU orders every kernel queued after a copy behind it. Here ops run on the calling
 * thread when called, so each op of the table first waits until the copies queued before it have
 * finished (wait_copies: two atomic loads when none is in flight), and so do the synchronous
 * copies, memset0 and the frees. That keeps backend.h's contract (an upload's destination is
 * ready for every later op; a download's source may be overwritten or freed by any later op), at
 * the price of running copies alongside host work only, never alongside device ops: what overlaps
 * here is what overlaps a GPU's copies with host work (the CPU Adam of ZeRO-Offload), not its
 * copies with its kernels. cpu_capped_ops.h lists the ops; test_backend checks every entry of the
 * table is wrapped. */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/cpu/cpu_capped_ops.h"
#include "core/cpu/cpu_internal.h"
#include "core/util/limits.h"

typedef struct copy_job {
    void *dst;
    const void *src;
    size_t bytes;
    uint64_t ticket;
} copy_job;

struct ct_capped {
    size_t cap;
    double gbps;                 /* copy bandwidth; 0: memory speed */
    ct_backend cpu;              /* the CPU backend's table: what the wrappers call once copies are done */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t more;         /* a job was queued, or stop */
    pthread_cond_t finished;     /* a job finished */
    copy_job *ring;              /* the jobs not finished yet, from head, count of them */
    size_t ring_cap, head, count;
    bool stop;
    _Atomic uint64_t issued;     /* the last ticket handed out */
    _Atomic uint64_t done;       /* the last ticket whose copy finished (tickets finish in order) */
};

static struct ct_capped *capped_of(ct_backend *be) { return ((ct_cpu *)be->impl)->capped; }

/* ---- the copy thread ---- */

static void sleep_until(double t) {
    double left = t - ct_now();
    if (left <= 0) return;
    struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* One job's bytes, in slices of 1 MiB, each no earlier than the bandwidth allows. */
static void copy_throttled(const struct ct_capped *c, const copy_job *j) {
    if (j->bytes == 0 || j->dst == j->src) return;
    if (c->gbps <= 0) {
        memcpy(j->dst, j->src, j->bytes);
        return;
    }
    const size_t slice = (size_t)1 << 20;
    double t0 = ct_now(), rate = c->gbps * 1e9;
    for (size_t at = 0; at < j->bytes; at += slice) {
        size_t n = j->bytes - at < slice ? j->bytes - at : slice;
        memcpy((char *)j->dst + at, (const char *)j->src + at, n);
        sleep_until(t0 + (double)(at + n) / rate);
    }
}

static void *copy_main(void *arg) {
    struct ct_capped *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (c->count == 0 && !c->stop) pthread_cond_wait(&c->more, &c->mu);
        if (c->count == 0) break;   /* stopped, nothing left */
        copy_job j = c->ring[c->head];
        pthread_mutex_unlock(&c->mu);
        copy_throttled(c, &j);
        pthread_mutex_lock(&c->mu);
        c->head = (c->head + 1) % c->ring_cap;
        c->count--;
        atomic_store(&c->done, j.ticket);
        pthread_cond_broadcast(&c->finished);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* Block until the copy with this ticket (and every earlier one) has finished. */
static void wait_ticket(struct ct_capped *c, uint64_t ticket) {
    if (atomic_load(&c->done) >= ticket) return;
    pthread_mutex_lock(&c->mu);
    while (atomic_load(&c->done) < ticket) pthread_cond_wait(&c->finished, &c->mu);
    pthread_mutex_unlock(&c->mu);
}

/* Every copy queued before this call finished: what each op does first. */
static void wait_copies(ct_backend *be) {
    struct ct_capped *c = capped_of(be);
    wait_ticket(c, atomic_load(&c->issued));
}

static uint64_t enqueue(ct_backend *be, void *dst, const void *src, size_t bytes) {
    struct ct_capped *c = capped_of(be);
    pthread_mutex_lock(&c->mu);
    if (c->count == c->ring_cap) {   /* grow, keeping the jobs in order from 0 */
        size_t cap = c->ring_cap ? 2 * c->ring_cap : 64;
        copy_job *r = ct_xmalloc(cap * sizeof *r);
        for (size_t i = 0; i < c->count; i++) r[i] = c->ring[(c->head + i) % c->ring_cap];
        free(c->ring);
        c->ring = r, c->ring_cap = cap, c->head = 0;
    }
    uint64_t ticket = atomic_load(&c->issued) + 1;
    c->ring[(c->head + c->count) % c->ring_cap] = (copy_job){dst, src, bytes, ticket};
    c->count++;
    atomic_store(&c->issued, ticket);
    pthread_cond_signal(&c->more);
    pthread_mutex_unlock(&c->mu);
    return ticket;
}

/* Ops run when called, so the work queued before `after` has finished: a copy may start at once
 * in either direction. */
static uint64_t capped_copy_async(ct_backend *be, void *dst, const void *src, size_t bytes, uint64_t after) {
    return enqueue(be, dst, src, bytes);
}

static bool capped_copy_done(ct_backend *be, uint64_t ticket, bool wait) {
    struct ct_capped *c = capped_of(be);
    if (wait) wait_ticket(c, ticket);
    return atomic_load(&c->done) >= ticket;
}

/* ---- the op table: every op after the copies queued before it ---- */

#define WRAP_VOID(tab, op, ret, params, args)                                                                   \
    static void capped_##tab##_##op params {                                                                    \
        wait_copies(be);                                                                                        \
        capped_of(be)->cpu.tab.op args;                                                                         \
    }
#define WRAP_VALUE(tab, op, ret, params, args)                                                                  \
    static ret capped_##tab##_##op params {                                                                     \
        wait_copies(be);                                                                                        \
        return capped_of(be)->cpu.tab.op args;                                                                  \
    }
CT_CAPPED_OPS(WRAP_VOID, WRAP_VALUE)

/* An op the CPU leaves out (NULL: the caller's fallback) stays out. */
#define INSTALL(tab, op, ret, params, args) \
    if (be->tab.op) be->tab.op = capped_##tab##_##op;

static void capped_free(ct_backend *be, void *p) {
    wait_copies(be);
    capped_of(be)->cpu.mem.free(be, p);
}

static void capped_free_pinned(ct_backend *be, void *p) {
    wait_copies(be);
    capped_of(be)->cpu.mem.free_host_pinned(be, p);
}

static void capped_copy(ct_backend *be, void *dst, const void *src, size_t bytes) {
    wait_copies(be);
    if (bytes && dst != src) memmove(dst, src, bytes);
}

static void capped_memset0(ct_backend *be, void *p, size_t bytes) {
    wait_copies(be);
    if (bytes) memset(p, 0, bytes);
}

static size_t capped_peak_bytes(ct_backend *be) {
    ct_mem_stats m;
    be->mem.mem_stats(be, &m);
    return m.peak_total;
}

static void capped_destroy(ct_backend *be) {
    struct ct_capped *c = capped_of(be);
    pthread_mutex_lock(&c->mu);
    c->stop = true;
    pthread_cond_signal(&c->more);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->thread, NULL);   /* the copies queued finish first */
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->more);
    pthread_cond_destroy(&c->finished);
    void (*cpu_destroy)(ct_backend *) = c->cpu.destroy;
    free(c->ring);
    free(c);
    ((ct_cpu *)be->impl)->capped = NULL;
    cpu_destroy(be);
}

static void describe(ct_backend *be, const char *cpu_desc) {
    const struct ct_capped *c = capped_of(be);
    char bw[48] = "copies at memory speed";
    if (c->gbps > 0) snprintf(bw, sizeof bw, "copies at %g GB/s", c->gbps);
    snprintf(be->device_desc, sizeof be->device_desc, "capped device of %.1f MiB, %s; on %.60s",
             (double)c->cap / 1048576.0, bw, cpu_desc);
}

ct_backend *ct_capped_backend_create(int threads, size_t cap, double gbps) {
    ct_backend *be = ct_cpu_backend_create(threads);
    if (!be) return NULL;
    struct ct_capped *c = ct_xcalloc(1, sizeof *c);
    c->cap = cap;
    c->gbps = gbps;
    c->cpu = *be;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->more, NULL);
    pthread_cond_init(&c->finished, NULL);
    int why = pthread_create(&c->thread, NULL, copy_main, c);
    if (why) {
        pthread_mutex_destroy(&c->mu);
        pthread_cond_destroy(&c->more);
        pthread_cond_destroy(&c->finished);
        free(c);
        ct_backend_destroy(be);
        errno = why;
        return NULL;
    }
    ((ct_cpu *)be->impl)->capped = c;
    be->name = "capped";
    be->memory_bytes = cap;
    ct_cpu_backend_set_limit(be, cap);
    describe(be, c->cpu.device_desc);
    be->destroy = capped_destroy;
    be->mem.free = capped_free;
    be->mem.free_host_pinned = capped_free_pinned;
    be->mem.copy_h2d = capped_copy;
    be->mem.copy_d2h = capped_copy;
    be->mem.copy_d2d = capped_copy;
    be->mem.memset0 = capped_memset0;
    be->mem.peak_bytes = capped_peak_bytes;
    be->queue.sync = wait_copies;
    be->queue.upload = capped_copy_async;
    be->queue.download = capped_copy_async;
    be->queue.upload_done = capped_copy_done;
    be->queue.download_done = capped_copy_done;
    CT_CAPPED_OPS(INSTALL, INSTALL)
    return be;
}

int ct_capped_parse(const char *text, size_t *cap, double *gbps, ct_err *err) {
    const char *forms = "the value is SIZE[,gbps=G], SIZE with a unit (64MiB, 1.5GiB, 65536B) and G the copy "
                        "bandwidth in GB/s, e.g. CTRAIN_CAPPED_DEVICE=256MiB,gbps=12 (or unset it)";
    char size[64], why[256];
    const char *comma = strchr(text, ',');
    size_t n = comma ? (size_t)(comma - text) : strlen(text);
    if (n >= sizeof size) n = sizeof size - 1;
    memcpy(size, text, n);
    size[n] = '\0';
    *gbps = 0;
    if (ct_parse_bytes(size, cap, why, sizeof why))
        return ct_errf(err, CT_ERR_CONFIG, "environment variable CTRAIN_CAPPED_DEVICE=\"%.80s\": %s; %s", text, why,
                       forms);
    if (!comma) return CT_OK;
    const char *g = comma + 1;
    char *end = NULL;
    errno = 0;
    double v = strncmp(g, "gbps=", 5) == 0 && g[5] >= '0' && g[5] <= '9' ? strtod(g + 5, &end) : -1;
    if (v <= 0 || errno || !end || *end || v > 1e6)
        return ct_errf(err, CT_ERR_CONFIG, "environment variable CTRAIN_CAPPED_DEVICE=\"%.80s\": \"%.40s\" is not a "
                       "bandwidth; %s", text, g, forms);
    *gbps = v;
    return CT_OK;
}
