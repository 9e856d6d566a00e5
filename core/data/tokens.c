/* tokens.c: token files (see tokens.h), read through mmap: ctrain's own, and llm.c's .bin shards
 * (a 256 x int32 header: magic 20240520, version 1, token count; then uint16 tokens), told apart
 * by their first bytes.
 *
 * Entry fields: {"format": "tokens", "path": P, "seq_len": T, "vocab": V, "limit": N}. P is a file,
 * a brace pattern, a glob ("fineweb_train_*.bin", its matches in byte order) or a list of them
 * (pathlist.h): the files, in that order, are one stream of tokens, as if joined, so a window may
 * run from the end of one shard into the next (llm.c's scripts split documents across shards the
 * same way). Every file's header is checked at open; all are of one kind (ctrain's or llm.c's) and
 * one vocabulary. Samples are [T] int32 inputs and [T] int32 targets (the next token at each
 * position); ds->classes is the vocabulary size: a ctrain file's header, else "vocab" (default
 * GPT-2's 50257, since llm.c's header does not carry one). A token >= the vocabulary size is
 * reported as corrupt data at decode, naming its file and byte offset. */
#include "core/data/tokens.h"
#include "core/util/fs.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/data/dataset.h"
#include "core/data/formats.h"
#include "core/data/pathlist.h"

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Header: magic[8], u32 version, u32 width, u64 count, u32 vocab, u32 crc of bytes 0..27. */
static void make_header(uint8_t h[CT_TOKENS_HEADER], int width, uint64_t n, uint32_t vocab) {
    memset(h, 0, CT_TOKENS_HEADER);
    memcpy(h, CT_TOKENS_MAGIC, 8);
    put32(h + 8, CT_TOKENS_VERSION);
    put32(h + 12, (uint32_t)width);
    put32(h + 16, (uint32_t)n);
    put32(h + 20, (uint32_t)(n >> 32));
    put32(h + 24, vocab);
    put32(h + 28, (uint32_t)crc32(0, h, 28));
}

int ct_tokens_write(const char *path, const uint32_t *tokens, uint64_t n, int width, uint32_t vocab,
                    ct_err *err) {
    if (width != 2 && width != 4) return ct_errf(err, CT_ERR_CONFIG, "%s: token width must be 2 or 4", path);
    FILE *f = fopen(path, "wb");
    if (!f) return ct_errf(err, CT_ERR_RUNTIME, "%s: cannot create: %s", path, strerror(errno));
    uint8_t h[CT_TOKENS_HEADER];
    make_header(h, width, n, vocab);
    bool ok = fwrite(h, 1, sizeof h, f) == sizeof h;
    uint8_t buf[4096];
    size_t k = 0;
    for (uint64_t i = 0; i < n && ok; i++) {
        for (int b = 0; b < width; b++) buf[k++] = (uint8_t)(tokens[i] >> (8 * b));
        if (k + 4 > sizeof buf || i + 1 == n) {
            ok = fwrite(buf, 1, k, f) == k;
            k = 0;
        }
    }
    ok &= fclose(f) == 0;
    if (!ok) return ct_fs_write_error(err, path, "write", errno);
    return CT_OK;
}

/* One file of the stream. */
typedef struct tok_file {
    const char *path;  /* the impl's pathlist owns it */
    const uint8_t *map;
    size_t size;
    size_t data_off;   /* where the tokens start: CT_TOKENS_HEADER or CT_LLMC_HEADER */
    int width;         /* bytes per token */
    uint32_t vocab;    /* a ctrain file's header's; 0 for an llm.c shard */
    bool llmc;
    uint64_t n;        /* tokens */
    uint64_t start;    /* the stream's index of its first token */
} tok_file;

typedef struct tok_impl {
    ct_pathlist paths;
    tok_file *files;   /* [paths.n] */
    uint32_t vocab;
    bool llmc;         /* the vocabulary came from the entry, not the files: say so in errors */
    int64_t seq_len;
    uint64_t total;    /* tokens in all files */
} tok_impl;

