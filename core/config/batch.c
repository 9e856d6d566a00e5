/* batch.c: DeepSpeed's batch rule (DeepSpeedConfig in deepspeed/runtime/config.py), exactly, plus
 * "auto".
 *
 *   train_batch_size = train_micro_batch_size_per_gpu × gradient_accumulation_steps × world_size
 *
 * A missing value is derived with DeepSpeed's floor divisions; then DeepSpeed's four checks run
 * in its order (train batch > 0, micro > 0, accumulation > 0, product). "auto" (HF tooling) counts
 * as missing; when neither train_batch_size nor the micro-batch has a number and one of the three
 * is "auto", the micro-batch is CT_CONFIG_DEFAULT_MICRO_BATCH. An "auto" micro-batch with a fixed
 * train_batch_size (and accumulation not given) is derived here and marked micro_batch_auto: the
 * trainer may choose another divisor from the memory plan (core/train/fit.h). Errors show the three values, where
 * each came from, and consistent alternatives. */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/config/internal.h"

typedef struct bval {
    const char *key;
    const char *label;    /* "train_batch_size", "micro", "accumulation" in the product line */
    const cJSON *node;
    bool given, is_auto;
    long v;
    ct_source src;
    bool not_identity;    /* ct_field.not_identity: the split of the batch, not the batch */
} bval;

#define CT_BATCH_MAX 1000000000000L /* 1e12: larger values are typos; keeps every product in range */

/* a × b × c, saturating at LONG_MAX (only reachable with absurd inputs, which the checks reject). */
static long mul3(long a, long b, long c) {
    long t, out;
    if (__builtin_mul_overflow(a, b, &t) || __builtin_mul_overflow(t, c, &out)) return LONG_MAX;
    return out;
}

/* Python's // for the signs that can occur here; 0 for a zero divisor (the checks then fail). */
static long floordiv(long a, long b) {
    if (b == 0) return 0;
    long q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q--;
    return q;
}

static int read_one(ct_rd *r, const cJSON *root, bval *b) {
    b->node = cJSON_GetObjectItemCaseSensitive(root, b->key);
    b->src = CT_SRC_DEFAULT;
    if (!b->node || cJSON_IsNull(b->node)) return CT_OK;
    if (ct_rd_is_auto(b->node)) {
        b->is_auto = true;
        return CT_OK;
    }
    const cJSON *v = b->node;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble != floor(v->valuedouble) ||
        fabs(v->valuedouble) > (double)CT_BATCH_MAX) {
        char shown[128];
        return ct_rd_fail(r, v, b->key, "expected a positive integer or \"auto\", got %s",
                          ct_rd_show(v, shown, sizeof shown));
    }
    b->given = true;
    b->v = (long)v->valuedouble;
    b->src = ct_rd_source(r, v);
    return CT_OK;
}

static void describe_source(ct_rd *r, const bval *b, char *out, size_t n) {
    char where[1200] = "";
    int line = 0, col = 0;
    if (b->node && r->cfg->doc && ct_json_pos(r->cfg->doc, b->node, &line, &col))
        snprintf(where, sizeof where, " (%d:%d)", line, col);
    switch (b->src) {
    case CT_SRC_FILE: snprintf(out, n, "%s was set in the file%s", b->key, where); break;
    case CT_SRC_OVERRIDE:
        snprintf(out, n, "%s was set with %s", b->key, ct_config_where(r->cfg, b->node, where, sizeof where));
        break;
    case CT_SRC_DERIVED: snprintf(out, n, "%s was derived from the other two", b->key); break;
    case CT_SRC_AUTO: snprintf(out, n, "%s was \"auto\" (ctrain's default %ld)", b->key, b->v); break;
    case CT_SRC_DEFAULT:
        snprintf(out, n, "%s was %s (DeepSpeed's default 1)", b->key, b->is_auto ? "\"auto\"" : "not given");
        break;
    }
}

/* Largest divisor of n that is <= cap (n >= 1, cap >= 1). */
static long divisor_at_most(long n, long cap) {
    for (long d = cap < n ? cap : n; d > 1; d--)
        if (n % d == 0) return d;
    return 1;
}

static void append_alternatives(ct_err *err, long tb, long micro, long gas, long w) {
    long m = micro > 0 ? micro : 1, g = gas > 0 ? gas : 1;
    char a[256] = "", b[256] = "";
    if (mul3(m, g, w) <= CT_BATCH_MAX)
        snprintf(a, sizeof a, "micro %ld and accumulation %ld with train_batch_size %ld", m, g, mul3(m, g, w));
    if (tb > CT_BATCH_MAX) {
        /* no alternative keeps it */
    } else if (tb >= w && tb % w == 0) {
        long per = tb / w;
        long m2 = divisor_at_most(per, micro > 0 ? micro : per);
        long g2 = per / m2;
        if (mul3(m2, g2, w) != mul3(m, g, w))
            snprintf(b, sizeof b, "micro %ld and accumulation %ld with %ld", m2, g2, tb);
    } else if (tb > 0) {
        long lo = tb / w * w, hi = lo + w;
        if (lo >= w)
            snprintf(b, sizeof b, "train_batch_size %ld or %ld (a multiple of world size %ld)", lo, hi, w);
        else /* fewer samples than ranks */
            snprintf(b, sizeof b, "keep train_batch_size %ld and run on %ld rank%s", tb, divisor_at_most(tb, w),
                     divisor_at_most(tb, w) == 1 ? "" : "s");
    }
    if (a[0] && b[0])
        ct_err_append(err, "  Consistent choices: %s, or %s.", a, b);
    else if (a[0] || b[0])
        ct_err_append(err, "  A consistent choice: %s.", a[0] ? a : b);
}

