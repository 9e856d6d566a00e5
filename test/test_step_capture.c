/* test_step_capture.c: the capture/replay bookkeeping of core/train/step_capture.c, on the CPU
 * backend with a fake capture API (the CPU has none; the CUDA one needs a GPU and runs in
 * e2e_cuda_train.sh). The fake "capture" lets the ops run (a real capture only records them)
 * and remembers the step; its "replay" runs the remembered step again, so results stay
 * checkable:
 *   - the first micro-batch with a key runs directly, the second is captured, the next ones
 *     replay it, and their losses and gradients equal direct runs bit for bit;
 *   - a different n, loss_grad_scale or input pointer is a different key; a fifth key evicts the
 *     least recently used one and frees its capture;
 *   - a failed capture runs the step directly and is retried once; a key that fails twice turns
 *     capture off for the run;
 *   - train.cuda_graph true with a dropout layer is a config error naming the layer, auto turns
 *     itself off, and true on a backend without capture is a notice. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu/cpu.h"
#include "core/graph/graph.h"
#include "core/graph/layer.h"
#include "core/params/store.h"
#include "core/util/json.h"
#include "core/util/rng.h"
#include "core/train/step_capture.h"
#include "test/model_text.h"

/* ---- the fake capture API: state in the backend copy's impl wrapper ---- */

typedef struct fake_graph {
    ct_graph *g;
    ct_exec_bufs bufs;
    ct_step_io io;
    bool freed;
} fake_graph;

typedef struct fake {
    ct_backend be;               /* a copy of the CPU backend's table with capture ops added */
    ct_backend *cpu;
    bool capturing, fail_next;
    int begun, ended, freed;
    fake_graph graphs[16];
    int n_graphs;
    /* what the runner is about to capture (set by the test before each ct_step_run) */
    ct_graph *g;
    ct_exec_bufs bufs;
    ct_step_io *io;
} fake;

static fake *fake_of(ct_backend *be) { return (fake *)be; }

static int fake_begin(ct_backend *be, ct_err *err) {
    fake *f = fake_of(be);
    ck_assert(!f->capturing);
    f->capturing = true;
    f->begun++;
    return CT_OK;
}

static void *fake_end(ct_backend *be, ct_err *err) {
    fake *f = fake_of(be);
    ck_assert(f->capturing);
    f->capturing = false;
    f->ended++;
    if (f->fail_next) {
        f->fail_next = false;
        ct_errf(err, CT_ERR_RUNTIME, "fake capture failure");
        return NULL;
    }
    fake_graph *fg = &f->graphs[f->n_graphs++];
    *fg = (fake_graph){.g = f->g, .bufs = f->bufs, .io = *f->io};
    return fg;
}

/* Runs the remembered step again. After a capture the runner replays at once, so a captured
 * micro-batch adds its gradient twice here (once while "capturing"); runner_step accounts for it. */
static void fake_replay(ct_backend *be, void *graph) {
    fake_graph *fg = graph;
    ck_assert(!fg->freed);
    ct_err err = {0};
    ct_step_io io = fg->io;
    io.defer_loss = true;
    ck_assert(ct_graph_forward(fg->g, &fg->bufs, &io, NULL, &err) == CT_OK);
    ck_assert(ct_graph_backward(fg->g, &fg->bufs, &io, NULL, &err) == CT_OK);
}

static void fake_free(ct_backend *be, void *graph) {
    fake_graph *fg = graph;
    ck_assert(!fg->freed);
    fg->freed = true;
    fake_of(be)->freed++;
}

static fake *fake_create(void) {
    fake *f = calloc(1, sizeof *f);
    f->cpu = ct_cpu_backend_create(1);
    f->be = *f->cpu;
    f->be.capture.begin = fake_begin;
    f->be.capture.end = fake_end;
    f->be.capture.replay = fake_replay;
    f->be.capture.free = fake_free;
    return f;
}

static void fake_destroy(fake *f) {
    ct_backend_destroy(f->cpu);
    free(f);
}

/* ---- a small MLP on random data ---- */

typedef struct model {
    ct_config cfg;
    ct_json_doc *doc;
    ct_graph *g;
    ct_param_store *store;
    float *params, *grads, *input[2];   /* params, grads: the store's (fp32) */
    int32_t labels[8];
} model;