static void tok_close(ct_dataset *ds) {
    tok_impl *im = ds->impl;
    for (int k = 0; im && im->files && k < im->paths.n; k++)
        if (im->files[k].map) munmap((void *)im->files[k].map, im->files[k].size);
    if (im) {
        free(im->files);
        ct_pathlist_free(&im->paths);
    }
    free(im);
    free(ds);
}

static const char *tok_file_name(const ct_dataset *ds, int64_t k) {
    const tok_impl *im = ds->impl;
    return k >= 0 && k < im->paths.n ? im->files[k].path : NULL;
}

/* The file that holds the stream's token g (< total): the last whose start is <= g, so that empty
 * files, which share their start with the next, are passed over. */
static const tok_file *file_of(const tok_impl *im, uint64_t g) {
    int lo = 0, hi = im->paths.n - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (im->files[mid].start <= g) lo = mid;
        else hi = mid - 1;
    }
    return &im->files[lo];
}

/* ds->where, for an entry of several files: the file, and the token's index and byte offset in it. */
static void tok_where(const ct_dataset *ds, int64_t i, int64_t pos, char *out, size_t n) {
    const tok_impl *im = ds->impl;
    uint64_t g = (uint64_t)i * (uint64_t)im->seq_len + (uint64_t)pos;
    const tok_file *f = file_of(im, g);
    uint64_t j = g - f->start;
    snprintf(out, n, "%s, token %llu, byte offset %llu", f->path, (unsigned long long)j,
             (unsigned long long)(f->data_off + j * (uint64_t)f->width));
}

static int tok_decode(const ct_dataset *ds, int64_t i, void *input, void *target, ct_err *err) {
    const tok_impl *im = ds->impl;
    if (i < 0 || i >= ds->count)
        return ct_errf(err, CT_ERR_DATA, "%s: window %lld out of range", ds->source, (long long)i);
    uint64_t g = (uint64_t)i * (uint64_t)im->seq_len;
    const tok_file *f = file_of(im, g);
    uint64_t j = g - f->start;   /* the token's index in f */
    int32_t *x = input, *y = target;
    for (int64_t t = 0; t <= im->seq_len; t++, j++) {
        while (j >= f->n) f++, j = 0;   /* on into the next file: the window ends before the last token */
        const uint8_t *q = f->map + f->data_off + j * (uint64_t)f->width;
        uint32_t v = f->width == 2 ? (uint32_t)(q[0] | q[1] << 8) : get32(q);
        if (v >= im->vocab)
            return ct_errf(err, CT_ERR_DATA, "%s: token %llu (byte offset %llu) is %u, outside the "
                           "vocabulary of %u%s", f->path, (unsigned long long)j,
                           (unsigned long long)(q - f->map), v, im->vocab,
                           im->llmc ? " (the entry's \"vocab\", default GPT-2's 50257: set it to the "
                                      "vocabulary the file was tokenized with)" : "");
        if (t < im->seq_len) x[t] = (int32_t)v;
        if (t > 0 && y) y[t - 1] = (int32_t)v;
    }
    return CT_OK;
}

/* Windows of seq_len + 1 tokens out of the stream's; none is a data error. */
static int count_windows(ct_dataset *ds, const tok_impl *im, ct_err *err) {
    uint64_t n = im->total;
    ds->count = n > (uint64_t)im->seq_len ? (int64_t)((n - 1) / (uint64_t)im->seq_len) : 0;
    if (ds->count == 0)
        return ct_errf(err, CT_ERR_DATA, "%s: %llu tokens make no window of seq_len + 1 = %lld", ds->source,
                       (unsigned long long)n, (long long)im->seq_len + 1);
    return CT_OK;
}

/* llm.c's shard (its dev/data/data_common.py write_datafile): int32 header[256] = {magic,
 * version, count, 0...}. Version 1 is uint16 tokens (GPT-2); version 2's uint32 tokens (LLaMA 3)
 * are refused rather than guessed at. The count is an int32, so it is checked for sign too. */
