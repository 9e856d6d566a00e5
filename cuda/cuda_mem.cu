/* cuda_mem.cu: caching device allocator, pinned host memory, copies, streams.
 *
 * be->upload is the loader's path: a DMA straight from its pinned slot, with a ticket the loader
 * polls (upload_done) before handing the slot back to its workers. be->download is its twin into
 * pinned memory; both take tickets from one ring of events on the copy stream.
 *
 * Uploads run on the copy stream, ordered after the compute work queued before them (so a buffer
 * still being read is never overwritten) and before the compute work queued after them (events,
 * no device-wide synchronization). copy_h2d returns as soon as the caller's buffer may be reused:
 * the bytes are first copied into a pinned staging slot (a host memcpy, ~40 us for a 128-image
 * batch), and the DMA runs from there while the host goes on queueing work. */
#include "cuda/cuda_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "cuda/cuda_backend.h"
}

/* ---- size classes ---- */

#define CT_CUDA_MIN_BLOCK 512

/* 8 classes per power of two (waste <= 12.5%), at least 512 bytes. */
static size_t size_class(size_t bytes) {
    if (bytes <= CT_CUDA_MIN_BLOCK) return CT_CUDA_MIN_BLOCK;
    size_t p = (size_t)1 << (63 - __builtin_clzll((unsigned long long)bytes));
    size_t step = p / 8;
    return (bytes + step - 1) / step * step;
}

/* ---- live-block table: open addressing keyed by pointer, backward-shift deletion ---- */

static size_t ptr_hash(const void *p, size_t cap) {
    uint64_t x = (uint64_t)(uintptr_t)p >> 9;
    x *= 0x9E3779B97F4A7C15ull;
    return (size_t)(x >> 20) & (cap - 1);
}

static void live_insert_raw(ct_cuda_block *t, size_t cap, ct_cuda_block b) {
    size_t i = ptr_hash(b.ptr, cap);
    while (t[i].ptr) i = (i + 1) & (cap - 1);
    t[i] = b;
}

static void live_grow(ct_cuda_alloc *a) {
    size_t cap = a->live_cap ? a->live_cap * 2 : 1024;
    ct_cuda_block *t = (ct_cuda_block *)ct_xcalloc(cap, sizeof *t);
    for (size_t i = 0; i < a->live_cap; i++)
        if (a->live[i].ptr) live_insert_raw(t, cap, a->live[i]);
    free(a->live);
    a->live = t;
    a->live_cap = cap;
}

static void live_insert(ct_cuda_alloc *a, ct_cuda_block b) {
    if ((a->live_n + 1) * 2 > a->live_cap) live_grow(a);
    live_insert_raw(a->live, a->live_cap, b);
    a->live_n++;
}

/* Removes p from the table; returns its block (ptr NULL when p was not allocated here). */
static ct_cuda_block live_remove(ct_cuda_alloc *a, const void *p) {
    ct_cuda_block none = {NULL, 0, 0, false};
    if (!a->live_cap) return none;
    size_t mask = a->live_cap - 1, i = ptr_hash(p, a->live_cap);
    while (a->live[i].ptr && a->live[i].ptr != p) i = (i + 1) & mask;
    if (!a->live[i].ptr) return none;
    ct_cuda_block found = a->live[i];
    /* backward shift: move later entries of the probe run into the hole when their home allows */
    size_t hole = i, j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (!a->live[j].ptr) break;
        size_t home = ptr_hash(a->live[j].ptr, a->live_cap);
        bool movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
        if (movable) {
            a->live[hole] = a->live[j];
            hole = j;
        }
    }
    a->live[hole].ptr = NULL;
    a->live[hole].bytes = 0;
    a->live_n--;
    return found;
}

void ct_cuda_alloc_init(ct_cuda_alloc *a) {
    memset(a, 0, sizeof *a);
    pthread_mutex_init(&a->mu, NULL);
}