static const char *mlp = "{\"input\": [6], \"layers\": [{\"type\": \"linear\", \"out\": 5},"
                         "{\"type\": \"relu\"}, {\"type\": \"linear\", \"out\": 3}],"
                         "\"loss\": {\"type\": \"cross_entropy\"}}";
static const char *deep_mlp = "{\"input\": [6], \"layers\": [{\"type\": \"linear\", \"out\": 5}, {\"type\": \"relu\"},"
                             "{\"type\": \"linear\", \"out\": 5}, {\"type\": \"relu\"}, {\"type\": \"linear\", \"out\": 5},"
                             "{\"type\": \"relu\"}, {\"type\": \"linear\", \"out\": 5}, {\"type\": \"relu\"},"
                             "{\"type\": \"linear\", \"out\": 5}, {\"type\": \"relu\"}, {\"type\": \"linear\", \"out\": 5},"
                             "{\"type\": \"relu\"}, {\"type\": \"linear\", \"out\": 3}], \"loss\": {\"type\": \"cross_entropy\"}}";
static const char *with_dropout = "{\"input\": [6], \"layers\": [{\"type\": \"linear\", \"out\": 5},"
                                  "{\"type\": \"dropout\", \"name\": \"drop\", \"p\": 0.1},"
                                  "{\"type\": \"linear\", \"out\": 3}],"
                                  "\"loss\": {\"type\": \"cross_entropy\"}}";

