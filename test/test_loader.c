/* test_loader.c: the threaded loader. Every batch's bytes are identical with 1, 2 and 4 workers
 * (the synthetic dataset sleeps at random to scramble timing), seeking to a position gives the
 * batches an uninterrupted run gives, eval order is 0..n-1, drop_last, augmentation, the cache,
 * skip_corrupt counting and data errors; data.transform.on_device (forced on the CPU backend)
 * gives the host-normalised batches bit for bit, with flips by the Philox rule; the ranks of a
 * data-parallel run take disjoint slices of every step that cover the epoch. */
#include <check.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/config/config.h"
#include "core/cpu/cpu.h"
#include "core/data/loader.h"
#include "core/util/rng.h"

enum { N = 103, C = 2, H = 5, W = 6 };

static uint32_t mix(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    return x ^ (x >> 16);
}

typedef struct syn {
    int bad_record;              /* decode fails for this record (-1: none) */
    int bad_label;               /* this record's label is 99 (-1: none) */
    int bad_every;               /* decode also fails for records i % bad_every == 3 (0: none) */
    _Atomic int decodes;
} syn;

static int syn_decode(const ct_dataset *ds, int64_t i, void *input, void *target, ct_err *err) {
    syn *s = ds->impl;
    s->decodes++;
    if (mix((uint32_t)i * 31u + (uint32_t)rand()) % 8 == 0) usleep(200); /* scramble timing */
    if (i == s->bad_record || (s->bad_every && i % s->bad_every == 3))
        return ct_errf(err, CT_ERR_DATA, "syn.bin: record %lld: corrupt", (long long)i);
    float *x = input;
    for (int k = 0; k < C * H * W; k++) x[k] = (float)(mix((uint32_t)(i * 1000 + k)) % 1000) / 100.0f;
    *(int32_t *)target = i == s->bad_label ? 99 : (int32_t)(mix((uint32_t)i) % 7);
    return CT_OK;
}

static ct_dataset make_ds(syn *s) {
    s->bad_record = s->bad_label = -1;
    s->bad_every = 0;
    s->decodes = 0;
    ct_dataset ds = {.format = "syn", .count = N, .sample_shape = {.ndim = 3, .d = {C, H, W}},
                     .sample_dtype = CT_F32, .target_dtype = CT_I32, .classes = 7, .impl = s,
                     .decode = syn_decode};
    snprintf(ds.source, sizeof ds.source, "syn.bin");
    return ds;
}

static ct_loader_opts opts(int workers) {
    ct_loader_opts o = {.batch = 8, .workers = workers, .prefetch = 3, .shuffle = true,
                        .drop_last = false, .seed = 1234, .classes = 7};
    o.aug.crop_pad = 2;
    o.aug.hflip = true;
    o.pad_value[0] = -1.5f;
    o.pad_value[1] = 2.5f;
    return o;
}

/* Concatenated bytes (inputs, then targets, then n) of `nb` batches. */
static uint8_t *collect(ct_backend *be, const ct_dataset *ds, const ct_loader_opts *o, int64_t epoch,
                        int64_t sample, int nb, size_t *len) {
    ct_loader *l;
    ct_err err = {0};
    ck_assert_msg(ct_loader_init(&l, be, ds, o, NULL, &err) == CT_OK, "%s", err.msg);
    if (epoch || sample) ct_loader_seek(l, epoch, sample);
    size_t per = (size_t)o->batch * (C * H * W * 4 + 4) + 8;
    uint8_t *all = calloc((size_t)nb, per);
    for (int i = 0; i < nb; i++) {
        ct_loader_batch b;
        ck_assert_msg(ct_loader_next(l, &b, &err) == CT_OK, "%s", err.msg);
        uint8_t *p = all + (size_t)i * per;
        memcpy(p, b.input, (size_t)b.n * C * H * W * 4);
        memcpy(p + (size_t)o->batch * C * H * W * 4, b.target, (size_t)b.n * 4);
        memcpy(p + per - 8, &b.n, 8);
    }
    ct_loader_free(l);
    *len = (size_t)nb * per;
    return all;
}

START_TEST(test_workers_identical) {
    ct_backend *be = ct_cpu_backend_create(1);
    syn s;
    ct_dataset ds = make_ds(&s);
    size_t n1, n2, n4;
    ct_loader_opts o = opts(1);
    int nb = 3 * 13 + 2; /* 13 batches per epoch: crosses epoch boundaries */
    uint8_t *a = collect(be, &ds, &o, 0, 0, nb, &n1);
    o.workers = 2;
    uint8_t *b = collect(be, &ds, &o, 0, 0, nb, &n2);
    o.workers = 4;
    o.prefetch = 7;
    uint8_t *c = collect(be, &ds, &o, 0, 0, nb, &n4);
    ck_assert(n1 == n2 && n1 == n4);
    ck_assert_msg(memcmp(a, b, n1) == 0, "1 vs 2 workers differ");
    ck_assert_msg(memcmp(a, c, n1) == 0, "1 vs 4 workers differ");
    /* Resume: from (epoch 1, sample 40: batch 5) the same bytes as the uninterrupted run. */
    size_t nr, per = n1 / (size_t)nb;
    uint8_t *r = collect(be, &ds, &o, 1, 5 * 8, nb - 18, &nr);
    ck_assert_msg(memcmp(a + 18 * per, r, nr) == 0, "resumed batches differ");
    /* Epochs differ (shuffle and augmentation change). */
    ck_assert(memcmp(a, a + 13 * per, per) != 0);
    free(a);
    free(b);
    free(c);
    free(r);
    ct_backend_destroy(be);
}
END_TEST

