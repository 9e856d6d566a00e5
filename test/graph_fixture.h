/* graph_fixture.h: what the test_graph_*.c files share (each a topic of core/graph/): building a
 * model from its text (built, build*, expect_ok, EXPECT_ERROR), running it (runner: a parameter
 * store, random inputs, loss and backward; check_graph_grads against central differences),
 * snapshots of a pass to compare runs bit for bit, the gathering hooks of ZeRO-3's seam, and the
 * models more than one file uses. Functions are static inline: each file uses a part. */
#ifndef CT_TEST_GRAPH_FIXTURE_H
#define CT_TEST_GRAPH_FIXTURE_H

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/ckpt/mapped.h"
#include "core/cpu/cpu.h"
#include "core/graph/graph.h"
#include "core/graph/hf_gpt2.h"
#include "core/graph/hf_llama.h"
#include "core/graph/internal.h"
#include "core/graph/layer.h"
#include "core/params/store.h"
#include "core/util/json.h"
#include "core/util/rng.h"
#include "test/ref_file.h"
#include "test/model_text.h"

typedef struct {
    ct_config cfg;
    ct_json_doc *doc;
    ct_backend *be;
    ct_graph *g;
    ct_err err;
    int rc;
} built;

/* Parse `text` as the model section of a file called "m.json" and build at `batch`, storing
 * activations in `dt`, with activation_checkpointing.number_checkpoints `n_checkpoints` (0: none)
 * and cpu_checkpointing `offload`. */
static inline void build_threads(built *b, const char *text, int64_t batch, ct_dtype dt, long n_checkpoints, bool offload,
                          int threads) {
    memset(b, 0, sizeof *b);
    b->cfg.pending.number_checkpoints = n_checkpoints;
    b->cfg.pending.cpu_checkpointing = offload;
    model_text(text, &b->cfg, &b->doc);
    b->be = ct_cpu_backend_create(threads);
    b->rc = ct_graph_build(&b->cfg, batch, dt, &b->g, &b->err);
    if (b->rc == CT_OK) ck_assert_int_eq(ct_graph_bind(b->g, b->be, NULL, &b->err), CT_OK);
}

static inline void build_full(built *b, const char *text, int64_t batch, ct_dtype dt, long n_checkpoints, bool offload) {
    build_threads(b, text, batch, dt, n_checkpoints, offload, 1);
}

static inline void build_dt(built *b, const char *text, int64_t batch, ct_dtype dt) { build_full(b, text, batch, dt, 0, false); }

static inline void build(built *b, const char *text, int64_t batch) { build_dt(b, text, batch, CT_F32); }

/* Activations and their gradients in the plan: everything but the layer workspace and the loss. */
static inline size_t activation_bytes(const ct_graph *g) {
    const ct_act_plan *p = ct_graph_plan(g);
    return p->outputs + p->aux + p->grads + p->recompute + p->gaps + p->scratch + p->input;
}

static inline void unbuild(built *b) {
    ct_graph_free(b->g);
    ct_backend_destroy(b->be);
    ct_json_free(b->doc);
}

static inline void expect_ok(const char *text, built *b) {
    build(b, text, 4);
    ck_assert_msg(b->rc == CT_OK, "build failed: %s", b->err.msg);
}

/* The build fails with CT_ERR_CONFIG and the message contains every one of `parts`. */
static inline void expect_error(const char *text, const char *const *parts, int n) {
    built b;
    build(&b, text, 4);
    ck_assert_msg(b.rc == CT_ERR_CONFIG, "expected a config error, got %d (%s) for %s", b.rc, b.err.msg, text);
    ck_assert_ptr_null(b.g);
    for (int i = 0; i < n; i++)
        ck_assert_msg(strstr(b.err.msg, parts[i]), "message \"%s\" lacks \"%s\"", b.err.msg, parts[i]);
    unbuild(&b);
}

