/* test_graph_memory.c: the activation plan against the step (plan.c, lifetime.c, segments.c,
 * offload.c): activation checkpointing bit for bit as keeping everything in less memory, the
 * recompute running what backward reads and no more, bytes the plan calls free never read (poisoned
 * before each layer), the lifetime placement never overlapping, and activation offload
 * (cpu_checkpointing) bit for bit with fewer device bytes. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test/graph_fixture.h"

/* ---- activation checkpointing: the same bits as keeping everything, in less memory ---- */

#define CK ", \"checkpoint\": true"

/* `text` without its checkpoint marks (a malloc'd copy). */
static char *strip_marks(const char *text) {
    char *out = strdup(text), *at;
    while ((at = strstr(out, CK))) memmove(at, at + strlen(CK), strlen(at + strlen(CK)) + 1);
    return out;
}

/* Two micro-steps of a and of c from the same state (the second accumulates, with other dropout
 * masks): loss, gradients and running statistics of c equal a's bit for bit after each. */
static void expect_two_steps_same(runner *a, runner *c, const char *what) {
    snapshot want = one_pass(a), got = one_pass(c);
    expect_same(c, &want, what);
    a->io.step = c->io.step = 1;
    runner_loss(a), runner_loss(c);
    runner_backward(a, NULL), runner_backward(c, NULL);
    snap_free(&want);
    want = snap(a);
    expect_same(c, &want, what);
    snap_free(&want), snap_free(&got);
}

/* Two micro-steps (the second accumulates, with other dropout masks) of the model as written and
 * of the model checkpointed (its "checkpoint" marks, or n_checkpoints even segments over it):
 * loss, gradients and running statistics equal bit for bit after each. Returns the two plans'
 * activation bytes (one-layer segments save nothing and lose in-place layers: callers check). */
static void expect_checkpointing_exact(const char *what, const char *marked, long n_checkpoints, size_t *plain_bytes,
                                       size_t *ckpt_bytes) {
    char *plain = strip_marks(marked);
    runner a, c;
    runner_start(&a, plain, 4, 7);
    runner_start_ckpt(&c, marked, 4, 7, n_checkpoints, false);
    /* (recompute counts what is busy at the peak: one-layer segments may have none then) */
    ck_assert_msg(ct_graph_plan(c.b.g)->segments > 0, "%s: no checkpointed segment planned", what);
    ck_assert_int_eq(ct_graph_plan(a.b.g)->segments, 0);
    expect_two_steps_same(&a, &c, what);
    *plain_bytes = activation_bytes(a.b.g);
    *ckpt_bytes = activation_bytes(c.b.g);
    runner_stop(&a), runner_stop(&c);
    free(plain);
}

/* Two marked runs at the top level (an unmarked linear between them); dropout in both; gelu
 * after the unmarked linear may not run in place over what enters its segment. */
static const char *ck_mlp =
    "{\"input\": [12], \"layers\": ["
    " {\"type\": \"linear\", \"out\": 16" CK "}, {\"type\": \"relu\"" CK "}, {\"type\": \"dropout\", \"p\": 0.3" CK "},"
    " {\"type\": \"linear\", \"out\": 16},"
    " {\"type\": \"gelu\"" CK "}, {\"type\": \"linear\", \"out\": 16" CK "}, {\"type\": \"dropout\", \"p\": 0.3" CK "},"
    " {\"type\": \"tanh\"" CK "}, {\"type\": \"linear\", \"out\": 5}], \"loss\": {\"type\": \"cross_entropy\"}}";

/* Batchnorm in both segments (running statistics must move once), and a residual from inside the
 * first segment ("bn1", not its last layer) into the second. */
static const char *ck_cnn =
    "{\"input\": [2, 8, 8], \"layers\": ["
    " {\"type\": \"conv2d\", \"out\": 4, \"kernel\": 3, \"padding\": 1" CK "},"
    " {\"type\": \"batchnorm2d\", \"name\": \"bn1\"" CK "}, {\"type\": \"relu\"" CK "},"
    " {\"type\": \"conv2d\", \"out\": 4, \"kernel\": 3, \"padding\": 1},"
    " {\"type\": \"batchnorm2d\"" CK "}, {\"type\": \"silu\", \"name\": \"s2\"" CK "},"
    " {\"type\": \"dropout\", \"p\": 0.2" CK "}, {\"type\": \"add\", \"inputs\": [\"bn1\", \"prev\"]" CK "},"
    " {\"type\": \"avgpool2d\", \"kernel\": 2}, {\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": 10}],"
    " \"loss\": {\"type\": \"cross_entropy\"}}";

