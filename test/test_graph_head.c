/* test_graph_head.c: the chunked LM head (model.loss.chunk_rows, exec.c): the same loss and
 * gradients as the whole head (finite differences too), bitwise across threads, fp16's loss scale
 * and accumulation, the logits generation reads, its config, the hooks around it, and ignored
 * labels. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test/graph_fixture.h"

/* ---- the chunked LM head (model.loss.chunk_rows) ---- */

/* A small language model ending in a linear head over a padded vocabulary (37 classes in 40
 * outputs), label smoothing on; %s is the loss's chunk_rows field. Tied: the head is the
 * embedding's table, no bias; untied: a head of its own with a bias, after an MLP. */
static const char *lm_tied =
    "{\"input\": [6], \"layers\": [{\"type\": \"embedding\", \"name\": \"wte\", \"vocab\": 40, \"dim\": 16},"
    " {\"type\": \"position_embedding\", \"name\": \"wpe\", \"max_len\": 6}, {\"type\": \"layernorm\", \"name\": \"ln\"},"
    " {\"type\": \"linear\", \"name\": \"head\", \"out\": 40, \"bias\": false, \"tie\": \"wte.weight\"}],"
    " \"loss\": {\"type\": \"cross_entropy\", \"classes\": 37, \"label_smoothing\": 0.1%s}}";

static const char *lm_untied =
    "{\"input\": [6], \"layers\": [{\"type\": \"embedding\", \"name\": \"wte\", \"vocab\": 40, \"dim\": 16},"
    " {\"type\": \"position_embedding\", \"name\": \"wpe\", \"max_len\": 6},"
    " {\"type\": \"linear\", \"name\": \"fc\", \"out\": 24}, {\"type\": \"gelu\"}, {\"type\": \"linear\", \"out\": 16},"
    " {\"type\": \"layernorm\", \"name\": \"ln\"}, {\"type\": \"linear\", \"name\": \"head\", \"out\": 40}],"
    " \"loss\": {\"type\": \"cross_entropy\", \"classes\": 37, \"label_smoothing\": 0.1%s}}";

enum { LM_N = 4, LM_T = 6 };   /* 24 rows of logits: chunks of 5 leave a last chunk of 4 */

/* The model text with its chunk_rows field (a static buffer per call site's copy). */
static char *lm_with(const char *model, const char *chunk_rows) {
    char field[64] = "";
    if (chunk_rows) snprintf(field, sizeof field, ", \"chunk_rows\": %s", chunk_rows);
    size_t n = strlen(model) + sizeof field;
    char *out = malloc(n);
    snprintf(out, n, model, field);
    return out;
}

/* got against want: the relative L2 difference of the gradients and of the loss. Chunking changes
 * the order dW is summed in (chunk by chunk) and each chunk's mean, so not bitwise. */
static void expect_close(const runner *got, const runner *want, double tol, const char *what) {
    const ct_graph_info *in = ct_graph_info_get(want->b.g);
    double num = 0, den = 0;
    int64_t nonzero = 0;
    for (int64_t i = 0; i < in->n_params; i++) {
        double d = (double)got->grads[i] - want->grads[i];
        num += d * d;
        den += (double)want->grads[i] * want->grads[i];
        nonzero += want->grads[i] != 0.0f;
    }
    ck_assert_msg(nonzero > in->n_params / 2, "%s: only %lld of %lld gradients non-zero", what, (long long)nonzero,
                  (long long)in->n_params);
    ck_assert_msg(sqrt(num / den) <= tol, "%s: gradients differ by %.3g (relative), tolerance %.3g", what,
                  sqrt(num / den), tol);
    ck_assert_msg(fabs((double)got->io.loss - want->io.loss) <= tol * fabs((double)want->io.loss),
                  "%s: loss %.9g, unchunked %.9g", what, got->io.loss, want->io.loss);
}

/* Two accumulating micro-steps (other samples' dropout streams: none here) of the model with and
 * without chunks: same loss and gradients within fp32 rounding, and the plan's chunk is what the
 * arena holds. */
