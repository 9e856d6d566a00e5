/* test_layers.c: every layer type and loss, four ways.
 *  1. Finite differences: on random shapes and random non-zero inputs, the analytic input and
 *     parameter gradients of L = sum(y * r) (r random, accumulated in double) match central
 *     differences of the fp32 forward.
 *  2. fp64 references written here (linear, conv2d, batchnorm2d, layernorm, the three losses):
 *     forward and backward computed directly in double.
 *  3. PyTorch values from the .bin files in test/ref/layers/ (test/ref/gen_layer_refs.py).
 *  4. 16-bit storage: every type run with fp16 and bf16 activations and parameters against the
 *     same layer in fp32 fed the widened values (half_cases).
 * Layers are driven through the Layer seam (core/graph/layer.h) on the CPU backend. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu/cpu.h"
#include "core/graph/graph.h"
#include "core/graph/layer.h"
#include "test/ref_file.h"
#include "core/util/fs.h"
#include "core/util/rng.h"

/* ---------------------------------------------------------------- harness ---- */

typedef struct {
    ct_backend *be;
    cJSON *node;
    ct_layer l;
    ct_param_spec specs[CT_LAYER_MAX_PARAMS];
    int n_specs;
    int64_t n;                                  /* batch */
    float *x[CT_LAYER_MAX_IN], *dx[CT_LAYER_MAX_IN], *y, *dy;
    float *p[CT_LAYER_MAX_PARAMS], *dp[CT_LAYER_MAX_PARAMS];
    int32_t *ids;
    void *aux, *ws;
    bool train;
    ct_rng rng;
} harness;

static float rand_nonzero(ct_rng *r, float lo, float hi) {   /* |v| in [lo, hi], random sign */
    float v = lo + (hi - lo) * ct_rng_uniform(r);
    return ct_rng_u32(r) & 1 ? v : -v;
}

/* Build one layer from JSON with the given per-sample input shapes; random inputs and params. */
static void h_setup(harness *h, const char *json, int n_in, const ct_shape *in, ct_dtype dt, int64_t n,
                    uint64_t seed) {
    memset(h, 0, sizeof *h);
    h->be = ct_cpu_backend_create(1);
    h->node = cJSON_Parse(json);
    ck_assert_msg(h->node, "bad JSON %s", json);
    ct_rng_init(&h->rng, seed, CT_RNG_AUGMENT, 1);
    ct_layer *l = &h->l;
    const cJSON *t = cJSON_GetObjectItem(h->node, "type");
    l->type = ct_layer_type_find(t->valuestring);
    ck_assert_msg(l->type, "no layer type %s", t->valuestring);
    snprintf(l->name, sizeof l->name, "t");
    snprintf(l->path, sizeof l->path, "model.layers[0]");
    l->node = h->node;
    l->cfg_data = calloc(1, l->type->cfg_size + 1);
    l->n_in = n_in;
    l->in_dtype = dt;
    for (int i = 0; i < n_in; i++) {
        l->in[i] = in[i];
        l->in_from[i] = i;                      /* pretend inputs come from layers: dx wanted */
        snprintf(l->in_name[i], sizeof l->in_name[i], "\"x%d\"", i);
    }
    ct_err err;
    ck_assert_msg(l->type->parse(l, &err) == CT_OK, "%s", err.msg);
    ck_assert_msg(l->type->infer(l, &err) == CT_OK, "%s", err.msg);
    h->n = n;
    h->n_specs = l->type->params ? l->type->params(l, h->specs) : 0;
    for (int i = 0; i < n_in; i++) {
        int64_t k = n * ct_layer_in_numel(l, i);
        h->x[i] = malloc(sizeof(float) * (size_t)k);
        h->dx[i] = malloc(sizeof(float) * (size_t)k);
        for (int64_t j = 0; j < k; j++) h->x[i][j] = rand_nonzero(&h->rng, 0.1f, 1.5f);
    }
    if (dt == CT_I32) {
        int64_t k = n * ct_layer_in_numel(l, 0);
        h->ids = malloc(sizeof(int32_t) * (size_t)k);
        for (int64_t j = 0; j < k; j++) h->ids[j] = (int32_t)ct_rng_below(&h->rng, (uint32_t)h->specs[0].shape.d[0]);
    }
    int64_t ny = n * ct_layer_out_numel(l);
    h->y = malloc(sizeof(float) * (size_t)ny);
    h->dy = malloc(sizeof(float) * (size_t)ny);
    for (int64_t j = 0; j < ny; j++) h->dy[j] = rand_nonzero(&h->rng, 0.1f, 1.0f);
    for (int s = 0; s < h->n_specs; s++) {
        int64_t k = ct_shape_numel(&h->specs[s].shape);
        h->p[s] = malloc(sizeof(float) * (size_t)k);
        h->dp[s] = h->specs[s].trainable ? calloc((size_t)k, sizeof(float)) : NULL;
        for (int64_t j = 0; j < k; j++)   /* buffers (running var) must stay positive */
            h->p[s][j] = h->specs[s].trainable ? rand_nonzero(&h->rng, 0.1f, 1.0f)
                                               : 0.5f + ct_rng_uniform(&h->rng);
    }
    size_t aux = l->type->aux_bytes ? l->type->aux_bytes(l, n, CT_F32) : 0;
    size_t ws = l->type->workspace_bytes ? l->type->workspace_bytes(l, n, CT_F32) : 0;
    h->aux = malloc(aux + 64);
    h->ws = malloc(ws + 64);
    h->train = true;
}

static void h_free(harness *h) {
    for (int i = 0; i < h->l.n_in; i++) free(h->x[i]), free(h->dx[i]);
    for (int s = 0; s < h->n_specs; s++) free(h->p[s]), free(h->dp[s]);
    free(h->y), free(h->dy), free(h->ids), free(h->aux), free(h->ws), free(h->l.cfg_data);
    cJSON_Delete(h->node);
    ct_backend_destroy(h->be);
}

static ct_layer_io h_io(harness *h) {
    ct_layer_io io = {.be = h->be, .n = h->n, .dt = CT_F32, .y = h->y, .dy = h->dy, .aux = h->aux, .ws = h->ws,
                      .train = h->train, .seed = 11, .stream = 5, .ids = h->ids};
    for (int i = 0; i < h->l.n_in; i++) io.x[i] = h->x[i], io.dx[i] = h->dx[i];
    for (int s = 0; s < h->n_specs; s++) io.p[s] = h->p[s], io.dp[s] = h->dp[s];
    return io;
}

static void h_forward(harness *h) {
    ct_layer_io io = h_io(h);
    h->l.type->forward(&h->l, &io);
}

static void h_backward(harness *h) {
    ct_layer_io io = h_io(h);
    h->l.type->backward(&h->l, &io);
}

/* L = sum(y * dy) in double: its gradient w.r.t. y is dy. */
static double h_objective(harness *h) {
    h_forward(h);
    double s = 0;
    int64_t ny = h->n * ct_layer_out_numel(&h->l);
    for (int64_t j = 0; j < ny; j++) s += (double)h->y[j] * h->dy[j];
    return s;
}

