/* causal_self_attention: multi-head scaled-dot-product attention with a causal mask, between a
 * fused q, k, v projection and the output projection: GPT-2's (heads only) and Llama's (grouped
 * kv heads and rotary positions).
 *
 * Input per sample [T, (H + 2 KV) D]: the fused projection (a linear with out = (H + 2 KV) D): per
 * token q of the H heads, then k of the KV heads, then v of the KV heads, head h's columns
 * h D .. h D + D - 1 of each part. KV ("kv_heads") is H by default ([T, 3C], GPT-2's c_attn);
 * fewer is grouped-query attention (query head h reads kv head h / (H / KV); 1 is multi-query).
 * "rope_theta" turns q and k by their position first (Hugging Face's half-split rotary
 * embeddings, rope_scaling "linear" or "dynamic" as Llama's config names them). Output [T, H D]:
 * the heads' outputs side by side, ready for the output projection. No parameters.
 *
 * With rotary positions or grouped heads, the backend's rope_gqa op writes the [T, 3, H, D] the
 * attention op reads into the workspace, and backward writes it again from x (an elementwise
 * pass) rather than keeping it: the layer keeps only what GPT-2's does.
 * "dropout" drops attention probabilities in train mode, drawn from the (step, layer) stream, so
 * a recomputed forward and the backward see the same drops. aux keeps the rows' log-sum-exp
 * [heads, T] (fp32) only: backward recomputes the scores from q, k and it (ct_backend_attn), so no
 * T x T matrix is kept, on any backend.
 *
 * Generation with a key/value cache (io->decode, graph.h): the cache [KV, cap, D] x 2 holds each
 * position's rotated k and its v once per kv head (kv_bytes). A fill forward (of the window's
 * graph, or of the graph of a prompt's first positions) computes as any forward and then stores
 * positions 0 .. T - 1 (kv_attention_forward with no output); a decode forward of the graph built
 * for new positions rotates them at pos0 .. (rope_gqa_forward's pos0; for dynamic scaling the base
 * of the whole window's length, as the fill used) and attends over the cache with
 * kv_attention_forward. */
#include <math.h>
#include <string.h>

#include "core/graph/layer.h"

enum { ROPE_NONE, ROPE_LINEAR, ROPE_DYNAMIC };

typedef struct {
    int64_t heads, kv_heads;
    double p;
    double theta;                /* rope_theta; 0: no rotary embeddings */
    int scaling;                 /* rope_scaling.type */
    double factor;               /* rope_scaling.factor */
    int64_t max_pos;             /* rope_scaling.max_position_embeddings (dynamic) */
} attn_cfg;

static const char *const fields[] = {"heads", "kv_heads", "dropout", "rope_theta", "rope_scaling", NULL};
static const char *const scaling_keys[] = {"type", "factor", "max_position_embeddings"};

/* The largest head dim the backends' kernels take (backend.h, ct_backend_attn). */
#define ATTN_MAX_HEAD_DIM 128

/* rope_scaling: {"type": "linear", "factor": F} divides every frequency by F (positions
 * stretched F times); {"type": "dynamic", "factor": F, "max_position_embeddings": N} raises the
 * base for a sequence longer than N (transformers' dynamic NTK scaling); "default" or null: none. */