/* cudaFree every cached free block (caller holds the lock; the device must be idle). */
static void release_cached(ct_cuda_alloc *a) {
    for (size_t i = 0; i < a->free_n; i++) {
        CT_CUDA_CHECK(cudaFree(a->free_blocks[i].ptr));
        a->reserved_bytes -= a->free_blocks[i].bytes;
    }
    a->free_n = 0;
}

void ct_cuda_alloc_release_all(ct_cuda_alloc *a) {
    pthread_mutex_lock(&a->mu);
    release_cached(a);
    for (size_t i = 0; i < a->live_cap; i++)
        if (a->live[i].ptr && a->live[i].bytes) CT_CUDA_CHECK(cudaFree(a->live[i].ptr));
    free(a->live);
    free(a->free_blocks);
    for (size_t i = 0; i < a->scratch_pool.n; i++) CT_CUDA_CHECK(cudaFree(a->scratch_pool.v[i].ptr));
    free(a->scratch_pool.v);
    memset(&a->scratch_pool, 0, sizeof a->scratch_pool);
    free(a->captured.v);
    memset(&a->captured, 0, sizeof a->captured);
    a->live = NULL;
    a->free_blocks = NULL;
    a->live_cap = a->live_n = a->free_cap = 0;
    a->live_bytes = a->reserved_bytes = 0;
    pthread_mutex_unlock(&a->mu);
    pthread_mutex_destroy(&a->mu);
}

/* Append b to a block list. */
static void blocks_push(ct_cuda_blocks *l, ct_cuda_block b) {
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 256;
        l->v = (ct_cuda_block *)ct_xrealloc(l->v, l->cap * sizeof *l->v);
    }
    l->v[l->n++] = b;
}

/* Takes a block of class cls out of l (ptr NULL when it holds none). */
static ct_cuda_block blocks_take(ct_cuda_blocks *l, size_t cls) {
    ct_cuda_block b = {NULL, cls, 0, false};
    for (size_t i = 0; i < l->n; i++)
        if (l->v[i].bytes == cls) {
            b = l->v[i];
            l->v[i] = l->v[--l->n];
            break;
        }
    return b;
}

static ct_cuda_block free_take(ct_cuda_alloc *a, size_t cls) {
    ct_cuda_blocks l = {a->free_blocks, a->free_n, a->free_cap};
    ct_cuda_block b = blocks_take(&l, cls);
    a->free_n = l.n;
    return b;
}

static void free_push(ct_cuda_alloc *a, ct_cuda_block b) {
    ct_cuda_blocks l = {a->free_blocks, a->free_n, a->free_cap};
    blocks_push(&l, b);
    a->free_blocks = l.v;
    a->free_n = l.n;
    a->free_cap = l.cap;
}

/* A fresh block from cudaMalloc (ptr NULL when the device is out of memory). */
static ct_cuda_block device_malloc(ct_cuda_alloc *a, size_t cls) {
    ct_cuda_block b = {NULL, cls, 0, false};
    cudaError_t e = cudaMalloc(&b.ptr, cls);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* out-of-memory is not sticky; clear it and retry once */
        CT_CUDA_CHECK(cudaDeviceSynchronize());
        release_cached(a);
        e = cudaMalloc(&b.ptr, cls);
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            b.ptr = NULL;
            return b;
        }
    }
    a->n_cuda_malloc++;
    a->reserved_bytes += cls;
    if (a->reserved_bytes > a->peak_reserved_bytes) a->peak_reserved_bytes = a->reserved_bytes;
    return b;
}

/* While capturing: the capture's own freed blocks first, then the cache, then a fresh cudaMalloc
 * with this thread's capture mode relaxed for the call (cudaMalloc is refused in a thread-local
 * capture, and it does not touch the captured stream). The new block is the graph's like any other
 * it uses. (Handing out a placeholder address instead fails as soon as a library records a memset
 * on it, as CUB's radix sort does in the embedding backward.) ptr NULL: the device is out of
 * memory; no retry, since releasing the cache would need a device sync, which a capture forbids. */
