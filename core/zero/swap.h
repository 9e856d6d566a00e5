/* swap.h: fp32 arrays kept in files under nvme_path and walked in chunks (ZeRO-Infinity's NVMe
 * optimizer state: the fp32 master, exp_avg and exp_avg_sq of a rank's range).
 *
 * A swap holds K named arrays of n floats each, one file per array in a directory of its own
 * under nvme_path (ctrain-swap-<tag>-rank<r>-XXXXXX, mode 0700, locked while in use, removed by
 * ct_swap_close; a directory left by a killed run is removed by the next ct_swap_open under the
 * same path). The arrays are reached only through passes: a pass walks chunks 0, 1, ... in order
 * and hands out, for each, a host pointer to every array's part of it:
 *
 *     ct_swap_begin(s, CT_SWAP_UPDATE, all, err);
 *     for (ct_swap_chunk c; !(rc = ct_swap_next(s, &c, err)) && c.n;) {
 *         step(c.lo, c.n, c.a[0], c.a[1], c.a[2]);      (the chunk's elements [lo, lo + n))
 *         rc = ct_swap_release(s, &c, err);             (written back behind the next chunk)
 *     }
 *     ct_swap_end(s, err);                              (every write done, or the first error)
 *
 * with buffer_count host buffers (each one chunk of every array): while the caller works on chunk
 * i, chunk i-1 is written and chunk i+1 (and further, as buffers allow) read. With two buffers the
 * write of i-1 and then the read of i+1 share the other buffer; more buffers read further ahead,
 * which absorbs uneven steps and I/O; one overlaps nothing. Host memory is buffer_count x K x chunk bytes, and the budget sets the chunk:
 * the largest multiple of CT_AIO_ALIGN that fits (at most max_chunk elements).
 *
 * Modes: CT_SWAP_UPDATE reads each chunk and writes it back after release (an optimizer step);
 * CT_SWAP_READ reads and writes nothing back (a checkpoint save streams the arrays out);
 * CT_SWAP_FILL reads nothing, the caller fills every element of the chunk and it is written (the
 * initial state, a resume from a checkpoint). A pass may cover a subset of the arrays (mask bit k:
 * array k; the others' pointers are NULL), e.g. one tensor at a time for a checkpoint file.
 *
 * Between passes, ct_swap_read and ct_swap_write reach any range of an array (a checkpoint's
 * tensors, in the order its files hold them).
 *
 * The files are scratch: they hold the state between steps of one process, never across runs.
 * A checkpoint holds the state (saved with ct_swap_read, loaded with ct_swap_write or a FILL pass);
 * docs/distributed.md, "NVMe offload", says what the trainer calls where. */
#ifndef CT_ZERO_SWAP_H
#define CT_ZERO_SWAP_H

#include <stdbool.h>
#include <stdint.h>

#include "core/util/common.h"
#include "core/zero/aio.h"

#define CT_SWAP_MAX_ARRAYS 8
#define CT_SWAP_ALL 0xffu /* every array (mask) */

typedef struct ct_swap_opts {
    const char *nvme_path;      /* an existing writable directory (ct_swap_check_dir) */
    const char *tag;            /* names the directory: "optimizer", "param" */
    int rank;
    int n_arrays;               /* 1..CT_SWAP_MAX_ARRAYS */
    const char *const *names;   /* [n_arrays]: file names (letters, digits, '_', '.', '-') */
    int64_t n;                  /* elements of every array, >= 1 */
    int buffer_count;           /* host buffers, >= 1 (offload_optimizer.buffer_count) */
    size_t host_bytes;          /* budget: buffer_count x n_arrays x chunk bytes, plus one block
                                   (CT_AIO_ALIGN) for aligning the allocator's memory */
    int64_t max_chunk;          /* elements per chunk at most (sub_group_size); 0: no limit */
    ct_aio_opts aio;
    /* The buffers' memory (page-locked for pin_memory: the backend's alloc_host_pinned); NULL:
     * plain aligned memory. Any alignment: the swap aligns inside. */
    void *(*alloc)(void *ctx, size_t bytes);
    void (*free)(void *ctx, void *p);
    void *alloc_ctx;
} ct_swap_opts;

typedef enum { CT_SWAP_UPDATE, CT_SWAP_READ, CT_SWAP_FILL } ct_swap_mode;

/* One chunk of a pass: elements [lo, lo + n) of every array in the pass, at a[k] (NULL for an
 * array outside the pass). Valid from ct_swap_next to ct_swap_release. */
typedef struct ct_swap_chunk {
    int64_t index, lo, n;
    float *a[CT_SWAP_MAX_ARRAYS];
} ct_swap_chunk;