/* Every block checkpointed: attention and residual dropout, residuals reading block_input (the
 * previous segment's last output). */
#define CK_GPT(times) \
    "{\"input\": [8], \"layers\": [{\"type\": \"embedding\", \"name\": \"wte\", \"vocab\": 32, \"dim\": 16}," \
    " {\"type\": \"position_embedding\", \"name\": \"wpe\", \"max_len\": 8}, {\"type\": \"repeat\", \"times\": " #times "," \
    " \"layers\": [{\"type\": \"transformer_block\", \"heads\": 2, \"attn_dropout\": 0.1, \"dropout\": 0.1" CK "}]}," \
    " {\"type\": \"layernorm\", \"name\": \"ln_f\"}, {\"type\": \"linear\", \"name\": \"head\", \"out\": 32," \
    " \"bias\": false, \"tie\": \"wte.weight\"}], \"loss\": {\"type\": \"cross_entropy\"}}"

/* The same with Llama's block: rmsnorm, grouped-query attention with rotary positions, SwiGLU. */
#define CK_LLAMA(times) \
    "{\"input\": [8], \"layers\": [{\"type\": \"embedding\", \"name\": \"wte\", \"vocab\": 32, \"dim\": 16}," \
    " {\"type\": \"repeat\", \"times\": " #times ", \"layers\": [{\"type\": \"llama_block\", \"heads\": 4," \
    " \"kv_heads\": 2, \"intermediate\": 24" CK "}]}, {\"type\": \"rmsnorm\", \"name\": \"norm\"}," \
    " {\"type\": \"linear\", \"name\": \"head\", \"out\": 32, \"bias\": false}], \"loss\": {\"type\": \"cross_entropy\"}}"

START_TEST(checkpointing_is_exact) {
    size_t plain, ckpt;
    expect_checkpointing_exact("mlp, marked", ck_mlp, 0, &plain, &ckpt);
    /* (no fewer bytes: every layer of its segments is recomputed, for dropout's masks and the
     * outputs relu and tanh read, and its plain plan already frees what no backward reads) */
    expect_checkpointing_exact("cnn, marked", ck_cnn, 0, &plain, &ckpt);
    ck_assert(ckpt < plain);
    expect_checkpointing_exact("gpt, every block", CK_GPT(2), 0, &plain, &ckpt);
    ck_assert(ckpt < plain);
    expect_checkpointing_exact("llama, every block", CK_LLAMA(3), 0, &plain, &ckpt);
    ck_assert(ckpt < plain);
    /* even segments cut anywhere, residuals crossing their boundaries */
    char *mlp = strip_marks(ck_mlp), *cnn = strip_marks(ck_cnn), *gpt = strip_marks(CK_GPT(2));
    for (long n = 1; n <= 4; n++) {
        char what[64];
        snprintf(what, sizeof what, "mlp, %ld segments", n);
        expect_checkpointing_exact(what, mlp, n, &plain, &ckpt);
        snprintf(what, sizeof what, "cnn, %ld segments", n);
        expect_checkpointing_exact(what, cnn, n, &plain, &ckpt);
        snprintf(what, sizeof what, "gpt, %ld segments", n + 1);
        expect_checkpointing_exact(what, gpt, n + 1, &plain, &ckpt);
    }
    /* more segments than layers: one layer each (exact, though it saves no memory) */
    expect_checkpointing_exact("mlp, 100 segments", mlp, 100, &plain, &ckpt);
    free(mlp), free(cnn), free(gpt);
}
END_TEST

/* The plan: a checkpointed block keeps only its output; the others' inner activations are busy
 * one block at a time (forward, then recompute to backward). Eight blocks: outputs and saved state drop by more than
 * half, and the plan says how many segments it recomputes. */
START_TEST(checkpointing_shrinks_the_plan) {
    built a, c;
    char *plain = strip_marks(CK_GPT(8));
    build(&a, plain, 4);
    build(&c, CK_GPT(8), 4);
    ck_assert_int_eq(a.rc, CT_OK);
    ck_assert_int_eq(c.rc, CT_OK);
    const ct_act_plan *pa = ct_graph_plan(a.g), *pc = ct_graph_plan(c.g);
    ck_assert_int_eq(pc->segments, 8);
    ck_assert_int_eq(pa->segments, 0);
    ck_assert_int_eq(pa->recompute, 0);
    size_t kept_a = pa->outputs + pa->aux, kept_c = pc->outputs + pc->aux + pc->recompute;
    ck_assert_msg(2 * kept_c < kept_a, "checkpointed %zu bytes, all kept %zu", kept_c, kept_a);
    ck_assert(activation_bytes(c.g) < activation_bytes(a.g));
    ck_assert(pc->total < pa->total);
    unbuild(&a), unbuild(&c);
    free(plain);
    /* marks and number_checkpoints both: refused, naming the layer and both settings */
    build_full(&c, CK_GPT(2), 4, CT_F32, 3, false);
    ck_assert_int_eq(c.rc, CT_ERR_CONFIG);
    ck_assert_msg(strstr(c.err.msg, "number_checkpoints 3") && strstr(c.err.msg, "\"checkpoint\": true"), "%s",
                  c.err.msg);
    unbuild(&c);
}
END_TEST