static void expect_chunked_like_whole(const char *model, long n_checkpoints, bool offload, const char *what) {
    char *whole = lm_with(model, "0"), *chunked = lm_with(model, "5");
    runner a, c;
    runner_start_ckpt(&a, whole, LM_N, 11, n_checkpoints, offload);
    runner_start_ckpt(&c, chunked, LM_N, 11, n_checkpoints, offload);
    const ct_act_plan *pa = ct_graph_plan(a.b.g), *pc = ct_graph_plan(c.b.g);
    ck_assert_int_eq(pa->head_chunk, 0);
    ck_assert_int_eq(pc->head_chunk, 5);
    ck_assert_int_eq(pc->head_rows, LM_N * LM_T);
    ck_assert_int_eq(pc->head_logits, 5 * 40 * sizeof(float));
    ck_assert_int_eq(pa->head_logits, LM_N * LM_T * 40 * sizeof(float));
    /* never more (fewer where the logits make the peak: not always at this size) */
    ck_assert_msg(pc->total <= pa->total, "%s: chunked arena %zu, whole %zu", what, pc->total, pa->total);
    if (n_checkpoints == 0)
        ck_assert_msg(pc->total < pa->total, "%s: chunked arena %zu, whole %zu", what, pc->total, pa->total);
    for (int step = 0; step < 2; step++) {   /* the second accumulates onto the first */
        a.io.step = c.io.step = (uint64_t)step;
        a.io.loss_grad_scale = c.io.loss_grad_scale = step ? 0.25f : 0.75f;
        runner_loss(&a), runner_loss(&c);
        runner_backward(&a, NULL), runner_backward(&c, NULL);
        expect_close(&c, &a, 2e-6, what);
    }
    /* eval: the same loss and correct predictions, no gradient */
    a.io.train = c.io.train = false;
    runner_loss(&a), runner_loss(&c);
    ck_assert_int_eq(c.io.correct, a.io.correct);
    ck_assert_msg(fabs((double)c.io.loss - a.io.loss) <= 2e-6 * a.io.loss, "%s eval: %.9g vs %.9g", what, c.io.loss,
                  a.io.loss);
    /* the arena the CPU backend measured is the plan's */
    ct_mem_stats ms;
    c.b.be->mem.mem_stats(c.b.be, &ms);
    ck_assert_msg(ms.peak[CT_MEM_ACTIVATIONS] == pc->total, "%s: measured activation peak %zu, planned %zu", what,
                  ms.peak[CT_MEM_ACTIVATIONS], pc->total);
    runner_stop(&a), runner_stop(&c);
    free(whole), free(chunked);
}

START_TEST(chunked_head_matches_whole) {
    expect_chunked_like_whole(lm_tied, 0, false, "tied head");
    expect_chunked_like_whole(lm_untied, 0, false, "untied head with bias");
    /* checkpointed segments below the head, their kept outputs offloaded or not */
    expect_chunked_like_whole(lm_untied, 2, false, "two checkpointed segments");
    expect_chunked_like_whole(lm_untied, 3, true, "three segments, offloaded");
}
END_TEST

START_TEST(chunked_head_finite_differences) {
    char *tied = lm_with(lm_tied, "5"), *untied = lm_with(lm_untied, "7");
    check_graph_grads(tied, LM_N, 1e-2, 2e-2);
    check_graph_grads(untied, LM_N, 1e-2, 2e-2);
    free(tied), free(untied);
}
END_TEST

/* One thread or two: the same bits, chunked. */
START_TEST(chunked_head_threads_bitwise) {
    char *text = lm_with(lm_untied, "5");
    runner a, b;
    runner_start_on(&a, text, LM_N, 3, 0, false, CT_F32, 1);
    runner_start_on(&b, text, LM_N, 3, 0, false, CT_F32, 2);
    runner_loss(&a), runner_loss(&b);
    runner_backward(&a, NULL), runner_backward(&b, NULL);
    ck_assert_mem_eq(&a.io.loss, &b.io.loss, sizeof(float));
    ck_assert_mem_eq(a.grads, b.grads, sizeof(float) * (size_t)ct_graph_info_get(a.b.g)->n_params);
    runner_stop(&a), runner_stop(&b);
    free(text);
}
END_TEST