static ct_cuda_block capture_malloc(ct_cuda_alloc *a, size_t cls) {
    ct_cuda_block b = {NULL, cls, 0, false};
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    CT_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    cudaError_t e = cudaMalloc(&b.ptr, cls);
    CT_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        b.ptr = NULL;
        return b;
    }
    a->n_cuda_malloc++;
    a->capture_mallocs++;
    a->reserved_bytes += cls;
    if (a->reserved_bytes > a->peak_reserved_bytes) a->peak_reserved_bytes = a->reserved_bytes;
    return b;
}

static ct_cuda_block capture_take(ct_cuda_alloc *a, size_t cls) {
    ct_cuda_block b = blocks_take(&a->captured, cls);
    if (!b.ptr) b = free_take(a, cls);
    return b.ptr ? b : capture_malloc(a, cls);
}

/* Op scratch: the pool's block of the class, else a fresh one (which joins the pool when freed). */
static ct_cuda_block scratch_take(ct_cuda_alloc *a, size_t cls) {
    ct_cuda_block b = blocks_take(&a->scratch_pool, cls);
    if (!b.ptr) b = a->capturing ? capture_malloc(a, cls) : device_malloc(a, cls);
    b.scratch = true;
    return b;
}

static void count_live(ct_cuda_alloc *a, const ct_cuda_block *b, bool add) {
    size_t *cur = &a->cat_bytes[b->cat];
    if (add) {
        *cur += b->bytes;
        a->live_bytes += b->bytes;
        if (*cur > a->cat_peak[b->cat]) a->cat_peak[b->cat] = *cur;
        if (a->live_bytes > a->peak_live_bytes) a->peak_live_bytes = a->live_bytes;
    } else {
        *cur -= b->bytes;
        a->live_bytes -= b->bytes;
    }
}

static void *alloc_locked(ct_cuda_alloc *a, size_t bytes, ct_mem_cat cat, bool scratch) {
    size_t cls = size_class(bytes);
    ct_cuda_block b;
    if (scratch) b = scratch_take(a, cls);
    else b = a->capturing ? capture_take(a, cls) : free_take(a, cls);
    if (!b.ptr && !a->capturing && !scratch) b = device_malloc(a, cls);
    if (!b.ptr) return NULL;
    b.cat = (int)cat;
    live_insert(a, b);
    count_live(a, &b, true);
    return b.ptr;
}

static void free_locked(ct_cuda_alloc *a, void *p) {
    ct_cuda_block b = live_remove(a, p);
    if (!b.ptr) {
        ct_cuda_fail_at("internal", "free of a pointer this backend did not allocate", "free",
                        __FILE__, __LINE__);
    }
    count_live(a, &b, false);
    if (b.scratch) blocks_push(&a->scratch_pool, b);
    else if (a->capturing) blocks_push(&a->captured, b);
    else free_push(a, b);
}

void ct_cuda_alloc_capture_begin(ct_cuda_alloc *a) {
    pthread_mutex_lock(&a->mu);
    a->capturing = true;
    a->captured.n = 0;
    pthread_mutex_unlock(&a->mu);
}

void ct_cuda_alloc_capture_end(ct_cuda_alloc *a, ct_cuda_blocks *owned) {
    pthread_mutex_lock(&a->mu);
    a->capturing = false;
    *owned = a->captured;
    memset(&a->captured, 0, sizeof a->captured);
    pthread_mutex_unlock(&a->mu);
}

/* Every later user of a block runs on the compute stream, after the work queued before it. */
void ct_cuda_alloc_give_back(ct_cuda_alloc *a, ct_cuda_blocks *owned) {
    pthread_mutex_lock(&a->mu);
    for (size_t i = 0; i < owned->n; i++) free_push(a, owned->v[i]);
    pthread_mutex_unlock(&a->mu);
    free(owned->v);
    memset(owned, 0, sizeof *owned);
}