/* Build `text` on be with activation_checkpointing.number_checkpoints and cpu_checkpointing. */
static void model_build_ckpt(model *m, const char *text, ct_backend *be, long n_checkpoints, bool offload) {
    memset(m, 0, sizeof *m);
    m->cfg.pending.number_checkpoints = n_checkpoints;
    m->cfg.pending.cpu_checkpointing = offload;
    ct_err err = {0};
    model_text(text, &m->cfg, &m->doc);
    ck_assert_msg(ct_graph_build(&m->cfg, 8, CT_F32, &m->g, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ct_graph_bind(m->g, be, NULL, &err), CT_OK);
    const ct_param_layout *L = ct_graph_layout(m->g);
    ck_assert_int_eq(ct_param_store_create(L, be, CT_F32, 0, L->n_params, CT_STORE_WHOLE, &m->store, &err), CT_OK);
    ct_param_store_init(m->store, 3);
    m->params = m->store->master, m->grads = m->store->grads;
    ct_rng r;
    ct_rng_init(&r, 11, CT_RNG_AUGMENT, 0);
    for (int k = 0; k < 2; k++) {
        m->input[k] = malloc(8 * 6 * sizeof(float));
        for (int i = 0; i < 48; i++) m->input[k][i] = (float)ct_rng_normal(&r);
    }
    for (int i = 0; i < 8; i++) m->labels[i] = (int32_t)(ct_rng_below(&r, 3));
}

static void model_build(model *m, const char *text, ct_backend *be) { model_build_ckpt(m, text, be, 0, false); }

static void model_free(model *m) {
    ct_graph_free(m->g);
    ct_json_free(m->doc);
    ct_param_store_free(m->store);
    free(m->input[0]), free(m->input[1]);
}

static ct_exec_bufs bufs_of(const model *m) { return (ct_exec_bufs){.params = m->params, .grads = m->grads}; }

static ct_step_io step_io(model *m, int which, int64_t n, float scale) {
    return (ct_step_io){.input = m->input[which], .target = m->labels, .n = n, .train = true,
                        .seed = 1, .loss_grad_scale = scale};
}

/* Loss and gradient of a direct (uncaptured) run from zero gradients. */
static float direct(model *m, int which, int64_t n, float scale, float *grads_out) {
    int64_t np = ct_graph_info_get(m->g)->n_params;
    memset(m->grads, 0, (size_t)np * sizeof(float));
    ct_step_io io = step_io(m, which, n, scale);
    ct_err err = {0};
    ct_exec_bufs b = bufs_of(m);
    ck_assert(ct_graph_forward(m->g, &b, &io, NULL, &err) == CT_OK);
    ck_assert(ct_graph_backward(m->g, &b, &io, NULL, &err) == CT_OK);
    memcpy(grads_out, m->grads, (size_t)np * sizeof(float));
    return io.loss;
}

/* One runner step from zero gradients; the fake learns what it would capture. A step that was
 * captured ran its ops twice with the fake (capture, then replay): its gradient is halved back,
 * which is exact in binary floating point. */
static float runner_step(ct_step_runner *r, fake *f, model *m, int which, int64_t n, float scale) {
    int64_t np = ct_graph_info_get(m->g)->n_params;
    memset(m->grads, 0, (size_t)np * sizeof(float));
    ct_step_io io = step_io(m, which, n, scale);
    f->g = m->g, f->bufs = bufs_of(m), f->io = &io;
    long captures = r->captures;
    ct_err err = {0};
    ck_assert_msg(ct_step_run(r, &f->bufs, &io, NULL, &err) == CT_OK, "%s", err.msg);
    if (r->captures != captures)
        for (int64_t i = 0; i < np; i++) m->grads[i] *= 0.5f;
    ct_graph_read_loss(m->g, &io);
    return io.loss;
}

/* The fake backend, the MLP on it and a runner with train.cuda_graph = mode; *want gets room for
 * one gradient. */
static fake *start(model *m, ct_step_runner *r, int mode, float **want) {
    fake *f = fake_create();
    model_build(m, mlp, &f->be);
    *want = malloc((size_t)ct_graph_info_get(m->g)->n_params * sizeof(float));
    char notice[128];
    ct_err err = {0};
    ck_assert(ct_step_runner_init(r, &f->be, m->g, mode, notice, sizeof notice, &err) == CT_OK);
    ck_assert(r->capture && notice[0] == '\0');
    return f;
}

START_TEST(capture_then_replay_matches_direct) {
    model m;
    ct_step_runner r;
    float *want;
    fake *f = start(&m, &r, CT_CUDA_GRAPH_AUTO, &want);
    int64_t np = ct_graph_info_get(m.g)->n_params;
    /* key A three times: direct, captured + replayed, replayed; the direct results each time */
    for (int k = 0; k < 3; k++) {
        float wl = direct(&m, 0, 8, 0.5f, want);
        float l = runner_step(&r, f, &m, 0, 8, 0.5f);
        ck_assert_msg(l == wl, "loss %g vs direct %g", (double)l, (double)wl);
        for (int64_t i = 0; i < np; i++) ck_assert_msg(m.grads[i] == want[i], "grad %lld", (long long)i);
        ck_assert_int_eq(r.captures, k == 0 ? 0 : 1);
        ck_assert_int_eq(r.replays, k);
    }
    /* other n, other scale, other input pointer: three more keys, each captured on its second use */
    for (int k = 0; k < 2; k++) {
        runner_step(&r, f, &m, 0, 5, 0.5f);
        runner_step(&r, f, &m, 0, 8, 0.25f);
        float wl = direct(&m, 1, 8, 0.5f, want);
        ck_assert(runner_step(&r, f, &m, 1, 8, 0.5f) == wl);
        for (int64_t i = 0; i < np; i++) ck_assert(m.grads[i] == want[i]);
    }
    ck_assert_int_eq(r.captures, 4);
    ck_assert_int_eq(f->freed, 0);
    runner_step(&r, f, &m, 0, 8, 0.5f);   /* key A again: a replay, A is now the most recent */
    ck_assert_int_eq(r.captures, 4);
    ck_assert_int_eq(r.replays, 6);
    /* a fifth key evicts the least recently used (n = 5, the second capture) and frees it */
    runner_step(&r, f, &m, 1, 7, 0.5f);
    ck_assert_int_eq(f->freed, 1);
    ck_assert(f->graphs[1].freed);
    runner_step(&r, f, &m, 0, 8, 0.5f);   /* key A still there: a replay */
    ck_assert_int_eq(r.captures, 4);
    ck_assert_int_eq(r.replays, 7);
    ct_step_runner_reset(&r);
    ck_assert_int_eq(f->freed, 4);   /* A, C, D; the fifth key was never captured */
    free(want);
    model_free(&m);
    fake_destroy(f);
}
END_TEST

/* One runner step with the fake primed, no correction of the gradient; returns the loss. */
static float raw_step(ct_step_runner *r, fake *f, model *m, int64_t n) {
    memset(m->grads, 0, (size_t)ct_graph_info_get(m->g)->n_params * sizeof(float));
    ct_step_io io = step_io(m, 0, n, 1.0f);
    f->g = m->g, f->bufs = bufs_of(m), f->io = &io;
    ct_err err = {0};
    ck_assert_msg(ct_step_run(r, &f->bufs, &io, NULL, &err) == CT_OK, "%s", err.msg);
    ct_graph_read_loss(m->g, &io);
    return io.loss;
}

START_TEST(failed_capture_retried_then_off) {
    model m;
    ct_step_runner r;
    float *want;
    fake *f = start(&m, &r, CT_CUDA_GRAPH_ON, &want);
    int64_t np = ct_graph_info_get(m.g)->n_params;
    runner_step(&r, f, &m, 0, 8, 1.0f);   /* key A, first sight: direct */
    ck_assert_int_eq(f->begun, 0);
    /* A's first capture fails: the step runs directly (the fake also ran the ops while
     * "capturing": two contributions) and capture stays on */
    float wl = direct(&m, 0, 8, 1.0f, want);
    f->fail_next = true;
    ck_assert(raw_step(&r, f, &m, 8) == wl);
    for (int64_t i = 0; i < np; i++) ck_assert(m.grads[i] == 2 * want[i]);
    ck_assert(r.capture && r.captures == 0 && r.replays == 0 && f->begun == 1);
    /* the retry succeeds */
    ck_assert(runner_step(&r, f, &m, 0, 8, 1.0f) == wl);
    ck_assert(r.captures == 1 && r.replays == 1 && f->begun == 2);
    /* key B fails both of its tries: capture is off for the run and A's graph is freed */
    raw_step(&r, f, &m, 5);
    f->fail_next = true;
    raw_step(&r, f, &m, 5);
    ck_assert(r.capture && f->begun == 3);
    f->fail_next = true;
    raw_step(&r, f, &m, 5);
    ck_assert(!r.capture && f->begun == 4 && f->freed == 1);
    /* from now on: direct runs, no capture attempts */
    ck_assert(raw_step(&r, f, &m, 8) == wl);
    for (int64_t i = 0; i < np; i++) ck_assert(m.grads[i] == want[i]);
    ck_assert_int_eq(f->begun, 4);
    free(want);
    model_free(&m);
    fake_destroy(f);
}
END_TEST

START_TEST(policy_dropout_and_cpu) {
    fake *f = fake_create();
    model m;
    model_build(&m, with_dropout, &f->be);
    ct_step_runner r;
    char notice[128];
    ct_err err = {0};
    ck_assert_int_eq(ct_step_runner_init(&r, &f->be, m.g, CT_CUDA_GRAPH_ON, notice, sizeof notice, &err),
                     CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "\"drop\"") && strstr(err.msg, "train.cuda_graph"), "%s", err.msg);
    ck_assert(ct_step_runner_init(&r, &f->be, m.g, CT_CUDA_GRAPH_AUTO, notice, sizeof notice, &err) == CT_OK);
    ck_assert(!r.capture && notice[0] == '\0');
    model_free(&m);
    /* the plain CPU backend: true is a notice, auto is silent, both run directly */
    model_build(&m, mlp, f->cpu);
    ck_assert(ct_step_runner_init(&r, f->cpu, m.g, CT_CUDA_GRAPH_ON, notice, sizeof notice, &err) == CT_OK);
    ck_assert(!r.capture && strstr(notice, "cannot capture"));
    ck_assert(ct_step_runner_init(&r, f->cpu, m.g, CT_CUDA_GRAPH_AUTO, notice, sizeof notice, &err) == CT_OK);
    ck_assert(!r.capture && notice[0] == '\0');
    model_free(&m);
    /* activation offload copies from the host every step: never captured, and true says why */
    model_build_ckpt(&m, deep_mlp, &f->be, 6, true);
    ck_assert(ct_graph_offloads(m.g));
    ck_assert(ct_step_runner_init(&r, &f->be, m.g, CT_CUDA_GRAPH_AUTO, notice, sizeof notice, &err) == CT_OK);
    ck_assert(!r.capture && notice[0] == '\0');
    ck_assert(ct_step_runner_init(&r, &f->be, m.g, CT_CUDA_GRAPH_ON, notice, sizeof notice, &err) == CT_OK);
    ck_assert_msg(!r.capture && strstr(notice, "cpu_checkpointing"), "%s", notice);
    model_free(&m);
    fake_destroy(f);
}
END_TEST