/* Under fp16 the loss scale is folded into each chunk's gradient before its 16-bit store, as the
 * whole head's: two accumulating micro-steps at scale 1024 (weights 3/4 and 1/4, as gradient
 * accumulation gives) against the fp32 model's gradients times the scale. */
START_TEST(chunked_head_fp16_loss_scale_and_accumulation) {
    char *chunked = lm_with(lm_untied, "5"), *whole = lm_with(lm_untied, "0");
    runner h, w, ref;
    runner_start_on(&h, chunked, LM_N, 5, 0, false, CT_F16, 1);
    runner_start_on(&w, whole, LM_N, 5, 0, false, CT_F16, 1);
    runner_start(&ref, whole, LM_N, 5);
    const float scale = 1024.0f;
    for (int step = 0; step < 2; step++) {
        float part = step ? 0.25f : 0.75f;
        h.io.step = w.io.step = ref.io.step = (uint64_t)step;
        h.io.loss_grad_scale = w.io.loss_grad_scale = part * scale;
        ref.io.loss_grad_scale = part;
        runner_loss(&h), runner_loss(&w), runner_loss(&ref);
        runner_backward(&h, NULL), runner_backward(&w, NULL), runner_backward(&ref, NULL);
    }
    int64_t n = ct_graph_info_get(ref.b.g)->n_params;
    for (int64_t i = 0; i < n; i++) h.grads[i] /= scale, w.grads[i] /= scale;
    /* fp16 activations: 2^-11 per rounding, a few roundings deep */
    ref.io.loss = h.io.loss;   /* the losses are each micro-batch's: compared below */
    expect_close(&h, &ref, 1e-2, "fp16 chunked vs fp32");
    ref.io.loss = w.io.loss;
    expect_close(&w, &ref, 1e-2, "fp16 whole vs fp32");
    expect_close(&h, &w, 1e-2, "fp16 chunked vs fp16 whole");
    ck_assert_msg(fabs((double)h.io.loss - w.io.loss) <= 2e-3 * w.io.loss, "fp16 loss %.6g, whole %.6g", h.io.loss,
                  w.io.loss);
    runner_stop(&h), runner_stop(&w), runner_stop(&ref);
    free(chunked), free(whole);
}
END_TEST

/* Generation reads the logits of a row: computed by the chunked head on demand, the same as the
 * whole head's after an eval-mode forward; a forward without a target stops before the head. */
START_TEST(chunked_head_logits_for_generation) {
    char *chunked = lm_with(lm_tied, "5"), *whole = lm_with(lm_tied, "0");
    runner c, w;
    runner_start(&c, chunked, LM_N, 9);
    runner_start(&w, whole, LM_N, 9);
    c.io.train = w.io.train = false;
    runner_loss(&w);
    ct_step_io untargeted = c.io;
    untargeted.target = NULL;
    ct_exec_bufs bc = runner_bufs(&c), bw = runner_bufs(&w);
    ct_err err = {0};
    ck_assert_msg(ct_graph_forward_range(c.b.g, 0, 4, CT_PASS_FORWARD, &bc, &untargeted, NULL, &err) == CT_OK, "%s",
                  err.msg);
    for (int64_t row = 0; row < LM_N * LM_T; row += 7) {
        const float *got = ct_graph_logits(c.b.g, &bc, row, 1, &err), *want = ct_graph_logits(w.b.g, &bw, row, 1, &err);
        ck_assert_ptr_nonnull(got);
        ck_assert_ptr_nonnull(want);
        for (int k = 0; k < 40; k++)
            ck_assert_msg(fabsf(got[k] - want[k]) <= 1e-5f * (1.0f + fabsf(want[k])), "row %lld logit %d: %g vs %g",
                          (long long)row, k, (double)got[k], (double)want[k]);
    }
    /* more rows than a chunk, or past the micro-batch: an error, not a write past the buffer */
    ck_assert_ptr_null(ct_graph_logits(c.b.g, &bc, 0, 6, &err));
    ck_assert_int_eq(err.code, CT_ERR_RUNTIME);
    ck_assert_ptr_null(ct_graph_logits(w.b.g, &bw, LM_N * LM_T - 1, 2, &err));
    /* a train-mode forward needs its target */
    untargeted.train = true;
    ck_assert_int_eq(ct_graph_forward_range(c.b.g, 0, 4, CT_PASS_FORWARD, &bc, &untargeted, NULL, &err), CT_ERR_RUNTIME);
    runner_stop(&c), runner_stop(&w);
    free(chunked), free(whole);
}
END_TEST

