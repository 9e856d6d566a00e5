/* test_safetensors.c: writer/reader round trip, header layout, and every kind of corruption the
 * reader must reject as CT_ERR_DATA naming the file. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/util/rng.h"
#include "core/ckpt/safetensors.h"

static char tmpdir[256];

static void setup(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ct_test_st_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}
static void teardown(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    ck_assert_int_eq(system(cmd), 0);
}

static void fill_random(void *p, size_t n, uint64_t seed) {
    ct_rng r;
    ct_rng_init(&r, seed, 99, 0);
    for (size_t i = 0; i < n; i++) ((uint8_t *)p)[i] = (uint8_t)(ct_rng_u32(&r) >> 7);
}

static void fill_floats(float *p, size_t n, uint64_t seed) {
    ct_rng r;
    ct_rng_init(&r, seed, 98, 0);
    for (size_t i = 0; i < n; i++) p[i] = (ct_rng_uniform(&r) - 0.5f) * 7.0f;
}

typedef struct sample {
    const char *name;
    ct_dtype dt;
    int ndim;
    int64_t d[3];
} sample;

static const sample samples[] = {
    {"a.weight", CT_F32, 2, {3, 4}}, {"b.half", CT_F16, 1, {5}},    {"c.bf", CT_BF16, 3, {2, 2, 2}},
    {"d.int", CT_I32, 1, {7}},       {"e.long", CT_I64, 1, {3}},    {"f.bytes", CT_U8, 1, {9}},
    {"g.u16", CT_U16, 2, {2, 2}},    {"h.scalar", CT_F32, 0, {0}},  {"i.empty", CT_F32, 2, {0, 3}},
    {"j\"quote\\name", CT_U8, 1, {1}},
};
#define NS ((int)(sizeof samples / sizeof samples[0]))

START_TEST(roundtrip_dtypes_shapes_and_layout) {
    ct_st_entry e[NS];
    void *data[NS];
    for (int i = 0; i < NS; i++) {
        ct_shape s = ct_shape_make(samples[i].ndim, samples[i].d);
        size_t bytes = (size_t)ct_shape_numel(&s) * ct_dtype_size(samples[i].dt);
        data[i] = malloc(bytes + 1);
        fill_random(data[i], bytes, 100 + (uint64_t)i);
        e[i] = (ct_st_entry){.name = samples[i].name, .dtype = samples[i].dt, .shape = s,
                             .data = data[i]};
    }
    const char *mk[] = {"format", "note"}, *mv[] = {"pt", "line\nbreak \"q\""};
    char path[512];
    snprintf(path, sizeof path, "%s/x.safetensors", tmpdir);
    ct_err err = {0};
    ck_assert_int_eq(ct_st_write(path, e, NS, mk, mv, 2, &err), CT_OK);

    ct_st_file *f = ct_st_open(path, &err);
    ck_assert_msg(f != NULL, "%s", err.msg);
    ck_assert_int_eq(f->n_tensors, NS);
    ck_assert_int_eq((int)(f->header_len % 8), 0);         /* buffer 8-byte aligned */
    ck_assert_str_eq(ct_st_meta(f, "format"), "pt");
    ck_assert_str_eq(ct_st_meta(f, "note"), "line\nbreak \"q\"");
    for (int i = 0; i < NS; i++) {
        const ct_st_tensor *t = ct_st_find(f, samples[i].name);
        ck_assert_ptr_nonnull(t);
        ck_assert_int_eq(t->ct_dtype, samples[i].dt);
        ck_assert(ct_shape_eq(&t->shape, &e[i].shape));
        size_t bytes = (size_t)ct_shape_numel(&e[i].shape) * ct_dtype_size(samples[i].dt);
        ck_assert_uint_eq(t->end - t->begin, bytes);
        ck_assert_int_eq((int)(t->begin % ct_dtype_size(samples[i].dt)), 0); /* natural alignment */
        ck_assert_int_eq(memcmp(t->data, data[i], bytes), 0);
    }
    /* header text: starts with {"__metadata__", the 8-byte tensors come first */
    FILE *fp = fopen(path, "rb");
    char head[64] = {0};
    ck_assert_int_eq((int)fread(head, 1, 40, fp), 40);
    fclose(fp);
    ck_assert_int_eq(strncmp(head + 8, "{\"__metadata__\":", 16), 0);
    ck_assert_uint_eq(ct_st_find(f, "e.long")->begin, 0);
    ct_st_close(f);
    for (int i = 0; i < NS; i++) free(data[i]);
}
END_TEST

