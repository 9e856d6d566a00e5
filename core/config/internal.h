/* internal.h: internals shared by the files of core/config/ (not a public header).
 *
 * Every section ctrain reads is described by a table of ct_field: key, accepted kind, where the
 * value is stored in the typed struct, default and range. One generic reader (read.c) fills
 * defaults, type-checks present keys, flags unknown keys with a suggestion, and collects keys that
 * are valid DeepSpeed keys but not acted on by ctrain; one generic writer emits the resolved
 * section for --print-config. Sections with extra rules (batch, optimizer, scheduler, precision,
 * ZeRO) add a few lines of code around the tables in schema.c, batch.c, optimizer.c and zero.c. */
#ifndef CT_CONFIG_IMPL_H
#define CT_CONFIG_IMPL_H

#include <stddef.h>

#include "core/config/config.h"
#include "core/util/json.h"

/* What a key accepts. */
typedef enum { CT_K_BOOL, CT_K_INT, CT_K_NUM, CT_K_STR, CT_K_ANY } ct_kind;
/* How it is stored in the typed struct (CT_S_NONE: validated, then listed as "read but not used"). */
typedef enum { CT_S_NONE, CT_S_CHECK, CT_S_BOOL, CT_S_INT, CT_S_LONG, CT_S_U64, CT_S_DBL, CT_S_STR } ct_store;
/* CT_S_CHECK: validated only; the consumer reads the JSON itself (data section). */

typedef struct ct_field {
    const char *key;
    const char *alias;  /* also accepted (e.g. the stage3_ prefix); giving both is an error */
    ct_kind kind;
    ct_store store;
    size_t off;         /* offset in the section struct */
    size_t cap;         /* CT_S_STR: buffer size */
    double def, lo, hi; /* default and inclusive range (numbers), default (bools) */
    const char *sdef;   /* CT_S_STR default */
    /* The key does not change what is trained (where outputs go, how long, how often to
     * evaluate, where and how fast it runs, what it prints): a resumed run may change it and stay
     * the same experiment (ct_config.not_identity, core/ckpt's ct_ckpt_same_experiment). */
    bool not_identity;
} ct_field;

/* The rows, one macro per kind. Each takes flags after its own arguments: CT_NOT_IDENTITY. */
#define CT_NOT_IDENTITY .not_identity = true
#define CT_ROW(k, a, kind_, store_, off_, cap_, d, lo_, hi_, sd, ...) \
    {.key = (k), .alias = (a), .kind = (kind_), .store = (store_), .off = (off_), .cap = (cap_), .def = (d), \
     .lo = (lo_), .hi = (hi_), .sdef = (sd), __VA_ARGS__}