static void *alloc_in(ct_backend *be, size_t bytes, ct_mem_cat cat, bool scratch) {
    ct_cuda_alloc *a = &ct_cuda_of(be)->mem;
    CT_CUDA_REQUIRE((int)cat >= 0 && cat < CT_MEM_CAT_COUNT, "memory category out of range");
    pthread_mutex_lock(&a->mu);
    void *p = alloc_locked(a, bytes, cat, scratch);
    pthread_mutex_unlock(&a->mu);
    return p;
}

static void *cu_alloc(ct_backend *be, size_t bytes, ct_mem_cat cat) { return alloc_in(be, bytes, cat, false); }

static void cu_free(ct_backend *be, void *p) {
    if (!p) return;
    ct_cuda_alloc *a = &ct_cuda_of(be)->mem;
    pthread_mutex_lock(&a->mu);
    free_locked(a, p);
    pthread_mutex_unlock(&a->mu);
}

void *ct_cuda_scratch(ct_backend *be, size_t bytes, const char *file, int line) {
    void *p = alloc_in(be, bytes, CT_MEM_WORKSPACE, true);
    if (!p) {
        char msg[128];
        snprintf(msg, sizeof msg, "out of device memory for %zu bytes of scratch", bytes);
        ct_cuda_fail_at("CUDA", msg, "ct_cuda_scratch", file, line);
    }
    return p;
}

void ct_cuda_scratch_free(ct_backend *be, void *p) { cu_free(be, p); }

/* Peak of what the allocator obtained from cudaMalloc, plus the fixed cuBLASLt workspace: the
 * device memory this backend held at its peak (the CUDA context itself is not counted). */
static size_t cu_peak_bytes(ct_backend *be) {
    ct_cuda *cu = ct_cuda_of(be);
    pthread_mutex_lock(&cu->mem.mu);
    size_t peak = cu->mem.peak_reserved_bytes;
    pthread_mutex_unlock(&cu->mem.mu);
    return peak + cu->lt_workspace_bytes;
}

/* Per-category accounting; the fixed cuBLASLt workspace counts as workspace (and reserved). */
static void cu_mem_stats(ct_backend *be, ct_mem_stats *out) {
    ct_cuda *cu = ct_cuda_of(be);
    ct_cuda_alloc *a = &cu->mem;
    size_t ws = cu->lt_workspace_bytes;
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&a->mu);
    for (int c = 0; c < CT_MEM_CAT_COUNT; c++) {
        out->current[c] = a->cat_bytes[c] + (c == CT_MEM_WORKSPACE ? ws : 0);
        out->peak[c] = a->cat_peak[c] + (c == CT_MEM_WORKSPACE ? ws : 0);
    }
    out->current_total = a->live_bytes + ws;
    out->peak_total = a->peak_live_bytes + ws;
    out->reserved = a->reserved_bytes + ws;
    for (int c = 0; c < CT_MEM_CAT_COUNT; c++) out->host_current[c] = a->host_bytes[c], out->host_peak[c] = a->host_peak[c];
    out->host_current_total = a->host_total;
    out->host_peak_total = a->host_peak_total;
    pthread_mutex_unlock(&a->mu);
}

extern "C" void ct_cuda_get_mem_stats(ct_backend *be, ct_cuda_mem_stats *out) {
    ct_cuda_alloc *a = &ct_cuda_of(be)->mem;
    pthread_mutex_lock(&a->mu);
    out->live_bytes = a->live_bytes;
    out->peak_live_bytes = a->peak_live_bytes;
    out->reserved_bytes = a->reserved_bytes;
    out->peak_reserved_bytes = a->peak_reserved_bytes;
    out->n_cuda_malloc = a->n_cuda_malloc;
    pthread_mutex_unlock(&a->mu);
}

/* ---- pinned host memory ---- */

/* A pinned block carries a 64-byte header with its size and category (the DMA alignment of what
 * follows stays 64 bytes), for mem_stats' host figures. */
typedef struct pinned_header {
    size_t bytes;
    int cat;
} pinned_header;
#define PINNED_HEADER 64

