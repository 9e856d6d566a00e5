/* order.c: data.shuffle_buffer (order.h), WebDataset's shuffle: shards shuffled per epoch
 * (`shardshuffle`), then `shuffle(N)`: the first N samples fill the buffer; for each further sample
 * one buffer slot drawn uniformly is emitted and the sample takes its place; at the end of the
 * stream the buffer is emitted in a random order.
 *
 * Random numbers: the shard order is ct_rng_permutation(seed, epoch) over the shards; the buffer's
 * draws come from (seed, CT_RNG_SHUFFLE, 2^63 + epoch), a stream index no epoch's permutation uses. */
#include "core/data/order.h"

#include <math.h>
#include <stdlib.h>

#include "core/util/rng.h"

int ct_order_buffer_parse(const ct_config *cfg, int64_t *buffer, ct_err *err) {
    const cJSON *v = cfg->data ? cJSON_GetObjectItemCaseSensitive(cfg->data, "shuffle_buffer") : NULL;
    *buffer = 0;
    if (!v || cJSON_IsNull(v)) return CT_OK;
    char where[1200];
    ct_config_where(cfg, v, where, sizeof where);
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 1 ||
        v->valuedouble > INT32_MAX)
        return ct_errf(err, CT_ERR_CONFIG, "%s: data.shuffle_buffer: expected the samples the shuffle buffer holds, "
                       "an integer in 1..%d (WebDataset's shuffle(N); leave it out for a full permutation)", where,
                       INT32_MAX);
    *buffer = (int64_t)v->valuedouble;
    return CT_OK;
}

/* Shard k's samples [*lo, *hi) of n (a shard past the last sample is empty). */
static void shard_range(const ct_dataset *ds, int64_t k, int64_t n, int64_t *lo, int64_t *hi) {
    int64_t a = ds->shard_start ? ds->shard_start(ds, k) : 0;
    int64_t b = ds->shard_start ? ds->shard_start(ds, k + 1) : -1;
    *lo = a < n ? a : n;
    *hi = b < 0 || b > n ? n : b;
}

void ct_order_shuffle_buffer(const ct_dataset *ds, uint64_t seed, uint64_t epoch, int64_t buffer, uint32_t *out) {
    int64_t n = ds->count, shards = 1;
    while (ds->shard_start && ds->shard_start(ds, shards) >= 0) shards++;
    uint32_t *shard_order = ct_xmalloc((size_t)shards * sizeof *shard_order);
    uint32_t *buf = ct_xmalloc((size_t)(buffer < n ? buffer : n) * sizeof *buf + 1);
    ct_rng_permutation(seed, epoch, shard_order, (uint32_t)shards);
    ct_rng r;
    ct_rng_init(&r, seed, CT_RNG_SHUFFLE, (1ull << 63) + epoch);
    int64_t held = 0, emitted = 0;
    for (int64_t s = 0; s < shards; s++) {
        int64_t lo, hi;
        shard_range(ds, shard_order[s], n, &lo, &hi);
        for (int64_t i = lo; i < hi; i++) {
            if (held < buffer) {
                buf[held++] = (uint32_t)i;
                continue;
            }
            uint32_t k = ct_rng_below(&r, (uint32_t)held);
            out[emitted++] = buf[k];
            buf[k] = (uint32_t)i;
        }
    }
    while (held > 0) { /* the end of the stream: what the buffer holds, in a random order */
        uint32_t k = ct_rng_below(&r, (uint32_t)held);
        out[emitted++] = buf[k];
        buf[k] = buf[--held];
    }
    free(buf);
    free(shard_order);
}