/* ---- the recompute runs what backward reads, no more ---- */

/* Every layer type says what its backward reads of its inputs (docs/ADDING.md): one that does not
 * would be planned as reading them (correct, but it keeps memory it need not). */
START_TEST(every_type_says_what_backward_reads) {
    const char *names[CT_LAYER_NAMES_MAX];
    int n = ct_layer_type_names(names, CT_LAYER_NAMES_MAX), types = 0;
    for (int i = 0; i < n; i++) {
        const ct_layer_type *t = ct_layer_type_find(names[i]);
        if (!t) continue;   /* a block type or repeat */
        types++;
        ck_assert_msg(t->backward_reads_input != CT_BWD_INPUT_UNSAID, "%s: backward_reads_input unsaid", t->name);
    }
    ck_assert_int_ge(types, 21);
}
END_TEST

/* A segment ending in linear -> add: fc's output is read only by the add, whose backward reads
 * no input, and the add's is the segment's kept output: the recompute runs the layernorm alone
 * (its saved statistics), with dropout after fc also fc and the dropout (the mask comes from
 * fc's output). */
static const char *ck_linear_add =
    "{\"input\": [12], \"layers\": [{\"type\": \"linear\", \"name\": \"a\", \"out\": 16},"
    " {\"type\": \"layernorm\", \"name\": \"ln\"" CK "}, {\"type\": \"linear\", \"name\": \"fc\", \"out\": 16" CK "},"
    " {\"type\": \"add\", \"name\": \"res\", \"inputs\": [\"fc\", \"a\"]" CK "},"
    " {\"type\": \"linear\", \"out\": 5}], \"loss\": {\"type\": \"cross_entropy\"}}";

static const char *ck_linear_dropout_add =
    "{\"input\": [12], \"layers\": [{\"type\": \"linear\", \"name\": \"a\", \"out\": 16},"
    " {\"type\": \"layernorm\", \"name\": \"ln\"" CK "}, {\"type\": \"linear\", \"name\": \"fc\", \"out\": 16" CK "},"
    " {\"type\": \"dropout\", \"name\": \"drop\", \"p\": 0.3" CK "},"
    " {\"type\": \"add\", \"name\": \"res\", \"inputs\": [\"drop\", \"a\"]" CK "},"
    " {\"type\": \"linear\", \"out\": 5}], \"loss\": {\"type\": \"cross_entropy\"}}";

/* tanh's backward reads its output, which only the add reads in forward: tanh runs again, and fc
 * before it. */
static const char *ck_tanh_add =
    "{\"input\": [12], \"layers\": [{\"type\": \"linear\", \"name\": \"a\", \"out\": 16},"
    " {\"type\": \"linear\", \"name\": \"fc\", \"out\": 16" CK "}, {\"type\": \"tanh\", \"name\": \"t\"" CK "},"
    " {\"type\": \"add\", \"name\": \"res\", \"inputs\": [\"t\", \"a\"]" CK "},"
    " {\"type\": \"linear\", \"out\": 5}], \"loss\": {\"type\": \"cross_entropy\"}}";

/* conv2d -> relu, which the CPU runs as one (fuse.c: the fused backward reads relu's output at
 * conv2d's backward), and pooling. */
static const char *ck_conv_relu =
    "{\"input\": [2, 8, 8], \"layers\": ["
    " {\"type\": \"conv2d\", \"out\": 4, \"kernel\": 3, \"padding\": 1}, {\"type\": \"relu\"},"
    " {\"type\": \"maxpool2d\", \"kernel\": 2" CK "}, {\"type\": \"conv2d\", \"out\": 4, \"kernel\": 3, \"padding\": 1" CK "},"
    " {\"type\": \"relu\"" CK "}, {\"type\": \"global_avgpool\"" CK "}, {\"type\": \"linear\", \"out\": 10}],"
    " \"loss\": {\"type\": \"cross_entropy\"}}";

