/* generate.h: a trained language model predicting its next token, for `ctrain generate`.
 *
 * ct_lm_open builds the config's model for one sample on its device, in the config's compute
 * dtype, and loads the weights of a complete checkpoint directory (CRC-checked, as a resume
 * does); it opens no data. The model must take token ids [T] and predict a token per position
 * (cross entropy over its first `classes` outputs). There is no key/value cache: every token runs
 * the model once over a window of the last T tokens, left-aligned (positions past the window's
 * tokens hold token 0; causal attention keeps them out of the rows read), which is simple and,
 * for the small models a CPU trains, fast enough. */
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
/* logits[classes] (fp32) of the token after ids[0..n) (n >= 1; only the last T are seen). */
int ct_lm_next_logits(ct_lm *m, const int32_t *ids, int64_t n, float *logits, ct_err *err);

/* One draw from softmax(logits / temperature) over the top_k largest logits (top_k <= 0 or >=
 * classes: all of them); temperature 0 is the argmax (the first on ties). The softmax is in
 * double; one uniform draw from rng per token. */
int32_t ct_sample_token(const float *logits, int64_t classes, double temperature, int64_t top_k, ct_rng *rng);

#endif
