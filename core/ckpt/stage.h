/* stage.h: values between checkpoint files and the tensors' memory (ckpt.h's ct_ckpt_mem), for
 * the files of core/ckpt/: a writer entry that asks for them in chunks, and a load that writes
 * them in chunks. Host memory is read and written in place; a device's, or memory without
 * addresses (an NVMe swap's files), goes through one host staging buffer of at most
 * CT_CKPT_STAGE_FLOATS floats, never a whole copy. */
#ifndef CT_CKPT_STAGE_H
#define CT_CKPT_STAGE_H

#include "core/ckpt/ckpt.h"
#include "core/ckpt/safetensors.h"

/* A place in a ct_ckpt_tensors' memory: element `at` of the array whose element 0 is `base`, in
 * mem (NULL: host memory, the values at base + at; else mem's copies reach it, and base may be
 * NULL: memory without addresses). */
typedef struct ct_ckpt_loc {
    const ct_ckpt_mem *mem;
    float *base;
    int64_t at;
} ct_ckpt_loc;

/* Where element `first` of view v is in t (params or buffers), and of slot s of a trainable v. */
ct_ckpt_loc ct_ckpt_view_loc(const ct_ckpt_tensors *t, const ct_param_view *v, int64_t first);
ct_ckpt_loc ct_ckpt_slot_loc(const ct_ckpt_tensors *t, int s, const ct_param_view *v, int64_t first);

/* e: an F32 tensor `name` of `shape` whose values start at src. span is the entry's context and
 * must live until the file is written. Host memory: e's data is the values themselves. */
void ct_ckpt_entry(ct_st_entry *e, const char *name, ct_shape shape, ct_ckpt_loc src, ct_ckpt_loc *span);

/* read(ctx, first, k, dst, err) writes values [first, first + k) as fp32 into host memory dst;
 * a failure fills err (naming what could not be read). */
typedef int (*ct_ckpt_read_fn)(const void *ctx, int64_t first, int64_t k, float *dst, ct_err *err);
/* dst's n values = read's values [0, n): straight into host memory, else in chunks through one
 * staging buffer. The first error of read or of the memory's copy (dst may then hold part of the
 * values). */
int ct_ckpt_load_into(ct_ckpt_loc dst, int64_t n, ct_ckpt_read_fn read, const void *ctx, ct_err *err);

#endif