/* Prepare-hook calls per pass and layer. */
typedef struct pass_calls {
    int calls[3][64];   /* [ct_pass][layer] */
} pass_calls;

static int count_calls(void *ctx, int layer, ct_pass pass, ct_layer_io *io, ct_err *err) {
    ((pass_calls *)ctx)->calls[pass][layer]++;
    return CT_OK;
}

/* `marked` checkpointed is exact (two micro-steps against the plain model), and one step's
 * recompute runs layer j want[j] - '0' times, its hooks with it (ZeRO-3 gathers nothing for a
 * layer left out). */
static void expect_recomputes(const char *what, const char *marked, const char *want) {
    size_t plain, ckpt;
    expect_checkpointing_exact(what, marked, 0, &plain, &ckpt);
    runner r;
    runner_start(&r, marked, 4, 7);
    int n = ct_graph_info_get(r.b.g)->n_layers;
    ck_assert_int_eq((int)strlen(want), n);
    pass_calls c = {0};
    ct_exec_hooks hooks = {.ctx = &c, .prepare = count_calls};
    ct_exec_bufs b = runner_bufs(&r);
    ct_err err = {0};
    ck_assert(ct_graph_forward(r.b.g, &b, &r.io, &hooks, &err) == CT_OK);
    ck_assert(ct_graph_backward(r.b.g, &b, &r.io, &hooks, &err) == CT_OK);
    for (int j = 0; j < n; j++) {
        ck_assert_int_eq(c.calls[CT_PASS_FORWARD][j], 1);
        ck_assert_msg(c.calls[CT_PASS_RECOMPUTE][j] == want[j] - '0', "%s: layer %d \"%s\" recomputed %d times, want %c",
                      what, j, ct_graph_layer_name(r.b.g, j), c.calls[CT_PASS_RECOMPUTE][j], want[j]);
    }
    runner_stop(&r);
}

/* A transformer block recomputes all but fc2 and res2 (read by the residual add alone; the
 * block's output); residual dropout after fc2 brings fc2 back. */
START_TEST(checkpointing_recomputes_what_backward_reads) {
    expect_recomputes("linear -> add", ck_linear_add, "01000");
    expect_recomputes("linear -> dropout -> add", ck_linear_dropout_add, "011100");
    expect_recomputes("linear -> tanh -> add", ck_tanh_add, "01100");
    /* conv relu (fused, unmarked) | maxpool (its argmax), conv, relu (reads its output), and not
     * global_avgpool (the segment's output) | linear */
    expect_recomputes("cnn", ck_conv_relu, "0011100");
    char *no_dropout = strdup(CK_GPT(2)), *at = strstr(no_dropout, "\"dropout\": 0.1");
    ck_assert(at);
    memcpy(at, "\"dropout\": 0  ", strlen("\"dropout\": 0.1"));
    /* wte wpe | ln1 qkv attn proj res1 ln2 fc1 gelu fc2 res2 | ... | ln_f head */
    expect_recomputes("gpt blocks", no_dropout, "00" "1111111100" "1111111100" "00");
    /* ... | ln1 qkv attn proj drop1 res1 ln2 fc1 gelu fc2 drop2 res2 | ... */
    expect_recomputes("gpt blocks, residual dropout", CK_GPT(2), "00" "111111111110" "111111111110" "00");
    free(no_dropout);
}
END_TEST

/* ---- the plan against the step: bytes the plan calls free are never read ---- */

/* Fill every byte of the lifetime region that no buffer holds at schedule time t with 0xff (a
 * NaN in every float format). A buffer read after the plan let it go (a backward reading an input
 * its type says it does not, a layer left out of a recompute that was needed, an upload too
 * late) then reads NaN, and the gradients differ. Returns the bytes poisoned. */
static size_t poison_free_bytes(ct_graph *g, int t) {
    const ct_lifetime_region *r = &g->placed;
    unsigned char *arena = ct_graph_arena(g), *held = calloc(r->bytes + 1, 1);
    for (int i = 0; i < r->n; i++) {
        const ct_lifetime_item *it = &r->items[i];
        for (int w = 0; w < it->n_when; w++)
            if (it->when[w].lo <= t && t <= it->when[w].hi) memset(held + it->off, 1, it->size);
    }
    size_t n = 0;
    for (size_t i = 0; i < r->bytes; i++)
        if (!held[i]) arena[i] = 0xff, n++;
    free(held);
    return n;
}

typedef struct poisoner {
    ct_graph *g;
    size_t bytes;   /* poisoned over the step */
} poisoner;