/* "auto" chunks only a head whose whole logits pass 32 MiB; a number asks for it, so a model that
 * cannot chunk its head says why. */
START_TEST(chunked_head_config) {
    built b;
    char *text = lm_with(lm_tied, NULL);
    build(&b, text, 4);   /* auto, tiny logits: whole */
    ck_assert_int_eq(b.rc, CT_OK);
    ck_assert_int_eq(ct_graph_plan(b.g)->head_chunk, 0);
    unbuild(&b);
    free(text);
    /* 2048 x 6 rows of 1000 fp32 logits: 46.9 MiB whole, so chunks of the most rows (a multiple of
     * 64) whose logits fit in 32 MiB */
    const char *big = "{\"input\": [6], \"layers\": [{\"type\": \"embedding\", \"vocab\": 1000, \"dim\": 8},"
                      " {\"type\": \"linear\", \"out\": 1000}], \"loss\": {\"type\": \"cross_entropy\"}}";
    memset(&b, 0, sizeof b);
    model_text(big, &b.cfg, &b.doc);
    ck_assert_int_eq(ct_graph_build(&b.cfg, 2048, CT_F32, &b.g, &b.err), CT_OK);
    const ct_act_plan *p = ct_graph_plan(b.g);
    ck_assert_int_eq(p->head_chunk, (int64_t)((32 << 20) / 4000) / 64 * 64);
    ck_assert_int_eq(p->head_rows, 2048 * 6);
    ck_assert_uint_le(p->head_logits, (size_t)32 << 20);
    ct_graph_free(b.g);
    ct_json_free(b.doc);
    /* more rows than the micro-batch has: one chunk of all of them */
    text = lm_with(lm_tied, "1000");
    build(&b, text, 4);
    ck_assert_int_eq(ct_graph_plan(b.g)->head_chunk, LM_N * LM_T);
    unbuild(&b);
    free(text);
    EXPECT_ERROR("{\"input\": [6], \"layers\": [{\"type\": \"linear\", \"out\": 5}],"
                 " \"loss\": {\"type\": \"mse\", \"chunk_rows\": 4}}", "m.json:1:", "model.loss.chunk_rows",
                 "cross_entropy", "linear", "\"auto\" or 0");
    EXPECT_ERROR("{\"input\": [6], \"layers\": [{\"type\": \"linear\", \"out\": 5}, {\"type\": \"tanh\", \"name\": \"t\"}],"
                 " \"loss\": {\"type\": \"cross_entropy\", \"chunk_rows\": 4}}", "model.loss.chunk_rows", "\"t\" (tanh)");
    EXPECT_ERROR("{\"input\": [6], \"layers\": [{\"type\": \"linear\", \"out\": 5}],"
                 " \"loss\": {\"type\": \"cross_entropy\", \"chunk_rows\": \"big\"}}", "model.loss.chunk_rows",
                 "\"auto\", 0 (off) or a number of rows");
    EXPECT_ERROR("{\"input\": [6], \"layers\": [{\"type\": \"linear\", \"out\": 5}],"
                 " \"loss\": {\"type\": \"cross_entropy\", \"chunk_rows\": -3}}", "model.loss.chunk_rows");
    EXPECT_ERROR("{\"input\": [6], \"layers\": [{\"type\": \"linear\", \"out\": 5}],"
                 " \"loss\": {\"type\": \"cross_entropy\", \"chunk_rowz\": 3}}", "chunk_rowz", "chunk_rows");
}
END_TEST

/* ZeRO's seam with a chunked head: the head's work runs between the hooks of its backward pass
 * (gathered parameters, a gradient bucket), during forward; backward does not call them again.
 * Untied, so the owner's gradients are those without hooks bit for bit. */
