/* test_tfevents.c: CRC-32C against published vectors, and TensorBoard event files read back by a
 * reader written here (TFRecord framing with both CRCs checked, Event protobufs decoded field by
 * field) from what the metrics writer thread wrote. */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/report/metrics.h"
#include "core/report/tfevents.h"
#include "core/util/crc32c.h"

START_TEST(crc32c_known_vectors) {
    ck_assert_uint_eq(ct_crc32c(0, "123456789", 9), 0xE3069283u);
    ck_assert_uint_eq(ct_crc32c(0, "", 0), 0);
    unsigned char zeros[32] = {0}, ones[32], inc[32];
    memset(ones, 0xff, sizeof ones);
    for (int i = 0; i < 32; i++) inc[i] = (unsigned char)i;
    /* RFC 3720 (iSCSI) B.4 */
    ck_assert_uint_eq(ct_crc32c(0, zeros, 32), 0x8A9136AAu);
    ck_assert_uint_eq(ct_crc32c(0, ones, 32), 0x62A8AB43u);
    ck_assert_uint_eq(ct_crc32c(0, inc, 32), 0x46DD794Eu);
}
END_TEST

/* Continuing from a partial CRC is the CRC of the whole, at every split of random data. */
START_TEST(crc32c_continues) {
    srand(11);
    unsigned char buf[300];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)rand();
    uint32_t whole = ct_crc32c(0, buf, sizeof buf);
    for (size_t k = 0; k <= sizeof buf; k += 1 + (size_t)(rand() % 17))
        ck_assert_uint_eq(ct_crc32c(ct_crc32c(0, buf, k), buf + k, sizeof buf - k), whole);
    buf[rand() % sizeof buf] ^= 4;
    ck_assert_uint_ne(ct_crc32c(0, buf, sizeof buf), whole);
}
END_TEST

/* ---- the reader ---- */

static uint32_t unmask(uint32_t m) {
    uint32_t r = m - 0xa282ead8u;
    return (r >> 17) | (r << 15);
}

static uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* One record's data into buf (its length returned); 0 at a clean end of file; fails the test on a
 * torn record or a CRC that does not match. */
static size_t read_record(FILE *f, unsigned char *buf, size_t cap) {
    unsigned char head[12], tail[4];
    size_t got = fread(head, 1, 12, f);
    if (got == 0) return 0;
    ck_assert_uint_eq(got, 12);
    uint64_t n = le(head, 8);
    ck_assert_uint_eq(unmask((uint32_t)le(head + 8, 4)), ct_crc32c(0, head, 8));
    ck_assert_msg(n > 0 && n <= cap, "record length %llu", (unsigned long long)n);
    ck_assert_uint_eq(fread(buf, 1, n, f), n);
    ck_assert_uint_eq(fread(tail, 1, 4, f), 4);
    ck_assert_uint_eq(unmask((uint32_t)le(tail, 4)), ct_crc32c(0, buf, n));
    return n;
}

static uint64_t varint(const unsigned char **p, const unsigned char *end) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        ck_assert(*p < end);
        unsigned char b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return v;
    }
    ck_abort_msg("varint longer than 10 bytes");
    return 0;
}

/* A protobuf field: number, wire type and its value (varint/fixed in v, bytes in s/len). */
typedef struct field {
    unsigned num, wire;
    uint64_t v;
    const unsigned char *s;
    size_t len;
} field;

static bool next_field(const unsigned char **p, const unsigned char *end, field *f) {
    if (*p == end) return false;
    uint64_t key = varint(p, end);
    f->num = (unsigned)(key >> 3), f->wire = (unsigned)(key & 7);
    if (f->wire == 0) {
        f->v = varint(p, end);
    } else if (f->wire == 1 || f->wire == 5) {
        int n = f->wire == 1 ? 8 : 4;
        ck_assert(end - *p >= n);
        f->v = le(*p, n);
        *p += n;
    } else {
        ck_assert_uint_eq(f->wire, 2);
        f->len = (size_t)varint(p, end);
        ck_assert(end - *p >= (ptrdiff_t)f->len);
        f->s = *p;
        *p += f->len;
    }
    return true;
}

/* A decoded Event: version "" unless a file_version event; tag "" unless a scalar. */
typedef struct event {
    double wall_time;
    int64_t step;
    char version[32], tag[64];
    float value;
} event;

static void decode_event(const unsigned char *buf, size_t n, event *e) {
    memset(e, 0, sizeof *e);
    const unsigned char *p = buf, *end = buf + n;
    field f;
    while (next_field(&p, end, &f)) {
        if (f.num == 1 && f.wire == 1) memcpy(&e->wall_time, &f.v, 8);
        else if (f.num == 2 && f.wire == 0) e->step = (int64_t)f.v;
        else if (f.num == 3 && f.wire == 2) snprintf(e->version, sizeof e->version, "%.*s", (int)f.len, f.s);
        else if (f.num == 5 && f.wire == 2) {
            const unsigned char *sp = f.s, *se = f.s + f.len;
            field sv;
            int values = 0;
            while (next_field(&sp, se, &sv)) {
                ck_assert_msg(sv.num == 1 && sv.wire == 2, "Summary field %u", sv.num);
                values++;
                const unsigned char *vp = sv.s, *ve = sv.s + sv.len;
                field vf;
                while (next_field(&vp, ve, &vf)) {
                    if (vf.num == 1 && vf.wire == 2) snprintf(e->tag, sizeof e->tag, "%.*s", (int)vf.len, vf.s);
                    else if (vf.num == 2 && vf.wire == 5) {
                        uint32_t bits = (uint32_t)vf.v;
                        memcpy(&e->value, &bits, 4);
                    } else ck_abort_msg("Value field %u wire %u", vf.num, vf.wire);
                }
            }
            ck_assert_int_eq(values, 1);
        } else ck_abort_msg("Event field %u wire %u", f.num, f.wire);
    }
}