/* Before each layer of each pass, at its time in the step's schedule (lifetime.c). */
static int poison_before(void *ctx, int j, ct_pass pass, ct_layer_io *io, ct_err *err) {
    poisoner *z = ctx;
    const ct_gnode *gn = &z->g->nodes[j];
    z->bytes += poison_free_bytes(z->g, pass == CT_PASS_FORWARD     ? j
                                        : pass == CT_PASS_RECOMPUTE ? gn->t_recompute
                                                                    : gn->t_backward);
    return CT_OK;
}

/* One step of `text` (n_checkpoints segments or its marks; offload) with the free bytes poisoned
 * before every layer and the loss: the same loss and gradients as without, bit for bit. */
static void expect_free_bytes_unread(const char *what, const char *text, long n_checkpoints, bool offload) {
    runner a, p;
    runner_start_ckpt(&a, text, 4, 7, n_checkpoints, offload);
    runner_start_ckpt(&p, text, 4, 7, n_checkpoints, offload);
    snapshot want = one_pass(&a);
    poisoner z = {.g = p.b.g};
    ct_exec_hooks hooks = {.ctx = &z, .prepare = poison_before};
    ct_exec_bufs b = runner_bufs(&p);
    ct_err err = {0};
    int n = ct_graph_info_get(p.b.g)->n_layers;
    ct_param_store_init(p.store, 5);
    ct_param_store_zero_grads(p.store);
    ck_assert(ct_graph_forward_range(p.b.g, 0, n, CT_PASS_FORWARD, &b, &p.io, &hooks, &err) == CT_OK);
    z.bytes += poison_free_bytes(p.b.g, n);
    ck_assert(ct_graph_loss(p.b.g, &p.io, &err) == CT_OK);
    ct_graph_read_loss(p.b.g, &p.io);
    ck_assert_msg(ct_graph_backward(p.b.g, &b, &p.io, &hooks, &err) == CT_OK, "%s", err.msg);
    ck_assert_msg(z.bytes > 0, "%s: no byte was ever free", what);
    expect_same(&p, &want, what);
    snap_free(&want);
    runner_stop(&a), runner_stop(&p);
}

/* A mark on the model's last layer: its output holds the loss's gradient once the loss ran, so
 * the segment stops before it (segments.c). Models whose last layer would be recomputed if it were
 * in a segment (a tanh under mse: its backward reads its output; a dropout: its mask) and whose
 * last output the plan would then call free between forward and recompute: exact, the last layer
 * never recomputed, its bytes never given away while the loss gradient is in them; and a GPT whose
 * ln_f and tied head are marked like its blocks. */
START_TEST(checkpointing_leaves_the_last_layer_out) {
    static const char tanh_last[] =
        "{\"input\": [12], \"layers\": [{\"type\": \"linear\", \"out\": 16" CK "}, {\"type\": \"relu\"" CK "},"
        " {\"type\": \"linear\", \"out\": 16" CK "}, {\"type\": \"gelu\"" CK "},"
        " {\"type\": \"linear\", \"out\": 6" CK "}, {\"type\": \"tanh\"" CK "}], \"loss\": {\"type\": \"mse\"}}";
    static const char dropout_last[] =
        "{\"input\": [12], \"layers\": [{\"type\": \"linear\", \"out\": 16" CK "}, {\"type\": \"tanh\"" CK "},"
        " {\"type\": \"linear\", \"out\": 6" CK "}, {\"type\": \"dropout\", \"p\": 0.3" CK "}],"
        " \"loss\": {\"type\": \"mse\"}}";
    const char *models[] = {tanh_last, dropout_last}, *names[] = {"tanh last, marked", "dropout last, marked"};
    for (int i = 0; i < 2; i++) {
        size_t plain, ckpt;
        expect_checkpointing_exact(names[i], models[i], 0, &plain, &ckpt);
        expect_free_bytes_unread(names[i], models[i], 0, false);
        runner r;
        runner_start(&r, models[i], 4, 7);
        int last = ct_graph_info_get(r.b.g)->n_layers - 1;
        pass_calls c = {0};
        ct_exec_hooks hooks = {.ctx = &c, .prepare = count_calls};
        ct_exec_bufs b = runner_bufs(&r);
        ct_err err = {0};
        ck_assert(ct_graph_forward(r.b.g, &b, &r.io, &hooks, &err) == CT_OK);
        ck_assert(ct_graph_backward(r.b.g, &b, &r.io, &hooks, &err) == CT_OK);
        ck_assert_msg(c.calls[CT_PASS_RECOMPUTE][last] == 0, "%s: the last layer recomputed", names[i]);
        runner_stop(&r);
    }
    char *gpt = strdup(CK_GPT(1)), *gpt_marked = malloc(strlen(gpt) + 64), *at = strstr(gpt, "\"ln_f\"}");
    ck_assert(at);
    at += strlen("\"ln_f\"");
    snprintf(gpt_marked, strlen(gpt) + 64, "%.*s" CK "%.*s" CK "}], %s", (int)(at - gpt), gpt,
             (int)(strstr(at, "}], \"loss\"") - at), at, strstr(at, "\"loss\""));
    /* wte wpe | ln1 qkv attn proj drop1 res1 ln2 fc1 gelu fc2 drop2 res2 | ln_f | head */
    expect_recomputes("gpt, ln_f and the head marked", gpt_marked, "00" "111111111110" "1" "0");
    expect_free_bytes_unread("gpt, ln_f and the head marked", gpt_marked, 0, false);
    free(gpt), free(gpt_marked);
}
END_TEST

