/* generate.c: a trained language model predicting its next token (generate.h).
 *
 * The key/value cache: the lm remembers which ids the cache holds (`cached`, from position 0 of
 * the window). A call whose window is those ids plus one more runs the one-position graph over
 * the new token (a decode: each attention layer reads the cache and adds the token's keys and
 * values); any other call (the first, another prompt, a window that slid past the context) runs
 * the whole window as without a cache, with a fill that stores every position's keys and values.
 * So the cache is used only where it holds exactly what a full forward would compute, whatever
 * the caller passes. */
#include "core/train/generate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend/backend.h"
#include "core/ckpt/ckpt.h"
#include "core/device/device.h"
#include "core/graph/graph.h"
#include "core/optim/amp.h"
#include "core/params/store.h"

/* A prompt shorter than the context fills the cache through the graph of the shortest of 16, 32,
 * 64, ... positions that holds it (left-aligned, as the window is), not of the whole window: a
 * 10-token prompt to a model of 2048 positions costs 16 positions' work. Powers of two keep the
 * graphs few (log2 of the context); they are built once, with the cache. */
#define FILL_MIN 16
#define LM_FILLS 40

struct ct_lm {
    ct_backend *be;
    ct_graph *g;                 /* built for one sample */
    const ct_graph_info *info;
    ct_param_store *store;
    int64_t T, classes, ld;      /* context, classes predicted, outputs per position */
    int32_t *window;             /* [T] host: the ids the next forward reads */
    void *ids;                   /* [T] backend memory */
    void *row;                   /* [ld] host: one position's logits in the graph's dtype */
    bool borrowed;               /* be, g and store are the caller's */
    /* the key/value cache (ct_lm_cache); its graphs use the store and g's arena: */
    ct_graph *g1;                /* the model for one new position */
    ct_graph *fill[LM_FILLS];    /* for the first FILL_MIN << i positions, those shorter than T */
    void **kv;                   /* [layers] each layer's cache, NULL for those without */
    int32_t *cached;             /* [T] the ids the cache holds, from position 0 */
    int64_t n_cached;            /* 0: the cache holds nothing to reuse */
    bool use_cache;
    int64_t decoded, windows;    /* calls answered by a decode, by a forward from position 0 */
};

static bool is_lm(const ct_graph_info *in) {
    return in->input_dtype == CT_I32 && in->input_shape.ndim == 1 && in->classes >= 2 && in->target_shape.ndim == 1;
}

/* The parts every model needs once the graph is bound and the weights are in: false when out of
 * memory. */
static bool lm_buffers(ct_lm *m) {
    m->info = ct_graph_info_get(m->g);
    m->T = m->info->input_shape.d[0];
    m->classes = m->info->classes;
    m->ld = m->info->padded_classes;
    m->window = ct_xcalloc((size_t)m->T, sizeof(int32_t));
    m->row = ct_xmalloc((size_t)m->ld * ct_dtype_size(ct_graph_compute_dtype(m->g)));
    m->ids = m->be->mem.alloc(m->be, (size_t)m->T * sizeof(int32_t), CT_MEM_ACTIVATIONS);
    return m->ids != NULL;
}

ct_lm *ct_lm_borrow(ct_backend *be, ct_graph *g, ct_param_store *store) {
    if (!is_lm(ct_graph_info_get(g))) return NULL;
    ct_lm *m = ct_xcalloc(1, sizeof *m);
    *m = (ct_lm){.be = be, .g = g, .store = store, .borrowed = true};
    if (!lm_buffers(m)) {
        ct_lm_close(m);
        return NULL;
    }
    return m;
}

int64_t ct_lm_context(const ct_lm *m) { return m->T; }
int64_t ct_lm_classes(const ct_lm *m) { return m->classes; }
const char *ct_lm_device(const ct_lm *m) { return m->be->device_desc; }

