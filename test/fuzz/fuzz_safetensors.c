/* fuzz_safetensors.c: libFuzzer target for the safetensors reader (core/ckpt/safetensors.c).
 *
 * Besides "no crash, no out-of-bounds read" (the sanitizers' job), it checks what the reader
 * promises: a failure is CT_ERR_DATA naming the file; a success gives tensors whose byte ranges
 * lie inside the input, tile the buffer exactly and match shape x dtype size, every tensor is
 * found by name, and each F32/F16/BF16 tensor converts to fp32 (reading every byte).
 * Build and run: test/fuzz/run_fuzz.sh fuzz_safetensors SECONDS. */
#include <stdlib.h>
#include <string.h>

#include "core/ckpt/safetensors.h"

static void check(int ok) {
    if (!ok) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    ct_err err = {0};
    ct_st_file *f = ct_st_parse(data, size, "fuzz.safetensors", &err);
    if (!f) {
        check(err.code == CT_ERR_DATA);
        check(strncmp(err.msg, "fuzz.safetensors: ", 18) == 0);
        return 0;
    }
    uint64_t buf_len = size - 8 - f->header_len, total = 0;
    for (int i = 0; i < f->n_tensors; i++) {
        const ct_st_tensor *t = &f->tensors[i];
        check(t->begin <= t->end && t->end <= buf_len);
        check(t->data == data + 8 + f->header_len + t->begin);
        check(ct_st_find(f, t->name) == t);
        int64_t n = ct_st_numel(t);
        check((uint64_t)n * (uint64_t)t->dtype_bits / 8 == t->end - t->begin);
        total += t->end - t->begin;
        if (t->ct_dtype == CT_F32 || t->ct_dtype == CT_F16 || t->ct_dtype == CT_BF16) {
            float *out = malloc((size_t)n * sizeof(float) + 1);
            check(ct_st_read_f32(t, out, n));
            free(out);
        }
    }
    check(total == buf_len);
    for (int i = 0; i < f->n_meta; i++) check(ct_st_meta(f, f->meta_keys[i]) != NULL);
    ct_st_close(f);
    return 0;
}
