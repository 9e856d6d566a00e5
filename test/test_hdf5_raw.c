/* test_hdf5_raw.c: ctrain's own HDF5 decoding, without libhdf5 or h5py: the filters
 * (core/data/hdf5_filters.c) against plain reference code on random data, the probe's reply
 * decoder (hdf5_layout.c) on valid, damaged and hostile replies, and the chunk reader
 * (hdf5_rows.c) on a file this test writes (random uint16 data in chunks tiling every dimension,
 * shuffle + deflate + fletcher32, some chunks never written) against the array it came from. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "core/data/hdf5_filters.h"
#include "core/data/hdf5_layout.h"
#include "core/data/hdf5_rows.h"
#include <fcntl.h>

static uint64_t g_state = 0x5eed19;
static uint32_t next_u32(void) { /* xorshift64*: the test's own random stream */
    g_state ^= g_state >> 12;
    g_state ^= g_state << 25;
    g_state ^= g_state >> 27;
    return (uint32_t)((g_state * 0x2545F4914F6CDD1Dull) >> 32);
}

/* The shuffle filter's forward direction, as its definition says: byte b of every element first. */
static void shuffle_ref(const uint8_t *src, size_t n, size_t elem, uint8_t *dst) {
    size_t count = n / elem;
    for (size_t i = 0; i < count; i++)
        for (size_t b = 0; b < elem; b++) dst[b * count + i] = src[i * elem + b];
    for (size_t i = count * elem; i < n; i++) dst[i] = src[i];
}

START_TEST(test_unshuffle) {
    for (int trial = 0; trial < 200; trial++) {
        size_t n = next_u32() % 300, elem = 1 + next_u32() % 8;
        uint8_t src[300], shuffled[300], back[300];
        for (size_t i = 0; i < n; i++) src[i] = (uint8_t)next_u32();
        shuffle_ref(src, n, elem, shuffled);
        ct_h5_unshuffle(shuffled, n, elem, back);
        ck_assert_msg(n == 0 || memcmp(src, back, n) == 0, "n %zu elem %zu", n, elem);
    }
}
END_TEST

START_TEST(test_inflate) {
    enum { N = 5000 };
    uint8_t raw[N], z[N + 1000], out[N + 8];
    for (int i = 0; i < N; i++) raw[i] = (uint8_t)(next_u32() % 7); /* compressible, not constant */
    uLongf zn = sizeof z;
    ck_assert_int_eq(compress2(z, &zn, raw, N, 6), Z_OK);
    char why[200];
    size_t got = 0;
    ck_assert_msg(ct_h5_inflate(z, zn, out, N, &got, why, sizeof why), "%s", why);
    ck_assert_int_eq(got, N);
    ck_assert(memcmp(out, raw, N) == 0);
    ck_assert(ct_h5_inflate(z, zn, out, N + 8, &got, why, sizeof why) && got == N); /* room to spare */
    ck_assert(!ct_h5_inflate(z, zn, out, N - 1, &got, why, sizeof why)); /* one byte short */
    ck_assert_msg(strstr(why, "more than the 4999 bytes"), "%s", why);
    ck_assert(!ct_h5_inflate(z, zn / 2, out, N, &got, why, sizeof why)); /* cut short */
    ck_assert_msg(strstr(why, "ends early"), "%s", why);
    z[zn - 2] ^= 0x55; /* the Adler-32 trailer */
    ck_assert(!ct_h5_inflate(z, zn, out, N, &got, why, sizeof why));
    ck_assert(!ct_h5_inflate(raw, 100, out, N, &got, why, sizeof why)); /* not zlib at all */
}
END_TEST

/* Fletcher-32 by its definition (sums mod 65535 of big-endian 16-bit words): HDF5's folded sums
 * are congruent to it. */
START_TEST(test_fletcher32) {
    for (int trial = 0; trial < 100; trial++) {
        size_t n = next_u32() % 3000;
        uint8_t p[3004];
        for (size_t i = 0; i < n; i++) p[i] = (uint8_t)next_u32();
        uint64_t a = 0, b = 0;
        for (size_t i = 0; i < n; i += 2) {
            a = (a + ((uint64_t)p[i] << 8 | (i + 1 < n ? p[i + 1] : 0))) % 65535;
            b = (b + a) % 65535;
        }
        uint32_t f = ct_h5_fletcher32(p, n);
        ck_assert_int_eq((f & 0xffff) % 65535, a);
        ck_assert_int_eq((f >> 16) % 65535, b);
        for (int k = 0; k < 4; k++) p[n + k] = (uint8_t)(f >> (8 * k)); /* stored little-endian */
        size_t body = 0;
        ck_assert(ct_h5_fletcher32_check(p, n + 4, &body) && body == n);
        if (n) {
            p[next_u32() % n] ^= (uint8_t)(1 + next_u32() % 255);
            ck_assert(!ct_h5_fletcher32_check(p, n + 4, &body));
        }
    }
    size_t body;
    ck_assert(!ct_h5_fletcher32_check((const uint8_t *)"abc", 3, &body)); /* no room for a checksum */
}
END_TEST