/* One sample as the loader hands it out: its input bytes (augmented), its target, its epoch. */
enum { SAMPLE_BYTES = C * H * W * 4 + 4 };
typedef struct taken {
    uint8_t *bytes;              /* [n, SAMPLE_BYTES] */
    int64_t *epoch;              /* [n] */
    int64_t n;
} taken;

/* Take batches until `epochs_done` epochs have ended (after a seek, the first is the rest of the
 * epoch sought), flattened to samples; checks each batch's size and last_of_epoch against the
 * epoch's end (ct_loader_epoch_end) and the micro-batch. */
static taken take_epochs(ct_loader *l, int64_t batch, int epochs_done) {
    taken t = {.bytes = malloc((size_t)(epochs_done + 1) * N * SAMPLE_BYTES),
               .epoch = malloc((size_t)(epochs_done + 1) * N * sizeof(int64_t))};
    int64_t e0, at;
    ct_loader_position(l, &e0, &at);
    ct_err err = {0};
    for (int done = 0; done < epochs_done;) {
        ct_loader_batch b;
        ck_assert_msg(ct_loader_next(l, &b, &err) == CT_OK, "%s", err.msg);
        int64_t end = ct_loader_epoch_end(l, b.epoch);
        ck_assert_int_eq(b.epoch, e0 + done);
        ck_assert_int_eq(b.n, end - at < batch ? end - at : batch);
        ck_assert(b.last_of_epoch == (at + b.n == end));
        for (int64_t k = 0; k < b.n; k++, t.n++) {
            memcpy(t.bytes + t.n * SAMPLE_BYTES, (const uint8_t *)b.input + k * (SAMPLE_BYTES - 4), SAMPLE_BYTES - 4);
            memcpy(t.bytes + t.n * SAMPLE_BYTES + SAMPLE_BYTES - 4, (const int32_t *)b.target + k, 4);
            t.epoch[t.n] = b.epoch;
        }
        at += b.n;
        if (b.last_of_epoch) {
            done++;
            at = 0;
        }
    }
    return t;
}

/* ct_loader_seek(epoch, sample) continues at that sample of the epoch's order whatever the
 * micro-batch and step size (train_batch_size) of the loader that seeks, so a resume with other
 * batch sizes sees the samples the interrupted run had not seen, in the same order and with the
 * same augmentation: the rest of the epoch (up to the last full step from there with drop_last,
 * else to its end) in micro-batches from that sample, then whole epochs as usual. Checked against
 * the epoch's order and augmented bytes as a loader of single samples gives them, for random
 * positions (on and off batch boundaries, at and past the epoch's end), batch sizes and
 * drop_last. */
START_TEST(test_seek_by_sample) {
    ct_backend *be = ct_cpu_backend_create(1);
    syn s;
    ct_dataset ds = make_ds(&s);
    ct_loader_opts ref = opts(2);
    ref.batch = 1;
    ct_loader *l;
    ct_err err = {0};
    ck_assert_int_eq(ct_loader_init(&l, be, &ds, &ref, NULL, &err), CT_OK);
    taken all = take_epochs(l, 1, 5); /* the full order of epochs 0..4, every sample */
    ct_loader_free(l);
    ck_assert_int_eq(all.n, 5 * N);
    ct_rng r;
    ct_rng_init(&r, 99, 1, 0);
    for (int trial = 0; trial < 24; trial++) {
        ct_loader_opts o = opts(1 + (int)ct_rng_below(&r, 3));
        o.prefetch = 1 + (int)ct_rng_below(&r, 4);
        o.batch = 1 + ct_rng_below(&r, 16);
        o.step_samples = o.batch * (1 + ct_rng_below(&r, 4));
        o.drop_last = ct_rng_below(&r, 2);
        int64_t e = ct_rng_below(&r, 3);
        /* a third on a batch boundary, some at or past the end, the rest anywhere */
        int64_t p = trial % 3 == 0 ? o.batch * ct_rng_below(&r, N / o.batch + 1)
                    : trial % 7 == 1 ? N - (int64_t)ct_rng_below(&r, 3) : ct_rng_below(&r, N + 1);
        ck_assert_int_eq(ct_loader_init(&l, be, &ds, &o, NULL, &err), CT_OK);
        ct_loader_seek(l, e, p);
        /* where the epoch sought ends; the next epoch is cut as usual */
        int64_t end = o.drop_last ? p + (N - p) / o.step_samples * o.step_samples : N;
        int64_t full = o.drop_last ? N / o.step_samples * o.step_samples : N;
        int64_t pe, pp;
        ct_loader_position(l, &pe, &pp);
        if (end <= p) { /* nothing left of epoch e: the next one from its start */
            ck_assert_msg(pe == e + 1 && pp == 0, "trial %d: position %lld/%lld", trial, (long long)pe,
                          (long long)pp);
            /* and epoch e ends there for the caller too, even where its usual end lies after p */
            ck_assert_int_le(ct_loader_epoch_end(l, e), p);
            e++, p = 0, end = full;
        } else {
            ck_assert_msg(pe == e && pp == p, "trial %d: position %lld/%lld", trial, (long long)pe, (long long)pp);
        }
        ck_assert_int_eq(ct_loader_epoch_end(l, e), end);
        ck_assert_int_eq(ct_loader_epoch_end(l, e + 1), full);
        taken t = take_epochs(l, o.batch, 2);
        ct_loader_free(l);
        ck_assert_int_eq(t.n, end - p + full);
        for (int64_t j = 0; j < t.n; j++) {
            int64_t want = j < end - p ? e * N + p + j : (e + 1) * N + (j - (end - p));
            ck_assert_int_eq(t.epoch[j], want / N);
            ck_assert_msg(memcmp(t.bytes + j * SAMPLE_BYTES, all.bytes + want * SAMPLE_BYTES, SAMPLE_BYTES) == 0,
                          "trial %d (batch %lld, step %lld, drop_last %d, seek %lld/%lld): sample %lld differs",
                          trial, (long long)o.batch, (long long)o.step_samples, o.drop_last, (long long)e,
                          (long long)p, (long long)j);
        }
        free(t.bytes);
        free(t.epoch);
    }
    free(all.bytes);
    free(all.epoch);
    ct_backend_destroy(be);
}
END_TEST