START_TEST(chunked_head_hooks) {
    char *text = lm_with(lm_untied, "5");
    runner r;
    runner_start(&r, text, LM_N, 5);
    const ct_graph_info *in = ct_graph_info_get(r.b.g);
    snapshot want = one_pass(&r);
    size_t np = (size_t)in->n_params;
    gather_ctx g = gather_start(&r, np);
    ct_exec_hooks hooks = {.ctx = &g, .prepare = gather_prepare, .after = gather_after};
    ct_exec_bufs b = runner_bufs(&r);
    ct_err err = {0};
    ck_assert_msg(ct_graph_forward(r.b.g, &b, &r.io, &hooks, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(g.prepared, in->n_layers);
    ck_assert_msg(ct_graph_backward(r.b.g, &b, &r.io, &hooks, &err) == CT_OK, "%s", err.msg);
    /* every layer forward and backward, but the head once */
    ck_assert_int_eq(g.prepared, 2 * in->n_layers - 1);
    ck_assert_int_eq(g.finished, 2 * in->n_layers - 1);
    memcpy(r.grads, g.owner_grads, sizeof(float) * np);
    expect_same(&r, &want, "chunked head between hooks");
    gather_stop(&g);
    snap_free(&want);
    runner_stop(&r);
    free(text);
}
END_TEST

/* Ignored labels (outside [0, classes)): each chunk's mean leaves out its own, and chunks count by
 * their rows (docs/config.md). Against that rule computed on the host from the whole head's
 * logits: chunk 0 has two ignored rows, chunk 2 all five, the others none. */
START_TEST(chunked_head_ignored_labels) {
    char *chunked = lm_with(lm_tied, "5"), *whole = lm_with(lm_tied, "0");
    runner c, w;
    runner_start(&c, chunked, LM_N, 13);
    runner_start(&w, whole, LM_N, 13);
    int32_t *labels = c.target;
    const int ignored[] = {1, 3, 10, 11, 12, 13, 14};
    for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++) labels[ignored[i]] = i % 2 ? -1 : 37;
    memcpy(w.target, c.target, sizeof(int32_t) * LM_N * LM_T);
    c.io.train = w.io.train = false;
    runner_loss(&w);
    runner_loss(&c);
    const float *logits = ct_graph_activation(w.b.g, 3);   /* [24, 40] after the eval forward */
    const double eps = 0.1;
    const int rows = LM_N * LM_T, chunk = 5, classes = 37;
    double want = 0;
    for (int r0 = 0; r0 < rows; r0 += chunk) {
        int r1 = r0 + chunk < rows ? r0 + chunk : rows, valid = 0;
        double sum = 0;
        for (int r = r0; r < r1; r++) {
            if (labels[r] < 0 || labels[r] >= classes) continue;
            const float *x = logits + r * 40;
            double mx = x[0], se = 0, sx = 0;
            for (int k = 1; k < classes; k++) mx = x[k] > mx ? x[k] : mx;
            for (int k = 0; k < classes; k++) se += exp(x[k] - mx), sx += x[k];
            double lse = mx + log(se);
            sum += (1 - eps) * (lse - x[labels[r]]) + eps * (lse - sx / classes);
            valid++;
        }
        if (valid) want += (double)(r1 - r0) / rows * (sum / valid);
    }
    ck_assert_msg(fabs(c.io.loss - want) <= 1e-5 * want, "chunked loss %.9g, the rule %.9g", c.io.loss, want);
    /* and not the whole head's mean over all labelled rows (the rule differs when a chunk has some) */
    ck_assert_msg(fabs(c.io.loss - w.io.loss) > 1e-4 * w.io.loss, "chunked %.9g, whole %.9g", c.io.loss, w.io.loss);
    runner_stop(&c), runner_stop(&w);
    free(chunked), free(whole);
}
END_TEST

int main(void) {
    Suite *s = suite_create("graph_head");
    TCase *tc = tcase_create("graph_head");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, chunked_head_matches_whole);
    tcase_add_test(tc, chunked_head_finite_differences);
    tcase_add_test(tc, chunked_head_threads_bitwise);
    tcase_add_test(tc, chunked_head_fp16_loss_scale_and_accumulation);
    tcase_add_test(tc, chunked_head_logits_for_generation);
    tcase_add_test(tc, chunked_head_config);
    tcase_add_test(tc, chunked_head_hooks);
    tcase_add_test(tc, chunked_head_ignored_labels);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