#define EXPECT_ERROR(text, ...)                                                                    \
    do {                                                                                           \
        const char *const parts_[] = {__VA_ARGS__};                                                \
        expect_error(text, parts_, (int)(sizeof parts_ / sizeof parts_[0]));                       \
    } while (0)

static const char mlp[] =
    "{\"input\": [1, 28, 28], \"layers\": [{\"type\": \"flatten\"},"
    " {\"type\": \"linear\", \"out\": 512}, {\"type\": \"relu\"},"
    " {\"type\": \"linear\", \"out\": 512}, {\"type\": \"relu\"},"
    " {\"type\": \"linear\", \"out\": 10}], \"loss\": {\"type\": \"cross_entropy\"}}";

static const char cnn[] =
    "{\"input\": [1, 28, 28], \"layers\": ["
    " {\"type\": \"conv2d\", \"out\": 32, \"kernel\": 3, \"padding\": 1}, {\"type\": \"relu\"},"
    " {\"type\": \"maxpool2d\", \"kernel\": 2},"
    " {\"type\": \"conv2d\", \"out\": 64, \"kernel\": 3, \"padding\": 1}, {\"type\": \"relu\"},"
    " {\"type\": \"maxpool2d\", \"kernel\": 2}, {\"type\": \"flatten\"},"
    " {\"type\": \"linear\", \"out\": 128}, {\"type\": \"relu\"}, {\"type\": \"linear\", \"out\": 10}],"
    " \"loss\": {\"type\": \"cross_entropy\"}}";

/* ---- running a built graph: loss and finite-difference gradients through the whole graph ---- */

typedef struct {
    built b;
    ct_param_store *store;
    float *params, *grads, *buffers, *input;   /* the store's (fp32: params is the master) */
    void *target;
    ct_step_io io;
} runner;

/* A runner on a graph stored in dt (16 bits: the parameters the passes read are the store's
 * compute copy, refreshed from the master by the caller), on `threads` CPU threads. */
static inline void runner_start_on(runner *r, const char *text, int64_t n, uint64_t seed, long n_checkpoints, bool offload,
                            ct_dtype dt, int threads) {
    build_threads(&r->b, text, n, dt, n_checkpoints, offload, threads);
    ck_assert_msg(r->b.rc == CT_OK, "build failed: %s", r->b.err.msg);
    const ct_graph_info *in = ct_graph_info_get(r->b.g);
    const ct_param_layout *L = ct_graph_layout(r->b.g);
    ct_err err;
    ck_assert_int_eq(ct_param_store_create(L, r->b.be, dt, 0, L->n_params, CT_STORE_WHOLE, &r->store, &err), CT_OK);
    ct_param_store_init(r->store, seed);
    ct_param_store_refresh(r->store);
    r->params = r->store->master, r->grads = r->store->grads, r->buffers = r->store->buffers;
    int64_t ni = n * ct_shape_numel(&in->input_shape), nt = n * ct_shape_numel(&in->target_shape);
    r->input = malloc(sizeof(float) * (size_t)ni);
    r->target = malloc(sizeof(float) * (size_t)nt);
    ct_rng rng;
    ct_rng_init(&rng, seed, CT_RNG_AUGMENT, 99);
    /* token ids (an embedding first) below the class count: the test models' vocabularies */
    for (int64_t i = 0; i < ni; i++)
        if (in->input_dtype == CT_I32) ((int32_t *)r->input)[i] = (int32_t)ct_rng_below(&rng, in->classes > 0 ? (uint32_t)in->classes : 2);
        else r->input[i] = 2.0f * ct_rng_uniform(&rng) - 1.0f;
    for (int64_t i = 0; i < nt; i++) {
        if (in->target_dtype == CT_I32) ((int32_t *)r->target)[i] = (int32_t)ct_rng_below(&rng, (uint32_t)in->classes);
        else ((float *)r->target)[i] = ct_rng_uniform(&rng);
    }
    r->io = (ct_step_io){.input = r->input, .target = r->target, .n = n, .train = true, .seed = seed,
                         .loss_grad_scale = 1.0f};
}