static void count_pinned(ct_cuda_alloc *a, int cat, size_t bytes, bool add) {
    pthread_mutex_lock(&a->mu);
    if (add) {
        a->host_bytes[cat] += bytes, a->host_total += bytes;
        if (a->host_bytes[cat] > a->host_peak[cat]) a->host_peak[cat] = a->host_bytes[cat];
        if (a->host_total > a->host_peak_total) a->host_peak_total = a->host_total;
    } else {
        a->host_bytes[cat] -= bytes, a->host_total -= bytes;
    }
    pthread_mutex_unlock(&a->mu);
}

static void *cu_alloc_host_pinned(ct_backend *be, size_t bytes, ct_mem_cat cat) {
    if ((unsigned)cat >= CT_MEM_CAT_COUNT) cat = CT_MEM_WORKSPACE;
    void *p = NULL;
    if (cudaHostAlloc(&p, PINNED_HEADER + (bytes ? bytes : 64), cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    pinned_header h = {bytes, (int)cat};
    memcpy(p, &h, sizeof h);
    count_pinned(&ct_cuda_of(be)->mem, (int)cat, bytes, true);
    return (char *)p + PINNED_HEADER;
}

static void cu_free_host_pinned(ct_backend *be, void *p) {
    if (!p) return;
    char *base = (char *)p - PINNED_HEADER;
    pinned_header h;
    memcpy(&h, base, sizeof h);
    count_pinned(&ct_cuda_of(be)->mem, h.cat, h.bytes, false);
    CT_CUDA_CHECK(cudaFreeHost(base));
}

/* ---- copies ---- */

bool ct_cuda_stages_init(ct_cuda *cu) {
    for (int i = 0; i < CT_CUDA_STAGES; i++)
        if (cudaEventCreateWithFlags(&cu->stage[i].done, cudaEventDisableTiming) != cudaSuccess) {
            cu->stage[i].done = NULL;
            (void)cudaGetLastError();
            return false;
        }
    return true;
}

void ct_cuda_stages_release(ct_cuda *cu, bool strict) {
    for (int i = 0; i < CT_CUDA_STAGES; i++) {
        ct_cuda_stage *s = &cu->stage[i];
        if (s->buf) {
            if (strict) CT_CUDA_CHECK(cudaFreeHost(s->buf));
            else (void)cudaFreeHost(s->buf);
        }
        if (s->done) {
            if (strict) CT_CUDA_CHECK(cudaEventDestroy(s->done));
            else (void)cudaEventDestroy(s->done);
        }
        s->buf = NULL;
        s->done = NULL;
        s->cap = 0;
        s->pending = false;
    }
}

/* Queue dst <- src (kind: to or from the device) on the copy stream after the compute work in
 * `ready` (NULL: everything queued on the compute stream so far: it may still use dst, or still
 * be producing src), record `done` when the copy finishes, and make later compute work wait for
 * it: an upload's dst is ready for its readers, and a download's src may be overwritten, or freed
 * and handed out again by the caching allocator, whose reuse rule assumes every user of a block
 * runs on the compute stream. */
static void queue_copy(ct_cuda *cu, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                       cudaEvent_t done, cudaEvent_t ready) {
    if (!ready) {
        CT_CUDA_CHECK(cudaEventRecord(cu->ev_compute, cu->compute));
        ready = cu->ev_compute;
    }
    CT_CUDA_CHECK(cudaStreamWaitEvent(cu->copy, ready, 0));
    CT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, cu->copy));
    CT_CUDA_CHECK(cudaEventRecord(done, cu->copy));
    CT_CUDA_CHECK(cudaStreamWaitEvent(cu->compute, done, 0));
}

/* A staging slot holding at least `bytes`, its previous upload finished; NULL when pinned memory
 * for it cannot be had (the caller then uploads directly). */