/* The event files in dir: how many, and the path of the last one listed. */
static int event_files(const char *dir, char *path, size_t n) {
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int count = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (strncmp(e->d_name, "events.out.tfevents.", 20) == 0) {
            count++;
            snprintf(path, n, "%s/%s", dir, e->d_name);
        }
    closedir(d);
    return count;
}

static void expect_scalar(FILE *f, const char *tag, int64_t step, double v, double t0) {
    unsigned char buf[CT_TFEVENT_MAX];
    size_t n = read_record(f, buf, sizeof buf);
    ck_assert_msg(n > 0, "file ends before %s at %lld", tag, (long long)step);
    event e;
    decode_event(buf, n, &e);
    ck_assert_str_eq(e.tag, tag);
    ck_assert_int_eq(e.step, step);
    ck_assert_msg(e.value == (float)v, "%s at %lld: %g, want %g", tag, (long long)step, e.value, v);
    ck_assert_str_eq(e.version, "");
    ck_assert(e.wall_time >= t0 - 1 && e.wall_time <= (double)time(NULL) + 1);
}

/* The writer thread's event file: the version event, then every monitor record's scalars at
 * DeepSpeed's global samples and each eval's, values as float32, wall_time now. A fresh run
 * replaces the earlier run's file; a resumed run adds one beside it. */
START_TEST(event_file_reads_back) {
    char dir[] = "/tmp/ct_tfevents_XXXXXX", tb[64], path[400];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(tb, sizeof tb, "%s/job", dir);
    srand(23);
    double t0 = (double)time(NULL);
    enum { STEPS = 40 };
    double loss[STEPS], lr[STEPS], scale[STEPS], eval_loss = 1 + (double)rand() / RAND_MAX;
    for (int run = 0; run < 2; run++) { /* the second run: fresh, so one file again */
        ct_metrics *m;
        ct_err err = {0};
        ck_assert_int_eq(ct_metrics_open(&(ct_metrics_opts){.tb_dir = tb}, &m, &err), CT_OK);
        for (int i = 0; i < STEPS; i++) {
            loss[i] = (double)rand() / RAND_MAX * 5, lr[i] = (double)rand() / RAND_MAX * 1e-3;
            scale[i] = i % 3 ? 65536.0 : NAN; /* NaN: no loss_scale event */
            ct_metrics_monitor(m, &(ct_metric_monitor){.samples_before = 8 * i, .samples_after = 8 * (i + 1),
                                                       .loss = loss[i], .lr = lr[i], .loss_scale = scale[i]});
        }
        ct_metrics_eval(m, &(ct_metric_eval){.step = STEPS, .samples = 8 * STEPS, .loss = eval_loss,
                                             .accuracy = NAN, .perplexity = NAN});
        ck_assert_int_eq(ct_metrics_close(m, &err), CT_OK);
        sleep(run == 0); /* the next file's name differs by its seconds */
    }
    ck_assert_int_eq(event_files(tb, path, sizeof path), 1);
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    unsigned char buf[CT_TFEVENT_MAX];
    event e;
    size_t n = read_record(f, buf, sizeof buf);
    ck_assert_uint_gt(n, 0);
    decode_event(buf, n, &e);
    ck_assert_str_eq(e.version, "brain.Event:2");
    ck_assert_str_eq(e.tag, "");
    for (int i = 0; i < STEPS; i++) {
        expect_scalar(f, "Train/Samples/train_loss", 8 * i, loss[i], t0);
        expect_scalar(f, "Train/Samples/lr", 8 * (i + 1), lr[i], t0);
        if (!isnan(scale[i])) expect_scalar(f, "Train/Samples/loss_scale", 8 * (i + 1), scale[i], t0);
    }
    expect_scalar(f, "Eval/Samples/eval_loss", 8 * STEPS, eval_loss, t0); /* accuracy NaN: none */
    ck_assert_uint_eq(read_record(f, buf, sizeof buf), 0);
    fclose(f);

    ct_metrics *m;
    ct_err err = {0};
    ck_assert_int_eq(ct_metrics_open(&(ct_metrics_opts){.tb_dir = tb, .append = true}, &m, &err), CT_OK);
    ck_assert_int_eq(ct_metrics_close(m, &err), CT_OK);
    int files = event_files(tb, path, sizeof path);
    /* same second and pid: one name; else two files */
    ck_assert(files == 1 || files == 2);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

int main(void) {
    Suite *s = suite_create("tfevents");
    TCase *tc = tcase_create("tfevents");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, crc32c_known_vectors);
    tcase_add_test(tc, crc32c_continues);
    tcase_add_test(tc, event_file_reads_back);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