/* ---- a dataset this test writes: [7, 5, 3] uint16, chunks [3, 2, 2], shuffle + deflate + fletcher32 ---- */

enum { D0 = 7, D1 = 5, D2 = 3, C0 = 3, C1 = 2, C2 = 2, G0 = 3, G1 = 3, G2 = 2, CHUNKS = G0 * G1 * G2 };
static const uint16_t FILL = 0xBEEF;

typedef struct synth {
    char path[64];
    uint16_t want[D0][D1][D2]; /* what a read must give (the fill value where a chunk is absent) */
    ct_h5_layout l;
} synth;

/* Writes the file: chunk k (row-major over the grid) is absent when k % 5 == 4. */
static void synth_write(synth *s) {
    snprintf(s->path, sizeof s->path, "/tmp/ct_test_hdf5_raw_XXXXXX");
    int fd = mkstemp(s->path);
    ck_assert_int_ge(fd, 0);
    FILE *f = fdopen(fd, "wb");
    fputs("not a real HDF5 header, only bytes before the chunks", f);
    ct_h5_layout *l = &s->l;
    *l = (ct_h5_layout){.ndim = 3, .dims = {D0, D1, D2}, .cls = CT_H5_CLASS_INT, .elem = 2, .little = true,
                        .nfilters = 3, .storage = CT_H5_CHUNKED, .chunk = {C0, C1, C2}, .grid = {G0, G1, G2},
                        .nchunks = CHUNKS};
    memcpy(l->fill, &FILL, 2);
    l->filters[0] = (ct_h5_filter){.id = CT_H5_FILTER_SHUFFLE, .ncd = 1, .cd = {2}};
    l->filters[1] = (ct_h5_filter){.id = CT_H5_FILTER_DEFLATE, .ncd = 1, .cd = {4}};
    l->filters[2] = (ct_h5_filter){.id = CT_H5_FILTER_FLETCHER32};
    l->chunks = ct_xcalloc(CHUNKS, sizeof *l->chunks);
    uint16_t values[D0][D1][D2];
    for (int i = 0; i < D0; i++)
        for (int j = 0; j < D1; j++)
            for (int k = 0; k < D2; k++) values[i][j][k] = (uint16_t)next_u32();
    for (int c = 0; c < CHUNKS; c++) {
        int g0 = c / (G1 * G2), g1 = c / G2 % G1, g2 = c % G2;
        bool absent = c % 5 == 4;
        uint16_t chunk[C0][C1][C2] = {{{0}}}; /* edge chunks: the part past the shape is padding */
        for (int i = 0; i < C0; i++)
            for (int j = 0; j < C1; j++)
                for (int k = 0; k < C2; k++) {
                    int x = g0 * C0 + i, y = g1 * C1 + j, z = g2 * C2 + k;
                    if (x >= D0 || y >= D1 || z >= D2) continue;
                    chunk[i][j][k] = values[x][y][z];
                    s->want[x][y][z] = absent ? FILL : values[x][y][z];
                }
        if (absent) {
            l->chunks[c] = (ct_h5_chunk){CT_H5_UNALLOCATED, 0, 0};
            continue;
        }
        uint8_t shuffled[sizeof chunk], z[sizeof chunk + 100];
        shuffle_ref((const uint8_t *)chunk, sizeof chunk, 2, shuffled);
        uLongf zn = sizeof z - 4;
        ck_assert_int_eq(compress2(z, &zn, shuffled, sizeof shuffled, 4), Z_OK);
        uint32_t sum = ct_h5_fletcher32(z, zn);
        for (int b = 0; b < 4; b++) z[zn + b] = (uint8_t)(sum >> (8 * b));
        l->chunks[c] = (ct_h5_chunk){(uint64_t)ftell(f), zn + 4, 0};
        l->stored += zn + 4;
        ck_assert_int_eq(fwrite(z, 1, zn + 4, f), zn + 4);
    }
    fclose(f);
}

START_TEST(test_read_rows) {
    synth s;
    synth_write(&s);
    int fd = open(s.path, O_RDONLY);
    char why[300];
    for (int first = 0; first < D0; first++)
        for (int rows = 1; first + rows <= D0; rows++) {
            uint16_t got[D0][D1][D2];
            memset(got, 0x11, sizeof got);
            ck_assert_msg(ct_h5_read_rows(&s.l, fd, first, rows, (uint8_t *)got, why, sizeof why), "%s", why);
            ck_assert_msg(memcmp(got, s.want[first], (size_t)rows * sizeof got[0]) == 0, "rows %d + %d", first, rows);
        }
    /* a chunk whose bytes were changed: its checksum fails, naming the chunk */
    s.l.chunks[0].addr += 1;
    uint16_t got[D0][D1][D2];
    ck_assert(!ct_h5_read_rows(&s.l, fd, 0, 1, (uint8_t *)got, why, sizeof why));
    ck_assert_msg(strstr(why, "chunk 0 (") && strstr(why, "fletcher32"), "%s", why);
    close(fd);
    unlink(s.path);
    ct_h5_layout_free(&s.l);
}
END_TEST