/* Relative error ||fd - analytic|| / ||fd|| over up to `samples` coordinates of v. */
static double fd_error(harness *h, float *v, const float *grad, int64_t k, double eps, int samples) {
    double num = 0, den = 0;
    int64_t step = k / samples + 1;
    for (int64_t j = ct_rng_below(&h->rng, (uint32_t)step); j < k; j += step) {
        float keep = v[j];
        v[j] = keep + (float)eps;
        double lp = h_objective(h);
        v[j] = keep - (float)eps;
        double lm = h_objective(h);
        v[j] = keep;
        double fd = (lp - lm) / (2.0 * eps);
        num += (fd - grad[j]) * (fd - grad[j]);
        den += fd * fd;
    }
    return den > 0 ? sqrt(num / den) : (num > 0 ? 1.0 : 0.0);
}

/* Central differences against backward for every input and parameter of one configuration. */
static void fd_check(const char *json, int n_in, const ct_shape *in, ct_dtype dt, int64_t n, uint64_t seed,
                     bool train, double eps, double tol) {
    harness h;
    h_setup(&h, json, n_in, in, dt, n, seed);
    h.train = train;
    h_forward(&h);
    h_backward(&h);
    /* copies: the objective re-runs forward, which may overwrite saved state but not these */
    float *dx[CT_LAYER_MAX_IN] = {0}, *dp[CT_LAYER_MAX_PARAMS] = {0};
    for (int i = 0; i < n_in && dt != CT_I32; i++) {
        size_t k = (size_t)(n * ct_layer_in_numel(&h.l, i));
        dx[i] = malloc(k * sizeof(float));
        memcpy(dx[i], h.dx[i], k * sizeof(float));
    }
    for (int s = 0; s < h.n_specs; s++)
        if (h.dp[s]) {
            size_t k = (size_t)ct_shape_numel(&h.specs[s].shape);
            dp[s] = malloc(k * sizeof(float));
            memcpy(dp[s], h.dp[s], k * sizeof(float));
        }
    for (int i = 0; i < n_in && dt != CT_I32; i++) {
        double e = fd_error(&h, h.x[i], dx[i], n * ct_layer_in_numel(&h.l, i), eps, 60);
        ck_assert_msg(e < tol, "%s: input %d gradient relative error %.3g >= %.3g", json, i, e, tol);
    }
    for (int s = 0; s < h.n_specs; s++)
        if (dp[s]) {
            double e = fd_error(&h, h.p[s], dp[s], ct_shape_numel(&h.specs[s].shape), eps, 60);
            ck_assert_msg(e < tol, "%s: %s gradient relative error %.3g >= %.3g", json, h.specs[s].suffix,
                          e, tol);
        }
    for (int i = 0; i < CT_LAYER_MAX_IN; i++) free(dx[i]);
    for (int s = 0; s < CT_LAYER_MAX_PARAMS; s++) free(dp[s]);
    h_free(&h);
}

/* ------------------------------------------------ finite differences, random shapes ---- */

static int64_t rnd(ct_rng *r, int lo, int hi) { return lo + (int64_t)ct_rng_below(r, (uint32_t)(hi - lo + 1)); }
#define SHAPE(...) ((ct_shape){CT_ARRAY_LEN(((int64_t[]){__VA_ARGS__})), {__VA_ARGS__}})

/* Three random configurations of each type; eps and tolerance chosen for fp32 forward passes. */
START_TEST(fd_every_layer) {
    ct_rng r;
    ct_rng_init(&r, 2024, CT_RNG_AUGMENT, 0);
    char js[512];
    for (int rep = 0; rep < 3; rep++) {
        uint64_t seed = 100 + (uint64_t)rep;
        int64_t n = rnd(&r, 1, 3), c = rnd(&r, 1, 4), hh = rnd(&r, 3, 7), ww = rnd(&r, 3, 7);
        int64_t f = rnd(&r, 2, 9), o = rnd(&r, 1, 6);
        ct_shape img = SHAPE(c, hh, ww), vec = SHAPE(f), seq = SHAPE(rnd(&r, 1, 3), f);

        snprintf(js, sizeof js, "{\"type\":\"linear\",\"out\":%lld,\"bias\":%s}", (long long)o, rep == 1 ? "false" : "true");
        fd_check(js, 1, rep == 2 ? &seq : &vec, CT_F32, n, seed, true, 1e-2, 5e-3);

        int64_t g = rep == 2 ? 2 : 1, cg = c * g, oc = o * g, k = rnd(&r, 1, 3);
        ct_shape gimg = SHAPE(cg, hh, ww);
        snprintf(js, sizeof js, "{\"type\":\"conv2d\",\"out\":%lld,\"kernel\":[%lld,%lld],\"stride\":%lld,"
                 "\"padding\":%lld,\"dilation\":%lld,\"groups\":%lld}", (long long)oc, (long long)k,
                 (long long)rnd(&r, 1, 2), (long long)rnd(&r, 1, 2), (long long)rnd(&r, 0, 1),
                 (long long)(rep == 1 ? 2 : 1), (long long)g);
        fd_check(js, 1, &gimg, CT_F32, n, seed, true, 1e-2, 5e-3);

        snprintf(js, sizeof js, "{\"type\":\"maxpool2d\",\"kernel\":%d,\"stride\":%d,\"padding\":%d}",
                 2 + rep % 2, 1 + rep % 2, rep == 2 ? 1 : 0);
        fd_check(js, 1, &img, CT_F32, n, seed, true, 1e-3, 5e-3);
        snprintf(js, sizeof js, "{\"type\":\"avgpool2d\",\"kernel\":%d,\"stride\":%d,\"padding\":1,"
                 "\"count_include_pad\":%s}", 2 + rep % 2, 1 + rep % 2, rep == 1 ? "false" : "true");
        fd_check(js, 1, &img, CT_F32, n, seed, true, 1e-2, 5e-3);
        fd_check("{\"type\":\"global_avgpool\"}", 1, &img, CT_F32, n, seed, true, 1e-2, 5e-3);

        /* batchnorm in train mode needs >= 2 values per channel; eval mode uses running stats */
        fd_check("{\"type\":\"batchnorm2d\"}", 1, &img, CT_F32, n + 1, seed, true, 1e-2, 2e-2);
        fd_check("{\"type\":\"layernorm\"}", 1, rep == 2 ? &seq : &vec, CT_F32, n, seed, true, 1e-2, 2e-2);
        fd_check("{\"type\":\"dropout\",\"p\":0.4}", 1, &img, CT_F32, n, seed, true, 1e-2, 5e-3);

        static const char *const acts[] = {
            "{\"type\":\"relu\"}", "{\"type\":\"leaky_relu\",\"negative_slope\":0.1}", "{\"type\":\"gelu\"}",
            "{\"type\":\"gelu\",\"approximate\":\"tanh\"}", "{\"type\":\"silu\"}", "{\"type\":\"tanh\"}",
            "{\"type\":\"sigmoid\"}"};
        for (int a = 0; a < CT_ARRAY_LEN(acts); a++) fd_check(acts[a], 1, &img, CT_F32, n, seed, true, 1e-2, 5e-3);

        fd_check("{\"type\":\"flatten\"}", 1, &img, CT_F32, n, seed, true, 1e-2, 5e-3);
        fd_check("{\"type\":\"reshape\",\"shape\":[-1, 1]}", 1, &img, CT_F32, n, seed, true, 1e-2, 5e-3);
        ct_shape three[3] = {img, img, img};
        fd_check("{\"type\":\"add\"}", 2 + rep % 2, three, CT_F32, n, seed, true, 1e-2, 5e-3);
        ct_shape cat[2] = {img, SHAPE(c + 1, hh, ww)};
        fd_check("{\"type\":\"concat\"}", 2, cat, CT_F32, n, seed, true, 1e-2, 5e-3);
        ct_shape cat_last[2] = {SHAPE(2, 3), SHAPE(2, f)};
        fd_check("{\"type\":\"concat\",\"axis\":-1}", 2, cat_last, CT_F32, n, seed, true, 1e-2, 5e-3);

        snprintf(js, sizeof js, "{\"type\":\"embedding\",\"vocab\":%lld,\"dim\":%lld}", (long long)rnd(&r, 2, 9), (long long)f);
        ct_shape tok = SHAPE(rnd(&r, 1, 5));
        fd_check(js, 1, &tok, CT_I32, n, seed, true, 1e-2, 5e-3);

        /* max_len > T on reps 1, 2: table rows past T must get exactly no gradient */
        snprintf(js, sizeof js, "{\"type\":\"position_embedding\",\"max_len\":%lld}",
                 (long long)(seq.d[0] + rep));
        fd_check(js, 1, &seq, CT_F32, n, seed, true, 1e-2, 5e-3);

        /* causal attention over a fused qkv of 2 heads of 3 (T from 1), with and without dropout */
        ct_shape qkv = SHAPE(rnd(&r, 1, 6), 18);
        fd_check("{\"type\":\"causal_self_attention\",\"heads\":2}", 1, &qkv, CT_F32, n, seed, true, 1e-2, 5e-3);
        fd_check("{\"type\":\"causal_self_attention\",\"heads\":3,\"dropout\":0.3}", 1, &qkv, CT_F32, n, seed,
                 true, 1e-2, 5e-3);

        /* Llama's parts: rmsnorm; swiglu over [gate | up]; attention with rotary positions and
         * grouped kv heads (2 of 4, then multi-query 1 of 3), plain, with linear scaling and
         * with dynamic scaling past max_position_embeddings */
        fd_check("{\"type\":\"rmsnorm\"}", 1, rep == 2 ? &seq : &vec, CT_F32, n, seed, true, 1e-2, 2e-2);
        ct_shape gate_up = SHAPE(rnd(&r, 1, 3), 2 * f);
        fd_check("{\"type\":\"swiglu\"}", 1, &gate_up, CT_F32, n, seed, true, 1e-2, 5e-3);
        ct_shape gqa = SHAPE(rnd(&r, 1, 6), (4 + 2 * 2) * 4), mqa = SHAPE(rnd(&r, 2, 6), (3 + 2) * 6);
        fd_check("{\"type\":\"causal_self_attention\",\"heads\":4,\"kv_heads\":2,\"rope_theta\":10000}", 1,
                 &gqa, CT_F32, n, seed, true, 1e-2, 5e-3);
        fd_check("{\"type\":\"causal_self_attention\",\"heads\":3,\"kv_heads\":1,\"rope_theta\":100,"
                 "\"rope_scaling\":{\"type\":\"linear\",\"factor\":2}}", 1, &mqa, CT_F32, n, seed, true, 1e-2, 5e-3);
        fd_check("{\"type\":\"causal_self_attention\",\"heads\":3,\"kv_heads\":1,\"rope_theta\":100,"
                 "\"rope_scaling\":{\"type\":\"dynamic\",\"factor\":2,\"max_position_embeddings\":1}}", 1, &mqa,
                 CT_F32, n, seed, true, 1e-2, 5e-3);
    }
}
END_TEST

