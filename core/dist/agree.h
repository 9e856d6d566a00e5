/* agree.h: ranks that must have been started alike check that they were, before they train.
 *
 * Ranks started with different configs or data train different things: a different ZeRO stage or
 * model width fails inside a collective (or crashes on buffers of another size), a different
 * learning rate, seed or data limit trains silently, averaging gradients of different runs. Before
 * the first collective that depends on the config, every rank describes what it was started with
 * as a list of (key, value) items: the leaves of its resolved config and its data's fingerprints.
 *
 * ct_comm_agree compares them: one all-reduce of a 52-bit digest of each rank's list when they
 * agree (the normal case: three doubles); when they do not, rank 0's list goes to every rank, each
 * rank that differs finds the first key whose value differs, and the lowest of them sends that key
 * and its value back, so that every rank can stop with the same message naming the ranks and the
 * key. Only the host all-reduce is used, so the NCCL communicator does it as well as MPI's.
 * Part of ctrain (libctrain.a): a communicator's table is all it calls. */
#ifndef CT_DIST_AGREE_H
#define CT_DIST_AGREE_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/dist/comm.h"

typedef struct ct_agree_item {
    char *key;                   /* "zero_optimization.stage", "model.layers[0].out", "data.train (its files)" */
    char *value;                 /* the value as text: compact JSON for a config leaf */
} ct_agree_item;

typedef struct ct_agree_list {
    ct_agree_item *items;
    int n, cap;
} ct_agree_list;

/* One item (copies of key and value). */
void ct_agree_add(ct_agree_list *l, const char *key, const char *value);
/* One item per leaf of doc, keyed by its path ("a.b", "a[2]"), valued by its compact JSON (an empty
 * object or array is a leaf, "{}" or "[]"), in document order. A path in skip, or under one (the
 * skip path followed by '.' or '['), is left out: a key that may differ between ranks on purpose. */
void ct_agree_add_json(ct_agree_list *l, const cJSON *doc, const char *const *skip, int n_skip);
void ct_agree_free(ct_agree_list *l);

/* A digest of every key and value, in any order (52 bits: a double holds it exactly). */
uint64_t ct_agree_digest(const ct_agree_list *l);

/* The first key on which mine differs from ref (rank 0's): in ref's order, a key whose value differs
 * or that mine lacks; after them, a key only mine has. *in_ref and *in_mine are its indices (-1 on
 * the side that lacks it). False when the two lists hold the same keys and values. */
bool ct_agree_first_difference(const ct_agree_list *ref, const ct_agree_list *mine, int *in_ref, int *in_mine);

/* Text through the host all-reduce: `bytes` (n of them, or NULL and 0 on every rank but `from`)
 * sent from rank `from` to every rank, which receive a malloc'd NUL-terminated copy in *out. Six
 * bytes to a double (exact), a sum in which only `from` adds anything. */
int ct_agree_send_text(ct_comm *c, int from, const char *bytes, size_t n, char **out, ct_err *err);

/* Collective: CT_OK when every rank's list equals rank 0's; else CT_ERR_CONFIG on every rank, naming
 * the ranks whose lists differ from rank 0's, the first key that differs on the lowest of them, and
 * the two values ("ranks 0 and 1 were started with different configs or data: zero_optimization.stage
 * is 1 on rank 0 and 2 on rank 1"). Rank 0 and the ranks that differ give the whole message; the
 * others say that they stopped for it, and where to read it. */
int ct_comm_agree(ct_comm *c, const ct_agree_list *mine, ct_err *err);

#endif