static int check_llmc(tok_file *fl, ct_err *err) {
    const uint8_t *h = fl->map;
    const char *f = fl->path;
    if (fl->size < CT_LLMC_HEADER)
        return ct_errf(err, CT_ERR_DATA, "%s: truncated: %zu bytes, the header of an llm.c shard (magic %u) "
                       "alone is %u", f, fl->size, CT_LLMC_MAGIC, CT_LLMC_HEADER);
    uint32_t version = get32(h + 4);
    if (version != 1)
        return ct_errf(err, CT_ERR_DATA, "%s: llm.c version %u (at byte 4), ctrain reads version 1 (uint16 GPT-2 "
                       "tokens)", f, version);
    int32_t n = (int32_t)get32(h + 8);
    uint64_t want = CT_LLMC_HEADER + 2 * (uint64_t)(n < 0 ? 0 : n);
    if (n < 0)
        return ct_errf(err, CT_ERR_DATA, "%s: its llm.c header gives a token count of %d, below 0: a corrupt header "
                       "(the count is at byte 8)", f, n);
    if (fl->size != want)
        return ct_errf(err, CT_ERR_DATA, "%s: %zu bytes, but its llm.c header gives %d tokens (at byte 8; %u + 2 x "
                       "%d = %llu bytes): truncated or corrupt", f, fl->size, n, CT_LLMC_HEADER, n,
                       (unsigned long long)want);
    fl->data_off = CT_LLMC_HEADER;
    fl->width = 2;
    fl->llmc = true;
    fl->n = (uint64_t)n;
    return CT_OK;
}

static int check_header(tok_file *fl, ct_err *err) {
    const uint8_t *h = fl->map;
    const char *f = fl->path;
    if (fl->size >= 4 && get32(h) == CT_LLMC_MAGIC) return check_llmc(fl, err);
    if (fl->size < CT_TOKENS_HEADER)
        return ct_errf(err, CT_ERR_DATA, "%s: truncated: %zu bytes, the header alone is %u", f, fl->size,
                       CT_TOKENS_HEADER);
    if (memcmp(h, CT_TOKENS_MAGIC, 8) != 0)
        return ct_errf(err, CT_ERR_DATA, "%s: not a token file: neither ctrain's magic \"CTTOKENS\" nor "
                       "llm.c's %u starts it (write one with ctrain pack --from text; nanoGPT's headerless "
                       "uint16 .bin files need a header first: docs/formats.md, \"nanoGPT\")", f, CT_LLMC_MAGIC);
    if (get32(h + 28) != (uint32_t)crc32(0, h, 28))
        return ct_errf(err, CT_ERR_DATA, "%s: header checksum mismatch (bytes 0..27 against the CRC at byte 28): "
                       "the file is corrupt", f);
    if (get32(h + 8) != CT_TOKENS_VERSION)
        return ct_errf(err, CT_ERR_DATA, "%s: version %u (at byte 8), this ctrain reads version %u", f,
                       get32(h + 8), CT_TOKENS_VERSION);
    fl->width = (int)get32(h + 12);
    uint64_t n = get32(h + 16) | (uint64_t)get32(h + 20) << 32;
    fl->vocab = get32(h + 24);
    if ((fl->width != 2 && fl->width != 4) || fl->vocab == 0)
        return ct_errf(err, CT_ERR_DATA, "%s: bad header (token width %d at byte 12, vocabulary %u at byte 24)", f,
                       fl->width, fl->vocab);
    if (n > (uint64_t)1 << 40 || fl->size != CT_TOKENS_HEADER + n * (uint64_t)fl->width)
        return ct_errf(err, CT_ERR_DATA, "%s: %zu bytes, but the header gives %llu tokens of %d bytes "
                       "(%llu bytes): truncated or corrupt", f, fl->size, (unsigned long long)n, fl->width,
                       (unsigned long long)(CT_TOKENS_HEADER + n * (uint64_t)fl->width));
    fl->data_off = CT_TOKENS_HEADER;
    fl->n = n;
    return CT_OK;
}

