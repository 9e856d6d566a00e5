/* generate.h: a trained language model predicting its next token, for `ctrain generate`.
 *
 * ct_lm_open builds the config's model for one sample on its device, in the config's compute
 * dtype, and loads the weights of a complete checkpoint directory (CRC-checked, as a resume
 * does); it opens no data. The model must take token ids [T] and predict a token per position
 * (cross entropy over its first `classes` outputs). Without a key/value cache every token runs
 * the model once over a window of the last T tokens, left-aligned (positions past the window's
 * tokens hold token 0; causal attention keeps them out of the rows read).
 *
 * With the cache (ct_lm_cache) a prompt runs once (filling each attention layer's keys and values;
 * through the graph of the shortest power of two >= 16 positions that holds it, or the window's),
 * then each new token runs the model over its one position, reading the cache: the work per token
 * is the weights once plus the attention over the tokens so far, not the whole window. Past the
 * context (n > T) the window slides: the model sees the newest T tokens at positions 0 .. T - 1,
 * so every position's keys and values change (positions, and through them every layer above the
 * first), and each token then recomputes the shifted window in full and refills the cache, as
 * without it: a sliding window costs what no cache costs. The logits equal the uncached ones bit
 * for bit past the context (the same forward of the whole window); elsewhere they agree within the
 * rounding of sums in another order (matrix products of fewer rows, attention over the cache:
 * test_train's "generate" case holds them to 1e-5 of the largest logit in fp32, measured 4e-7). */
#ifndef CT_TRAIN_GENERATE_H
#define CT_TRAIN_GENERATE_H

#include "core/backend/backend.h"
#include "core/config/config.h"
#include "core/graph/graph.h"
#include "core/params/store.h"
#include "core/util/common.h"
#include "core/util/rng.h"

typedef struct ct_lm ct_lm;

/* warn (may be NULL) collects why device "auto" runs on the CPU on a machine with a GPU. */
int ct_lm_open(const ct_config *cfg, const char *checkpoint_dir, ct_lm **out, ct_warnings *warn, ct_err *err);
/* A model that is already there (a training run's graph and parameters, train.sample_every):
 * borrowed, never freed by ct_lm_close. The graph's activations are overwritten by every call
 * (between training steps nothing needs them); parameters, buffers, random streams and the loss
 * are left alone. NULL when the graph is not a language model. */
ct_lm *ct_lm_borrow(ct_backend *be, ct_graph *g, ct_param_store *store);
void ct_lm_close(ct_lm *m);
/* The context length T and the classes predicted (the vocabulary without its padding). */
int64_t ct_lm_context(const ct_lm *m);
int64_t ct_lm_classes(const ct_lm *m);
/* The backend's description ("x86-64, 2 threads, ..."), for the report line. */
const char *ct_lm_device(const ct_lm *m);
/* Turn the key/value cache on (cfg: the model's config, for the graph of one new position):
 * CT_OK with the cache on, or off with why (a model that cannot run one position at a time: a
 * layer that mixes positions, ct_graph_decodes) in why[why_n] ("" when on); an error when the
 * cache cannot be allocated. The cache then holds keys and values computed with the weights of
 * the time: after they change (a borrowed training model between steps), ct_lm_forget. */
int ct_lm_cache(ct_lm *m, const ct_config *cfg, char *why, size_t why_n, ct_err *err);
bool ct_lm_cached(const ct_lm *m);
size_t ct_lm_cache_bytes(const ct_lm *m);
void ct_lm_forget(ct_lm *m);
/* How many ct_lm_next_logits calls so far decoded one position from the cache, and how many ran a
 * forward from position 0 (a prompt's fill, every token past the context, every one without it). */
void ct_lm_counts(const ct_lm *m, int64_t *decoded, int64_t *forwards);
/* logits[classes] (fp32) of the token after ids[0..n) (n >= 1; only the last T are seen). With the
 * cache, a call whose last T ids extend the previous call's window by one id decodes that one
 * position; any other call runs the window whole. */
int ct_lm_next_logits(ct_lm *m, const int32_t *ids, int64_t n, float *logits, ct_err *err);

/* One draw from softmax(logits / temperature) over the top_k largest logits (top_k <= 0 or >=
 * classes: all of them); temperature 0 is the argmax (the first on ties). The softmax is in
 * double; one uniform draw from rng per token. */
int32_t ct_sample_token(const float *logits, int64_t classes, double temperature, int64_t top_k, ct_rng *rng);

#endif