START_TEST(fp32_converted_to_f16_and_bf16) {
    float src[1000];
    fill_floats(src, 1000, 5);
    src[0] = 70000.0f; /* overflows f16 */
    src[1] = 1e-6f;    /* f16 subnormal */
    int64_t d[] = {10, 100};
    ct_st_entry e[] = {{.name = "h", .dtype = CT_F16, .shape = ct_shape_make(2, d), .from_f32 = src},
                       {.name = "b", .dtype = CT_BF16, .shape = ct_shape_make(2, d), .from_f32 = src},
                       {.name = "f", .dtype = CT_F32, .shape = ct_shape_make(2, d), .from_f32 = src}};
    char path[512];
    snprintf(path, sizeof path, "%s/c.safetensors", tmpdir);
    ct_err err = {0};
    ck_assert_int_eq(ct_st_write(path, e, 3, NULL, NULL, 0, &err), CT_OK);
    ct_st_file *f = ct_st_open(path, &err);
    ck_assert_ptr_nonnull(f);
    float back[1000];
    ck_assert(ct_st_read_f32(ct_st_find(f, "h"), back, 1000));
    for (int i = 0; i < 1000; i++) ck_assert(back[i] == ct_f16_to_f32(ct_f32_to_f16(src[i])));
    ck_assert(isinf(back[0]));
    ck_assert(ct_st_read_f32(ct_st_find(f, "b"), back, 1000));
    for (int i = 0; i < 1000; i++) ck_assert(back[i] == ct_bf16_to_f32(ct_f32_to_bf16(src[i])));
    ck_assert(ct_st_read_f32(ct_st_find(f, "f"), back, 1000));
    ck_assert_int_eq(memcmp(back, src, sizeof src), 0);
    ck_assert(!ct_st_read_f32(ct_st_find(f, "f"), back, 999));
    ct_st_close(f);
    /* duplicate names are refused by the writer */
    e[1].name = "h";
    ck_assert_int_eq(ct_st_write(path, e, 2, NULL, NULL, 0, &err), CT_ERR_CONFIG);
}
END_TEST

/* A buffer: 8-byte length, header text as given (unpadded), then data_len random bytes. */
static uint8_t *make_buf(const char *header, uint64_t hlen_field, size_t data_len, size_t *len) {
    size_t h = strlen(header);
    *len = 8 + h + data_len;
    uint8_t *b = malloc(*len + 1);
    memcpy(b, &hlen_field, 8);
    memcpy(b + 8, header, h);
    fill_random(b + 8 + h, data_len, 7);
    return b;
}

static void expect_bad(const char *header, size_t data_len, const char *what) {
    size_t len;
    uint8_t *b = make_buf(header, strlen(header), data_len, &len);
    ct_err err = {0};
    ct_st_file *f = ct_st_parse(b, len, "bad.safetensors", &err);
    ck_assert_msg(f == NULL, "accepted: %s", header);
    ck_assert_int_eq(err.code, CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "bad.safetensors") == err.msg, "%s", err.msg);
    ck_assert_msg(strstr(err.msg, what) != NULL, "expected \"%s\" in: %s", what, err.msg);
    free(b);
}

START_TEST(unpadded_header_accepted) {
    size_t len;
    const char *h = "{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    uint8_t *b = make_buf(h, strlen(h), 8, &len);
    ct_err err = {0};
    ct_st_file *f = ct_st_parse(b, len, "ok", &err);
    ck_assert_msg(f != NULL, "%s", err.msg);
    float v[2];
    ck_assert(ct_st_read_f32(ct_st_find(f, "x"), v, 2)); /* unaligned data is fine */
    ck_assert_int_eq(memcmp(v, b + 8 + strlen(h), 8), 0);
    ct_st_close(f);
    free(b);
}
END_TEST