static ct_cuda_stage *stage_get(ct_cuda *cu, size_t bytes) {
    ct_cuda_stage *s = &cu->stage[cu->stage_next];
    cu->stage_next = (cu->stage_next + 1) % CT_CUDA_STAGES;
    if (s->pending) {
        CT_CUDA_CHECK(cudaEventSynchronize(s->done));
        s->pending = false;
    }
    if (s->cap < bytes) {
        if (s->buf) CT_CUDA_CHECK(cudaFreeHost(s->buf));
        s->buf = NULL;
        s->cap = 0;
        size_t cap = bytes < ((size_t)1 << 20) ? ((size_t)1 << 20) : bytes + bytes / 4;
        if (cap > CT_CUDA_STAGE_MAX) cap = CT_CUDA_STAGE_MAX;
        if (cudaHostAlloc(&s->buf, cap, cudaHostAllocDefault) != cudaSuccess) {
            (void)cudaGetLastError();
            s->buf = NULL;
            return NULL;
        }
        s->cap = cap;
    }
    return s;
}

void ct_cuda_require_not_capturing(ct_backend *be, const char *what) {
    ct_cuda_alloc *a = &ct_cuda_of(be)->mem;
    pthread_mutex_lock(&a->mu);
    bool capturing = a->capturing;
    pthread_mutex_unlock(&a->mu);
    if (capturing)
        ct_cuda_fail_at("internal", "called while a CUDA graph is being captured (uploads, copies "
                        "to the host and syncs belong outside the captured step)", what, __FILE__,
                        __LINE__);
}

/* ---- asynchronous copies from and to pinned memory (be->upload, be->download) ---- */

static bool events_create(cudaEvent_t *ev, int n, unsigned flags) {
    for (int i = 0; i < n; i++) {
        if (cudaEventCreateWithFlags(&ev[i], flags) != cudaSuccess) {
            ev[i] = NULL;
            (void)cudaGetLastError();
            return false;
        }
    }
    return true;
}

static void events_destroy(cudaEvent_t *ev, int n, bool strict) {
    for (int i = 0; i < n; i++) {
        if (!ev[i]) continue;
        if (strict) CT_CUDA_CHECK(cudaEventDestroy(ev[i]));
        else (void)cudaEventDestroy(ev[i]);
        ev[i] = NULL;
    }
}

bool ct_cuda_queue_events_init(ct_cuda *cu) {
    return events_create(cu->cq.ev, CT_CUDA_COPY_EVENTS, cudaEventDisableTiming) &&
           events_create(cu->cq.mark_ev, CT_CUDA_COPY_EVENTS, cudaEventDisableTiming) &&
           events_create(cu->timer.ev, CT_TIMER_MARKS, cudaEventDefault);
}

void ct_cuda_queue_events_release(ct_cuda *cu, bool strict) {
    events_destroy(cu->cq.ev, CT_CUDA_COPY_EVENTS, strict);
    events_destroy(cu->cq.mark_ev, CT_CUDA_COPY_EVENTS, strict);
    events_destroy(cu->timer.ev, CT_TIMER_MARKS, strict);
}

/* Copies finish in ticket order (one copy stream), so `done` only moves forward. */
static void copy_mark_done(ct_cuda_copy_ring *r, uint64_t ticket) {
    if (ticket > r->done) r->done = ticket;
}

static uint64_t cu_compute_mark(ct_backend *be) {
    ct_cuda *cu = ct_cuda_of(be);
    ct_cuda_require_not_capturing(be, "compute_mark");
    uint64_t m = ++cu->cq.mark_next;
    CT_CUDA_CHECK(cudaEventRecord(cu->cq.mark_ev[m % CT_CUDA_COPY_EVENTS], cu->compute));
    return m;
}

/* No staging: the copy engine reads or writes the caller's pinned buffer directly, and the caller
 * leaves it alone until the ticket says the copy is done. */