#define CT_F_BOOL(T, m, d, ...) CT_ROW(#m, NULL, CT_K_BOOL, CT_S_BOOL, offsetof(T, m), 0, (d), 0, 1, NULL, __VA_ARGS__)
#define CT_F_INT(T, m, d, lo, hi, ...) \
    CT_ROW(#m, NULL, CT_K_INT, CT_S_INT, offsetof(T, m), 0, (d), (lo), (hi), NULL, __VA_ARGS__)
#define CT_F_LONG(T, m, d, lo, hi, ...) \
    CT_ROW(#m, NULL, CT_K_INT, CT_S_LONG, offsetof(T, m), 0, (d), (lo), (hi), NULL, __VA_ARGS__)
#define CT_F_NUM(T, m, d, lo, hi, ...) \
    CT_ROW(#m, NULL, CT_K_NUM, CT_S_DBL, offsetof(T, m), 0, (d), (lo), (hi), NULL, __VA_ARGS__)
/* An integer-valued key stored as double (bucket sizes can exceed int). */
#define CT_F_INTD(T, m, d, alias, ...) \
    CT_ROW(#m, alias, CT_K_INT, CT_S_DBL, offsetof(T, m), 0, (d), 0, CT_BIG, NULL, __VA_ARGS__)
#define CT_F_STR(T, m, d, ...) \
    CT_ROW(#m, NULL, CT_K_STR, CT_S_STR, offsetof(T, m), sizeof(((T *)0)->m), 0, 0, 0, (d), __VA_ARGS__)
/* Keys whose JSON name differs from the struct member. */
#define CT_F_NUM_K(T, k, m, d, lo, hi, ...) \
    CT_ROW(k, NULL, CT_K_NUM, CT_S_DBL, offsetof(T, m), 0, (d), (lo), (hi), NULL, __VA_ARGS__)
#define CT_F_LONG_K(T, k, m, d, lo, hi, ...) \
    CT_ROW(k, NULL, CT_K_INT, CT_S_LONG, offsetof(T, m), 0, (d), (lo), (hi), NULL, __VA_ARGS__)
#define CT_F_BOOL_K(T, k, m, d, ...) \
    CT_ROW(k, NULL, CT_K_BOOL, CT_S_BOOL, offsetof(T, m), 0, (d), 0, 1, NULL, __VA_ARGS__)
#define CT_F_STR_K(T, k, m, d, ...) \
    CT_ROW(k, NULL, CT_K_STR, CT_S_STR, offsetof(T, m), sizeof(((T *)0)->m), 0, 0, 0, (d), __VA_ARGS__)
/* Valid DeepSpeed keys ctrain validates but does not act on. */
#define CT_C_BOOL(k, ...) CT_ROW(k, NULL, CT_K_BOOL, CT_S_CHECK, 0, 0, 0, 0, 1, NULL, __VA_ARGS__)
#define CT_C_INT(k, lo, ...) CT_ROW(k, NULL, CT_K_INT, CT_S_CHECK, 0, 0, 0, (lo), CT_BIG, NULL, __VA_ARGS__)
#define CT_C_STR(k, ...) CT_ROW(k, NULL, CT_K_STR, CT_S_CHECK, 0, 0, 0, 0, 0, NULL, __VA_ARGS__)
#define CT_C_ANY(k, ...) CT_ROW(k, NULL, CT_K_ANY, CT_S_CHECK, 0, 0, 0, 0, 0, NULL, __VA_ARGS__)
#define CT_U_BOOL(k, ...) CT_ROW(k, NULL, CT_K_BOOL, CT_S_NONE, 0, 0, 0, 0, 1, NULL, __VA_ARGS__)
#define CT_U_INT(k, lo, ...) CT_ROW(k, NULL, CT_K_INT, CT_S_NONE, 0, 0, 0, (lo), CT_BIG, NULL, __VA_ARGS__)
#define CT_U_INT_A(k, a, ...) CT_ROW(k, a, CT_K_INT, CT_S_NONE, 0, 0, 0, 0, CT_BIG, NULL, __VA_ARGS__)
#define CT_U_BOOL_A(k, a, ...) CT_ROW(k, a, CT_K_BOOL, CT_S_NONE, 0, 0, 0, 0, 1, NULL, __VA_ARGS__)
#define CT_U_NUM(k, ...) CT_ROW(k, NULL, CT_K_NUM, CT_S_NONE, 0, 0, 0, -1e308, 1e308, NULL, __VA_ARGS__)
#define CT_U_STR(k, ...) CT_ROW(k, NULL, CT_K_STR, CT_S_NONE, 0, 0, 0, 0, 0, NULL, __VA_ARGS__)
#define CT_U_ANY(k, ...) CT_ROW(k, NULL, CT_K_ANY, CT_S_NONE, 0, 0, 0, 0, 0, NULL, __VA_ARGS__)

typedef struct ct_section {
    const char *name;           /* for messages only */
    const ct_field *fields;
    int n_fields;
    const char *const *custom;  /* keys read by the caller's own code (not unknown) */
    int n_custom;
    bool strict;                /* unknown key: error (else warning) */
    bool lax;                   /* pydantic "lax" coercion: numeric strings, "yes"/"off" bools */
    bool whole;                 /* the caller lists the whole section as unused, not its keys */
    bool not_identity;          /* none of it changes what is trained (ct_field.not_identity) */
} ct_section;

/* A section table read so far, kept for suggesting a key of any section (ct_rd_check_overrides). */
typedef struct ct_rd_seen {
    char path[64];
    const ct_section *sec;      /* static tables only: the pointer outlives the load */
} ct_rd_seen;
#define CT_RD_MAX_SEEN 48

/* Loader state shared by the files of core/config/. */
typedef struct ct_rd {
    ct_config *cfg;
    const ct_config_opts *opts;
    ct_warnings *warn;
    ct_err *err;
    char **unused;              /* "path.key" of keys read but not used, in reading order */
    int n_unused, cap_unused;
    ct_rd_seen seen[CT_RD_MAX_SEEN];
    int n_seen;
    /* The first unknown key an override set where the file's unknown keys only warn: refused by
     * ct_rd_check_overrides once every section is read, so the hint can come from any of them. */
    const cJSON *bad_override;
    char bad_path[512];         /* its JSON path */
    char bad_sug[512];          /* the suggestion from its own section ("": none) */
} ct_rd;

/* --- read.c: generic reading --- */
/* path (a key or section a caller's own code reads, without a row) is not part of the
 * experiment's identity (ct_field.not_identity): added to cfg->not_identity. The rows' flags
 * are added by ct_rd_section. */
void ct_rd_not_identity(ct_rd *r, const char *path);
/* Fill dst with defaults, then read obj (may be NULL) at JSON path `path`. */
int ct_rd_section(ct_rd *r, const cJSON *obj, const char *path, const ct_section *sec, void *dst);
/* The resolved section: every stored field's value, plus unused keys present in `in` verbatim. */
cJSON *ct_rd_emit(const ct_section *sec, const void *src, const cJSON *in);
/* Check one value against a kind and range. lax as in ct_section. *out gets the number (bools 0/1). */
int ct_rd_value(ct_rd *r, const cJSON *v, const char *path, ct_kind kind, double lo, double hi, bool lax,
                double *out);
/* After every section is read: an override that named an unknown key is an error (CT_ERR_CONFIG,
 * "did you mean" a key of the same section, else a key of that name in any section). A typo in a
 * --set would otherwise train with the default, and a sweep would run one point many times. */
int ct_rd_check_overrides(ct_rd *r);
/* Unknown-key check only (for sections read by hand): keys in `known` are fine. */
int ct_rd_keys(ct_rd *r, const cJSON *obj, const char *path, const char *const *known, int n, bool strict);
/* "WHERE: PATH: message" into r->err; returns CT_ERR_CONFIG. */
int ct_rd_fail(ct_rd *r, const cJSON *node, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void ct_rd_warn(ct_rd *r, const cJSON *node, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* "expected ..., got <value>" helper text for a value (quoted strings, truncated). */
const char *ct_rd_show(const cJSON *v, char *buf, size_t n);
/* path + "." + key (or key alone at the top level). */
const char *ct_rd_join(char *buf, size_t n, const char *path, const char *key);
void ct_rd_add_unused(ct_rd *r, const char *path);
bool ct_rd_is_auto(const cJSON *v);
/* Where a value came from: file, --set (override origin) or absent (default). */
ct_source ct_rd_source(const ct_rd *r, const cJSON *v);

/* pydantic's lax bool words ("yes", "off", "t", ...): 0/1, or -1 when the string is not one. */
int ct_rd_lax_bool(const char *s);
bool ct_rd_given(const cJSON *v); /* present and not null */

#define CT_INF 1e308
#define CT_BIG 9.007199254740992e15 /* 2^53: the largest integer a double holds exactly */

/* --- the sections: each reads its part of the root, fills r->cfg, returns CT_OK or an error --- */
int ct_rd_top(ct_rd *r, const cJSON *root);        /* schema.c: all below, in order */
int ct_rd_optimizer(ct_rd *r, const cJSON *root);  /* optimizer.c */
int ct_rd_scheduler(ct_rd *r, const cJSON *root);  /* optimizer.c (after the optimizer) */
int ct_rd_zero(ct_rd *r, const cJSON *root);       /* zero.c */
int ct_rd_aio(ct_rd *r, const cJSON *root);        /* aio.c */
int ct_rd_ds_sections(ct_rd *r, const cJSON *root); /* ds_sections.c */
int ct_rd_model(ct_rd *r, const cJSON *root);      /* ctrain_sections.c */
int ct_rd_data(ct_rd *r, const cJSON *root);
int ct_rd_train(ct_rd *r, const cJSON *root);
/* Resolved sections for cfg->resolved (`in`: the section as given, for unused keys kept verbatim). */
cJSON *ct_rd_emit_optimizer(const ct_optimizer_cfg *o, const cJSON *in);
cJSON *ct_rd_emit_scheduler(const ct_scheduler_cfg *s, const cJSON *in);
cJSON *ct_rd_emit_zero(const ct_zero_cfg *z, const cJSON *in);
cJSON *ct_rd_emit_aio(const ct_aio_cfg *a, const cJSON *in);
cJSON *ct_rd_emit_train(const ct_train_cfg *t);
cJSON *ct_rd_resolved(ct_rd *r, const cJSON *root); /* cfg->resolved, after ct_rd_top and ct_rd_batch */
/* --- not_yet.c --- */
/* Leave out of r->unused what a ct_config_not_yet() line already says (run after every section is
 * read, before the "keys read but not used" warning). */
void ct_rd_drop_explained(ct_rd *r);
/* --- batch.c --- */
int ct_rd_batch(ct_rd *r, const cJSON *root);
/* --- override.c --- */
int ct_cfg_apply_overrides(ct_rd *r, cJSON *root);
/* Replace "model"/"data" given as file paths (or by --model/--data when use_opts) with the files'
 * objects. Run before the overrides (so --set model.x reaches the file's section) and again after
 * them without use_opts (so --set model=FILE works). */
int ct_cfg_splice_sections(ct_rd *r, cJSON *root, bool use_opts);
/* null means "not set" (docs/config.md). The table-driven sections read it so; "model" and "data"
 * are read by the graph builder and the dataset openers, so their null members are taken out of
 * the tree (after the sections are validated, so that a null still cannot hide a misspelt key). */
void ct_cfg_drop_nulls(ct_config *cfg, cJSON *root);

#endif