/* Data parallelism: the loader of rank r of `world` gives, for every step of step_samples from the
 * epoch's start (or from a seek), the micro-batches of the rank's slice (ct_loader_rank_slice), with
 * the bytes a single loader gives at those positions; the ranks' slices cover every position of the
 * epoch exactly once, a short last step included (ranks past its end get nothing), and each rank's
 * last batch of an epoch says so. Random world sizes, accumulations, drop_last and seek positions. */
START_TEST(test_rank_slices) {
    ct_backend *be = ct_cpu_backend_create(1);
    syn s;
    ct_dataset ds = make_ds(&s);
    ct_loader_opts ref = opts(2);
    ref.batch = 1;
    ct_loader *l;
    ct_err err = {0};
    ck_assert_int_eq(ct_loader_init(&l, be, &ds, &ref, NULL, &err), CT_OK);
    taken all = take_epochs(l, 1, 2);   /* epochs 0 and 1, every sample in order */
    ct_loader_free(l);
    ct_rng r;
    ct_rng_init(&r, 77, 1, 0);
    for (int trial = 0; trial < 12; trial++) {
        int world = 2 + (int)ct_rng_below(&r, 3);
        ct_loader_opts o = opts(1 + (int)ct_rng_below(&r, 2));
        o.batch = 1 + ct_rng_below(&r, 4);
        int64_t per = o.batch * (1 + ct_rng_below(&r, 3));   /* a rank's part of a full step */
        o.step_samples = per * world;
        o.drop_last = ct_rng_below(&r, 2);
        o.world = world;
        int64_t p = trial % 3 == 0 ? 0 : ct_rng_below(&r, N);
        int covered[2][N] = {{0}};
        for (int rank = 0; rank < world; rank++) {
            o.rank = rank;
            int rc = ct_loader_init(&l, be, &ds, &o, NULL, &err);
            if (rc == CT_ERR_CONFIG) continue;   /* an epoch too short to give this rank anything */
            ck_assert_msg(rc == CT_OK, "%s", err.msg);
            if (p) ct_loader_seek(l, 0, p);
            for (int64_t e = 0, pos = p; e < 2; e++, pos = 0) {
                int64_t end = ct_loader_epoch_end(l, e), n;
                bool any = false, last = false;
                for (; pos < end; pos += n) {
                    n = end - pos < o.step_samples ? end - pos : o.step_samples;
                    int64_t lo, hi;
                    ct_loader_rank_slice(n, per, rank, &lo, &hi);
                    for (int64_t at = pos + lo; at < pos + hi; at += o.batch) {
                        ct_loader_batch b;
                        ck_assert_msg(ct_loader_next(l, &b, &err) == CT_OK, "%s", err.msg);
                        ck_assert_msg(b.epoch == e && b.start == at, "trial %d rank %d/%d: batch at %lld/%lld, "
                                      "want %lld/%lld", trial, rank, world, (long long)b.epoch,
                                      (long long)b.start, (long long)e, (long long)at);
                        ck_assert_int_eq(b.n, pos + hi - at < o.batch ? pos + hi - at : o.batch);
                        for (int64_t k = 0; k < b.n; k++) {
                            const uint8_t *want = all.bytes + (e * N + at + k) * SAMPLE_BYTES;
                            ck_assert(memcmp((const uint8_t *)b.input + k * (SAMPLE_BYTES - 4), want,
                                             SAMPLE_BYTES - 4) == 0);
                            ck_assert(memcmp((const int32_t *)b.target + k, want + SAMPLE_BYTES - 4, 4) == 0);
                            covered[e][at + k]++;
                        }
                        any = true;
                        last = b.last_of_epoch;
                    }
                }
                ck_assert_msg(!any || last, "trial %d rank %d: the last batch of epoch %lld not marked", trial,
                              rank, (long long)e);
            }
            ct_loader_free(l);
        }
        for (int e = 0; e < 2; e++) {
            int64_t from = e == 0 ? p : 0;
            int64_t end = o.drop_last ? from + (N - from) / o.step_samples * o.step_samples : N;
            for (int64_t i = 0; i < N; i++)
                ck_assert_msg(covered[e][i] == (i >= from && i < end), "trial %d (world %d, batch %lld, per %lld, "
                              "drop_last %d, seek %lld): epoch %d position %lld taken %d times", trial, world,
                              (long long)o.batch, (long long)per, o.drop_last, (long long)p, e, (long long)i,
                              covered[e][i]);
        }
    }
    free(all.bytes);
    free(all.epoch);
    ct_backend_destroy(be);
}
END_TEST