/* A test that can fail: a wrong gradient is caught by the check above. */
START_TEST(fd_catches_wrong_gradient) {
    harness h;
    ct_shape in = SHAPE(5);
    h_setup(&h, "{\"type\":\"tanh\"}", 1, &in, CT_F32, 2, 9);
    h_forward(&h);
    h_backward(&h);
    float bad[10];
    for (int i = 0; i < 10; i++) bad[i] = 1.1f * h.dx[0][i];
    ck_assert(fd_error(&h, h.x[0], bad, 10, 1e-2, 10) > 0.05);
    ck_assert(fd_error(&h, h.x[0], h.dx[0], 10, 1e-2, 10) < 5e-3);
    h_free(&h);
}
END_TEST

/* Dropout: mask statistics in train mode, identity in eval mode, same mask for the same stream. */
START_TEST(dropout_modes) {
    harness h;
    ct_shape in = SHAPE(1000);
    h_setup(&h, "{\"type\":\"dropout\",\"p\":0.3}", 1, &in, CT_F32, 4, 3);
    h_forward(&h);
    int zeros = 0;
    for (int i = 0; i < 4000; i++) {
        if (h.y[i] == 0) zeros++;
        else ck_assert_float_eq_tol(h.y[i], h.x[0][i] / 0.7f, 1e-6f);
    }
    ck_assert_msg(zeros > 1050 && zeros < 1350, "dropped %d of 4000 at p 0.3", zeros);
    h.train = false;
    h_forward(&h);
    for (int i = 0; i < 4000; i++) ck_assert_float_eq(h.y[i], h.x[0][i]);
    h_free(&h);
}
END_TEST

/* ---------------------------------------------------------------- fp64 references ---- */

static void close_enough(const char *what, const float *got, const double *want, int64_t k, double tol) {
    for (int64_t i = 0; i < k; i++)
        ck_assert_msg(fabs(got[i] - want[i]) <= tol * (1.0 + fabs(want[i])), "%s[%lld]: got %.8g want %.8g",
                      what, (long long)i, got[i], want[i]);
}

START_TEST(fp64_linear) {
    harness h;
    ct_shape in = SHAPE(2, 7);
    h_setup(&h, "{\"type\":\"linear\",\"out\":5}", 1, &in, CT_F32, 3, 21);
    h_forward(&h);
    h_backward(&h);
    int64_t rows = 6, k = 7, m = 5;
    double y[30], dx[42] = {0}, dw[35] = {0}, db[5] = {0};
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < m; j++) {
            double s = h.p[1][j];
            for (int64_t i = 0; i < k; i++) s += (double)h.x[0][r * k + i] * h.p[0][j * k + i];
            y[r * m + j] = s;
            double g = h.dy[r * m + j];
            db[j] += g;
            for (int64_t i = 0; i < k; i++) {
                dx[r * k + i] += g * h.p[0][j * k + i];
                dw[j * k + i] += g * h.x[0][r * k + i];
            }
        }
    close_enough("y", h.y, y, 30, 1e-5);
    close_enough("dx", h.dx[0], dx, 42, 1e-5);
    close_enough("dW", h.dp[0], dw, 35, 1e-5);
    close_enough("db", h.dp[1], db, 5, 1e-5);
    h_free(&h);
}
END_TEST