/* The reply for the synthetic dataset (twice: as images and labels). */
static void reply_of(const ct_h5_layout *l, ct_h5_writer *w) {
    ct_h5_put_header(w, CT_OK, "", 2);
    ct_h5_put_layout(w, l);
    ct_h5_put_layout(w, l);
}

START_TEST(test_reply) {
    synth s;
    synth_write(&s);
    ct_h5_writer w = {0};
    reply_of(&s.l, &w);
    const char *const names[2] = {"x", "y"};
    uint64_t file_size = 4096;
    ct_h5_reply r;
    ct_err err = {0};
    ck_assert_msg(ct_h5_reply_decode(w.p, w.n, file_size, "f.h5", names, &r, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(r.nlayouts, 2);
    ck_assert_int_eq(r.layouts[1].nchunks, CHUNKS);
    ck_assert_int_eq(r.layouts[1].grid[1], G1);
    ck_assert_int_eq(r.layouts[0].stored, s.l.stored);
    ck_assert(memcmp(r.layouts[0].chunks, s.l.chunks, CHUNKS * sizeof *s.l.chunks) == 0);
    ct_h5_reply_free(&r);
    /* every prefix is refused (the reply ends inside a field), never read past */
    for (size_t n = 0; n < w.n; n++) {
        uint8_t *cut = ct_xmalloc(n + 1);
        memcpy(cut, w.p, n);
        ck_assert_int_eq(ct_h5_reply_decode(cut, n, file_size, "f.h5", names, &r, &err), CT_ERR_DATA);
        ct_h5_reply_free(&r);
        free(cut);
    }
    /* random damage: decoded or refused as data, and whatever decodes stays inside the file */
    for (int trial = 0; trial < 3000; trial++) {
        uint8_t *bad = ct_xmalloc(w.n);
        memcpy(bad, w.p, w.n);
        for (int k = 0; k <= trial % 4; k++) bad[next_u32() % w.n] ^= (uint8_t)(1u << (next_u32() % 8));
        int rc = ct_h5_reply_decode(bad, w.n, file_size, "f.h5", names, &r, &err);
        ck_assert(rc == CT_OK || rc == CT_ERR_DATA);
        for (int d = 0; rc == CT_OK && d < r.nlayouts; d++)
            for (uint64_t c = 0; c < r.layouts[d].nchunks; c++) {
                const ct_h5_chunk *ch = &r.layouts[d].chunks[c];
                ck_assert(ch->addr == CT_H5_UNALLOCATED || ch->addr + ch->size <= file_size);
            }
        ct_h5_reply_free(&r);
        free(bad);
    }
    /* the checks by name: a chunk past the end of the file; a grid that does not match the shape */
    s.l.chunks[3].addr = file_size - 10;
    ct_h5_writer w2 = {0};
    reply_of(&s.l, &w2);
    ck_assert_int_eq(ct_h5_reply_decode(w2.p, w2.n, file_size, "f.h5", names, &r, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "f.h5: dataset \"x\": chunk 3 (") && strstr(err.msg, "runs past the end of the file"),
                  "%s", err.msg);
    ct_h5_reply_free(&r);
    s.l.chunks[3].addr = CT_H5_UNALLOCATED;
    s.l.nchunks = CHUNKS - 1;
    ct_h5_writer w3 = {0};
    reply_of(&s.l, &w3);
    ck_assert_int_eq(ct_h5_reply_decode(w3.p, w3.n, file_size, "f.h5", names, &r, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "a chunk grid of 17 cells (the shape and chunk dims give 18"), "%s", err.msg);
    ct_h5_reply_free(&r);
    /* an error reply: its code and text, control bytes made visible */
    ct_h5_writer w4 = {0};
    ct_h5_put_header(&w4, CT_ERR_DATA, "f.h5: no dataset\x1b[2J", 0);
    ck_assert_int_eq(ct_h5_reply_decode(w4.p, w4.n, file_size, "f.h5", names, &r, &err), CT_OK);
    ck_assert_int_eq(r.code, CT_ERR_DATA);
    ck_assert_str_eq(r.text, "f.h5: no dataset?[2J");
    ct_h5_reply_free(&r);
    free(w.p);
    free(w2.p);
    free(w3.p);
    free(w4.p);
    unlink(s.path);
    ct_h5_layout_free(&s.l);
}
END_TEST

int main(void) {
    Suite *s = suite_create("hdf5_raw");
    TCase *tc = tcase_create("hdf5_raw");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_unshuffle);
    tcase_add_test(tc, test_inflate);
    tcase_add_test(tc, test_fletcher32);
    tcase_add_test(tc, test_read_rows);
    tcase_add_test(tc, test_reply);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed != 0;
}