START_TEST(test_eval_order_and_drop_last) {
    ct_backend *be = ct_cpu_backend_create(1);
    syn s;
    ct_dataset ds = make_ds(&s);
    ct_loader_opts o = {.batch = 10, .workers = 2, .seed = 5, .classes = 7};
    ct_loader *l;
    ct_err err = {0};
    ck_assert_int_eq(ct_loader_init(&l, be, &ds, &o, NULL, &err), CT_OK);
    ck_assert_int_eq(ct_loader_batches_per_epoch(l), 11);
    float want[C * H * W];
    int32_t tgt;
    for (int64_t bi = 0, i = 0; bi < 11; bi++) {
        ct_loader_batch b;
        ck_assert_int_eq(ct_loader_next(l, &b, &err), CT_OK);
        ck_assert_int_eq(b.n, bi == 10 ? 3 : 10);
        ck_assert(b.last_of_epoch == (bi == 10));
        for (int64_t j = 0; j < b.n; j++, i++) {
            syn_decode(&ds, i, want, &tgt, &err);
            ck_assert(memcmp((float *)b.input + j * C * H * W, want, sizeof want) == 0);
            ck_assert_int_eq(((int32_t *)b.target)[j], tgt);
        }
    }
    int64_t e, bi;
    ct_loader_position(l, &e, &bi);
    ck_assert(e == 1 && bi == 0);
    ct_loader_free(l);
    /* drop_last with a step of 20 samples: 100 of 103 samples, 10 batches of 10. */
    o.drop_last = true;
    o.step_samples = 20;
    o.shuffle = true;
    ck_assert_int_eq(ct_loader_init(&l, be, &ds, &o, NULL, &err), CT_OK);
    ck_assert_int_eq(ct_loader_batches_per_epoch(l), 10);
    for (int i = 0; i < 20; i++) {
        ct_loader_batch b;
        ck_assert_int_eq(ct_loader_next(l, &b, &err), CT_OK);
        ck_assert_int_eq(b.n, 10);
    }
    ct_loader_free(l);
    /* Too few samples for one step. */
    o.step_samples = 200;
    ck_assert_int_eq(ct_loader_init(&l, be, &ds, &o, NULL, &err), CT_ERR_CONFIG);
    ct_backend_destroy(be);
}
END_TEST

START_TEST(test_augment_shape) {
    /* Padding only ever shows pad values; with padding 0 and no flip the sample is untouched. */
    ct_backend *be = ct_cpu_backend_create(1);
    syn s;
    ct_dataset ds = make_ds(&s);
    ct_loader_opts o = opts(2);
    o.shuffle = false;
    o.aug.hflip = false;
    o.aug.crop_pad = 0;
    size_t n0, n1;
    uint8_t *plain = collect(be, &ds, &o, 0, 0, 2, &n0);
    float want[C * H * W];
    int32_t t;
    ct_err err;
    syn_decode(&ds, 3, want, &t, &err);
    ck_assert(memcmp(plain + 3 * sizeof want, want, sizeof want) == 0);
    o.aug.hflip = true;
    uint8_t *flipped = collect(be, &ds, &o, 0, 0, 2, &n1);
    int same = 0, mirrored = 0;
    for (int i = 0; i < 8; i++) {
        const float *a = (const float *)(plain + i * sizeof want), *b = (const float *)(flipped + i * sizeof want);
        bool eq = true, mir = true;
        for (int k = 0; k < C * H; k++)
            for (int x = 0; x < W; x++) {
                eq &= a[k * W + x] == b[k * W + x];
                mir &= a[k * W + x] == b[k * W + W - 1 - x];
            }
        same += eq;
        mirrored += mir;
        ck_assert(eq || mir);
    }
    ck_assert_msg(same > 0 && mirrored > 0, "flips: %d same, %d mirrored of 8", same, mirrored);
    free(plain);
    free(flipped);
    ct_backend_destroy(be);
}
END_TEST

/* The crop offset that turns sample `want` into `got` (pad values where the shifted window leaves
 * the image), searched over [-p, p]^2; false when none does. */
static bool find_crop(const float *got, const float *want, const float *pad, int p, int *dy, int *dx) {
    for (int oy = -p; oy <= p; oy++)
        for (int ox = -p; ox <= p; ox++) {
            bool eq = true;
            for (int c = 0; c < C && eq; c++)
                for (int y = 0; y < H && eq; y++)
                    for (int x = 0; x < W && eq; x++) {
                        int sy = y + oy, sx = x + ox;
                        float v = sy >= 0 && sy < H && sx >= 0 && sx < W ? want[(c * H + sy) * W + sx] : pad[c];
                        eq = got[(c * H + y) * W + x] == v;
                    }
            if (eq) {
                *dy = oy;
                *dx = ox;
                return true;
            }
        }
    return false;
}