static int parse_scaling(ct_layer *l, attn_cfg *c, ct_err *err) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(l->node, "rope_scaling");
    c->factor = 1.0;
    if (!s || cJSON_IsNull(s)) return CT_OK;
    if (!cJSON_IsObject(s))
        return ct_layer_errf(l, err, s, "rope_scaling: expected an object such as {\"type\": \"linear\", "
                             "\"factor\": 2}");
    char path[160];
    snprintf(path, sizeof path, "%s.rope_scaling", l->path);
    int rc = ct_model_check_keys(l->cfg, NULL, s, path, scaling_keys, CT_ARRAY_LEN(scaling_keys), err);
    if (rc) return rc;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(s, "type");
    const cJSON *factor = cJSON_GetObjectItemCaseSensitive(s, "factor");
    const cJSON *max_pos = cJSON_GetObjectItemCaseSensitive(s, "max_position_embeddings");
    if (!cJSON_IsString(type))
        return ct_layer_errf(l, err, type ? type : s, "rope_scaling.type: expected \"linear\" or \"dynamic\"");
    if (strcmp(type->valuestring, "default") == 0) return CT_OK;
    if (strcmp(type->valuestring, "linear") == 0) c->scaling = ROPE_LINEAR;
    else if (strcmp(type->valuestring, "dynamic") == 0) c->scaling = ROPE_DYNAMIC;
    else
        return ct_layer_errf(l, err, type, "rope_scaling.type \"%s\" is not supported: ctrain does \"linear\" and "
                             "\"dynamic\" (NTK), the two Llama's config names", type->valuestring);
    if (!cJSON_IsNumber(factor) || !isfinite(factor->valuedouble) || factor->valuedouble < 1)
        return ct_layer_errf(l, err, factor ? factor : s, "rope_scaling.factor: expected a number >= 1");
    c->factor = factor->valuedouble;
    if (c->scaling == ROPE_LINEAR && max_pos)
        return ct_layer_errf(l, err, max_pos, "rope_scaling.max_position_embeddings: only \"dynamic\" scaling "
                             "reads it");
    if (c->scaling == ROPE_DYNAMIC &&
        (!cJSON_IsNumber(max_pos) || max_pos->valuedouble < 1 || max_pos->valuedouble > 1e9 ||
         max_pos->valuedouble != floor(max_pos->valuedouble)))
        return ct_layer_errf(l, err, max_pos ? max_pos : s, "rope_scaling.max_position_embeddings: \"dynamic\" "
                             "scaling needs the positions the model was trained on (an integer >= 1)");
    if (c->scaling == ROPE_DYNAMIC) c->max_pos = (int64_t)max_pos->valuedouble;
    return CT_OK;
}

static int parse(ct_layer *l, ct_err *err) {
    attn_cfg *c = l->cfg_data;
    int rc = ct_layer_int(l, "heads", true, 0, 1, &c->heads, err);
    if (!rc) rc = ct_layer_int(l, "kv_heads", false, c->heads, 1, &c->kv_heads, err);
    if (!rc) rc = ct_layer_num(l, "dropout", 0.0, 0.0, 1.0, true, &c->p, err);
    if (!rc) rc = ct_layer_num(l, "rope_theta", 0.0, 0.0, 1e12, false, &c->theta, err);
    if (!rc && c->kv_heads > c->heads)
        rc = ct_layer_errf(l, err, cJSON_GetObjectItemCaseSensitive(l->node, "kv_heads"), "kv_heads = %lld is "
                           "above heads = %lld", (long long)c->kv_heads, (long long)c->heads);
    if (!rc && c->heads % c->kv_heads)
        rc = ct_layer_errf(l, err, cJSON_GetObjectItemCaseSensitive(l->node, "kv_heads"), "heads = %lld is not "
                           "divisible by kv_heads = %lld: each kv head serves a whole group of query heads",
                           (long long)c->heads, (long long)c->kv_heads);
    if (!rc) rc = parse_scaling(l, c, err);
    if (!rc && c->scaling != ROPE_NONE && c->theta == 0)
        rc = ct_layer_errf(l, err, NULL, "rope_scaling without rope_theta: give the rotary base, e.g. "
                           "\"rope_theta\": 10000");
    return rc;
}

static int infer(ct_layer *l, ct_err *err) {
    const attn_cfg *c = l->cfg_data;
    char shape[64];
    int64_t parts = c->heads + 2 * c->kv_heads;
    bool mha = c->kv_heads == c->heads;
    if (l->in[0].ndim != 2 || l->in[0].d[1] % (mha ? 3 : parts)) {
        if (mha)
            return ct_layer_errf(l, err, NULL, "input is %s (from %s), expected [T, 3C]: the fused q, k, v of "
                                 "each token, from a linear layer with out = 3 x the width",
                                 ct_shape_str(&l->in[0], shape, sizeof shape), l->in_name[0]);
        return ct_layer_errf(l, err, NULL, "input is %s (from %s), expected [T, (heads + 2 kv_heads) D] = "
                             "[T, %lld D]: the fused q, k, v of each token, from a linear layer with out = %lld x "
                             "the head dim", ct_shape_str(&l->in[0], shape, sizeof shape), l->in_name[0],
                             (long long)parts, (long long)parts);
    }
    int64_t D = l->in[0].d[1] / parts;
    if (mha && (l->in[0].d[1] / 3) % c->heads)
        return ct_layer_errf(l, err, NULL, "width C = %lld (input %lld / 3) is not divisible by heads = %lld",
                             (long long)(l->in[0].d[1] / 3), (long long)l->in[0].d[1], (long long)c->heads);
    if (D > ATTN_MAX_HEAD_DIM)
        return ct_layer_errf(l, err, NULL, "head dim %s%lld is above %d: use more heads", mha ? "C / heads = " : "",
                             (long long)D, ATTN_MAX_HEAD_DIM);
    if (c->theta != 0 && D % 2)
        return ct_layer_errf(l, err, NULL, "head dim %lld is odd: rotary embeddings turn pairs of its elements "
                             "(i, i + D/2)", (long long)D);
    l->out = l->in[0];
    l->out.d[1] = c->heads * D;
    return CT_OK;
}