/* The checkpoint's weights (and buffers) into the store's master, then its compute copy. */
static int load_weights(ct_lm *m, const char *dir, ct_err *err) {
    const ct_param_layout *L = ct_graph_layout(m->g);
    float *params = ct_xcalloc((size_t)L->n_params + 1, sizeof(float));
    float *buffers = ct_xcalloc((size_t)L->n_buffers + 1, sizeof(float));
    ct_ckpt_tensors ck;
    ct_ckpt_tensors_for(L, NULL, 0, L->n_params, params, buffers, &ck);
    int rc = ct_ckpt_load(dir, &ck, CT_CKPT_LOAD_MODEL, NULL, NULL, err);
    if (!rc) {
        m->be->mem.copy_h2d(m->be, m->store->master, params, sizeof(float) * (size_t)L->n_params);
        if (L->n_buffers)
            m->be->mem.copy_h2d(m->be, m->store->buffers, buffers, sizeof(float) * (size_t)L->n_buffers);
        ct_param_store_refresh(m->store);
    }
    free(params);
    free(buffers);
    return rc;
}

int ct_lm_open(const ct_config *cfg, const char *checkpoint_dir, ct_lm **out, ct_warnings *warn, ct_err *err) {
    *out = NULL;
    ct_lm *m = ct_xcalloc(1, sizeof *m);
    int rc = ct_graph_build(cfg, 1, ct_amp_compute_dtype(cfg), &m->g, err);
    if (!rc && !is_lm(ct_graph_info_get(m->g)))
            rc = ct_errf(err, CT_ERR_CONFIG, "%s: generate needs a language model: token ids [T] in and a "
                         "cross-entropy prediction per position out (as configs/tiny_lm.json)", cfg->path);
    char notice[CT_ERR_MSG + 64];
    if (!rc) rc = ct_backend_create_noting(cfg->train.device, cfg->train.threads, &m->be, notice, sizeof notice, err);
    if (!rc && notice[0] && warn) ct_warnf(warn, "%s", notice);
    if (!rc) rc = ct_graph_bind(m->g, m->be, NULL, err);
    const ct_param_layout *L = rc ? NULL : ct_graph_layout(m->g);
    if (!rc)
        rc = ct_param_store_create(L, m->be, ct_graph_compute_dtype(m->g), 0, L->n_params, CT_STORE_WHOLE, &m->store,
                                   err);
    if (!rc) rc = load_weights(m, checkpoint_dir, err);
    if (rc) {
        ct_lm_close(m);
        return rc;
    }
    if (!lm_buffers(m)) {
        ct_lm_close(m);
        return ct_errf(err, CT_ERR_RUNTIME, "out of memory on %s", cfg->train.device);
    }
    *out = m;
    return CT_OK;
}

/* The cache's parts, freed (also after a failed ct_lm_cache). */
static void cache_free(ct_lm *m) {
    for (int j = 0; m->kv && j < m->info->n_layers; j++)
        if (m->kv[j]) m->be->mem.free(m->be, m->kv[j]);
    free(m->kv);
    free(m->cached);
    ct_graph_free(m->g1);
    for (int i = 0; i < LM_FILLS; i++) ct_graph_free(m->fill[i]);
    memset(m->fill, 0, sizeof m->fill);
    m->kv = NULL, m->cached = NULL, m->g1 = NULL;
    m->n_cached = 0;
    m->use_cache = false;
}

/* The model for sequences of len positions, on the lm's parameters and (when it fits) g's arena;
 * NULL with why filled when its parameters are not g's. */
static int seq_graph(ct_lm *m, const ct_config *cfg, int64_t len, ct_graph **out, char *why, size_t why_n,
                     ct_err *err) {
    *out = NULL;
    ct_graph *g = NULL;
    int rc = ct_graph_build_seq(cfg, 1, ct_graph_compute_dtype(m->g), len, &g, err);
    if (!rc && !ct_param_layout_same(ct_graph_layout(g), ct_graph_layout(m->g))) {
        snprintf(why, why_n, "has parameters that change with the sequence length");
        ct_graph_free(g);
        return CT_OK;
    }
    bool fits = !rc && ct_graph_plan(g)->total <= ct_graph_plan(m->g)->total;
    if (!rc) rc = ct_graph_bind(g, m->be, fits ? ct_graph_arena(m->g) : NULL, err);
    if (rc) ct_graph_free(g);
    else *out = g;
    return rc;
}