/* The executor hooks reach every layer through the runner; hooks that do host work keep a step
 * from being captured (a replay would not repeat them), device-only hooks are captured with it. */
typedef struct hook_count {
    int prepare, after;
} hook_count;
static int count_prepare(void *c, int l, ct_pass pass, ct_layer_io *io, ct_err *err) {
    ((hook_count *)c)->prepare++;
    return CT_OK;
}
static int count_after(void *c, int l, ct_pass pass, const ct_layer_io *io, ct_err *err) {
    ((hook_count *)c)->after++;
    return CT_OK;
}

START_TEST(hooks_through_the_runner) {
    model m;
    ct_step_runner r;
    float *want;
    fake *f = start(&m, &r, CT_CUDA_GRAPH_AUTO, &want);
    hook_count c = {0};
    ct_exec_hooks hooks = {.ctx = &c, .prepare = count_prepare, .after = count_after, .host_work = true};
    ct_err err = {0};
    for (int k = 0; k < 4; k++) {   /* one key, four times: would be captured without host work */
        ct_step_io io = step_io(&m, 0, 8, 1.0f);
        f->g = m.g, f->bufs = bufs_of(&m), f->io = &io;
        ck_assert_msg(ct_step_run(&r, &f->bufs, &io, &hooks, &err) == CT_OK, "%s", err.msg);
    }
    /* 3 layers forward and backward, 4 steps, no capture begun */
    ck_assert_int_eq(c.prepare, 24);
    ck_assert_int_eq(c.after, 24);
    ck_assert_int_eq(f->begun, 0);
    ck_assert_int_eq(r.captures, 0);
    /* device-only hooks: the second sight of the key is captured, the hooks run inside it */
    hooks.host_work = false;
    for (int k = 0; k < 2; k++) {
        ct_step_io io = step_io(&m, 1, 8, 1.0f);
        f->g = m.g, f->bufs = bufs_of(&m), f->io = &io;
        ck_assert_msg(ct_step_run(&r, &f->bufs, &io, &hooks, &err) == CT_OK, "%s", err.msg);
    }
    ck_assert_int_eq(f->begun, 1);
    ck_assert_int_eq(r.captures, 1);
    free(want);
    model_free(&m);
    fake_destroy(f);
}
END_TEST

