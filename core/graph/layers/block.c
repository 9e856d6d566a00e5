/* block.c: the block types' shared field readers and sub-layer builders (block.h). */
#include "core/graph/layers/block.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int ct_block_errf(const ct_block *b, const cJSON *at, const char *fmt, ...) {
    char where[512], text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    ct_model_where(b->ctx->cfg, at ? at : b->node, where, sizeof where);
    return ct_errf(b->err, CT_ERR_CONFIG, "%s%s%s (%s): %s", where, where[0] ? ": " : "", b->ctx->path, b->type,
                   text);
}

int ct_block_open(ct_block *b, const ct_block_ctx *ctx, const cJSON *node, const char *type,
                  const char *const *fields, int n_fields, ct_err *err) {
    *b = (ct_block){.ctx = ctx, .node = node, .err = err, .type = type};
    int rc = ct_model_check_keys(ctx->cfg, NULL, node, ctx->path, fields, n_fields, err);
    if (rc) return rc;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(node, "name");
    if (name && (!cJSON_IsString(name) || !name->valuestring[0] || strlen(name->valuestring) > 80))
        return ct_block_errf(b, name, "name: expected a non-empty string of at most 80 characters");
    if (name) snprintf(b->prefix, sizeof b->prefix, "%s.", name->valuestring);
    const cJSON *ck = cJSON_GetObjectItemCaseSensitive(node, "checkpoint");
    if (ck && !cJSON_IsBool(ck)) return ct_block_errf(b, ck, "checkpoint: expected true or false");
    b->checkpoint = cJSON_IsTrue(ck);
    return CT_OK;
}

int ct_block_number(const ct_block *b, const char *key, double def, double lo, double hi, bool hi_open, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(b->node, key);
    *out = def;
    if (!v) return CT_OK;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < lo ||
        (hi_open ? v->valuedouble >= hi : v->valuedouble > hi))
        return ct_block_errf(b, v, "%s: expected a number in [%g, %g%s", key, lo, hi, hi_open ? ")" : "]");
    *out = v->valuedouble;
    return CT_OK;
}

int ct_block_integer(const ct_block *b, const char *key, bool required, int64_t def, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(b->node, key);
    *out = def;
    if (!v && required) return ct_block_errf(b, NULL, "missing field \"%s\"", key);
    if (!v) return CT_OK;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 1 || v->valuedouble > 1e6)
        return ct_block_errf(b, v, "%s: expected an integer >= 1", key);
    *out = (int64_t)v->valuedouble;
    return CT_OK;
}

int ct_block_needs_sequence(const ct_block *b) {
    if (b->ctx->input_rank == 2) return CT_OK;
    return ct_block_errf(b, NULL, "takes a sequence [T, C], got an input of %d dimensions per sample "
                         "(put an embedding before it)", b->ctx->input_rank);
}

cJSON *ct_block_sub(cJSON *layers, const ct_block *b, const char *type, const char *part) {
    char name[160];
    snprintf(name, sizeof name, "%s%s", b->prefix, part);
    cJSON *l = cJSON_CreateObject();
    cJSON_AddStringToObject(l, "type", type);
    cJSON_AddStringToObject(l, "name", name);
    if (b->checkpoint) cJSON_AddTrueToObject(l, "checkpoint");
    cJSON_AddItemToArray(layers, l);
    return l;
}

void ct_block_linear(cJSON *layers, const ct_block *b, const char *part, int64_t out, double std, bool bias) {
    cJSON *l = ct_block_sub(layers, b, "linear", part);
    cJSON_AddNumberToObject(l, "out", (double)out);
    cJSON *init = cJSON_AddObjectToObject(l, "init");
    cJSON_AddStringToObject(init, "type", "normal");
    cJSON_AddNumberToObject(init, "std", std);
    if (!bias) cJSON_AddFalseToObject(l, "bias");
    else cJSON_AddStringToObject(cJSON_AddObjectToObject(l, "bias_init"), "type", "zeros");
}

void ct_block_residual(cJSON *layers, const ct_block *b, const char *part, const char *a, const char *c) {
    cJSON *in = cJSON_AddArrayToObject(ct_block_sub(layers, b, "add", part), "inputs");
    cJSON_AddItemToArray(in, cJSON_CreateString(a));
    cJSON_AddItemToArray(in, cJSON_CreateString(c));
}