int ct_lm_cache(ct_lm *m, const ct_config *cfg, char *why, size_t why_n, ct_err *err) {
    cache_free(m);
    why[0] = 0;
    if (!ct_graph_decodes(m->g, why, why_n)) return CT_OK;
    int rc = seq_graph(m, cfg, 1, &m->g1, why, why_n, err);
    for (int i = 0; !rc && m->g1 && i < LM_FILLS && ((int64_t)FILL_MIN << i) < m->T; i++)
        rc = seq_graph(m, cfg, (int64_t)FILL_MIN << i, &m->fill[i], why, why_n, err);
    if (!rc && why[0]) {   /* some length's parameters differ: no cache */
        cache_free(m);
        return CT_OK;
    }
    m->kv = ct_xcalloc((size_t)m->info->n_layers, sizeof(void *));
    for (int j = 0; !rc && j < m->info->n_layers; j++) {
        size_t bytes = ct_graph_layer_kv_bytes(m->g1, j, m->T);
        if (bytes && !(m->kv[j] = m->be->mem.alloc(m->be, bytes, CT_MEM_ACTIVATIONS)))
            rc = ct_errf(err, CT_ERR_RUNTIME, "out of memory on %s for the key/value cache of layer \"%s\" (%zu bytes)",
                         m->be->name, ct_graph_layer_name(m->g, j), bytes);
    }
    if (rc) {
        cache_free(m);
        return rc;
    }
    m->cached = ct_xcalloc((size_t)m->T, sizeof(int32_t));
    m->use_cache = true;
    return CT_OK;
}

bool ct_lm_cached(const ct_lm *m) { return m->use_cache; }

size_t ct_lm_cache_bytes(const ct_lm *m) {
    size_t total = 0;
    for (int j = 0; m->kv && j < m->info->n_layers; j++) total += ct_graph_layer_kv_bytes(m->g1, j, m->T);
    return total;
}

void ct_lm_forget(ct_lm *m) { m->n_cached = 0; }

void ct_lm_counts(const ct_lm *m, int64_t *decoded, int64_t *forwards) {
    *decoded = m->decoded;
    *forwards = m->windows;
}

void ct_lm_close(ct_lm *m) {
    if (!m) return;
    cache_free(m);
    if (m->ids) m->be->mem.free(m->be, m->ids);
    if (!m->borrowed) {
        ct_param_store_free(m->store);
        ct_graph_free(m->g);
        if (m->be) ct_backend_destroy(m->be);
    }
    free(m->window);
    free(m->row);
    free(m);
}

/* Row `row` of graph g's logits after forward `io` over input `ids` (a chunked head computes just
 * that row), into m->row. */
static int forward_logits(ct_lm *m, ct_graph *g, const int32_t *ids, const ct_decode *d, int64_t row, ct_err *err) {
    ct_exec_bufs b = {.params = m->store->params, .buffers = m->store->buffers};
    ct_step_io io = {.input = ids, .input_dt = CT_I32, .n = 1, .train = false, .loss_grad_scale = 1.0f, .decode = d};
    int rc = ct_graph_forward_range(g, 0, m->info->n_layers, CT_PASS_FORWARD, &b, &io, NULL, err);
    if (rc) return rc;
    const void *y = ct_graph_logits(g, &b, row, 1, err);
    if (!y) return CT_ERR_RUNTIME;
    m->be->mem.copy_d2h(m->be, m->row, y, (size_t)m->ld * ct_dtype_size(ct_graph_compute_dtype(g)));
    return CT_OK;
}

/* The graph a fill of k positions runs: the shortest fill graph that holds them, else the window's. */
static ct_graph *fill_graph(ct_lm *m, int64_t k) {
    for (int i = 0; i < LM_FILLS && m->fill[i]; i++)
        if (((int64_t)FILL_MIN << i) >= k) return m->fill[i];
    return m->g;
}