static int64_t seq_len(const ct_layer *l) { return l->in[0].d[0]; }
static int64_t head_dim(const ct_layer *l) { return l->out.d[1] / ((const attn_cfg *)l->cfg_data)->heads; }
/* Whether the attention op's [T, 3, H, D] input is made by rope_gqa in the workspace. */
static bool expands(const attn_cfg *c) { return c->theta != 0 || c->kv_heads != c->heads; }

static size_t aux_bytes(const ct_layer *l, int64_t batch, ct_dtype dt) {
    return (size_t)(batch * ((const attn_cfg *)l->cfg_data)->heads * seq_len(l)) * sizeof(float);
}

/* Bytes of one [batch, T, 3, H, D] in dt, rounded up so the second copy starts aligned. */
static size_t expanded_bytes(const ct_layer *l, int64_t batch, ct_dtype dt) {
    size_t b = ct_nbytes(batch * seq_len(l) * 3 * l->out.d[1], dt);
    return (b + 255) / 256 * 256;
}

/* The expanded q, k, v in forward; and in backward their gradient after them. */
static size_t workspace_bytes(const ct_layer *l, int64_t batch, ct_dtype dt) {
    return expands(l->cfg_data) ? 2 * expanded_bytes(l, batch, dt) : 0;
}

/* The rotation of tokens from position pos0 of sequences of len positions (this layer's own from 0,
 * or a decode's window). Dynamic scaling raises the base when the sequence is longer than
 * max_position_embeddings, transformers' formula (in double, then used by the op as the fp32
 * base). */
static ct_rope rope_at(const ct_layer *l, int64_t pos0, int64_t length) {
    const attn_cfg *c = l->cfg_data;
    ct_rope r = {.theta = c->theta, .factor = c->scaling == ROPE_LINEAR ? c->factor : 1.0, .pos0 = pos0};
    double len = (double)length, D = (double)head_dim(l);
    if (c->scaling == ROPE_DYNAMIC && len > (double)c->max_pos)
        r.theta = c->theta * pow(c->factor * len / (double)c->max_pos - (c->factor - 1.0), D / (D - 2.0));
    return r;
}
static ct_rope rope_of(const ct_layer *l) { return rope_at(l, 0, seq_len(l)); }

/* The dropout probability of this call: none in eval mode. */
static float drop_p(const ct_layer *l, const ct_layer_io *io) {
    return io->train ? (float)((const attn_cfg *)l->cfg_data)->p : 0.0f;
}

/* The attention op's input: x itself, or the rotated, expanded copy in the workspace, its tokens at
 * positions pos0 .. of a sequence of `length` (rope_at). */
static const void *attention_input(const ct_layer *l, const ct_layer_io *io, int64_t pos0, int64_t length) {
    const attn_cfg *c = l->cfg_data;
    if (!expands(c)) return io->x[0];
    ct_rope r = rope_at(l, pos0, length);
    io->be->attn.rope_gqa_forward(io->be, io->ws, io->x[0], io->n, seq_len(l), c->heads, c->kv_heads, head_dim(l),
                                  &r, io->dt);
    return io->ws;
}

