/* transform.h: data.transform as the format readers and the loader read it.
 *
 * A leaf of core/data: transform.c calls no other file of the module, so the openers (idx.c,
 * image_folder.c, shard.c), the loader and dataset.c, which dispatches to the openers, all sit
 * above it. */
#ifndef CT_DATA_TRANSFORM_H
#define CT_DATA_TRANSFORM_H

#include <stdint.h>

#include "core/config/config.h"
#include "core/util/common.h"

/* data.transform.normalize {"mean": [..], "std": [..]}: per-channel, after scaling pixels to
 * [0, 1]. Fills mean/std (channels entries; a single value is broadcast). No "normalize": mean 0,
 * std 1. Rejects unknown data.transform keys (the augmentations belong to the loader). */
int ct_data_normalize_parse(const ct_config *cfg, int64_t channels, float *mean, float *std,
                            ct_err *err);

/* The normalised value of each 8-bit pixel, [channels][256] (caller frees): v / 255 scaled to
 * [0, 1], then (x - mean[c]) / std[c]. One table for every 8-bit format, so that a sample decodes
 * to the same floats whatever file it comes from (training from IDX and from its PNGs, shards or
 * TFRecords is then bitwise the same). */
float *ct_data_u8_lut(int64_t channels, const float *mean, const float *std);

#endif