/* The window's logits at position k - 1: a decode of that one position when the cache holds the
 * window's first k - 1 ids, else a forward from position 0 (with the cache: a fill, through the
 * shortest graph that holds the k ids; without: the whole window). */
static int window_logits(ct_lm *m, int64_t k, ct_err *err) {
    ct_backend *be = m->be;
    bool extends = m->use_cache && m->n_cached > 0 && m->n_cached == k - 1 &&
                   memcmp(m->cached, m->window, sizeof(int32_t) * (size_t)(k - 1)) == 0;
    ct_decode d = {.fill = !extends, .pos0 = extends ? k - 1 : 0, .cap = m->T, .kv = m->kv};
    int rc;
    if (extends) {
        be->mem.copy_h2d(be, m->ids, m->window + k - 1, sizeof(int32_t));
        rc = forward_logits(m, m->g1, m->ids, &d, 0, err);
    } else {
        ct_graph *g = m->use_cache ? fill_graph(m, k) : m->g;
        be->mem.copy_h2d(be, m->ids, m->window, sizeof(int32_t) * (size_t)ct_graph_info_get(g)->input_shape.d[0]);
        rc = forward_logits(m, g, m->ids, m->use_cache ? &d : NULL, k - 1, err);
    }
    m->n_cached = 0;   /* until it is known to hold the window */
    if (!rc && extends) m->decoded++;
    else if (!rc) m->windows++;
    if (!rc && m->use_cache) {
        memcpy(m->cached, m->window, sizeof(int32_t) * (size_t)k);
        m->n_cached = k;
    }
    return rc;
}

int ct_lm_next_logits(ct_lm *m, const int32_t *ids, int64_t n, float *logits, ct_err *err) {
    if (n < 1) return ct_errf(err, CT_ERR_RUNTIME, "generate: no token to continue from");
    int64_t k = n < m->T ? n : m->T;   /* the last k tokens, at positions 0..k-1 */
    memset(m->window, 0, sizeof(int32_t) * (size_t)m->T);
    memcpy(m->window, ids + (n - k), sizeof(int32_t) * (size_t)k);
    int rc = window_logits(m, k, err);
    if (rc) return rc;
    ct_dtype dt = ct_graph_compute_dtype(m->g);
    for (int64_t j = 0; j < m->classes; j++)
        logits[j] = dt == CT_F32 ? ((const float *)m->row)[j]
                    : dt == CT_BF16 ? ct_bf16_to_f32(((const uint16_t *)m->row)[j])
                                    : ct_f16_to_f32(((const uint16_t *)m->row)[j]);
    return CT_OK;
}

typedef struct {
    float v;
    int32_t i;
} scored;

/* Larger logit first; the smaller index first on ties (so the argmax is the first maximum). */
static int by_logit(const void *a, const void *b) {
    const scored *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

int32_t ct_sample_token(const float *logits, int64_t classes, double temperature, int64_t top_k, ct_rng *rng) {
    scored *s = ct_xmalloc(sizeof *s * (size_t)classes);
    for (int64_t j = 0; j < classes; j++) s[j] = (scored){isnan(logits[j]) ? -INFINITY : logits[j], (int32_t)j};
    qsort(s, (size_t)classes, sizeof *s, by_logit);
    int64_t k = top_k > 0 && top_k < classes ? top_k : classes;
    int32_t pick = s[0].i;
    if (temperature > 0 && isfinite(s[0].v)) {
        double total = 0;
        for (int64_t j = 0; j < k; j++) total += exp(((double)s[j].v - s[0].v) / temperature);
        double u = ct_rng_uniform_f64(rng) * total, acc = 0;
        for (int64_t j = 0; j < k; j++) {
            acc += exp(((double)s[j].v - s[0].v) / temperature);
            pick = s[j].i;
            if (u < acc) break;
        }
    }
    free(s);
    return pick;
}