START_TEST(freed_bytes_are_never_read) {
    const char *marked[] = {ck_mlp, ck_cnn, CK_GPT(2), ck_linear_add, ck_linear_dropout_add, ck_tanh_add, ck_conv_relu,
                            CK_LLAMA(2)};
    const char *names[] = {"mlp", "cnn", "gpt", "linear -> add", "linear -> dropout -> add", "tanh -> add", "conv relu",
                           "llama"};
    for (int m = 0; m < CT_ARRAY_LEN(marked); m++) {
        char *plain = strip_marks(marked[m]), what[96];
        for (int off = 0; off < 2; off++) {
            snprintf(what, sizeof what, "%s, marked%s", names[m], off ? ", offloaded" : "");
            expect_free_bytes_unread(what, marked[m], 0, off);
        }
        snprintf(what, sizeof what, "%s, plain", names[m]);
        expect_free_bytes_unread(what, plain, 0, false);
        snprintf(what, sizeof what, "%s, 3 segments", names[m]);
        expect_free_bytes_unread(what, plain, 3, false);
        free(plain);
    }
    expect_free_bytes_unread("residual add and concat", residual, 0, false);
    expect_free_bytes_unread("seam model", seam_model, 0, false);
}
END_TEST

/* The lifetime placement (lifetime.c) on random buffers of one or two busy intervals: no two busy
 * at the same time share a byte, offsets are 64-byte aligned, and the region is at least the
 * busiest moment's bytes and at most every buffer end to end. */
START_TEST(lifetime_pack_never_overlaps) {
    ct_rng r;
    ct_rng_init(&r, 5, CT_RNG_AUGMENT, 0);
    for (int round = 0; round < 50; round++) {
        int n = 1 + (int)ct_rng_below(&r, 60), horizon = 2 + (int)ct_rng_below(&r, 80);
        ct_lifetime_item it[60];
        size_t sum = 0;
        for (int i = 0; i < n; i++) {
            int a = (int)ct_rng_below(&r, (uint32_t)horizon), b = a + (int)ct_rng_below(&r, (uint32_t)(horizon - a));
            it[i] = (ct_lifetime_item){.size = 1 + ct_rng_below(&r, 5000), .when = {{a, b}, {0, -1}}, .n_when = 1};
            if (ct_rng_below(&r, 3) == 0 && b + 2 < horizon) {   /* a second interval after a gap */
                int c = b + 2 + (int)ct_rng_below(&r, (uint32_t)(horizon - b - 2));
                it[i].when[1] = (ct_span){c, c + (int)ct_rng_below(&r, 5)};
                it[i].n_when = 2;
            }
            sum += (it[i].size + 63) & ~(size_t)63;
        }
        size_t region = ct_lifetime_pack(it, n), busiest = 0;
        for (int t = 0; t < horizon + 6; t++) {
            size_t now = 0;
            for (int i = 0; i < n; i++)
                for (int w = 0; w < it[i].n_when; w++)
                    if (it[i].when[w].lo <= t && t <= it[i].when[w].hi) {
                        now += (it[i].size + 63) & ~(size_t)63;
                        break;
                    }
            if (now > busiest) busiest = now;
        }
        ck_assert_msg(region >= busiest && region <= sum, "round %d: region %zu, busiest %zu, all %zu", round, region,
                      busiest, sum);
        for (int i = 0; i < n; i++) {
            ck_assert_uint_eq(it[i].off % 64, 0);
            ck_assert_uint_le(it[i].off + it[i].size, region);
            for (int k = i + 1; k < n; k++) {
                bool together = false;
                for (int w = 0; w < it[i].n_when; w++)
                    for (int v = 0; v < it[k].n_when; v++) together |= ct_span_overlap(it[i].when[w], it[k].when[v]);
                bool apart = it[i].off + it[i].size <= it[k].off || it[k].off + it[k].size <= it[i].off;
                ck_assert_msg(!together || apart, "round %d: items %d and %d busy together share bytes", round, i, k);
            }
        }
    }
}
END_TEST

