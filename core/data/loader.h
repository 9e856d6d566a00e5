/* loader.h: the threaded, prefetching batch loader.
 *
 * data.workers threads each assemble WHOLE batches (read, decode, augment, collate) into a ring
 * of data.prefetch slots; the trainer takes them in order with ct_loader_next. Batch g of the
 * stream (epoch g / batches_per_epoch) holds the same bytes whatever the worker count or timing:
 * its samples come from ct_rng_permutation(seed, epoch) (or 0..n-1 without shuffle) and its
 * augmentation from Philox (seed, CT_RNG_AUGMENT, epoch * count + sample). The stream runs on
 * across epochs; ct_loader_seek restarts it at any sample of an epoch's order (resume), which
 * does not depend on the batch sizes.
 *
 * Slots are backend->alloc_host_pinned memory. On the CPU backend the graph reads the slot
 * directly; on a device backend ct_loader_next queues be->upload straight from the slot into
 * device buffers and hands the slot back to the workers once upload_done says the DMA has read it.
 *
 * data.transform.on_device (device backends): workers decode uint8 pixels (ct_dataset.decode_u8),
 * random-crop them with pixel-0 padding (which normalises to the -mean/std the float path pads
 * with) and, instead of flipping, store one flip byte per sample after the batch's pixels; the
 * backend's normalize_u8 normalises and flips on the device into the compute dtype. Same Philox
 * draws as the float path, so the batch equals the host-normalised one. */
#ifndef CT_DATA_LOADER_H
#define CT_DATA_LOADER_H

#include "core/backend/backend.h"
#include "core/util/common.h"
#include "core/config/config.h"
#include "core/data/dataset.h"

/* data.transform augmentations (train set only) and normalisation constants for padding. */
typedef struct ct_augment {
    int crop_pad;                /* random crop with this much zero padding per side (0: off) */
    bool hflip;                  /* horizontal flip with probability 1/2 */
} ct_augment;

typedef struct ct_loader_opts {
    int64_t batch;               /* samples per batch (the micro-batch) */
    int64_t step_samples;        /* drop_last cuts each epoch to a multiple of this (train_batch_size);
                                    0 = batch */
    /* Data parallelism (world > 1): this loader gives rank `rank` its slice of every step of
     * step_samples (ct_loader_rank_slice), in micro-batches of `batch`; the ranks' slices of a
     * step are disjoint and cover it, so together they see the global batches one process sees.
     * step_samples / world must be a multiple of batch. 0 or 1: the whole stream. */
    int rank, world;
    int workers;                 /* 0 = number of online cores */
    int prefetch;                /* ring slots; 0 = 4 */
    bool shuffle, drop_last, cache, skip_corrupt;
    int64_t shuffle_buffer;      /* data.shuffle_buffer: with shuffle, WebDataset's buffer of this
                                    many samples over shuffled shards (order.h); 0 = a permutation */
    uint64_t seed;
    int64_t classes;             /* class-index targets must be < classes (0: not checked) */
    int64_t ids_below;           /* token-id (int32) samples: every id must be in [0, ids_below), the
                                    model's embedding vocabulary (0: not checked). Checked here, on
                                    the loader's threads: a device kernel reading past its table
                                    would fault (or read garbage) instead of naming the data */
    ct_augment aug;
    float pad_value[4];          /* per channel: what a zero pixel normalises to (-mean/std) */
    bool on_device;              /* data.transform.on_device (used only off the CPU backend) */
    bool on_device_cpu;          /* tests: run the on_device path on the CPU backend too */
    ct_dtype device_dtype;       /* what normalize_u8 writes (the compute dtype); CT_F32 default */
    float mean[4], std[4];       /* data.transform.normalize, per channel (on_device) */
    /* skip_corrupt: what was skipped, one line at a time (no "ctrain: warning:" prefix), called
     * from ct_loader_next on its caller's thread in stream order: a line naming each of the first
     * CT_LOADER_SKIPS_NAMED distinct records skipped (the decode error: file and record), then, at
     * the end of each epoch that skipped records not named so, one line counting them. NULL:
     * nothing is said (ct_loader_skipped still counts). */
    void (*warn_fn)(void *ctx, const char *line);
    void *warn_ctx;
} ct_loader_opts;

enum { CT_LOADER_SKIPS_NAMED = 10 };