START_TEST(test_crop_offsets_cover_range) {
    /* random_crop with padding p draws each offset from all 2p + 1 values, evenly: a draw over
     * 2p values (one edge never reached) or a shifted range leaves a count at 0 here. */
    enum { P = 2, EPOCHS = 4, PER_EPOCH = (N + 7) / 8 };
    ct_backend *be = ct_cpu_backend_create(1);
    syn s;
    ct_dataset ds = make_ds(&s);
    ct_loader_opts o = opts(2);
    o.shuffle = false;
    o.aug.hflip = false;
    o.aug.crop_pad = P;
    size_t len;
    uint8_t *all = collect(be, &ds, &o, 0, 0, EPOCHS * PER_EPOCH, &len);
    size_t per = len / (EPOCHS * PER_EPOCH), sample_bytes = C * H * W * sizeof(float);
    int hy[2 * P + 1] = {0}, hx[2 * P + 1] = {0}, total = 0;
    for (int b = 0; b < EPOCHS * PER_EPOCH; b++) {
        int64_t n;
        memcpy(&n, all + (size_t)(b + 1) * per - 8, 8);
        for (int j = 0; j < n; j++) {
            float want[C * H * W];
            int32_t t;
            ct_err err;
            syn_decode(&ds, (b % PER_EPOCH) * 8 + j, want, &t, &err);
            int dy, dx;
            ck_assert_msg(find_crop((const float *)(all + (size_t)b * per + j * sample_bytes), want, o.pad_value,
                                    P, &dy, &dx), "batch %d sample %d is no crop of its record", b, j);
            hy[dy + P]++;
            hx[dx + P]++;
            total++;
        }
    }
    ck_assert_int_eq(total, EPOCHS * N);
    for (int k = 0; k <= 2 * P; k++)
        ck_assert_msg(hy[k] > total / (2 * P + 1) / 2 && hx[k] > total / (2 * P + 1) / 2,
                      "offset %d drawn %d times (rows), %d (columns) of %d", k - P, hy[k], hx[k], total);
    free(all);
    ct_backend_destroy(be);
}
END_TEST

/* ---- data.transform.on_device on the CPU backend (forced) ---- */

static const float u8_mean[C] = {0.485f, 0.406f}, u8_std[C] = {0.229f, 0.225f};

static uint8_t syn_pixel(int64_t i, int k) { return (uint8_t)(mix((uint32_t)(i * 977 + k)) & 255); }

static int syn_decode_u8(const ct_dataset *ds, int64_t i, uint8_t *input, void *target, ct_err *err) {
    if (mix((uint32_t)i * 17u + (uint32_t)rand()) % 8 == 0) usleep(200); /* scramble timing */
    for (int k = 0; k < C * H * W; k++) input[k] = syn_pixel(i, k);
    *(int32_t *)target = (int32_t)(mix((uint32_t)i) % 7);
    return CT_OK;
}

/* The float decode of the same pixels, normalised on the host as the image formats do. */
static int syn_decode_norm(const ct_dataset *ds, int64_t i, void *input, void *target, ct_err *err) {
    float *x = input;
    for (int k = 0; k < C * H * W; k++)
        x[k] = ((float)syn_pixel(i, k) / 255.0f - u8_mean[k / (H * W)]) / u8_std[k / (H * W)];
    *(int32_t *)target = (int32_t)(mix((uint32_t)i) % 7);
    return CT_OK;
}

/* The synthetic images as a dataset with both decode paths (on_device tests). */
static ct_dataset make_u8_ds(void) {
    ct_dataset ds = {.format = "syn", .count = N, .sample_shape = {.ndim = 3, .d = {C, H, W}},
                     .sample_dtype = CT_F32, .target_dtype = CT_I32, .classes = 7,
                     .decode = syn_decode_norm, .decode_u8 = syn_decode_u8};
    snprintf(ds.source, sizeof ds.source, "syn.bin");
    return ds;
}

static ct_loader_opts u8_opts(int workers, int crop, bool hflip) {
    ct_loader_opts o = opts(workers);
    o.aug.crop_pad = crop;
    o.aug.hflip = hflip;
    for (int c = 0; c < C; c++) {
        o.mean[c] = u8_mean[c];
        o.std[c] = u8_std[c];
        o.pad_value[c] = -u8_mean[c] / u8_std[c];
    }
    o.device_dtype = CT_F32;
    return o;
}

START_TEST(test_on_device_equals_host) {
    /* Every batch normalised by normalize_u8 equals the host-normalised batch, bit for bit: same
     * samples, same crops (pixel-0 padding), same flips; over an epoch boundary. */
    ct_backend *be = ct_cpu_backend_create(1);
    ct_dataset ds = make_u8_ds();
    const int crops[3] = {0, 2, 3};
    const bool flips[3] = {true, true, false};
    int nb = 16; /* 103 samples, batch 8: 13 per epoch, so the second epoch starts at batch 13 */
    for (int v = 0; v < 3; v++) {
        ct_loader_opts o = u8_opts(1, crops[v], flips[v]);
        size_t n0, n1;
        uint8_t *host = collect(be, &ds, &o, 0, 0, nb, &n0);
        for (int workers = 1; workers <= 2; workers++) {
            o = u8_opts(workers, crops[v], flips[v]);
            o.on_device = true;
            o.on_device_cpu = true;
            uint8_t *dev = collect(be, &ds, &o, 0, 0, nb, &n1);
            ck_assert_int_eq(n0, n1);
            ck_assert_msg(memcmp(host, dev, n0) == 0, "crop %d flip %d, %d workers: batches differ",
                          crops[v], flips[v], workers);
            free(dev);
        }
        /* without on_device_cpu the CPU keeps the float path (the slot itself) */
        o.on_device = true;
        o.on_device_cpu = false;
        uint8_t *plain = collect(be, &ds, &o, 0, 0, nb, &n1);
        ck_assert(memcmp(host, plain, n0) == 0);
        free(plain);
        free(host);
    }
    ct_backend_destroy(be);
}
END_TEST

/* A backend whose uploads report "not finished" until waited for: the loader must keep those
 * slots from the workers, and wait rather than deadlock when it runs out of them. */