/* Placed by lifetime, every block checkpointed: only one block's inner activations are busy at a
 * time, so four more blocks add their four kept outputs and nothing else; with offload the kept
 * outputs wait in host memory and depth adds nothing. Without checkpointing every block adds its
 * whole activations. */
START_TEST(checkpointing_grows_by_kept_outputs) {
    const size_t block_out = 4 * 8 * 16 * sizeof(float);   /* [batch, T, C] */
    size_t total[2][3];   /* [offload][plain, 4 blocks, 8 blocks] */
    char *plain4 = strip_marks(CK_GPT(4)), *plain8 = strip_marks(CK_GPT(8));
    for (int off = 0; off < 2; off++) {
        const char *text[3] = {plain4, CK_GPT(4), CK_GPT(8)};
        for (int k = 0; k < 3; k++) {
            built b;
            build_full(&b, text[k], 4, CT_F32, 0, off);
            ck_assert_int_eq(b.rc, CT_OK);
            total[off][k] = ct_graph_plan(b.g)->total;
            unbuild(&b);
        }
    }
    ck_assert_msg(total[0][2] - total[0][1] <= 4 * block_out, "checkpointed: 4 blocks %zu, 8 blocks %zu",
                  total[0][1], total[0][2]);
    ck_assert_msg(total[1][2] <= total[1][1], "offloaded: 4 blocks %zu, 8 blocks %zu", total[1][1], total[1][2]);
    /* ... where four more blocks kept whole cost more than four blocks' inner activations */
    built p8;
    build(&p8, plain8, 4);
    ck_assert_int_eq(p8.rc, CT_OK);
    ck_assert_msg(ct_graph_plan(p8.g)->total - total[0][0] > 4 * 4 * block_out, "plain: 4 blocks %zu, 8 blocks %zu",
                  total[0][0], ct_graph_plan(p8.g)->total);
    unbuild(&p8);
    free(plain4), free(plain8);
}
END_TEST

/* ---- activation offload (cpu_checkpointing): the same bits again, fewer device bytes ---- */

/* Two micro-steps of the model as written and of the model checkpointed (marks, or n_checkpoints
 * even segments) with its kept outputs offloaded: loss, gradients and running statistics equal
 * bit for bit. Offloaded outputs share device slots, so a copy that came back late, or not at
 * all, leaves another output's values in a slot and the gradients differ. Returns how many kept
 * outputs moved; when any did, the plan holds fewer activation bytes than checkpointing alone,
 * puts their copies in host memory, and the arena the CPU backend measured is the plan's. */
static int expect_offload_exact_n(const char *what, const char *marked, long n_checkpoints, int64_t n) {
    char *plain = strip_marks(marked);
    runner a, o;
    built c;
    runner_start(&a, plain, 4, 7);
    runner_start_ckpt(&o, marked, 4, 7, n_checkpoints, true);
    a.io.n = o.io.n = n;   /* a short micro-batch copies its samples only */
    build_full(&c, marked, 4, CT_F32, n_checkpoints, false);
    ck_assert_int_eq(c.rc, CT_OK);
    const ct_act_plan *po = ct_graph_plan(o.b.g), *pc = ct_graph_plan(c.g);
    ck_assert_msg(po->segments > 0, "%s: no checkpointed segment planned", what);
    expect_two_steps_same(&a, &o, what);
    ck_assert_int_eq(pc->offloaded, 0);
    ck_assert_int_eq(pc->host, 0);
    if (po->offloaded > 0) {
        ck_assert_msg(po->host > 0, "%s: %d outputs offloaded to 0 host bytes", what, po->offloaded);
        /* never more; fewer once the peak is where outputs are away (offload_shrinks_the_plan:
         * at four blocks the next block's backward, with its prefetched inputs, peaks as high) */
        ck_assert_msg(po->total <= pc->total, "%s: arena %zu, checkpointed %zu", what, po->total, pc->total);
    } else {
        ck_assert_int_eq(po->host, 0);
    }
    ct_mem_stats ms;
    o.b.be->mem.mem_stats(o.b.be, &ms);
    size_t peak = ms.peak[CT_MEM_ACTIVATIONS];
    ck_assert_msg(peak >= po->total && (double)peak <= 1.05 * (double)po->total,
                  "%s: measured activation peak %zu, planned %zu", what, peak, po->total);
    int moved = po->offloaded;
    runner_stop(&a), runner_stop(&o);
    unbuild(&c);
    free(plain);
    return moved;
}