START_TEST(fp64_conv2d) {
    harness h;
    const int64_t n = 2, c = 4, H = 7, W = 6, oc = 6, G = 2, kh = 3, kw = 2, sh = 2, sw = 1, ph = 1, pw = 1, dh = 1, dw_ = 2;
    ct_shape in = SHAPE(c, H, W);
    h_setup(&h, "{\"type\":\"conv2d\",\"out\":6,\"kernel\":[3,2],\"stride\":[2,1],\"padding\":1,"
                "\"dilation\":[1,2],\"groups\":2}", 1, &in, CT_F32, n, 22);
    h_forward(&h);
    h_backward(&h);
    const int64_t OH = h.l.out.d[1], OW = h.l.out.d[2], cg = c / G, og = oc / G;
    ck_assert_int_eq(OH, (H + 2 * ph - dh * (kh - 1) - 1) / sh + 1);
    ck_assert_int_eq(OW, (W + 2 * pw - dw_ * (kw - 1) - 1) / sw + 1);
    int64_t ny = n * oc * OH * OW, nx = n * c * H * W, nw = oc * cg * kh * kw;
    double *y = calloc((size_t)ny, sizeof(double)), *dx = calloc((size_t)nx, sizeof(double));
    double *dwt = calloc((size_t)nw, sizeof(double)), db[6] = {0};
    for (int64_t b = 0; b < n; b++)
        for (int64_t o = 0; o < oc; o++)
            for (int64_t i = 0; i < OH; i++)
                for (int64_t j = 0; j < OW; j++) {
                    int64_t yi = ((b * oc + o) * OH + i) * OW + j;
                    double s = h.p[1][o], g = h.dy[yi];
                    db[o] += g;
                    for (int64_t ci = 0; ci < cg; ci++)
                        for (int64_t u = 0; u < kh; u++)
                            for (int64_t v = 0; v < kw; v++) {
                                int64_t ih = i * sh - ph + u * dh, iw = j * sw - pw + v * dw_;
                                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                                int64_t xi = ((b * c + (o / og) * cg + ci) * H + ih) * W + iw;
                                int64_t wi = ((o * cg + ci) * kh + u) * kw + v;
                                s += (double)h.x[0][xi] * h.p[0][wi];
                                dx[xi] += g * h.p[0][wi];
                                dwt[wi] += g * h.x[0][xi];
                            }
                    y[yi] = s;
                }
    close_enough("y", h.y, y, ny, 1e-5);
    close_enough("dx", h.dx[0], dx, nx, 1e-5);
    close_enough("dW", h.dp[0], dwt, nw, 1e-5);
    close_enough("db", h.dp[1], db, oc, 1e-5);
    free(y), free(dx), free(dwt);
    h_free(&h);
}
END_TEST

/* Normalize groups of `d` values (strided by `stride`, `count` of them) in double; returns dx etc. */
static void norm_ref(const float *x, const float *dy, const float *gamma, const float *beta, int64_t count,
                     int64_t stride_between, double eps, double *y, double *dx, double *dg, double *db,
                     double *mean_out, double *var_out, const int64_t *idx) {
    double mean = 0, var = 0, sdy = 0, sdyx = 0;
    for (int64_t i = 0; i < count; i++) mean += x[idx[i]];
    mean /= (double)count;
    for (int64_t i = 0; i < count; i++) var += (x[idx[i]] - mean) * (x[idx[i]] - mean);
    var /= (double)count;
    double inv = 1.0 / sqrt(var + eps);
    for (int64_t i = 0; i < count; i++) {
        double xh = (x[idx[i]] - mean) * inv, g = gamma[i % stride_between];
        y[idx[i]] = g * xh + beta[i % stride_between];
        sdy += dy[idx[i]] * g;
        sdyx += dy[idx[i]] * g * xh;
        dg[i % stride_between] += dy[idx[i]] * xh;
        db[i % stride_between] += dy[idx[i]];
    }
    for (int64_t i = 0; i < count; i++) {
        double xh = (x[idx[i]] - mean) * inv;
        dx[idx[i]] = inv / (double)count * ((double)count * dy[idx[i]] * gamma[i % stride_between] - sdy - xh * sdyx);
    }
    *mean_out = mean;
    *var_out = var;
}

START_TEST(fp64_batchnorm2d) {
    harness h;
    const int64_t n = 3, c = 2, hw = 6;
    ct_shape in = SHAPE(c, 2, 3);
    h_setup(&h, "{\"type\":\"batchnorm2d\",\"momentum\":0.3,\"eps\":0.001}", 1, &in, CT_F32, n, 23);
    float rm0[2] = {h.p[2][0], h.p[2][1]}, rv0[2] = {h.p[3][0], h.p[3][1]};
    h_forward(&h);
    h_backward(&h);
    double y[36], dx[36], dg[2] = {0}, db[2] = {0};
    for (int64_t ch = 0; ch < c; ch++) {
        int64_t idx[18], k = 0;
        for (int64_t b = 0; b < n; b++)
            for (int64_t i = 0; i < hw; i++) idx[k++] = (b * c + ch) * hw + i;
        float g1 = h.p[0][ch], b1 = h.p[1][ch];
        double dgc = 0, dbc = 0, mean, var;
        norm_ref(h.x[0], h.dy, &g1, &b1, k, 1, 1e-3, y, dx, &dgc, &dbc, &mean, &var, idx);
        dg[ch] = dgc, db[ch] = dbc;
        double rm = 0.7 * rm0[ch] + 0.3 * mean, rv = 0.7 * rv0[ch] + 0.3 * var * 18.0 / 17.0;
        close_enough("running_mean", &h.p[2][ch], &rm, 1, 1e-5);
        close_enough("running_var", &h.p[3][ch], &rv, 1, 1e-5);
    }
    close_enough("y", h.y, y, 36, 1e-4);
    close_enough("dx", h.dx[0], dx, 36, 1e-4);
    close_enough("dgamma", h.dp[0], dg, 2, 1e-4);
    close_enough("dbeta", h.dp[1], db, 2, 1e-4);
    h_free(&h);
}
END_TEST

START_TEST(fp64_layernorm) {
    harness h;
    const int64_t rows = 6, d = 5;
    ct_shape in = SHAPE(3, d);
    h_setup(&h, "{\"type\":\"layernorm\"}", 1, &in, CT_F32, 2, 24);
    h_forward(&h);
    h_backward(&h);
    double y[30], dx[30], dg[5] = {0}, db[5] = {0}, mean, var;
    for (int64_t r = 0; r < rows; r++) {
        int64_t idx[5];
        for (int64_t i = 0; i < d; i++) idx[i] = r * d + i;
        norm_ref(h.x[0], h.dy, h.p[0], h.p[1], d, d, 1e-5, y, dx, dg, db, &mean, &var, idx);
    }
    close_enough("y", h.y, y, 30, 1e-4);
    close_enough("dx", h.dx[0], dx, 30, 1e-4);
    close_enough("dgamma", h.dp[0], dg, 5, 1e-4);
    close_enough("dbeta", h.dp[1], db, 5, 1e-4);
    h_free(&h);
}
END_TEST

/* ---------------------------------------------------------------- losses through the graph ---- */