static inline void runner_start_ckpt(runner *r, const char *text, int64_t n, uint64_t seed, long n_checkpoints,
                              bool offload) {
    runner_start_on(r, text, n, seed, n_checkpoints, offload, CT_F32, 1);
}

static inline void runner_start(runner *r, const char *text, int64_t n, uint64_t seed) {
    runner_start_ckpt(r, text, n, seed, 0, false);
}

static inline ct_exec_bufs runner_bufs(const runner *r) {
    const void *params = ct_graph_compute_dtype(r->b.g) == CT_F32 ? (const void *)r->params : r->store->params;
    return (ct_exec_bufs){.params = params, .grads = r->grads, .buffers = r->buffers};
}

static inline double runner_loss(runner *r) {
    ct_err err;
    ct_exec_bufs b = runner_bufs(r);
    ck_assert_int_eq(ct_graph_forward(r->b.g, &b, &r->io, NULL, &err), CT_OK);
    return r->io.loss;
}

static inline void runner_backward(runner *r, const ct_exec_hooks *hooks) {
    ct_err err;
    ct_exec_bufs b = runner_bufs(r);
    ck_assert_msg(ct_graph_backward(r->b.g, &b, &r->io, hooks, &err) == CT_OK, "%s", err.msg);
}

static inline void runner_stop(runner *r) {
    ct_param_store_free(r->store);
    free(r->input), free(r->target);
    unbuild(&r->b);
}

/* Analytic parameter gradients against central differences of the fp32 loss. */
static inline void check_graph_grads(const char *text, int64_t n, double eps, double tol) {
    runner r;
    runner_start(&r, text, n, 3);
    const ct_graph_info *in = ct_graph_info_get(r.b.g);
    runner_loss(&r);
    runner_backward(&r, NULL);
    /* kept aside: a train-mode forward of a chunked head accumulates its gradients (exec.c) */
    float *analytic = malloc(sizeof(float) * (size_t)in->n_params);
    memcpy(analytic, r.grads, sizeof(float) * (size_t)in->n_params);
    double num = 0, den = 0;
    for (int64_t i = 0; i < in->n_params; i += 1 + in->n_params / 200) {
        float keep = r.params[i];
        r.params[i] = keep + (float)eps;
        double lp = runner_loss(&r);
        r.params[i] = keep - (float)eps;
        double lm = runner_loss(&r);
        r.params[i] = keep;
        double fd = (lp - lm) / (2 * eps);
        num += (fd - analytic[i]) * (fd - analytic[i]);
        den += fd * fd;
    }
    free(analytic);
    ck_assert_msg(den > 0, "all sampled gradients are zero");
    ck_assert_msg(sqrt(num / den) < tol, "relative gradient error %g >= %g", sqrt(num / den), tol);
    runner_stop(&r);
}

static const char residual[] =
    "{\"input\": [6], \"layers\": ["
    " {\"type\": \"linear\", \"name\": \"a\", \"out\": 8}, {\"type\": \"tanh\", \"name\": \"t\"},"
    " {\"type\": \"linear\", \"name\": \"b\", \"out\": 8},"
    " {\"type\": \"add\", \"name\": \"sum\", \"inputs\": [\"b\", \"a\"]},"
    " {\"type\": \"concat\", \"inputs\": [\"sum\", \"t\", \"sum\"]},"
    " {\"type\": \"linear\", \"out\": 5}], \"loss\": {\"type\": \"cross_entropy\"}}";

/* ---- the executor's seams: ranges, recompute, prepare hooks, ties ---- */

/* Linear, batchnorm (running statistics), an activation, dropout (random masks), a residual and
 * a layernorm: everything a range boundary or a recompute could disturb. (The activation is a
 * leaky_relu with a negative slope: it does not run in place, and its backward reads its input
 * and its output, so batchnorm's output and dropout's input live through backward, which
 * recompute_restores_a_range needs.) */