typedef struct ct_swap ct_swap;

/* Before training starts: path is an existing directory in which this process can create files,
 * and its file system has `bytes` free (0: not checked). CT_ERR_CONFIG naming the path and what
 * is wrong (what_key: the config key it came from, for the message, e.g.
 * "zero_optimization.offload_optimizer.nvme_path"). */
int ct_swap_check_dir(const char *path, int64_t bytes, const char *what_key, ct_err *err);
/* File bytes a swap of these options takes (every array, padded to CT_AIO_ALIGN). */
int64_t ct_swap_file_bytes(const ct_swap_opts *o);
/* The chunk (elements) the options give, or 0 when the budget holds less than one aligned block
 * per buffer and array (then ct_swap_open fails, naming the smallest budget). */
int64_t ct_swap_chunk_for(const ct_swap_opts *o);

/* Make the directory and the files (space reserved), allocate the buffers, start the I/O engine.
 * Warnings (w, may be NULL): a stale directory removed, O_DIRECT refused by the file system. */
int ct_swap_open(const ct_swap_opts *o, ct_swap **out, ct_warnings *w, ct_err *err);
/* Stop the engine, remove the files and the directory, free everything. After an error in a pass,
 * too. NULL: CT_OK. */
int ct_swap_close(ct_swap *s, ct_err *err);

const char *ct_swap_dir(const ct_swap *s);
int64_t ct_swap_chunk_elems(const ct_swap *s);     /* elements per chunk (the last may be shorter) */
int64_t ct_swap_chunks(const ct_swap *s);
size_t ct_swap_host_bytes(const ct_swap *s);   /* what the buffers take (<= the budget) */
bool ct_swap_direct(const ct_swap *s);         /* every file uses O_DIRECT */
ct_aio_counts ct_swap_io_stats(const ct_swap *s);

/* A pass (one at a time): CT_OK or the first error. */
int ct_swap_begin(ct_swap *s, ct_swap_mode mode, unsigned mask, ct_err *err);
/* The next chunk, once its reads are done (c->n == 0: the pass has no more). The previous chunk
 * must have been released. */
int ct_swap_next(ct_swap *s, ct_swap_chunk *c, ct_err *err);
/* Done with the chunk: its writes are queued (UPDATE, FILL) and the buffer is reused once they
 * finish. */
int ct_swap_release(ct_swap *s, ct_swap_chunk *c, ct_err *err);
/* Wait for every write of the pass. After it returned CT_OK, the files hold what the pass wrote.
 * Ends a pass that stopped early too (the chunks not reached are unchanged). */
int ct_swap_end(ct_swap *s, ct_err *err);

/* Elements [at, at + n) of array k, outside a pass, in any order and of any length (a checkpoint
 * reads and writes the arrays tensor by tensor, in its files' order, not the arrays'). They go
 * through the swap's own buffers (idle between passes: no host memory of their own), a buffer's
 * worth at a time; a write that starts or ends inside a block reads that block first, so the
 * elements around the range keep their values. CT_ERR_RUNTIME naming the file, the operation and
 * the offset. */
int ct_swap_read(ct_swap *s, int k, int64_t at, int64_t n, float *dst, ct_err *err);
int ct_swap_write(ct_swap *s, int k, int64_t at, int64_t n, const float *src, ct_err *err);

/* Whole-array helpers over passes (bounded memory: the swap's own buffers). fill(ctx, k, lo, n,
 * dst) writes elements [lo, lo + n) of array k; drain(ctx, k, lo, n, src) takes them. Each runs
 * one pass per array in mask, k ascending, lo ascending within an array (so a stream can be
 * read or written front to back: a checkpoint file's tensors one after another). */
typedef int (*ct_swap_fill_fn)(void *ctx, int k, int64_t lo, int64_t n, float *dst, ct_err *err);
typedef int (*ct_swap_drain_fn)(void *ctx, int k, int64_t lo, int64_t n, const float *src, ct_err *err);
int ct_swap_fill(ct_swap *s, unsigned mask, ct_swap_fill_fn fill, void *ctx, ct_err *err);
int ct_swap_drain(ct_swap *s, unsigned mask, ct_swap_drain_fn drain, void *ctx, ct_err *err);
/* The same from and into host arrays: src[k] / dst[k] of n floats for each k in mask. */
int ct_swap_load_host(ct_swap *s, unsigned mask, const float *const *src, ct_err *err);
int ct_swap_store_host(ct_swap *s, unsigned mask, float *const *dst, ct_err *err);

#endif