/* Graph [flatten] + loss on input logits [rows, cols]: loss and d(loss)/d(logits) (scale 2). */
static void run_loss(const char *loss_json, int64_t rows, int64_t cols, const float *logits, const void *target,
                     float *loss, float *dlogits) {
    char js[512];
    snprintf(js, sizeof js, "{\"input\": [%lld], \"layers\": [{\"type\": \"flatten\"}], \"loss\": %s}",
             (long long)cols, loss_json);
    ct_config cfg = {0};
    cJSON *model = cJSON_Parse(js);
    cfg.model = model;
    ct_backend *be = ct_cpu_backend_create(1);
    ct_graph *g;
    ct_err err;
    ck_assert_msg(ct_graph_build(&cfg, rows, CT_F32, &g, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ct_graph_bind(g, be, NULL, &err), CT_OK);
    ct_step_io io = {.input = logits, .target = target, .n = rows, .train = true, .loss_grad_scale = 2.0f};
    ct_exec_bufs none = {0};
    ck_assert_int_eq(ct_graph_forward(g, &none, &io, NULL, &err), CT_OK);
    ck_assert_int_eq(ct_graph_backward(g, &none, &io, NULL, &err), CT_OK);
    *loss = io.loss;
    const float *d = ct_graph_activation_grad(g, 0);
    for (int64_t i = 0; i < rows * cols; i++) dlogits[i] = d[i] / 2.0f;
    ct_graph_free(g);
    ct_backend_destroy(be);
    cJSON_Delete(model);
}

START_TEST(fp64_losses) {
    ct_rng r;
    ct_rng_init(&r, 5, CT_RNG_AUGMENT, 0);
    enum { R = 6, C = 5 };
    float x[R * C], t[R * C], dl[R * C], loss;
    int32_t lab[R];
    double want_d[R * C];
    for (int i = 0; i < R * C; i++) x[i] = rand_nonzero(&r, 0.1f, 3.0f), t[i] = ct_rng_uniform(&r);
    for (int i = 0; i < R; i++) lab[i] = (int32_t)ct_rng_below(&r, C);
    for (int ls = 0; ls < 2; ls++) {      /* cross entropy, with and without label smoothing */
        double eps = ls ? 0.2 : 0.0, total = 0;
        for (int i = 0; i < R; i++) {
            double mx = -1e30, z = 0;
            for (int j = 0; j < C; j++) mx = fmax(mx, x[i * C + j]);
            for (int j = 0; j < C; j++) z += exp(x[i * C + j] - mx);
            for (int j = 0; j < C; j++) {
                double logp = x[i * C + j] - mx - log(z), q = (j == lab[i] ? 1.0 - eps : 0.0) + eps / C;
                total -= q * logp;
                want_d[i * C + j] = (exp(logp) - q) / R;
            }
        }
        run_loss(ls ? "{\"type\": \"cross_entropy\", \"label_smoothing\": 0.2}" : "{\"type\": \"cross_entropy\"}",
                 R, C, x, lab, &loss, dl);
        double want = total / R;
        close_enough("cross_entropy", &loss, &want, 1, 1e-5);
        close_enough("d cross_entropy", dl, want_d, R * C, 1e-5);
    }
    double mse = 0, bce = 0, want_b[R * C];
    for (int i = 0; i < R * C; i++) {
        mse += (x[i] - t[i]) * (double)(x[i] - t[i]);
        want_d[i] = 2.0 * (x[i] - t[i]) / (R * C);
        bce += fmax(x[i], 0) - (double)x[i] * t[i] + log1p(exp(-fabs(x[i])));
        want_b[i] = (1.0 / (1.0 + exp(-(double)x[i])) - t[i]) / (R * C);
    }
    mse /= R * C, bce /= R * C;
    run_loss("{\"type\": \"mse\"}", R, C, x, t, &loss, dl);
    close_enough("mse", &loss, &mse, 1, 1e-5);
    close_enough("d mse", dl, want_d, R * C, 1e-5);
    run_loss("{\"type\": \"bce_with_logits\"}", R, C, x, t, &loss, dl);
    close_enough("bce", &loss, &bce, 1, 1e-5);
    close_enough("d bce", dl, want_b, R * C, 1e-5);
}
END_TEST

/* ------------------------------------------------ 16-bit storage against fp32 ---- */

/* Each layer runs with activations and parameters stored in fp16 or bf16 and, separately, in
 * fp32 fed the same values widened: the backends compute in fp32 and round once per stored
 * result, so the two agree to 16-bit rounding. Layers that only move, select or exactly scale
 * 16-bit values (copies, relu, maxpool over disjoint windows, dropout at p 0.5, embedding rows)
 * must agree bit for bit. */
typedef struct {
    const char *json;
    int n_in;
    ct_shape in[3];
    ct_dtype in_dt;      /* CT_I32: token ids (embedding) */
    int64_t n;
    bool exact;          /* y and dx bitwise equal to the fp32 run */
    bool eval;           /* forward only, running statistics */
    bool no_dx;          /* the model input: no input gradient (norms write dx into workspace) */
} half_case;

static const half_case half_cases[] = {
    {"{\"type\":\"linear\",\"out\":5}", 1, {SHAPE(7)}, CT_F32, 4, false, false, false},
    {"{\"type\":\"linear\",\"out\":6,\"bias\":false}", 1, {SHAPE(3, 9)}, CT_F32, 2, false, false, false},
    {"{\"type\":\"conv2d\",\"out\":4,\"kernel\":3,\"padding\":1}", 1, {SHAPE(3, 6, 6)}, CT_F32, 2,
     false, false, false},
    {"{\"type\":\"conv2d\",\"out\":6,\"kernel\":[3,2],\"stride\":[2,1],\"padding\":1,\"dilation\":[1,2],"
     "\"groups\":2}", 1, {SHAPE(4, 7, 6)}, CT_F32, 2, false, false, false},
    {"{\"type\":\"maxpool2d\",\"kernel\":2}", 1, {SHAPE(3, 6, 6)}, CT_F32, 2, true, false, false},
    {"{\"type\":\"maxpool2d\",\"kernel\":3,\"stride\":1,\"padding\":1}", 1, {SHAPE(2, 5, 5)}, CT_F32, 2,
     false, false, false},
    {"{\"type\":\"avgpool2d\",\"kernel\":3,\"stride\":2,\"padding\":1}", 1, {SHAPE(3, 7, 6)}, CT_F32, 2,
     false, false, false},
    {"{\"type\":\"global_avgpool\"}", 1, {SHAPE(4, 5, 3)}, CT_F32, 3, false, false, false},
    {"{\"type\":\"batchnorm2d\"}", 1, {SHAPE(3, 4, 5)}, CT_F32, 3, false, false, false},
    {"{\"type\":\"batchnorm2d\"}", 1, {SHAPE(3, 4, 5)}, CT_F32, 3, false, false, true},
    {"{\"type\":\"batchnorm2d\"}", 1, {SHAPE(3, 4, 5)}, CT_F32, 3, false, true, false},
    {"{\"type\":\"layernorm\"}", 1, {SHAPE(3, 16)}, CT_F32, 2, false, false, false},
    {"{\"type\":\"layernorm\"}", 1, {SHAPE(10)}, CT_F32, 4, false, false, true},
    {"{\"type\":\"dropout\",\"p\":0.5}", 1, {SHAPE(40)}, CT_F32, 3, true, false, false},
    {"{\"type\":\"dropout\",\"p\":0.3}", 1, {SHAPE(40)}, CT_F32, 3, false, false, false},
    {"{\"type\":\"relu\"}", 1, {SHAPE(30)}, CT_F32, 3, true, false, false},
    {"{\"type\":\"leaky_relu\",\"negative_slope\":0.1}", 1, {SHAPE(30)}, CT_F32, 3, false, false, false},
    {"{\"type\":\"gelu\"}", 1, {SHAPE(30)}, CT_F32, 3, false, false, false},
    {"{\"type\":\"gelu\",\"approximate\":\"tanh\"}", 1, {SHAPE(30)}, CT_F32, 3, false, false, false},
    {"{\"type\":\"silu\"}", 1, {SHAPE(30)}, CT_F32, 3, false, false, false},
    {"{\"type\":\"tanh\"}", 1, {SHAPE(30)}, CT_F32, 3, false, false, false},
    {"{\"type\":\"sigmoid\"}", 1, {SHAPE(30)}, CT_F32, 3, false, false, false},
    {"{\"type\":\"flatten\"}", 1, {SHAPE(2, 3, 4)}, CT_F32, 2, true, false, false},
    {"{\"type\":\"reshape\",\"shape\":[4,-1]}", 1, {SHAPE(2, 3, 4)}, CT_F32, 2, true, false, false},
    {"{\"type\":\"add\"}", 3, {SHAPE(2, 9), SHAPE(2, 9), SHAPE(2, 9)}, CT_F32, 3, false, false, false},
    {"{\"type\":\"concat\"}", 2, {SHAPE(2, 3, 3), SHAPE(3, 3, 3)}, CT_F32, 2, true, false, false},
    {"{\"type\":\"concat\",\"axis\":-1}", 2, {SHAPE(2, 3), SHAPE(2, 5)}, CT_F32, 2, true, false, false},
    {"{\"type\":\"embedding\",\"vocab\":7,\"dim\":6}", 1, {SHAPE(5)}, CT_I32, 3, true, false, false},
    {"{\"type\":\"position_embedding\",\"max_len\":9}", 1, {SHAPE(5, 6)}, CT_F32, 3, false, false, false},
    {"{\"type\":\"causal_self_attention\",\"heads\":2}", 1, {SHAPE(7, 24)}, CT_F32, 3, false, false, false},
    {"{\"type\":\"causal_self_attention\",\"heads\":4,\"kv_heads\":2,\"rope_theta\":10000}", 1, {SHAPE(9, 64)}, CT_F32,
     2, false, false, false},
    {"{\"type\":\"rmsnorm\"}", 1, {SHAPE(3, 10)}, CT_F32, 2, false, false, false},
    {"{\"type\":\"rmsnorm\",\"eps\":1e-5}", 1, {SHAPE(3, 10)}, CT_F32, 2, false, false, true},
    {"{\"type\":\"swiglu\"}", 1, {SHAPE(3, 14)}, CT_F32, 2, false, false, false},
};

static uint16_t half_bits(float v, ct_dtype dt) { return dt == CT_F16 ? ct_f32_to_f16(v) : ct_f32_to_bf16(v); }
static float half_value(uint16_t b, ct_dtype dt) { return dt == CT_F16 ? ct_f16_to_f32(b) : ct_bf16_to_f32(b); }

/* A new array of k elements of dt holding x (rounded to nearest even when dt is 16-bit). */
static void *store_as(const float *x, int64_t k, ct_dtype dt) {
    void *out = malloc((size_t)k * ct_dtype_size(dt) + 4);
    for (int64_t i = 0; i < k; i++)
        if (dt == CT_F32) ((float *)out)[i] = x[i];
        else ((uint16_t *)out)[i] = half_bits(x[i], dt);
    return out;
}

/* out[k] (fp32) = the k elements of dt at x. */
static void load_from(float *out, const void *x, int64_t k, ct_dtype dt) {
    for (int64_t i = 0; i < k; i++)
        out[i] = dt == CT_F32 ? ((const float *)x)[i] : half_value(((const uint16_t *)x)[i], dt);
}

static double rel_l2(const float *got, const float *want, int64_t k) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < k; i++) {
        num += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
        den += (double)want[i] * want[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Everything one run produced, widened to fp32. */
typedef struct {
    float *y, *dx[CT_LAYER_MAX_IN], *dp[CT_LAYER_MAX_PARAMS], *buf[CT_LAYER_MAX_PARAMS];
} half_run;

/* Run h's layer (its inputs, dy and trainable params already hold dt-representable values) with
 * storage in dt: forward, then backward unless eval, as the executor would call them. */
static void run_stored(harness *h, const half_case *c, ct_dtype dt, half_run *o) {
    const ct_layer *l = &h->l;
    ct_layer_io io = {.be = h->be, .n = h->n, .dt = dt, .ids = h->ids, .train = !c->eval, .seed = 11,
                      .stream = 5};
    int64_t ny = h->n * ct_layer_out_numel(l);
    for (int i = 0; i < l->n_in && c->in_dt != CT_I32; i++) {
        int64_t k = h->n * ct_layer_in_numel(l, i);
        io.x[i] = store_as(h->x[i], k, dt);
        io.dx[i] = c->no_dx || c->eval ? NULL : malloc((size_t)k * ct_dtype_size(dt));
    }
    for (int s = 0; s < h->n_specs; s++) {   /* trainable in dt, buffers fp32 */
        int64_t k = ct_shape_numel(&h->specs[s].shape);
        io.p[s] = store_as(h->p[s], k, h->specs[s].trainable ? dt : CT_F32);
        io.dp[s] = h->specs[s].trainable ? calloc((size_t)k, sizeof(float)) : NULL;
    }
    size_t aux = l->type->aux_bytes ? l->type->aux_bytes(l, h->n, dt) : 0;
    size_t ws = l->type->workspace_bytes ? l->type->workspace_bytes(l, h->n, dt) : 0;
    io.aux = malloc(aux + 64);
    io.ws = malloc(ws + 64);
    io.y = malloc((size_t)ny * ct_dtype_size(dt));
    io.dy = store_as(h->dy, ny, dt);
    l->type->forward(l, &io);
    o->y = malloc(sizeof(float) * (size_t)ny);
    load_from(o->y, io.y, ny, dt);
    for (int s = 0; s < h->n_specs; s++)
        if (!h->specs[s].trainable) {
            int64_t k = ct_shape_numel(&h->specs[s].shape);
            o->buf[s] = malloc(sizeof(float) * (size_t)k);
            memcpy(o->buf[s], io.p[s], sizeof(float) * (size_t)k);
            free(io.p[s]);
            io.p[s] = NULL;                     /* buffers are NULL in backward */
        }
    if (!c->eval) l->type->backward(l, &io);
    for (int i = 0; i < l->n_in; i++) {
        if (io.dx[i]) {
            int64_t k = h->n * ct_layer_in_numel(l, i);
            o->dx[i] = malloc(sizeof(float) * (size_t)k);
            load_from(o->dx[i], io.dx[i], k, dt);
        }
        free((void *)io.x[i]), free(io.dx[i]);
    }
    for (int s = 0; s < h->n_specs; s++) o->dp[s] = io.dp[s], free(io.p[s]);
    free(io.aux), free(io.ws), free(io.y), free((void *)io.dy);
}

static void half_run_free(half_run *o) {
    free(o->y);
    for (int i = 0; i < CT_LAYER_MAX_IN; i++) free(o->dx[i]);
    for (int s = 0; s < CT_LAYER_MAX_PARAMS; s++) free(o->dp[s]), free(o->buf[s]);
}

/* got (16-bit run) against want (fp32 run): bitwise when exact, else relative L2 <= tol; always
 * finite. */
static void half_compare(const char *json, ct_dtype dt, const char *what, const float *got, const float *want,
                         int64_t k, bool exact, double tol) {
    for (int64_t i = 0; i < k; i++)
        ck_assert_msg(isfinite(got[i]), "%s %s: %s[%lld] = %g", json, ct_dtype_name(dt), what, (long long)i, got[i]);
    if (exact) {
        for (int64_t i = 0; i < k; i++)
            ck_assert_msg(memcmp(&got[i], &want[i], sizeof(float)) == 0, "%s %s: %s[%lld] = %.8g, fp32 %.8g",
                          json, ct_dtype_name(dt), what, (long long)i, got[i], want[i]);
        return;
    }
    double e = rel_l2(got, want, k);
    ck_assert_msg(e <= tol, "%s %s: %s relative L2 error %.3g > %.3g", json, ct_dtype_name(dt), what, e, tol);
}

START_TEST(half_storage_matches_fp32) {
    const half_case *c = &half_cases[_i / 2];
    ct_dtype dt = _i % 2 ? CT_BF16 : CT_F16;
    harness h;
    h_setup(&h, c->json, c->n_in, c->in, c->in_dt, c->n, 300 + (uint64_t)_i);
    if (c->no_dx) h.l.in_from[0] = -1;        /* the model input: workspace takes dx */
    /* the fp32 run sees exactly the values the 16-bit run stores */
    for (int i = 0; i < h.l.n_in && c->in_dt != CT_I32; i++) {
        int64_t k = h.n * ct_layer_in_numel(&h.l, i);
        for (int64_t j = 0; j < k; j++) h.x[i][j] = half_value(half_bits(h.x[i][j], dt), dt);
    }
    for (int64_t j = 0; j < h.n * ct_layer_out_numel(&h.l); j++) h.dy[j] = half_value(half_bits(h.dy[j], dt), dt);
    for (int s = 0; s < h.n_specs; s++)
        for (int64_t j = 0; h.specs[s].trainable && j < ct_shape_numel(&h.specs[s].shape); j++)
            h.p[s][j] = half_value(half_bits(h.p[s][j], dt), dt);
    size_t ws32 = h.l.type->workspace_bytes ? h.l.type->workspace_bytes(&h.l, h.n, CT_F32) : 0;
    size_t ws16 = h.l.type->workspace_bytes ? h.l.type->workspace_bytes(&h.l, h.n, dt) : 0;
    ck_assert_msg(ws16 <= ws32, "%s: workspace %zu bytes in %s, %zu in f32", c->json, ws16, ct_dtype_name(dt), ws32);

    half_run r32 = {0}, r16 = {0};
    run_stored(&h, c, CT_F32, &r32);
    run_stored(&h, c, dt, &r16);
    half_compare(c->json, dt, "y", r16.y, r32.y, h.n * ct_layer_out_numel(&h.l), c->exact, 1e-2);
    for (int i = 0; i < h.l.n_in; i++) {
        ck_assert(!r16.dx[i] == !r32.dx[i]);
        if (r16.dx[i])
            half_compare(c->json, dt, "dx", r16.dx[i], r32.dx[i], h.n * ct_layer_in_numel(&h.l, i), c->exact, 2e-2);
    }
    for (int s = 0; s < h.n_specs; s++) {
        int64_t k = ct_shape_numel(&h.specs[s].shape);
        if (r16.dp[s] && !c->eval) half_compare(c->json, dt, h.specs[s].suffix, r16.dp[s], r32.dp[s], k, false, 2e-2);
        if (r16.buf[s]) half_compare(c->json, dt, h.specs[s].suffix, r16.buf[s], r32.buf[s], k, false, 1e-2);
    }
    half_run_free(&r32);
    half_run_free(&r16);
    h_free(&h);
}
END_TEST

/* Every registered type is in the 16-bit table (so a new type without a case fails here). */
START_TEST(every_type_has_half_case) {
    const char *names[CT_LAYER_NAMES_MAX];
    int n = ct_layer_type_names(names, CT_LAYER_NAMES_MAX);
    for (int i = 0; i < n; i++) {
        if (!ct_layer_type_find(names[i])) continue;   /* repeat and block types expand into layers */
        char key[64];
        snprintf(key, sizeof key, "{\"type\":\"%s\"", names[i]);
        bool found = false;
        for (int j = 0; j < CT_ARRAY_LEN(half_cases) && !found; j++)
            found = strncmp(half_cases[j].json, key, strlen(key)) == 0;
        ck_assert_msg(found, "layer type %s has no case in half_cases", names[i]);
    }
}
END_TEST

/* ---------------------------------------------------------------- PyTorch references ---- */

/* test/ref/layers/<name>.bin */
static void ref_load_layer(ref_file *rf, const char *name) {
    char path[256];
    snprintf(path, sizeof path, "test/ref/layers/%s.bin", name);
    ref_load(rf, path);
}

static void ref_layer(const char *file) {
    ref_file rf;
    ref_load_layer(&rf, file);
    char *cfg = cJSON_PrintUnformatted(cJSON_GetObjectItem(rf.meta, "layer"));
    bool eval = strcmp(cJSON_GetObjectItem(rf.meta, "mode")->valuestring, "eval") == 0;
    ct_shape in[CT_LAYER_MAX_IN];
    int n_in = 0;
    char key[16];
    const ref_array *a;
    for (; snprintf(key, sizeof key, "x%d", n_in), (a = ref_get(&rf, key)); n_in++) {
        in[n_in].ndim = a->shape.ndim - 1;
        for (int d = 1; d < a->shape.ndim; d++) in[n_in].d[d - 1] = a->shape.d[d];
    }
    const ref_array *x0 = ref_get(&rf, "x0");
    /* by the type's flag, not the name: position_embedding takes floats */
    bool tokens = ct_layer_type_find(cJSON_GetObjectItem(cJSON_GetObjectItem(rf.meta, "layer"), "type")
                                         ->valuestring)->flags & CT_LAYER_TAKES_IDS;
    harness h;
    h_setup(&h, cfg, n_in, in, tokens ? CT_I32 : CT_F32, x0->shape.d[0], 1);
    h.train = !eval;
    for (int i = 0; i < n_in; i++) {
        snprintf(key, sizeof key, "x%d", i);
        a = ref_get(&rf, key);
        memcpy(h.x[i], a->data, sizeof(float) * (size_t)ct_shape_numel(&a->shape));
    }
    if (tokens)
        for (int64_t j = 0; j < ct_shape_numel(&x0->shape); j++) h.ids[j] = (int32_t)x0->data[j];
    for (int s = 0; s < h.n_specs; s++) {
        snprintf(key, sizeof key, "p%d", s);
        a = ref_get(&rf, key);
        ck_assert_msg(a && ct_shape_numel(&a->shape) == ct_shape_numel(&h.specs[s].shape), "%s: %s", file, key);
        memcpy(h.p[s], a->data, sizeof(float) * (size_t)ct_shape_numel(&a->shape));
    }
    const ref_array *dy = ref_get(&rf, "dy");
    ck_assert_int_eq(ct_shape_numel(&dy->shape), h.n * ct_layer_out_numel(&h.l));
    memcpy(h.dy, dy->data, sizeof(float) * (size_t)ct_shape_numel(&dy->shape));
    h_forward(&h);
    ref_compare(file, "y", h.y, ref_get(&rf, "y"), 2e-5);
    for (int s = 0; s < h.n_specs; s++) {
        snprintf(key, sizeof key, "r%d", s);
        if ((a = ref_get(&rf, key))) ref_compare(file, key, h.p[s], a, 2e-5);
    }
    /* Backward runs only after a train-mode forward (ct_graph_backward refuses otherwise). */
    if (!eval) h_backward(&h);
    for (int i = 0; i < n_in && !tokens && !eval; i++) {
        snprintf(key, sizeof key, "dx%d", i);
        ref_compare(file, key, h.dx[i], ref_get(&rf, key), 5e-5);
    }
    for (int s = 0; s < h.n_specs && !eval; s++)
        if (h.dp[s]) {
            snprintf(key, sizeof key, "dp%d", s);
            ref_compare(file, key, h.dp[s], ref_get(&rf, key), 5e-5);
        }
    free(cfg);
    h_free(&h);
    ref_free(&rf);
}

static const char *const layer_refs[] = {
    "linear", "linear_rank3_nobias", "conv2d", "conv2d_groups", "maxpool2d", "avgpool2d", "avgpool2d_nopad",
    "global_avgpool", "batchnorm2d", "batchnorm2d_eval", "layernorm", "relu", "leaky_relu", "gelu",
    "gelu_tanh", "silu", "tanh", "sigmoid", "dropout_eval", "flatten", "reshape", "add", "concat",
    "concat_last", "embedding",
    "position_embedding", "causal_self_attention", "rmsnorm", "swiglu", "causal_self_attention_gqa_rope",
    "causal_self_attention_mqa_linear", "causal_self_attention_dynamic"};

START_TEST(pytorch_layers) {
    ref_layer(layer_refs[_i]);
}
END_TEST

static const char *const loss_refs[] = {"cross_entropy", "cross_entropy_smooth", "mse", "bce_with_logits"};

START_TEST(pytorch_losses) {
    ref_file rf;
    ref_load_layer(&rf, loss_refs[_i]);
    const ref_array *x = ref_get(&rf, "logits"), *t = ref_get(&rf, "target");
    int64_t rows = x->shape.d[0], cols = x->shape.d[1];
    int32_t labels[64];
    bool ce = strstr(loss_refs[_i], "cross") != NULL;
    for (int64_t i = 0; ce && i < rows; i++) labels[i] = (int32_t)t->data[i];
    char *js = cJSON_PrintUnformatted(cJSON_GetObjectItem(rf.meta, "loss"));
    float loss, *dl = malloc(sizeof(float) * (size_t)(rows * cols));
    run_loss(js, rows, cols, x->data, ce ? (const void *)labels : t->data, &loss, dl);
    ref_compare(loss_refs[_i], "loss", &loss, ref_get(&rf, "loss"), 1e-5);
    ref_compare(loss_refs[_i], "dlogits", dl, ref_get(&rf, "dlogits"), 1e-5);
    free(js), free(dl);
    ref_free(&rf);
}
END_TEST

/* Every registered type has a PyTorch reference (so a new type without one fails here). */
START_TEST(every_type_has_reference) {
    const char *names[CT_LAYER_NAMES_MAX];
    int n = ct_layer_type_names(names, CT_LAYER_NAMES_MAX);
    for (int i = 0; i < n; i++) {
        if (!ct_layer_type_find(names[i])) continue;   /* repeat and block types expand into layers */
        bool found = false;
        for (int j = 0; j < CT_ARRAY_LEN(layer_refs) && !found; j++)
            found = strncmp(layer_refs[j], names[i], strlen(names[i])) == 0;
        ck_assert_msg(found, "layer type %s has no file in test/ref/layers", names[i]);
    }
}
END_TEST

/* name is one of the comma-separated names of a "### " heading line, or a table row "| `name` |". */
static bool doc_line_names(const char *line, size_t len, const char *name) {
    size_t k = strlen(name);
    if (len > 4 && !strncmp(line, "### ", 4)) {
        for (const char *p = line + 4; p < line + len;) {
            size_t w = strcspn(p, ",\n");
            if (w == k && !strncmp(p, name, k)) return true;
            p += w + 1;
            while (*p == ' ') p++;
        }
        return false;
    }
    return len > k + 5 && !strncmp(line, "| `", 3) && !strncmp(line + 3, name, k) && !strncmp(line + 3 + k, "` |", 3);
}

/* Every name a "type" may take (the registry's, all of them fitting CT_LAYER_NAMES_MAX) has its
 * section in docs/model.md: a layer type a "### " heading or an activation table row under
 * "## Layer types", a block type and repeat their example `{"type": "NAME"`. */
START_TEST(every_type_has_doc_section) {
    const char *names[CT_LAYER_NAMES_MAX];
    int n = ct_layer_type_names(names, CT_LAYER_NAMES_MAX);
    ck_assert_int_lt(n, CT_LAYER_NAMES_MAX);
    char *doc = ct_fs_read_small("docs/model.md", 1 << 20, NULL);
    ck_assert_msg(doc != NULL, "docs/model.md: cannot read it (run from the repository root)");
    const char *types = strstr(doc, "\n## Layer types\n");
    ck_assert_ptr_nonnull(types);
    const char *end = strstr(types + 1, "\n## ");
    for (int i = 0; i < n; i++) {
        bool found = false;
        if (ct_layer_type_find(names[i])) {
            for (const char *line = types + 1; !found && line && line < end; line = strchr(line, '\n'), line += !!line)
                found = doc_line_names(line, strcspn(line, "\n"), names[i]);
        } else {
            char example[96];
            snprintf(example, sizeof example, "{\"type\": \"%s\"", names[i]);
            found = strstr(doc, example) != NULL;
        }
        ck_assert_msg(found, "docs/model.md has no section for the type \"%s\"", names[i]);
    }
    free(doc);
}
END_TEST

int main(void) {
    Suite *s = suite_create("layers");
    TCase *tc = tcase_create("layers");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, fd_every_layer);
    tcase_add_test(tc, fd_catches_wrong_gradient);
    tcase_add_test(tc, dropout_modes);
    tcase_add_test(tc, fp64_linear);
    tcase_add_test(tc, fp64_conv2d);
    tcase_add_test(tc, fp64_batchnorm2d);
    tcase_add_test(tc, fp64_layernorm);
    tcase_add_test(tc, fp64_losses);
    tcase_add_loop_test(tc, pytorch_layers, 0, CT_ARRAY_LEN(layer_refs));
    tcase_add_loop_test(tc, pytorch_losses, 0, CT_ARRAY_LEN(loss_refs));
    tcase_add_test(tc, every_type_has_reference);
    tcase_add_test(tc, every_type_has_doc_section);
    tcase_add_loop_test(tc, half_storage_matches_fp32, 0, 2 * CT_ARRAY_LEN(half_cases));
    tcase_add_test(tc, every_type_has_half_case);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