static const char seam_model[] =
    "{\"input\": [6], \"layers\": ["
    " {\"type\": \"linear\", \"name\": \"a\", \"out\": 12}, {\"type\": \"batchnorm2d\", \"name\": \"bn\"},"
    " {\"type\": \"leaky_relu\", \"name\": \"act\", \"negative_slope\": -0.1}, {\"type\": \"dropout\", \"name\": \"d\", \"p\": 0.3},"
    " {\"type\": \"linear\", \"name\": \"b\", \"out\": 12},"
    " {\"type\": \"add\", \"name\": \"res\", \"inputs\": [\"b\", \"a\"]}, {\"type\": \"layernorm\", \"name\": \"ln\"},"
    " {\"type\": \"linear\", \"name\": \"head\", \"out\": 5}], \"loss\": {\"type\": \"cross_entropy\"}}";

/* Copies of what a pass leaves behind, to compare runs bit for bit. */
typedef struct snapshot {
    float *grads, *buffers;
    float loss;
} snapshot;

static inline snapshot snap(const runner *r) {
    const ct_graph_info *in = ct_graph_info_get(r->b.g);
    snapshot s = {malloc(sizeof(float) * (size_t)in->n_params), malloc(sizeof(float) * (size_t)in->n_buffers), r->io.loss};
    memcpy(s.grads, r->grads, sizeof(float) * (size_t)in->n_params);
    memcpy(s.buffers, r->buffers, sizeof(float) * (size_t)in->n_buffers);
    return s;
}

static inline void expect_same(const runner *r, const snapshot *want, const char *what) {
    const ct_graph_info *in = ct_graph_info_get(r->b.g);
    ck_assert_msg(memcmp(&r->io.loss, &want->loss, sizeof(float)) == 0, "%s: loss %.9g, one pass %.9g", what,
                  r->io.loss, want->loss);
    ck_assert_msg(memcmp(r->grads, want->grads, sizeof(float) * (size_t)in->n_params) == 0,
                  "%s: gradients differ from one pass", what);
    ck_assert_msg(memcmp(r->buffers, want->buffers, sizeof(float) * (size_t)in->n_buffers) == 0,
                  "%s: running statistics differ from one pass", what);
}

static inline void snap_free(snapshot *s) { free(s->grads), free(s->buffers); }

/* The baseline: one forward, loss and backward over the whole model from fresh state. */
static inline snapshot one_pass(runner *r) {
    ct_param_store_init(r->store, 5);
    ct_param_store_zero_grads(r->store);
    runner_loss(r);
    runner_backward(r, NULL);
    return snap(r);
}

/* ZeRO-3's seam: a prepare hook gathers each layer's parameters from an owner copy into one
 * reused scratch and hands backward a zeroed per-layer gradient bucket, which its after hook adds
 * into the owner's gradients. The flat buffers the executor is given hold NaN: a layer that read
 * them would poison the result. */
typedef struct gather_ctx {
    const ct_param_layout *L;
    const float *owner;          /* [n_params] the real parameters */
    float *owner_grads;          /* [n_params] */
    float *scratch, *bucket;     /* per-layer, reused */
    int prepared, finished;
} gather_ctx;

static inline int gather_prepare(void *c, int layer, ct_pass pass, ct_layer_io *io, ct_err *err) {
    gather_ctx *g = c;
    int64_t at = 0;
    for (int s = 0; s < ct_param_layout_layer_specs(g->L, layer); s++) {
        const ct_param_view *v = &g->L->views[ct_param_layout_layer_view(g->L, layer, s)];
        if (!v->trainable) continue;
        memcpy(g->scratch + at, g->owner + v->offset, sizeof(float) * (size_t)v->numel);
        io->p[s] = g->scratch + at;
        if (pass == CT_PASS_BACKWARD) {
            memset(g->bucket + at, 0, sizeof(float) * (size_t)v->numel);
            io->dp[s] = g->bucket + at;
        }
        at += v->numel;
    }
    g->prepared++;
    return CT_OK;
}