static uint64_t async_copy(ct_backend *be, void *dst, const void *src, size_t bytes,
                           cudaMemcpyKind kind, uint64_t after, const char *what) {
    ct_cuda *cu = ct_cuda_of(be);
    ct_cuda_copy_ring *r = &cu->cq;
    ct_cuda_require_not_capturing(be, what);
    CT_CUDA_REQUIRE(after <= r->mark_next, "copy after a compute_mark never handed out");
    cudaEvent_t ready = after ? r->mark_ev[after % CT_CUDA_COPY_EVENTS] : NULL;
    uint64_t t = ++r->next;
    int k = (int)(t % CT_CUDA_COPY_EVENTS);
    if (r->ticket[k] > r->done) { /* the event still marks an older copy: let it finish first */
        CT_CUDA_CHECK(cudaEventSynchronize(r->ev[k]));
        copy_mark_done(r, r->ticket[k]);
    }
    r->ticket[k] = t;
    if (bytes) {
        queue_copy(cu, dst, src, bytes, kind, r->ev[k], ready);
    } else {
        CT_CUDA_CHECK(cudaEventRecord(r->ev[k], cu->copy));
    }
    return t;
}

static uint64_t cu_upload(ct_backend *be, void *dst, const void *src_pinned, size_t bytes,
                          uint64_t after) {
    return async_copy(be, dst, src_pinned, bytes, cudaMemcpyHostToDevice, after, "upload");
}

static uint64_t cu_download(ct_backend *be, void *dst_pinned, const void *src, size_t bytes,
                            uint64_t after) {
    return async_copy(be, dst_pinned, src, bytes, cudaMemcpyDeviceToHost, after, "download");
}

/* upload_done and download_done: one ticket sequence answers both. */
static bool cu_copy_done(ct_backend *be, uint64_t ticket, bool wait) {
    ct_cuda_copy_ring *r = &ct_cuda_of(be)->cq;
    if (ticket <= r->done) return true;
    CT_CUDA_REQUIRE(ticket <= r->next, "copy ticket never handed out");
    int k = (int)(ticket % CT_CUDA_COPY_EVENTS);
    if (r->ticket[k] != ticket) { /* reused: that only happens after this ticket finished */
        copy_mark_done(r, ticket);
        return true;
    }
    if (wait) {
        CT_CUDA_CHECK(cudaEventSynchronize(r->ev[k]));
    } else {
        cudaError_t e = cudaEventQuery(r->ev[k]);
        if (e == cudaErrorNotReady) return false;
        CT_CUDA_CHECK(e);
    }
    copy_mark_done(r, ticket);
    return true;
}

/* ---- timing marks ---- */

static uint64_t cu_timer_mark(ct_backend *be) {
    ct_cuda *cu = ct_cuda_of(be);
    ct_cuda_require_not_capturing(be, "timer_mark");
    uint64_t m = ++cu->timer.last;
    CT_CUDA_CHECK(cudaEventRecord(cu->timer.ev[m % CT_TIMER_MARKS], cu->compute));
    return m;
}

static double cu_timer_elapsed(ct_backend *be, uint64_t a, uint64_t b) {
    ct_cuda_timer_ring *t = &ct_cuda_of(be)->timer;
    ct_cuda_require_not_capturing(be, "timer_elapsed");
    if (!ct_timer_mark_live(a, t->last) || !ct_timer_mark_live(b, t->last)) return NAN;
    cudaEvent_t ea = t->ev[a % CT_TIMER_MARKS], eb = t->ev[b % CT_TIMER_MARKS];
    /* both, whichever comes first in the queue */
    CT_CUDA_CHECK(cudaEventSynchronize(ea));
    CT_CUDA_CHECK(cudaEventSynchronize(eb));
    float ms = 0.0f;
    CT_CUDA_CHECK(cudaEventElapsedTime(&ms, ea, eb));
    return 1e-3 * (double)ms;
}

static void cu_copy_h2d(ct_backend *be, void *dst, const void *src_host, size_t bytes) {
    if (!bytes) return;
    ct_cuda *cu = ct_cuda_of(be);
    ct_cuda_require_not_capturing(be, "copy_h2d");
    ct_cuda_stage *s = bytes <= CT_CUDA_STAGE_MAX ? stage_get(cu, bytes) : NULL;
    if (s) {
        memcpy(s->buf, src_host, bytes);
        queue_copy(cu, dst, s->buf, bytes, cudaMemcpyHostToDevice, s->done, NULL);
        s->pending = true;
        return;
    }
    /* large or unstageable: upload straight from the caller's memory and wait, so that the caller
     * may reuse it when we return */
    queue_copy(cu, dst, src_host, bytes, cudaMemcpyHostToDevice, cu->ev_copy, NULL);
    CT_CUDA_CHECK(cudaEventSynchronize(cu->ev_copy));
}