/* Map one file and check its header. */
static int open_file(tok_file *fl, ct_err *err) {
    int fd;
    struct stat st;
    int rc = ct_fs_open_regular(fl->path, CT_ERR_DATA, "a tokens file", &fd, err);
    if (rc) {
        /* a FIFO: refused, not waited on */
    } else if (fstat(fd, &st) != 0) {
        rc = ct_errf(err, ct_err_io(errno, CT_ERR_DATA), "%s: cannot stat: %s", fl->path, strerror(errno));
    } else {
        fl->size = (size_t)st.st_size;
        void *p = fl->size ? mmap(NULL, fl->size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
        if (p != MAP_FAILED) fl->map = p;
        rc = fl->map ? check_header(fl, err) : ct_errf(err, CT_ERR_DATA, "%s: empty or unmappable file", fl->path);
    }
    if (fd >= 0) close(fd);
    return rc;
}

/* File k against the first: one kind, one vocabulary (tokens of two vocabularies in one stream
 * would be read as one). */
static int same_kind(const tok_file *first, const tok_file *fl, ct_err *err) {
    if (fl->llmc != first->llmc)
        return ct_errf(err, CT_ERR_DATA, "%s: %s, but %s is %s: the files of one entry must be of one kind", fl->path,
                       fl->llmc ? "an llm.c shard" : "a ctrain token file", first->path,
                       first->llmc ? "an llm.c shard" : "a ctrain token file");
    if (fl->vocab != first->vocab)
        return ct_errf(err, CT_ERR_DATA, "%s: its header gives a vocabulary of %u, but %s's gives %u: the files of "
                       "one entry must share a vocabulary (tokenized with one tokenizer)", fl->path, fl->vocab,
                       first->path, first->vocab);
    return CT_OK;
}

static int open_files(tok_impl *im, uint32_t vocab, ct_err *err) {
    im->files = ct_xcalloc((size_t)im->paths.n, sizeof *im->files);
    int rc = CT_OK;
    for (int k = 0; k < im->paths.n && !rc; k++) {
        tok_file *fl = &im->files[k];
        fl->path = im->paths.paths[k];
        rc = open_file(fl, err);
        if (!rc && k > 0) rc = same_kind(&im->files[0], fl, err);
        fl->start = im->total;
        im->total += fl->n;
    }
    if (rc) return rc;
    im->llmc = im->files[0].llmc;
    im->vocab = im->llmc ? (vocab ? vocab : CT_LLMC_VOCAB) : im->files[0].vocab;
    return CT_OK;
}

static int read_entry(const ct_config *cfg, const cJSON *entry, const char *path, int64_t *seq_len,
                      int64_t *limit, uint32_t *vocab, ct_err *err) {
    char where[1200];
    const cJSON *it;
    *limit = 0;
    *seq_len = 0;
    *vocab = 0;
    cJSON_ArrayForEach(it, entry) {
        ct_config_where(cfg, it, where, sizeof where);
        const char *k = it->string;
        bool num = cJSON_IsNumber(it) && it->valuedouble == floor(it->valuedouble) && it->valuedouble >= 1;
        if (strcmp(k, "seq_len") == 0 && num && it->valuedouble <= 1 << 24)
            *seq_len = (int64_t)it->valuedouble;
        else if (strcmp(k, "limit") == 0 && num)
            *limit = (int64_t)it->valuedouble;
        else if (strcmp(k, "vocab") == 0 && num && it->valuedouble <= 4294967295.0)
            *vocab = (uint32_t)it->valuedouble;
        else if (strcmp(k, "format") != 0 && strcmp(k, "path") != 0)   /* path: ct_pathlist_parse */
            return ct_errf(err, CT_ERR_CONFIG, "%s: %s.%s: %s", where, path, k,
                           strcmp(k, "seq_len") == 0 || strcmp(k, "limit") == 0
                               ? "expected a positive integer"
                           : strcmp(k, "vocab") == 0
                               ? "expected the vocabulary size, a positive integer below 2^32"
                               : "unknown key for format tokens (expected path, seq_len, vocab, limit)");
    }
    ct_config_where(cfg, entry, where, sizeof where);
    if (!cJSON_GetObjectItemCaseSensitive(entry, "path") || !*seq_len)
        return ct_errf(err, CT_ERR_CONFIG, "%s: %s: format tokens needs \"path\" and \"seq_len\"", where, path);
    return CT_OK;
}

/* The files of entry.path, globs expanded. */
static int read_paths(const ct_config *cfg, const cJSON *entry, const char *path, ct_pathlist *l, ct_err *err) {
    int rc = ct_pathlist_parse(l, cfg, entry, path, "path", "paths of token files", "data/fineweb_train_*.bin",
                               err);
    if (rc) return rc;
    char where[1200], at[1300];
    ct_config_where(cfg, cJSON_GetObjectItemCaseSensitive(entry, "path"), where, sizeof where);
    snprintf(at, sizeof at, "%s: %s.path", where, path);
    return ct_pathlist_glob(l, at, err);
}

/* ds->source: the file, or for several the entry's path ("DIR/fineweb_train_*.bin (12 files)",
 * "DIR/a.bin, ... (3 files)"): messages about the stream name it, and the fingerprint names files
 * by their base names. */
static void name_source(ct_dataset *ds, const ct_config *cfg, const cJSON *entry, const ct_pathlist *l) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(entry, "path");
    char given[1100];
    if (l->n == 1) {
        snprintf(ds->source, sizeof ds->source, "%s", l->paths[0]);
    } else if (cJSON_IsString(v)) {
        ct_config_resolve_path(cfg, v->valuestring, given, sizeof given);
        snprintf(ds->source, sizeof ds->source, "%.900s (%d files)", given, l->n);
    } else {
        snprintf(ds->source, sizeof ds->source, "%.900s, ... (%d files)", l->paths[0], l->n);
    }
}