static inline int gather_after(void *c, int layer, ct_pass pass, const ct_layer_io *io, ct_err *err) {
    gather_ctx *g = c;
    g->finished++;
    if (pass != CT_PASS_BACKWARD) return CT_OK;
    int64_t at = 0;
    for (int s = 0; s < ct_param_layout_layer_specs(g->L, layer); s++) {
        const ct_param_view *v = &g->L->views[ct_param_layout_layer_view(g->L, layer, s)];
        if (!v->trainable) continue;
        ck_assert(io->dp[s] == g->bucket + at);
        for (int64_t i = 0; i < v->numel; i++) g->owner_grads[v->offset + i] += g->bucket[at + i];
        at += v->numel;
    }
    return CT_OK;
}

/* The owner copy of r's parameters (its 5-initialised store) and its zeroed gradients, the
 * scratch and bucket; r's own flat parameters and gradients poisoned with NaN. */
static inline gather_ctx gather_start(runner *r, size_t np) {
    ct_param_store_init(r->store, 5);
    float *owner = malloc(sizeof(float) * np);
    memcpy(owner, r->params, sizeof(float) * np);
    gather_ctx g = {.L = ct_graph_layout(r->b.g), .owner = owner, .owner_grads = calloc(np, sizeof(float)),
                    .scratch = malloc(sizeof(float) * np), .bucket = malloc(sizeof(float) * np)};
    for (size_t i = 0; i < np; i++) r->params[i] = r->grads[i] = NAN;
    return g;
}

static inline void gather_stop(gather_ctx *g) {
    free((float *)g->owner), free(g->owner_grads), free(g->scratch), free(g->bucket);
}

/* The transformer_block shorthand expands into the layers of the same block written out (GPT-2
 * initialisation: weights normal(0, 0.02), the residual projections 0.02 / sqrt(2 * 2 blocks),
 * biases zero): the same views by name and shape, the same initial values and the same loss and
 * gradients bit for bit. */
#define GPT_HEAD "{\"input\": [8], \"layers\": [{\"type\": \"embedding\", \"name\": \"wte\", \"vocab\": 32, \"dim\": 16}," \
                 " {\"type\": \"position_embedding\", \"name\": \"wpe\", \"max_len\": 8}, {\"type\": \"repeat\", \"times\": 2, \"layers\": ["

#define GPT_TAIL "]}, {\"type\": \"layernorm\", \"name\": \"ln_f\"}, {\"type\": \"linear\", \"name\": \"head\", \"out\": 32," \
                 " \"bias\": false, \"tie\": \"wte.weight\"}], \"loss\": {\"type\": \"cross_entropy\"}}"

#define LIN(name, out, std) "{\"type\": \"linear\", \"name\": \"" name "\", \"out\": " #out ", \"init\": {\"type\": \"normal\"," \
                            " \"std\": " std "}, \"bias_init\": {\"type\": \"zeros\"}}"

/* llama_block expands into the layers of the same block written out (every linear normal(0,
 * 0.02), no biases, rmsnorm weights ones): the same views, initial values, loss and gradients bit
 * for bit; the whole model's gradients match finite differences. */
#define LLAMA_HEAD "{\"input\": [8], \"layers\": [{\"type\": \"embedding\", \"name\": \"wte\", \"vocab\": 32, \"dim\": 16}," \
                   " {\"type\": \"repeat\", \"times\": 2, \"layers\": ["

#define LLAMA_TAIL "]}, {\"type\": \"rmsnorm\", \"name\": \"norm\"}, {\"type\": \"linear\", \"name\": \"head\", \"out\": 32," \
                   " \"bias\": false}], \"loss\": {\"type\": \"cross_entropy\"}}"

#define LIN_NB(name, out, std) "{\"type\": \"linear\", \"name\": \"" name "\", \"out\": " #out ", \"bias\": false," \
                               " \"init\": {\"type\": \"normal\", \"std\": " std "}}"

#endif