static int refuse(void *c, int l, ct_pass pass, ct_layer_io *io, ct_err *err) {
    return l == 1 ? ct_errf(err, CT_ERR_RUNTIME, "gather of layer %d failed", l) : CT_OK;
}

START_TEST(failing_hook_stops_the_step) {
    model m;
    ct_step_runner r;
    float *want;
    fake *f = start(&m, &r, CT_CUDA_GRAPH_AUTO, &want);
    ct_exec_hooks hooks = {.prepare = refuse};
    ct_step_io io = step_io(&m, 0, 8, 1.0f);
    ct_exec_bufs b = bufs_of(&m);
    ct_err err = {0};
    ck_assert_int_eq(ct_step_run(&r, &b, &io, &hooks, &err), CT_ERR_RUNTIME);
    ck_assert_str_eq(err.msg, "gather of layer 1 failed");
    free(want);
    model_free(&m);
    fake_destroy(f);
}
END_TEST

int main(void) {
    Suite *s = suite_create("step_capture");
    TCase *tc = tcase_create("runner");
    tcase_add_test(tc, capture_then_replay_matches_direct);
    tcase_add_test(tc, failed_capture_retried_then_off);
    tcase_add_test(tc, policy_dropout_and_cpu);
    tcase_add_test(tc, hooks_through_the_runner);
    tcase_add_test(tc, failing_hook_stops_the_step);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
