/* stage.h: values between checkpoint files and the tensors' memory (ckpt.h's ct_ckpt_mem), for
 * the files of core/ckpt/: a writer entry that asks for them in chunks, and a load that writes
 * them in chunks. Host memory is read and written in place; a device's goes through one host
 * staging buffer of at most CT_CKPT_STAGE_FLOATS floats, never a whole copy. */
#ifndef CT_CKPT_STAGE_H
#define CT_CKPT_STAGE_H

#include "core/ckpt/ckpt.h"
#include "core/ckpt/safetensors.h"

/* The values of one writer entry: src in mem (NULL: host memory). */
typedef struct ct_ckpt_span {
    const ct_ckpt_mem *mem;
    const float *src;
} ct_ckpt_span;

/* e: an F32 tensor `name` of `shape` whose values are src in mem. span is the entry's context and
 * must live until the file is written. Host memory: e's data is src itself. */
void ct_ckpt_entry(ct_st_entry *e, const char *name, ct_shape shape, const ct_ckpt_mem *mem,
                   const float *src, ct_ckpt_span *span);

/* read(ctx, first, k, dst) writes values [first, first + k) as fp32 into host memory dst; false
 * when it cannot. */
typedef bool (*ct_ckpt_read_fn)(const void *ctx, int64_t first, int64_t k, float *dst);
/* dst[0, n) in mem = read's values [0, n): straight into dst in host memory, else in chunks
 * through one staging buffer. False when read fails (dst may then hold part of the values). */
bool ct_ckpt_load_into(const ct_ckpt_mem *mem, float *dst, int64_t n, ct_ckpt_read_fn read, const void *ctx);

#endif