static int batch_error(ct_rd *r, bval *bv, const bval *bad, long w, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static int batch_error(ct_rd *r, bval *bv, const bval *bad, long w, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    const cJSON *at = bad->node;
    for (int i = 0; i < 3 && (!at || bad->src != CT_SRC_FILE); i++)
        if (bv[i].src == CT_SRC_FILE || bv[i].src == CT_SRC_OVERRIDE) {
            at = bv[i].node;
            break;
        }
    ct_rd_fail(r, at, bad->key, "%s", msg);
    char line[4400] = "  ";
    for (int i = 0; i < 3; i++) {
        char one[1400];
        describe_source(r, &bv[i], one, sizeof one);
        size_t len = strlen(line);
        snprintf(line + len, sizeof line - len, "%s%s", i ? "; " : "", one);
    }
    ct_err_append(r->err, "%s.", line);
    append_alternatives(r->err, bv[0].v, bv[1].v, bv[2].v, w);
    return CT_ERR_CONFIG;
}

int ct_rd_batch(ct_rd *r, const cJSON *root) {
    ct_config *cfg = r->cfg;
    long w = cfg->world_size;
    bval bv[3] = {{.key = "train_batch_size"},
                  {.key = "train_micro_batch_size_per_gpu", .not_identity = true},
                  {.key = "gradient_accumulation_steps", .not_identity = true}};
    for (int i = 0; i < 3; i++) {
        if (bv[i].not_identity) ct_rd_not_identity(r, bv[i].key);
        int rc = read_one(r, root, &bv[i]);
        if (rc) return rc;
    }
    bval *tb = &bv[0], *mb = &bv[1], *ga = &bv[2];
    if (!tb->given && !mb->given && (tb->is_auto || mb->is_auto || ga->is_auto)) {
        mb->given = true;
        mb->v = CT_CONFIG_DEFAULT_MICRO_BATCH;
        mb->src = CT_SRC_AUTO;
    }
    if (tb->given && mb->given && ga->given) {
        /* nothing to derive */
    } else if (tb->given && mb->given) {
        ga->v = floordiv(floordiv(tb->v, mb->v), w);
        ga->src = CT_SRC_DERIVED;
    } else if (tb->given && ga->given) {
        mb->v = floordiv(floordiv(tb->v, w), ga->v);
        mb->src = CT_SRC_DERIVED;
    } else if (mb->given && ga->given) {
        tb->v = mul3(mb->v, ga->v, w);
        tb->src = CT_SRC_DERIVED;
    } else if (tb->given) {
        ga->v = 1;
        mb->v = floordiv(tb->v, w);
        mb->src = CT_SRC_DERIVED;
    } else if (mb->given) {
        ga->v = 1;
        tb->v = mul3(mb->v, 1, w);
        tb->src = CT_SRC_DERIVED;
    } else {
        const cJSON *at = ga->node;
        ct_rd_fail(r, at, "train_batch_size",
                   "missing: give train_batch_size or train_micro_batch_size_per_gpu (or both); DeepSpeed needs one "
                   "of them to set the batch size");
        ct_err_append(r->err, "  e.g. \"train_micro_batch_size_per_gpu\": %d", CT_CONFIG_DEFAULT_MICRO_BATCH);
        return CT_ERR_CONFIG;
    }
    if (tb->v <= 0)
        return batch_error(r, bv, tb, w, "%s %ld: the train batch size must be at least 1",
                           tb->src == CT_SRC_DERIVED ? "derived" : "got", tb->v);
    if (mb->v <= 0) {
        if (mb->src == CT_SRC_DERIVED)
            return batch_error(r, bv, mb, w,
                               "derived (train_batch_size %ld // world %ld) // accumulation %ld = %ld; the "
                               "micro-batch must be at least 1",
                               tb->v, w, ga->v, mb->v);
        return batch_error(r, bv, mb, w, "got %ld; the micro-batch must be at least 1", mb->v);
    }
    if (ga->v <= 0) {
        if (ga->src == CT_SRC_DERIVED)
            return batch_error(r, bv, ga, w,
                               "derived (train_batch_size %ld // micro %ld) // world %ld = %ld; accumulation "
                               "steps must be at least 1",
                               tb->v, mb->v, w, ga->v);
        return batch_error(r, bv, ga, w, "got %ld; accumulation steps must be at least 1", ga->v);
    }
    if (tb->v != mul3(mb->v, ga->v, w))
        return batch_error(r, bv, tb, w, "%ld != micro %ld × accumulation %ld × world %ld = %ld", tb->v, mb->v,
                           ga->v, w, mul3(mb->v, ga->v, w));
    if (tb->v > CT_BATCH_MAX)
        return batch_error(r, bv, tb, w, "micro × accumulation × world is more than ctrain supports (%ld samples "
                           "per step)", CT_BATCH_MAX);
    cfg->train_batch_size = tb->v;
    /* "auto" micro-batch under a fixed train_batch_size: what the rule derived is the fallback;
     * the trainer picks from the memory plan when it knows a limit (core/train/fit.h) */
    cfg->micro_batch_auto = mb->is_auto && tb->given && !ga->given;
    cfg->micro_batch = mb->v;
    cfg->grad_accum = ga->v;
    cfg->train_batch_src = tb->src;
    cfg->micro_batch_src = mb->src;
    cfg->grad_accum_src = ga->src;
    return CT_OK;
}