/* Options for data.<which> from the config: data.workers/prefetch/shuffle (train only, default
 * true)/drop_last/cache/skip_corrupt, data.transform.random_crop {"padding": P} and
 * data.transform.hflip (train only), data.transform.on_device (a format without 8-bit images is a
 * config error naming the key), train.seed. device_dtype is left CT_F32 (the trainer sets it). batch = micro-batch, step_samples =
 * train_batch_size. Returns CT_OK or CT_ERR_CONFIG. */
int ct_loader_opts_from_config(const ct_config *cfg, const ct_dataset *ds, bool train,
                               int64_t classes, ct_loader_opts *o, ct_err *err);

typedef struct ct_loader ct_loader;

/* A batch handed to the trainer: valid until the next ct_loader_next / seek / free. */
typedef struct ct_loader_batch {
    void *input, *target;        /* backend memory: [n, sample] and [n, target] */
    ct_dtype input_dtype;        /* of input: the dataset's, or opts.device_dtype on_device */
    int64_t n;                   /* samples (fewer than opts.batch at an epoch's end or when
                                    skip_corrupt dropped records; may be 0 then) */
    int64_t epoch, start;        /* position of this batch: it holds samples start, start + 1, ...
                                    of the epoch's order */
    bool last_of_epoch;
} ct_loader_batch;

/* Rank `rank`'s part of a step of n samples (n <= world * per_rank, per_rank samples per rank in
 * a full step): samples [*lo, *hi) of the step, in rank order; a short last step leaves the last
 * ranks less, or nothing. Pure: the trainer counts its micro-batches with it. */
void ct_loader_rank_slice(int64_t n, int64_t per_rank, int rank, int64_t *lo, int64_t *hi);

/* Start the workers at (epoch 0, batch 0). Warnings (cache does not fit) go to warn. */
int ct_loader_init(ct_loader **out, ct_backend *be, const ct_dataset *ds, const ct_loader_opts *o,
                   ct_warnings *warn, ct_err *err);
/* Take the next batch in order, waiting for it if needed. Data errors: CT_ERR_DATA naming the
 * file and record (without skip_corrupt). */
int ct_loader_next(ct_loader *l, ct_loader_batch *b, ct_err *err);
/* Position of the batch the next ct_loader_next returns: its epoch and its first sample in the
 * epoch's order. */
void ct_loader_position(const ct_loader *l, int64_t *epoch, int64_t *sample);
/* Continue at sample `sample` of epoch `epoch`'s order (a resume: the samples of that epoch the
 * interrupted run had taken, whatever its batch sizes were). The rest of that epoch comes in
 * micro-batches from there; with drop_last it ends after the last whole step (step_samples) from
 * there, the remainder dropped as drop_last drops it at every epoch's end; later epochs are cut
 * from their start as usual. When nothing is left of the epoch (sample at or past where it would
 * end), the stream goes on at the next epoch's first sample. */
void ct_loader_seek(ct_loader *l, int64_t epoch, int64_t sample);
/* Where an epoch's part of the stream ends, in samples of its order: for the epoch of the last
 * seek, as ct_loader_seek says (the sample sought when nothing was left of it); for the others
 * the samples an epoch uses (drop_last). */
int64_t ct_loader_epoch_end(const ct_loader *l, int64_t epoch);
/* Micro-batches of an epoch from its start, over all ranks (the stream of one rank has its share). */
int64_t ct_loader_batches_per_epoch(const ct_loader *l);
/* Seconds the caller waited in ct_loader_next: the last call and the total. */
double ct_loader_last_wait(const ct_loader *l);
double ct_loader_total_wait(const ct_loader *l);
/* Distinct records skipped as corrupt so far (data.skip_corrupt), in the batches taken. */
int64_t ct_loader_skipped(const ct_loader *l);
void ct_loader_free(ct_loader *l);

/* Bytes of device memory (CT_MEM_LOADER) a loader holds on a backend other than the CPU: two
 * batch buffers of `batch` samples (sample_numel elements of sample_dt; on the u8 path of
 * data.transform.on_device, uint8 pixels plus a flip byte per sample as uploaded and the input in
 * device_dt) and their targets. Pure: the memory plan's number. */
size_t ct_loader_device_bytes(int64_t batch, int64_t sample_numel, ct_dtype sample_dt,
                              int64_t target_numel, ct_dtype target_dt, bool u8, ct_dtype device_dt);

#endif