static void cu_copy_d2h(ct_backend *be, void *dst_host, const void *src, size_t bytes) {
    if (!bytes) return;
    ct_cuda *cu = ct_cuda_of(be);
    ct_cuda_require_not_capturing(be, "copy_d2h");
    CT_CUDA_CHECK(cudaMemcpyAsync(dst_host, src, bytes, cudaMemcpyDeviceToHost, cu->compute));
    CT_CUDA_CHECK(cudaStreamSynchronize(cu->compute));
}

static void cu_copy_d2d(ct_backend *be, void *dst, const void *src, size_t bytes) {
    if (!bytes || dst == src) return;
    uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
    if (d < s + bytes && s < d + bytes) {
        /* overlapping ranges (the CPU backend's memmove allows them; cudaMemcpy does not) */
        void *tmp = CT_CUDA_SCRATCH(be, bytes);
        CT_CUDA_CHECK(cudaMemcpyAsync(tmp, src, bytes, cudaMemcpyDeviceToDevice, ct_cuda_stream(be)));
        CT_CUDA_CHECK(cudaMemcpyAsync(dst, tmp, bytes, cudaMemcpyDeviceToDevice, ct_cuda_stream(be)));
        ct_cuda_scratch_free(be, tmp);
        return;
    }
    CT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ct_cuda_stream(be)));
}

static void cu_memset0(ct_backend *be, void *p, size_t bytes) {
    if (!bytes) return;
    CT_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, ct_cuda_stream(be)));
}

static void cu_sync(ct_backend *be) {
    ct_cuda *cu = ct_cuda_of(be);
    ct_cuda_require_not_capturing(be, "sync");
    CT_CUDA_CHECK(cudaStreamSynchronize(cu->copy));
    CT_CUDA_CHECK(cudaStreamSynchronize(cu->compute));
}

void ct_cuda_read_result(ct_backend *be, void *dst_host, const void *src_dev, size_t bytes) {
    ct_cuda *cu = ct_cuda_of(be);
    CT_CUDA_REQUIRE(bytes <= CT_CUDA_HOST_SCRATCH, "result larger than the host scratch buffer");
    ct_cuda_require_not_capturing(be, "a host-visible result (reduction, norm, finite check)");
    CT_CUDA_CHECK(cudaMemcpyAsync(cu->host_scratch, src_dev, bytes, cudaMemcpyDeviceToHost,
                                  cu->compute));
    CT_CUDA_CHECK(cudaStreamSynchronize(cu->compute));
    memcpy(dst_host, cu->host_scratch, bytes);
}

void ct_cuda_mem_install(ct_backend *be) {
    be->mem.alloc = cu_alloc;
    be->mem.free = cu_free;
    be->mem.alloc_host_pinned = cu_alloc_host_pinned;
    be->mem.free_host_pinned = cu_free_host_pinned;
    be->mem.copy_h2d = cu_copy_h2d;
    be->mem.copy_d2h = cu_copy_d2h;
    be->mem.copy_d2d = cu_copy_d2d;
    be->mem.memset0 = cu_memset0;
    be->queue.sync = cu_sync;
    be->mem.peak_bytes = cu_peak_bytes;
    be->mem.mem_stats = cu_mem_stats;
    be->queue.compute_mark = cu_compute_mark;
    be->queue.upload = cu_upload;
    be->queue.upload_done = cu_copy_done;
    be->queue.download = cu_download;
    be->queue.download_done = cu_copy_done;
    be->queue.timer_mark = cu_timer_mark;
    be->queue.timer_elapsed = cu_timer_elapsed;
}
