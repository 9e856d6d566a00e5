/* write_st_sample.c: writes safetensors files with ctrain's writer for test/e2e_safetensors.sh,
 * and the values they must hold (expected.json) for test/ref/read_safetensors.py to compare.
 *
 *   OUT/sample.safetensors   every dtype ctrain writes, a 0-d and an empty tensor, metadata
 *   OUT/ckpt/global_step3/   a checkpoint saved by ct_ckpt_save
 *   OUT/export_bf16.safetensors, OUT/export_fp16.safetensors   `ctrain export` of it
 *   OUT/expected.json        {file: {tensor: {"dtype", "shape", "values": [...]}}}
 * Usage: write_st_sample OUT_DIR (built and run by the e2e script). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ckpt/ckpt.h"
#include "cmd/commands.h"
#include "core/util/rng.h"
#include "core/ckpt/safetensors.h"

/* Element i of a tensor as a double (exact for every dtype written here). */
static double value_at(ct_dtype dt, const void *p, int64_t i) {
    switch (dt) {
    case CT_F32: return ((const float *)p)[i];
    case CT_F16: return ct_f16_to_f32(((const uint16_t *)p)[i]);
    case CT_BF16: return ct_bf16_to_f32(((const uint16_t *)p)[i]);
    case CT_I32: return ((const int32_t *)p)[i];
    case CT_I64: return (double)((const int64_t *)p)[i];
    case CT_U8: return ((const uint8_t *)p)[i];
    case CT_U16: return ((const uint16_t *)p)[i];
    default: return 0;
    }
}

static void expect(cJSON *file, const char *name, ct_dtype dt, const ct_shape *s, const void *p,
                   bool from_f32) {
    cJSON *t = cJSON_AddObjectToObject(file, name);
    cJSON_AddStringToObject(t, "dtype", ct_dtype_safetensors_name(dt));
    cJSON *sh = cJSON_AddArrayToObject(t, "shape");
    for (int d = 0; d < s->ndim; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)s->d[d]));
    cJSON *v = cJSON_AddArrayToObject(t, "values");
    for (int64_t i = 0; i < ct_shape_numel(s); i++) {
        double x;
        if (!from_f32) x = value_at(dt, p, i);
        else if (dt == CT_F16) x = ct_f16_to_f32(ct_f32_to_f16(((const float *)p)[i]));
        else if (dt == CT_BF16) x = ct_bf16_to_f32(ct_f32_to_bf16(((const float *)p)[i]));
        else x = ((const float *)p)[i];
        char num[40]; /* 17 digits: cJSON's own printing may drop the last bit */
        snprintf(num, sizeof num, "%.17g", x);
        cJSON_AddItemToArray(v, cJSON_CreateRaw(num));
    }
}

static void random_bytes(void *p, size_t n, uint64_t seed) {
    ct_rng r;
    ct_rng_init(&r, seed, 5, 0);
    for (size_t i = 0; i < n; i++) ((uint8_t *)p)[i] = (uint8_t)ct_rng_u32(&r);
}