START_TEST(corrupt_headers_rejected) {
    const char *ok_t = "\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}";
    char h[512];
    expect_bad("{\"x\": garbage", 8, "not valid JSON");
    expect_bad("[1, 2]", 0, "does not start with '{'");
    expect_bad(" {}", 0, "does not start with '{'");
    expect_bad("{\"x\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "unknown dtype");
    expect_bad("{\"x\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "no dtype");
    expect_bad("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,16]}}", 8, "need 8 bytes");
    expect_bad("{\"x\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "need 12 bytes");
    expect_bad("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "truncated");
    expect_bad("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12, "ends at 8");
    expect_bad("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16, "leave a gap");
    expect_bad("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"y\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "overlap");
    expect_bad("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8, "end before begin");
    expect_bad("{\"x\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "shape[0]");
    expect_bad("{\"x\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,8]}}", 8, "shape[0]");
    expect_bad("{\"x\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
               "\"data_offsets\":[0,8]}}", 8, "overflow");
    expect_bad("{\"x\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4,
               "dimensions");
    expect_bad("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8, "data_offsets");
    expect_bad("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,1e300]}}", 8, "data_offsets");
    expect_bad("{\"x\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,1]}}", 1, "whole bytes");
    expect_bad("{\"x\":5}", 0, "not an object");
    snprintf(h, sizeof h, "{%s,%s}", ok_t, ok_t);
    expect_bad(h, 8, "twice");
    snprintf(h, sizeof h, "{\"__metadata__\":{\"a\":1},%s}", ok_t);
    expect_bad(h, 8, "not a string");
    snprintf(h, sizeof h, "{\"__metadata__\":[],%s}", ok_t);
    expect_bad(h, 8, "__metadata__ is not an object");
    snprintf(h, sizeof h, "{%s} x", ok_t);
    expect_bad(h, 8, "after its JSON");
    snprintf(h, sizeof h, "{\"\xff\":1}");
    expect_bad(h, 0, "UTF-8");
}
END_TEST

START_TEST(bad_lengths_and_files_rejected) {
    ct_err err = {0};
    uint8_t small[5] = {1, 2, 3, 4, 5};
    ck_assert_ptr_null(ct_st_parse(small, 5, "tiny", &err));
    ck_assert_int_eq(err.code, CT_ERR_DATA);
    ck_assert_ptr_nonnull(strstr(err.msg, "shorter than"));
    size_t len;
    uint8_t *b = make_buf("{}", 1000, 0, &len);
    ck_assert_ptr_null(ct_st_parse(b, len, "long", &err));
    ck_assert_ptr_nonnull(strstr(err.msg, "exceeds the 2 bytes"));
    free(b);
    b = make_buf("{}", 200000000, 0, &len);
    ck_assert_ptr_null(ct_st_parse(b, len, "huge", &err));
    ck_assert_ptr_nonnull(strstr(err.msg, "exceeds the limit"));
    free(b);
    b = make_buf("{}", UINT64_MAX, 0, &len);
    ck_assert_ptr_null(ct_st_parse(b, len, "max", &err));
    free(b);

    /* a real file truncated on disk: the message names the path */
    float v[64];
    fill_floats(v, 64, 3);
    int64_t d[] = {8, 8};
    ct_st_entry e = {.name = "w", .dtype = CT_F32, .shape = ct_shape_make(2, d), .data = v};
    char path[512];
    snprintf(path, sizeof path, "%s/t.safetensors", tmpdir);
    ck_assert_int_eq(ct_st_write(path, &e, 1, NULL, NULL, 0, &err), CT_OK);
    ck_assert_int_eq(truncate(path, 100), 0);
    ck_assert_ptr_null(ct_st_open(path, &err));
    ck_assert_int_eq(err.code, CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, path) && strstr(err.msg, "truncated"), "%s", err.msg);
    ck_assert_int_eq(truncate(path, 0), 0);
    ck_assert_ptr_null(ct_st_open(path, &err));
    ck_assert_ptr_nonnull(strstr(err.msg, path));
    snprintf(path, sizeof path, "%s/missing.safetensors", tmpdir);
    ck_assert_ptr_null(ct_st_open(path, &err));
    ck_assert_int_eq(err.code, CT_ERR_DATA);
    ck_assert_ptr_nonnull(strstr(err.msg, "missing.safetensors"));
    ck_assert_ptr_null(ct_st_open(tmpdir, &err)); /* a directory */
}
END_TEST

/* Every single-byte change and every truncation of a valid file: no crash, and either a valid
 * parse or CT_ERR_DATA naming the file. */
START_TEST(every_mutation_is_safe) {
    float v[6];
    fill_floats(v, 6, 11);
    int64_t d[] = {2, 3};
    ct_st_entry e[] = {{.name = "p", .dtype = CT_F32, .shape = ct_shape_make(2, d), .data = v},
                       {.name = "q", .dtype = CT_BF16, .shape = ct_shape_make(1, d), .from_f32 = v}};
    char path[512];
    snprintf(path, sizeof path, "%s/m.safetensors", tmpdir);
    ct_err err = {0};
    ck_assert_int_eq(ct_st_write(path, e, 2, NULL, NULL, 0, &err), CT_OK);
    FILE *fp = fopen(path, "rb");
    uint8_t buf[1024];
    size_t n = fread(buf, 1, sizeof buf, fp);
    fclose(fp);
    int rejected = 0;
    for (size_t cut = 0; cut < n; cut++) {
        ct_st_file *f = ct_st_parse(buf, cut, "m", &err);
        ck_assert_ptr_null(f);
        ck_assert_int_eq(err.code, CT_ERR_DATA);
    }
    for (size_t i = 0; i < n; i++) {
        uint8_t save = buf[i];
        static const uint8_t subs[] = {0x00, 0x7b, 0x5b, 0x22, 0x31, 0xff, 0x20};
        for (int k = 0; k < (int)sizeof subs; k++) {
            buf[i] = subs[k];
            ct_st_file *f = ct_st_parse(buf, n, "m", &err);
            if (!f) {
                ck_assert_int_eq(err.code, CT_ERR_DATA);
                ck_assert(strncmp(err.msg, "m: ", 3) == 0);
                rejected++;
            }
            ct_st_close(f);
        }
        buf[i] = save;
    }
    ck_assert_int_gt(rejected, 100);
}
END_TEST

int main(void) {
    Suite *s = suite_create("safetensors");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, roundtrip_dtypes_shapes_and_layout);
    tcase_add_test(tc, fp32_converted_to_f16_and_bf16);
    tcase_add_test(tc, unpadded_header_accepted);
    tcase_add_test(tc, corrupt_headers_rejected);
    tcase_add_test(tc, bad_lengths_and_files_rejected);
    tcase_add_test(tc, every_mutation_is_safe);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