int ct_tokens_open(const ct_config *cfg, const cJSON *entry, const char *path, ct_dataset **out,
                   ct_err *err) {
    *out = NULL;
    int64_t seq_len, limit;
    uint32_t vocab;
    int rc = read_entry(cfg, entry, path, &seq_len, &limit, &vocab, err);
    if (rc) return rc;
    ct_dataset *ds = ct_xcalloc(1, sizeof *ds);
    tok_impl *im = ct_xcalloc(1, sizeof *im);
    ds->impl = im;
    ds->format = "tokens";
    ds->decode = tok_decode;
    ds->file = tok_file_name;
    ds->close = tok_close;
    im->seq_len = seq_len;
    rc = read_paths(cfg, entry, path, &im->paths, err);
    if (!rc) {
        name_source(ds, cfg, entry, &im->paths);
        rc = open_files(im, vocab, err);
    }
    if (!rc) rc = count_windows(ds, im, err);
    /* A ctrain file names its vocabulary: an entry's "vocab" can only repeat it (a larger one would
     * hide a file tokenized with another vocabulary than the model's). */
    if (!rc && vocab && !im->llmc && vocab != im->vocab) {
        char where[1200];
        ct_config_where(cfg, cJSON_GetObjectItemCaseSensitive(entry, "vocab"), where, sizeof where);
        rc = ct_errf(err, CT_ERR_CONFIG, "%s: %s.vocab: %u, but %s's header gives a vocabulary of %u (vocab "
                     "is for llm.c shards, whose header has none; leave it out)", where, path, vocab,
                     im->files[0].path, im->vocab);
    }
    if (rc) {
        tok_close(ds);
        return rc;
    }
    if (limit && limit < ds->count) ds->count = limit;
    if (im->paths.n > 1) ds->where = tok_where;   /* one file: its name and the record say where */
    ds->sample_shape = (ct_shape){.ndim = 1, .d = {seq_len}};
    ds->sample_dtype = CT_I32;
    ds->target_shape = ds->sample_shape;
    ds->target_dtype = CT_I32;
    ds->classes = im->vocab;
    if (im->llmc) ds->classes_key = "vocab";   /* an llm.c header has no vocabulary: the entry's is the config's */
    if (im->llmc)
        snprintf(ds->label_note, sizeof ds->label_note, "%s: llm.c shard%s, vocabulary of %u tokens from the "
                 "entry's \"vocab\" (default GPT-2's 50257)", ds->source, im->paths.n > 1 ? "s" : "", im->vocab);
    else
        snprintf(ds->label_note, sizeof ds->label_note, "%s: vocabulary of %u tokens in %s header", ds->source,
                 im->vocab, im->paths.n > 1 ? "their" : "its");
    *out = ds;
    return CT_OK;
}
