/* ref_file.h: reading the PyTorch reference files of test/ref/ (the "CTRF" format written by
 * test/ref/gen_layer_refs.py: a JSON description of the case, then named float arrays) and
 * comparing against them. Shared by the Check tests that use PyTorch values. */
#ifndef CT_TEST_REF_FILE_H
#define CT_TEST_REF_FILE_H

#include <check.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util/tensor.h"

typedef struct {
    char name[32];
    ct_shape shape;
    float *data;
} ref_array;

typedef struct {
    cJSON *meta;
    ref_array a[64];        /* gpt_small: 3 + 2 per parameter tensor */
    int n;
} ref_file;

static inline bool rd(FILE *f, void *p, size_t n) { return fread(p, 1, n, f) == n; }

static inline void ref_load(ref_file *rf, const char *path) {
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f, "cannot open %s (run tests from the repo root)", path);
    char magic[4];
    uint32_t ver, len, n;
    ck_assert(rd(f, magic, 4) && memcmp(magic, "CTRF", 4) == 0 && rd(f, &ver, 4) && ver == 1 && rd(f, &len, 4));
    char *js = calloc(len + 1, 1);
    ck_assert(rd(f, js, len));
    rf->meta = cJSON_Parse(js);
    free(js);
    ck_assert(rf->meta && rd(f, &n, 4) && n <= CT_ARRAY_LEN(rf->a));
    rf->n = (int)n;
    for (uint32_t i = 0; i < n; i++) {
        ref_array *a = &rf->a[i];
        uint32_t nl, nd;
        ck_assert(rd(f, &nl, 4) && nl < sizeof a->name && rd(f, a->name, nl));
        a->name[nl] = 0;
        ck_assert(rd(f, &nd, 4) && nd <= CT_MAX_DIMS);
        a->shape.ndim = (int)nd;
        for (uint32_t d = 0; d < nd; d++) {
            int32_t v;
            ck_assert(rd(f, &v, 4));
            a->shape.d[d] = v;
        }
        size_t k = (size_t)ct_shape_numel(&a->shape);
        a->data = malloc(k * sizeof(float) + 4);
        ck_assert(rd(f, a->data, k * sizeof(float)));
    }
    fclose(f);
}

static inline const ref_array *ref_get(const ref_file *rf, const char *name) {
    for (int i = 0; i < rf->n; i++)
        if (strcmp(rf->a[i].name, name) == 0) return &rf->a[i];
    return NULL;
}

static inline void ref_free(ref_file *rf) {
    for (int i = 0; i < rf->n; i++) free(rf->a[i].data);
    cJSON_Delete(rf->meta);
}

/* |got - want| <= atol + rtol |want| elementwise. */
static inline void ref_compare(const char *file, const char *what, const float *got, const ref_array *want, double tol) {
    ck_assert_msg(want, "%s: no array %s", file, what);
    int64_t k = ct_shape_numel(&want->shape);
    for (int64_t i = 0; i < k; i++)
        ck_assert_msg(fabs(got[i] - want->data[i]) <= tol * (1.0 + fabs(want->data[i])),
                      "%s: %s[%lld]: got %.7g, PyTorch %.7g", file, what, (long long)i, got[i], want->data[i]);
}

#endif