static int write_sample(const char *out, cJSON *exp) {
    enum { N = 8 };
    static const struct { const char *name; ct_dtype dt; int nd; int64_t d[2]; } spec[N] = {
        {"layer.weight", CT_F32, 2, {3, 4}}, {"h", CT_F16, 1, {5}},  {"b", CT_BF16, 2, {2, 3}},
        {"i32", CT_I32, 1, {4}},             {"i64", CT_I64, 1, {2}}, {"u8", CT_U8, 1, {6}},
        {"scalar", CT_F32, 0, {0}},          {"empty", CT_F32, 2, {0, 2}}};
    ct_st_entry e[N];
    float f[64];
    ct_rng r;
    ct_rng_init(&r, 9, 6, 0);
    for (int i = 0; i < 64; i++) f[i] = ct_rng_normal(&r) * 3.0f;
    uint8_t raw[N][64];
    cJSON *file = cJSON_AddObjectToObject(exp, "sample.safetensors");
    for (int i = 0; i < N; i++) {
        ct_shape s = ct_shape_make(spec[i].nd, spec[i].d);
        bool conv = spec[i].dt == CT_F32 || spec[i].dt == CT_F16 || spec[i].dt == CT_BF16;
        random_bytes(raw[i], sizeof raw[i], 100 + (uint64_t)i);
        e[i] = (ct_st_entry){.name = spec[i].name, .dtype = spec[i].dt, .shape = s};
        if (conv) e[i].from_f32 = f + 8 * i;
        else e[i].data = raw[i];
        expect(file, spec[i].name, spec[i].dt, &s, conv ? (const void *)(f + 8 * i) : raw[i], conv);
    }
    const char *mk[] = {"format", "who"}, *mv[] = {"pt", "ctrain e2e"};
    char path[1024];
    snprintf(path, sizeof path, "%s/sample.safetensors", out);
    ct_err err = {0};
    if (ct_st_write(path, e, N, mk, mv, 2, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    return 0;
}

static int write_checkpoint(const char *out, cJSON *exp) {
    float params[20], buffers[3], m[20], v[20];
    ct_rng r;
    ct_rng_init(&r, 10, 6, 0);
    for (int i = 0; i < 20; i++) {
        params[i] = ct_rng_normal(&r);
        m[i] = ct_rng_normal(&r);
        v[i] = ct_rng_uniform(&r);
    }
    for (int i = 0; i < 3; i++) buffers[i] = ct_rng_uniform(&r);
    ct_param_view views[3] = {{.name = "fc.weight", .offset = 0, .numel = 15, .trainable = true},
                              {.name = "fc.bias", .offset = 15, .numel = 5, .trainable = true},
                              {.name = "norm.running_var", .offset = 0, .numel = 3}};
    int64_t d0[] = {5, 3}, d1[] = {5}, d2[] = {3};
    views[0].shape = ct_shape_make(2, d0);
    views[1].shape = ct_shape_make(1, d1);
    views[2].shape = ct_shape_make(1, d2);
    ct_ckpt_tensors t = {.views = views, .n_views = 3, .params = params, .buffers = buffers,
                         .lo = 0, .hi = 20, .n_buffers = 3, .n_slots = 2,
                         .slot_name = {"exp_avg", "exp_avg_sq"}, .slot = {m, v},
                         .optimizer = "Adam"};
    ct_ckpt_state st;
    ct_ckpt_state_init(&st);
    st.step = 3;
    char save_dir[1024];
    snprintf(save_dir, sizeof save_dir, "%s/ckpt", out);
    ct_err err = {0};
    if (ct_ckpt_save(save_dir, &t, &st, NULL, NULL, NULL, 0, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    static const struct { const char *flag, *file; ct_dtype dt; } ex[] = {
        {"--dtype=bf16", "export_bf16.safetensors", CT_BF16},
        {"--dtype=fp16", "export_fp16.safetensors", CT_F16}};
    for (int k = 0; k < 2; k++) {
        char dst[1200];
        snprintf(dst, sizeof dst, "%s/%s", out, ex[k].file);
        char *argv[] = {"export", "--checkpoint", save_dir, "--out", dst, (char *)ex[k].flag, NULL};
        if (ct_export_main(6, argv, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        cJSON *file = cJSON_AddObjectToObject(exp, ex[k].file);
        for (int i = 0; i < 3; i++)
            expect(file, views[i].name, ex[k].dt, &views[i].shape,
                   (views[i].trainable ? params : buffers) + views[i].offset, true);
    }
    cJSON *model = cJSON_AddObjectToObject(exp, "ckpt/global_step3/model.safetensors");
    for (int i = 0; i < 3; i++)
        expect(model, views[i].name, CT_F32, &views[i].shape,
               (views[i].trainable ? params : buffers) + views[i].offset, true);
    cJSON *file = cJSON_AddObjectToObject(exp, "ckpt/global_step3/optimizer.safetensors");
    char name[1024];
    for (int i = 0; i < 2; i++) {
        snprintf(name, sizeof name, "%s.exp_avg", views[i].name);
        expect(file, name, CT_F32, &views[i].shape, m + views[i].offset, true);
        snprintf(name, sizeof name, "%s.exp_avg_sq", views[i].name);
        expect(file, name, CT_F32, &views[i].shape, v + views[i].offset, true);
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: write_st_sample OUT_DIR\n");
        return 2;
    }
    cJSON *exp = cJSON_CreateObject();
    int rc = write_sample(argv[1], exp) || write_checkpoint(argv[1], exp);
    char path[1024];
    snprintf(path, sizeof path, "%s/expected.json", argv[1]);
    char *text = cJSON_Print(exp);
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0) rc = 1;
    if (f) fclose(f);
    free(text);
    cJSON_Delete(exp);
    return rc;
}
