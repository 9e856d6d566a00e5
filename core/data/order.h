/* order.h: data.shuffle_buffer, an epoch's sample order as WebDataset shuffles a stream: the shards
 * in an order drawn per epoch, their samples in file order, streamed through a buffer of N samples
 * from which each next sample is drawn at random. Reads stay close to sequential (each shard is
 * read from start to end, N samples ahead at most), where the loader's default, a permutation of
 * every sample, reads all over every file.
 *
 * The order is a permutation of 0..count-1 computed from (train.seed, epoch) alone, so that it is
 * the same for any worker count and a resume lands on the exact sample, as with the default. */
#ifndef CT_DATA_ORDER_H
#define CT_DATA_ORDER_H

#include <stdint.h>

#include "core/config/config.h"
#include "core/data/dataset.h"

/* data.shuffle_buffer: *buffer = N (an integer 1..2^31-1), or 0 when absent or null (the full
 * permutation). CT_ERR_CONFIG at the key otherwise. */
int ct_order_buffer_parse(const ct_config *cfg, int64_t *buffer, ct_err *err);

/* The order of `epoch` into out[0..ds->count): shards by ds->shard_start (one shard when NULL). */
void ct_order_shuffle_buffer(const ct_dataset *ds, uint64_t seed, uint64_t epoch, int64_t buffer, uint32_t *out);

#endif