static int polls_refused;
static uint64_t waited_upto;      /* uploads finish in order: a wait covers every earlier ticket */
static bool lazy_upload_done(ct_backend *be, uint64_t ticket, bool wait) {
    if (wait && ticket > waited_upto) waited_upto = ticket;
    if (ticket <= waited_upto) return true;
    polls_refused++;
    return false;
}

START_TEST(test_on_device_slow_uploads) {
    ct_backend *cpu = ct_cpu_backend_create(1);
    ct_backend lazy = *cpu;
    lazy.queue.upload_done = lazy_upload_done;
    ct_dataset ds = make_u8_ds();
    ct_loader_opts o = u8_opts(2, 2, true);
    size_t n0, n1;
    uint8_t *host = collect(cpu, &ds, &o, 0, 0, 20, &n0);
    o.on_device = o.on_device_cpu = true;
    o.prefetch = 2;
    polls_refused = 0;
    waited_upto = 0;
    uint8_t *dev = collect(&lazy, &ds, &o, 0, 0, 20, &n1);
    ck_assert(n0 == n1 && memcmp(host, dev, n0) == 0);
    ck_assert_int_gt(polls_refused, 0);
    free(host);
    free(dev);
    ct_backend_destroy(cpu);
}
END_TEST

/* Double buffering: alternate batches land in alternate device buffers, and each batch's uploads
 * wait only for the compute mark taken at the previous call, when the work on the batch before
 * that (same buffers) had been queued (0, "everything", for the very first batch). */
static uint64_t marks_taken;
static uint64_t uploads_after[64];
static int n_uploads;
static uint64_t counting_mark(ct_backend *be) { return ++marks_taken; }
static uint64_t recording_upload(ct_backend *be, void *dst, const void *src, size_t bytes, uint64_t after) {
    if (n_uploads < 64) uploads_after[n_uploads] = after;
    n_uploads++;
    memcpy(dst, src, bytes);
    return (uint64_t)n_uploads;
}

START_TEST(test_on_device_double_buffered) {
    ct_backend *cpu = ct_cpu_backend_create(1);
    ct_backend rec = *cpu;
    rec.queue.compute_mark = counting_mark;
    rec.queue.upload = recording_upload;
    ct_dataset ds = make_u8_ds();
    ct_loader_opts o = u8_opts(1, 0, false);   /* no flips: two uploads per batch (pixels, targets) */
    o.on_device = o.on_device_cpu = true;
    ct_loader *l;
    ct_err err = {0};
    ct_warnings w = {0};
    ck_assert(ct_loader_init(&l, &rec, &ds, &o, &w, &err) == CT_OK);
    marks_taken = 0;
    n_uploads = 0;
    const void *in[6];
    for (int j = 0; j < 6; j++) {
        ct_loader_batch b;
        ck_assert(ct_loader_next(l, &b, &err) == CT_OK);
        in[j] = b.input;
        /* call j takes mark j + 1; batch j waits for the mark of call j - 1, mark j */
        uint64_t want = (uint64_t)j;
        ck_assert_msg(uploads_after[2 * j] == want && uploads_after[2 * j + 1] == want,
                      "batch %d waited for marks %llu/%llu, expected %llu", j,
                      (unsigned long long)uploads_after[2 * j], (unsigned long long)uploads_after[2 * j + 1],
                      (unsigned long long)want);
        if (j >= 1) ck_assert_ptr_ne(in[j], in[j - 1]);
        if (j >= 2) ck_assert_ptr_eq(in[j], in[j - 2]);
    }
    ct_loader_free(l);
    ct_warnings_free(&w);
    ct_backend_destroy(cpu);
}
END_TEST

START_TEST(test_on_device_flip_rule) {
    /* The device flip of sample idx in epoch e is bit 0 of the first Philox draw of
     * (seed, CT_RNG_AUGMENT, e * count + idx) when there is no crop: check each sample against
     * the unflipped normalisation. */
    ct_backend *be = ct_cpu_backend_create(1);
    ct_dataset ds = make_u8_ds();
    ct_loader_opts o = u8_opts(2, 0, true);
    o.shuffle = false;
    o.on_device = true;
    o.on_device_cpu = true;
    ct_loader *l;
    ct_err err = {0};
    ck_assert_msg(ct_loader_init(&l, be, &ds, &o, NULL, &err) == CT_OK, "%s", err.msg);
    int flipped = 0, total = 0;
    for (int bi = 0; bi < 15; bi++) {
        ct_loader_batch b;
        ck_assert_msg(ct_loader_next(l, &b, &err) == CT_OK, "%s", err.msg);
        ck_assert_int_eq(b.input_dtype, CT_F32);
        for (int64_t j = 0; j < b.n; j++) {
            int64_t idx = b.start + j; /* no shuffle: sample k of the epoch is record k */
            ct_rng r;
            ct_rng_init(&r, o.seed, CT_RNG_AUGMENT, (uint64_t)b.epoch * N + (uint64_t)idx);
            bool flip = ct_rng_u32(&r) & 1;
            float want[C * H * W];
            int32_t t;
            syn_decode_norm(&ds, idx, want, &t, &err);
            const float *got = (const float *)b.input + j * C * H * W;
            for (int k = 0; k < C * H; k++)
                for (int x = 0; x < W; x++)
                    ck_assert(got[k * W + x] == want[k * W + (flip ? W - 1 - x : x)]);
            flipped += flip;
            total++;
        }
    }
    ck_assert_msg(flipped > total / 4 && flipped < 3 * total / 4, "%d of %d flipped", flipped, total);
    ct_loader_free(l);
    ct_backend_destroy(be);
}
END_TEST