static int expect_offload_exact(const char *what, const char *marked, long n_checkpoints) {
    return expect_offload_exact_n(what, marked, n_checkpoints, 4);
}

START_TEST(offload_is_exact) {
    expect_offload_exact("mlp, marked", ck_mlp, 0);
    expect_offload_exact("cnn, marked", ck_cnn, 0);
    ck_assert_int_gt(expect_offload_exact("gpt, every block", CK_GPT(4), 0), 0);
    char *mlp = strip_marks(ck_mlp), *cnn = strip_marks(ck_cnn), *gpt = strip_marks(CK_GPT(3));
    int moved_mlp = 0, moved_cnn = 0;
    for (long n = 1; n <= 5; n++) {
        char what[64];
        snprintf(what, sizeof what, "mlp, %ld segments", n);
        moved_mlp += expect_offload_exact(what, mlp, n);
        snprintf(what, sizeof what, "cnn, %ld segments", n);
        moved_cnn += expect_offload_exact(what, cnn, n);
        snprintf(what, sizeof what, "gpt, %ld segments", n + 1);
        expect_offload_exact(what, gpt, n + 1);
    }
    ck_assert_int_gt(moved_mlp, 0);
    ck_assert_int_gt(moved_cnn, 0);
    expect_offload_exact("mlp, 100 segments", mlp, 100);
    ck_assert_int_gt(expect_offload_exact_n("gpt, every block, 3 of 4 samples", CK_GPT(4), 0, 3), 0);
    int short_moved = expect_offload_exact_n("cnn, 5 segments, 1 of 4 samples", cnn, 5, 1);
    short_moved += expect_offload_exact_n("mlp, 4 segments, 2 of 4 samples", mlp, 4, 2);
    ck_assert_int_gt(short_moved, 0);
    free(mlp), free(cnn), free(gpt);
}
END_TEST

/* Eight checkpointed blocks: the device holds a few kept outputs at a time, the rest wait in host
 * memory; without checkpointing there is nothing to offload (the plan is the plain one). */
START_TEST(offload_shrinks_the_plan) {
    built c, o, p;
    char *plain = strip_marks(CK_GPT(8));
    build_full(&c, CK_GPT(8), 4, CT_F32, 0, false);
    build_full(&o, CK_GPT(8), 4, CT_F32, 0, true);
    build_full(&p, plain, 4, CT_F32, 0, true);
    const ct_act_plan *pc = ct_graph_plan(c.g), *po = ct_graph_plan(o.g), *pp = ct_graph_plan(p.g);
    ck_assert_int_ge(po->offloaded, 4);
    size_t block_out = 4 * 8 * 16 * sizeof(float);   /* [batch, T, C] */
    ck_assert_uint_ge(po->host, (size_t)po->offloaded * block_out);
    /* the eight kept block outputs: at the peak a buffer each without offload, few with it */
    ck_assert_msg(pc->outputs - po->outputs >= 4 * block_out, "outputs %zu offloaded, %zu kept", po->outputs,
                  pc->outputs);
    ck_assert(po->total < pc->total);
    ck_assert_int_eq(pp->offloaded, 0);
    ck_assert_int_eq(pp->host, 0);
    ck_assert(!ct_graph_offloads(p.g) && ct_graph_offloads(o.g) && !ct_graph_offloads(c.g));
    unbuild(&c), unbuild(&o), unbuild(&p);
    free(plain);
}
END_TEST

int main(void) {
    Suite *s = suite_create("graph_memory");
    TCase *tc = tcase_create("graph_memory");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, checkpointing_is_exact);
    tcase_add_test(tc, checkpointing_shrinks_the_plan);
    tcase_add_test(tc, every_type_says_what_backward_reads);
    tcase_add_test(tc, checkpointing_recomputes_what_backward_reads);
    tcase_add_test(tc, checkpointing_leaves_the_last_layer_out);
    tcase_add_test(tc, freed_bytes_are_never_read);
    tcase_add_test(tc, checkpointing_grows_by_kept_outputs);
    tcase_add_test(tc, lifetime_pack_never_overlaps);
    tcase_add_test(tc, offload_is_exact);
    tcase_add_test(tc, offload_shrinks_the_plan);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