/* Bytes of the key/value cache: K and V [batch, KV, cap, D] in dt. */
static size_t kv_bytes(const ct_layer *l, int64_t batch, int64_t cap, ct_dtype dt) {
    return ct_nbytes(2 * batch * ((const attn_cfg *)l->cfg_data)->kv_heads * cap * head_dim(l), dt);
}

/* A decode's new positions: rotated from pos0 into the workspace (or x as it is), then stored
 * in the cache and attended over it. */
static void decode_forward(const ct_layer *l, const ct_layer_io *io) {
    const attn_cfg *c = l->cfg_data;
    const ct_decode *d = io->decode;
    const void *qkv = attention_input(l, io, d->pos0, d->cap);
    io->be->attn.kv_attention_forward(io->be, io->y, d->kv[l->index], qkv, io->n, seq_len(l), d->pos0, d->cap, c->heads,
                                      c->kv_heads, head_dim(l), io->dt);
}

static void forward(const ct_layer *l, const ct_layer_io *io) {
    const attn_cfg *c = l->cfg_data;
    const ct_decode *d = io->decode;
    if (d && !d->fill) {
        decode_forward(l, io);
        return;
    }
    /* a fill's positions 0 .. T - 1 of the window of d->cap (dynamic scaling's base is the window's) */
    const void *qkv = attention_input(l, io, 0, d ? d->cap : seq_len(l));
    io->be->attn.causal_attention_forward(io->be, io->y, io->aux, qkv, io->n, seq_len(l), c->heads, head_dim(l),
                                          drop_p(l, io), io->seed, io->stream, io->dt);
    if (d)   /* a fill: its positions' keys and values into the cache, the output as computed */
        io->be->attn.kv_attention_forward(io->be, NULL, d->kv[l->index], qkv, io->n, seq_len(l), 0, d->cap, c->heads,
                                          c->kv_heads, head_dim(l), io->dt);
}

static void backward(const ct_layer *l, const ct_layer_io *io) {
    const attn_cfg *c = l->cfg_data;
    if (!io->dx[0]) return;
    const void *qkv = attention_input(l, io, 0, seq_len(l));
    void *dqkv = expands(c) ? (char *)io->ws + expanded_bytes(l, io->n, io->dt) : io->dx[0];
    io->be->attn.causal_attention_backward(io->be, dqkv, io->dy, qkv, io->y, io->aux, io->n, seq_len(l), c->heads,
                                           head_dim(l), drop_p(l, io), io->seed, io->stream, io->dt);
    if (!expands(c)) return;
    ct_rope r = rope_of(l);
    io->be->attn.rope_gqa_backward(io->be, io->dx[0], dqkv, io->n, seq_len(l), c->heads, c->kv_heads, head_dim(l),
                                   &r, io->dt);
}

/* q k^T and P v over the causal half: T (T + 1) / 2 pairs, D multiply-adds each, for each of
 * the heads, twice; with rotary embeddings 6 per pair of q and k elements turned. */
static double flops(const ct_layer *l) {
    const attn_cfg *c = l->cfg_data;
    double T = (double)seq_len(l), D = (double)head_dim(l);
    double rope = c->theta != 0 ? 3.0 * T * (double)(c->heads + c->kv_heads) * D : 0.0;
    return 2.0 * 2.0 * T * (T + 1.0) / 2.0 * (double)l->out.d[1] + rope;
}

/* C·T for the 6·N + 6·ΣC·T count of a transformer's training FLOPs (layer.h). */
static double sequence_mixing(const ct_layer *l) { return (double)l->out.d[0] * (double)l->out.d[1]; }

static bool draws_random(const ct_layer *l) { return ((const attn_cfg *)l->cfg_data)->p > 0; }

const ct_layer_type ct_layer_causal_self_attention = {
    .name = "causal_self_attention", .flags = CT_LAYER_DECODES, .fields = fields, .min_inputs = 1, .max_inputs = 1,
    .cfg_size = sizeof(attn_cfg), .parse = parse, .infer = infer, .aux_bytes = aux_bytes,
    .workspace_bytes = workspace_bytes, .forward = forward, .backward = backward, .flops = flops,
    .sequence_mixing = sequence_mixing, .backward_reads_output = true, .draws_random = draws_random,
    .kv_bytes = kv_bytes,
    .backward_reads_input = CT_BWD_INPUT_READ,     /* q, k, v to recompute the scores */
};