START_TEST(test_cache) {
    ct_backend *be = ct_cpu_backend_create(1);
    syn s;
    ct_dataset ds = make_ds(&s);
    ct_loader_opts o = opts(2);
    size_t n0, n1;
    uint8_t *a = collect(be, &ds, &o, 0, 0, 39, &n0);
    int plain = s.decodes;
    o.cache = true;
    s.decodes = 0;
    uint8_t *b = collect(be, &ds, &o, 0, 0, 39, &n1);
    ck_assert(memcmp(a, b, n0) == 0);
    ck_assert_msg(s.decodes <= N + 8 && plain >= 3 * N, "cached: %d decodes, uncached %d", s.decodes, plain);
    free(a);
    free(b);
    ct_backend_destroy(be);
}
END_TEST

START_TEST(test_errors_and_skip) {
    ct_backend *be = ct_cpu_backend_create(1);
    syn s;
    ct_dataset ds = make_ds(&s);
    s.bad_record = 17;
    s.bad_label = 40;
    ct_loader_opts o = {.batch = 10, .workers = 2, .seed = 5, .classes = 7};
    ct_loader *l;
    ct_err err = {0};
    ct_loader_batch b;
    ck_assert_int_eq(ct_loader_init(&l, be, &ds, &o, NULL, &err), CT_OK);
    ck_assert_int_eq(ct_loader_next(l, &b, &err), CT_OK);
    ck_assert_int_eq(ct_loader_next(l, &b, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "syn.bin: record 17"), "%s", err.msg);
    ct_loader_seek(l, 0, 40);
    ck_assert_int_eq(ct_loader_next(l, &b, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "syn.bin: record 40: label 99 is outside"), "%s", err.msg);
    ct_loader_free(l);
    o.skip_corrupt = true;
    ck_assert_int_eq(ct_loader_init(&l, be, &ds, &o, NULL, &err), CT_OK);
    int64_t total = 0;
    for (int e = 0; e < 2; e++)
        for (int i = 0; i < 11; i++) {
            ck_assert_int_eq(ct_loader_next(l, &b, &err), CT_OK);
            total += b.n;
        }
    ck_assert_int_eq(total, 2 * (N - 2));
    ck_assert_int_eq(ct_loader_skipped(l), 2);
    ct_loader_free(l);
    ct_backend_destroy(be);
}
END_TEST

/* A dataset whose sample i is the value i (so a batch shows the order it was drawn in). */
static int id_decode(const ct_dataset *ds, int64_t i, void *input, void *target, ct_err *err) {
    float *x = input;
    for (int k = 0; k < C * H * W; k++) x[k] = (float)i;
    *(int32_t *)target = (int32_t)(i % 7);
    return CT_OK;
}

/* The order in which the loader gives the samples of `epochs` epochs: order[e * N + j]. */
static void epoch_orders(const ct_loader_opts *o, int epochs, int64_t *order) {
    ct_backend *be = ct_cpu_backend_create(1);
    ct_dataset ds = {.format = "ids", .count = N, .sample_shape = {.ndim = 3, .d = {C, H, W}},
                     .sample_dtype = CT_F32, .target_dtype = CT_I32, .classes = 7, .decode = id_decode};
    ct_loader *l;
    ct_err err = {0};
    ck_assert_msg(ct_loader_init(&l, be, &ds, o, NULL, &err) == CT_OK, "%s", err.msg);
    int64_t j = 0;
    while (j < epochs * N) {
        ct_loader_batch b;
        ck_assert_int_eq(ct_loader_next(l, &b, &err), CT_OK);
        for (int64_t k = 0; k < b.n; k++) order[j++] = (int64_t)((const float *)b.input)[k * C * H * W];
    }
    ct_loader_free(l);
    ct_backend_destroy(be);
}

/* Each epoch is a permutation of 0..N-1; returns whether it is the identity. */
static bool permutation_is_identity(const int64_t *order) {
    bool seen[N] = {false}, identity = true;
    for (int j = 0; j < N; j++) {
        ck_assert(order[j] >= 0 && order[j] < N && !seen[order[j]]);
        seen[order[j]] = true;
        identity &= order[j] == j;
    }
    return identity;
}

/* Shuffling alone, augmentation off: every epoch draws a new order (the per-epoch check in
 * test_workers_identical also passes through augmentation alone). And data.shuffle defaults to
 * true for the train set, false for eval. */
START_TEST(test_shuffle_per_epoch) {
    ct_loader_opts o = {.batch = 8, .workers = 2, .prefetch = 3, .shuffle = true, .seed = 77, .classes = 7};
    int64_t order[3 * N];
    epoch_orders(&o, 3, order);
    for (int e = 0; e < 3; e++) ck_assert_msg(!permutation_is_identity(order + e * N), "epoch %d in order", e);
    ck_assert_msg(memcmp(order, order + N, sizeof order[0] * N) != 0, "epochs 0 and 1 in the same order");
    ck_assert_msg(memcmp(order + N, order + 2 * N, sizeof order[0] * N) != 0, "epochs 1 and 2 the same");

    ct_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cJSON *data = cJSON_Parse("{\"train\": {}}");
    cfg.data = data;
    cfg.micro_batch = cfg.train_batch_size = 8;
    cfg.train.seed = 77;
    ct_dataset ds = {.format = "ids", .count = N, .sample_shape = {.ndim = 3, .d = {C, H, W}},
                     .sample_dtype = CT_F32, .target_dtype = CT_I32, .classes = 7, .decode = id_decode};
    ct_loader_opts from_cfg;
    ct_err err = {0};
    ck_assert_msg(ct_loader_opts_from_config(&cfg, &ds, true, 7, &from_cfg, &err) == CT_OK, "%s", err.msg);
    ck_assert_msg(from_cfg.shuffle, "data.shuffle should default to true for the train set");
    from_cfg.drop_last = false;
    epoch_orders(&from_cfg, 1, order);
    ck_assert(!permutation_is_identity(order));
    ck_assert_int_eq(ct_loader_opts_from_config(&cfg, &ds, false, 7, &from_cfg, &err), CT_OK);
    ck_assert_msg(!from_cfg.shuffle, "the eval set is read in order");
    epoch_orders(&from_cfg, 1, order);
    ck_assert(permutation_is_identity(order));
    cJSON_Delete(data);
}
END_TEST

/* The lines skip_corrupt says, joined ("\n" after each). */
typedef struct said {
    char text[8192];
    int lines;
} said;

static void collect_line(void *ctx, const char *line) {
    said *w = ctx;
    size_t n = strlen(w->text);
    snprintf(w->text + n, sizeof w->text - n, "%s\n", line);
    w->lines++;
}

/* skip_corrupt names the first 10 distinct records skipped, in stream order whatever the worker
 * count, then says once per epoch how many more it skipped; a bad record met again in a later
 * epoch is not named again. */
START_TEST(test_skip_warnings) {
    ct_backend *be = ct_cpu_backend_create(1);
    syn s;
    ct_dataset ds = make_ds(&s);
    s.bad_every = 8; /* records 3, 11, ..., 99: 13 of 103 */
    said first = {0};
    for (int workers = 1; workers <= 4; workers += 3) {
        said w = {0};
        ct_loader_opts o = {.batch = 10, .workers = workers, .prefetch = 3, .shuffle = true, .seed = 9,
                            .classes = 7, .skip_corrupt = true, .warn_fn = collect_line, .warn_ctx = &w};
        ct_loader *l;
        ct_err err = {0};
        ck_assert_int_eq(ct_loader_init(&l, be, &ds, &o, NULL, &err), CT_OK);
        for (int i = 0; i < 2 * 11; i++) {
            ct_loader_batch b;
            ck_assert_int_eq(ct_loader_next(l, &b, &err), CT_OK);
        }
        ck_assert_int_eq(ct_loader_skipped(l), 13);
        ct_loader_free(l);
        ck_assert_msg(w.lines == 12, "%d lines:\n%s", w.lines, w.text);
        /* the first 10 bad records of epoch 0's order, each named once with its error */
        uint32_t perm[N];
        ct_rng_permutation(o.seed, 0, perm, N);
        char want[64];
        const char *at = w.text;
        for (int k = 0, named = 0; k < N && named < 10; k++) {
            if (perm[k] % 8 != 3) continue;
            snprintf(want, sizeof want, "skipped syn.bin: record %u: corrupt", perm[k]);
            const char *hit = strstr(at, want);
            ck_assert_msg(hit, "missing or out of order: %s\n%s", want, w.text);
            at = hit + 1;
            named++;
        }
        ck_assert_msg(strstr(w.text, "syn.bin: epoch 1 skipped 13 corrupt records, 3 of them not named "
                                     "above (13 distinct so far)") &&
                      strstr(w.text, "syn.bin: epoch 2 skipped 13 corrupt records, 3 of them not named "
                                     "above (13 distinct so far)"), "%s", w.text);
        if (workers == 1) first = w;
        else ck_assert_str_eq(first.text, w.text);
    }
    /* one bad record over three epochs: one line */
    s.bad_every = 0;
    s.bad_record = 50;
    said w = {0};
    ct_loader_opts o = {.batch = 10, .workers = 2, .shuffle = true, .seed = 9, .classes = 7,
                        .skip_corrupt = true, .warn_fn = collect_line, .warn_ctx = &w};
    ct_loader *l;
    ct_err err = {0};
    ck_assert_int_eq(ct_loader_init(&l, be, &ds, &o, NULL, &err), CT_OK);
    for (int i = 0; i < 3 * 11; i++) {
        ct_loader_batch b;
        ck_assert_int_eq(ct_loader_next(l, &b, &err), CT_OK);
    }
    ct_loader_free(l);
    ck_assert_msg(w.lines == 1 && strstr(w.text, "syn.bin: record 50: corrupt"), "%s", w.text);
    ct_backend_destroy(be);
}
END_TEST

int main(void) {
    Suite *s = suite_create("loader");
    TCase *tc = tcase_create("loader");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_workers_identical);
    tcase_add_test(tc, test_eval_order_and_drop_last);
    tcase_add_test(tc, test_seek_by_sample);
    tcase_add_test(tc, test_rank_slices);
    tcase_add_test(tc, test_augment_shape);
    tcase_add_test(tc, test_crop_offsets_cover_range);
    tcase_add_test(tc, test_cache);
    tcase_add_test(tc, test_on_device_equals_host);
    tcase_add_test(tc, test_on_device_flip_rule);
    tcase_add_test(tc, test_on_device_slow_uploads);
    tcase_add_test(tc, test_on_device_double_buffered);
    tcase_add_test(tc, test_errors_and_skip);
    tcase_add_test(tc, test_skip_warnings);
    tcase_add_test(tc, test_shuffle_per_epoch);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed != 0;
}
