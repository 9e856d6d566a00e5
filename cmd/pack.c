/* pack.c: `ctrain pack` (commands.h). The sources are opened through the dataset openers with an
 * empty config (no normalisation), so packing reads exactly what training would. */
#include "cmd/commands.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "core/util/fs.h"
#include "core/config/config.h"
#include "core/data/dataset.h"
#include "core/data/pngdec.h"
#include "core/data/shard.h"
#include "core/data/tokens.h"

#define PACK_USAGE \
    "usage: ctrain pack --from image_folder|idx|webdataset|tfrecord|hdf5 SRC --out DIR [--shard-size MB] [--compress] " \
    "[--labels FILE] [--features INPUT,LABEL]\n       ctrain pack --from text FILE... --out DIR [--eval-fraction F]"
const char ct_pack_usage[] = PACK_USAGE;

typedef struct pack_args {
    const char *from, *src, *out, *labels;
    const char *features;  /* --from tfrecord: "INPUT,LABEL", the tf.Example features to read; --from hdf5:
                            * "IMAGES,LABELS", the datasets */
    char **texts;      /* --from text: the files, in the order given (texts[0] == src) */
    int n_texts;
    double shard_mb;
    double eval_frac;  /* --from text: 0, or the fraction of the bytes that goes to eval.bin */
    bool compress;
} pack_args;

static int parse_args(int argc, char **argv, pack_args *a, ct_err *err) {
    memset(a, 0, sizeof *a);
    a->shard_mb = 256;
    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        bool has_val = i + 1 < argc;
        if (strcmp(o, "--compress") == 0) {
            a->compress = true;
        } else if (strcmp(o, "--from") == 0 && i + 2 < argc) {
            a->from = argv[++i];
            a->src = argv[++i];
            /* text takes several files: the words up to the next option (a file whose name starts
             * with "-" is given as ./-name) */
            a->texts = argv + i;
            a->n_texts = 1;
            while (strcmp(a->from, "text") == 0 && i + 1 < argc && argv[i + 1][0] != '-') {
                i++;
                a->n_texts++;
            }
        } else if (strcmp(o, "--eval-fraction") == 0 && has_val) {
            char *end;
            a->eval_frac = strtod(argv[++i], &end);
            if (*end || end == argv[i] || !(a->eval_frac > 0 && a->eval_frac < 1))
                return ct_errf(err, CT_ERR_CONFIG, "pack: --eval-fraction: expected a number between 0 and "
                               "1 (exclusive), got \"%s\"\n" PACK_USAGE, argv[i]);
        } else if (strcmp(o, "--out") == 0 && has_val) {
            a->out = argv[++i];
        } else if (strcmp(o, "--features") == 0 && has_val) {
            a->features = argv[++i];
            const char *comma = strchr(a->features, ',');
            if (!comma || comma == a->features || !comma[1] || strchr(comma + 1, ','))
                return ct_errf(err, CT_ERR_CONFIG, "pack: --features: expected INPUT,LABEL (two tf.Example feature "
                               "names, or two HDF5 dataset names), got \"%s\"\n" PACK_USAGE, a->features);
        } else if (strcmp(o, "--labels") == 0 && has_val) {
            a->labels = argv[++i];
        } else if (strcmp(o, "--shard-size") == 0 && has_val) {
            char *end;
            a->shard_mb = strtod(argv[++i], &end);
            if (*end || !(a->shard_mb > 0 && a->shard_mb <= 1 << 20))
                return ct_errf(err, CT_ERR_CONFIG, "pack: --shard-size: expected megabytes (a positive "
                               "number), got \"%s\"\n" PACK_USAGE, argv[i]);
        } else {
            return ct_errf(err, CT_ERR_CONFIG, "pack: unexpected argument \"%s\"%s\n" PACK_USAGE, o,
                           o[0] == '-' && !has_val ? " (missing its value)" : "");
        }
    }
    if (!a->from || !a->out)
        return ct_errf(err, CT_ERR_CONFIG, "pack: --from KIND SRC and --out DIR are required\n" PACK_USAGE);
    if (strcmp(a->from, "image_folder") && strcmp(a->from, "idx") && strcmp(a->from, "webdataset") &&
        strcmp(a->from, "tfrecord") && strcmp(a->from, "hdf5") && strcmp(a->from, "text"))
        return ct_errf(err, CT_ERR_CONFIG, "pack: --from: expected image_folder, idx, webdataset, tfrecord, hdf5 or "
                       "text, got \"%s\"", a->from);
    if (a->features && strcmp(a->from, "tfrecord") && strcmp(a->from, "hdf5"))
        return ct_errf(err, CT_ERR_CONFIG, "pack: --features is for --from tfrecord and hdf5\n" PACK_USAGE);
    if (a->eval_frac && strcmp(a->from, "text"))
        return ct_errf(err, CT_ERR_CONFIG, "pack: --eval-fraction is for --from text\n" PACK_USAGE);
    return CT_OK;
}

/* Write tokens [0, n) of the text as byte tokens (vocabulary 256, 2 bytes each) to DIR/name. */
static int write_bytes_as_tokens(const char *dir, const char *name, const uint8_t *text, size_t n,
                                 char *path, size_t path_n, ct_err *err) {
    uint32_t *tok = ct_xmalloc((n ? n : 1) * sizeof *tok);
    for (size_t i = 0; i < n; i++) tok[i] = text[i];
    snprintf(path, path_n, "%s/%s", dir, name);
    int rc = ct_tokens_write(path, tok, n, 2, 256, err);
    free(tok);
    return rc;
}

/* Bytes of the text files, one after another in the order given -> tokens 0..255: OUT/tokens.bin,
 * or with --eval-fraction F OUT/train.bin and OUT/eval.bin, eval holding the last floor(F x bytes)
 * bytes (the end of the last files: a split by position, so the same files give the same split). */
/* The files pack --from text writes must not be one it reads (an input named OUT/tokens.bin would
 * be replaced by its own tokens): refused before anything is read. */
static int check_text_outputs(const pack_args *a, ct_err *err) {
    static const char *const names[] = {"tokens.bin", "train.bin", "eval.bin"};
    for (int k = 0; k < CT_ARRAY_LEN(names); k++) {
        char out[1100];
        snprintf(out, sizeof out, "%s/%s", a->out, names[k]);
        for (int f = 0; f < a->n_texts; f++)
            if (ct_fs_same_file(out, a->texts[f]))
                return ct_errf(err, CT_ERR_CONFIG, "pack: --out %s would write %s over %s, an input: give another "
                               "--out", a->out, out, a->texts[f]);
    }
    return CT_OK;
}

static int pack_text(const pack_args *a, ct_err *err) {
    uint8_t *text = NULL, *buf = NULL;
    size_t cap = 0, len = 0, bcap = 0, blen = 0;
    int rc = check_text_outputs(a, err);
    for (int f = 0; f < a->n_texts && !rc; f++) {
        rc = ct_read_file(a->texts[f], &buf, &bcap, &blen, err);
        if (rc) break;
        if (len + blen > cap) {
            cap = 2 * (len + blen); /* doubling: many small files cost O(total) copying */
            text = ct_xrealloc(text, cap);
        }
        if (blen) memcpy(text + len, buf, blen);
        len += blen;
    }
    free(buf);
    size_t n_eval = (size_t)((double)len * a->eval_frac);
    if (!rc && a->eval_frac && (n_eval == 0 || n_eval == len))
        rc = ct_errf(err, CT_ERR_CONFIG, "pack: --eval-fraction %g of %zu bytes leaves %s split empty: give "
                     "more text or another fraction", a->eval_frac, len, n_eval ? "the train" : "the eval");
    if (!rc) rc = ct_fs_mkdirs(a->out, err); /* like mkdir -p: --out may name a new nested folder */
    char path[1100], epath[1100];
    if (!rc && !a->eval_frac) {
        rc = write_bytes_as_tokens(a->out, "tokens.bin", text, len, path, sizeof path, err);
        if (!rc) printf("packed %zu byte-level tokens (vocabulary 256) from %d file(s) into %s\n", len,
                        a->n_texts, path);
    } else if (!rc) {
        rc = write_bytes_as_tokens(a->out, "train.bin", text, len - n_eval, path, sizeof path, err);
        if (!rc) rc = write_bytes_as_tokens(a->out, "eval.bin", text + len - n_eval, n_eval, epath,
                                            sizeof epath, err);
        if (!rc) printf("packed %zu byte-level tokens (vocabulary 256) from %d file(s): %zu into %s, %zu "
                        "into %s\n", len, a->n_texts, len - n_eval, path, n_eval, epath);
    }
    free(text);
    return rc;
}

/* IDX element type from the magic (gz or plain); 0 when unreadable (the opener reports it). */
static int idx_type(const char *path) {
    gzFile f = gzopen(path, "rb");
    uint8_t m[4] = {0};
    int n = f ? gzread(f, m, 4) : 0;
    if (f) gzclose(f);
    return n == 4 ? m[2] : 0;
}

/* The labels file of IDX images: --labels, else the images' path with MNIST's "images-idx3"
 * replaced by "labels-idx1" (in the file name). Anything else would read some other file as
 * labels (the images file itself, when the name has no "images-idx3"): refused with a hint. */
static int idx_labels(const pack_args *a, char *out, size_t n, ct_err *err) {
    const char *base = strrchr(a->src, '/');
    base = base ? base + 1 : a->src;
    const char *p = strstr(base, "images-idx3");
    if (a->labels) {
        snprintf(out, n, "%s", a->labels);
    } else if (!p) {
        return ct_errf(err, CT_ERR_CONFIG, "pack: %s: cannot tell where its labels are (the file name "
                       "has no \"images-idx3\" to turn into \"labels-idx1\", MNIST's naming); give "
                       "--labels FILE\n" PACK_USAGE, a->src);
    } else {
        snprintf(out, n, "%.*slabels-idx1%s", (int)(p - a->src), a->src, p + 11);
        if (!ct_fs_exists(out))
            return ct_errf(err, CT_ERR_CONFIG, "pack: %s: its labels would be %s, which does not exist; "
                           "give --labels FILE\n" PACK_USAGE, a->src, out);
    }
    struct stat si, sl;
    if (stat(a->src, &si) == 0 && stat(out, &sl) == 0 && si.st_dev == sl.st_dev && si.st_ino == sl.st_ino)
        return ct_errf(err, CT_ERR_CONFIG, "pack: --labels %s is the images file %s; give the IDX file "
                       "of labels (magic 00 00 08 01)\n" PACK_USAGE, out, a->src);
    return CT_OK;
}

static int open_source(const pack_args *a, ct_dataset **ds, uint32_t *enc, ct_err *err) {
    ct_config cfg;
    memset(&cfg, 0, sizeof cfg);
    snprintf(cfg.path, sizeof cfg.path, "ctrain pack");
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "format", a->from);
    *enc = CT_SHARD_U8;
    if (strcmp(a->from, "idx") == 0) {
        char labels[1024];
        int rc = idx_labels(a, labels, sizeof labels, err);
        if (rc) {
            cJSON_Delete(e);
            return rc;
        }
        cJSON_AddStringToObject(e, "images", a->src);
        cJSON_AddStringToObject(e, "labels", labels);
        if (idx_type(a->src) != 0x08) *enc = CT_SHARD_F32;
    } else if (strcmp(a->from, "webdataset") == 0) { /* .png + .cls (the format's defaults) */
        cJSON_AddStringToObject(e, "urls", a->src);
    } else if (strcmp(a->from, "tfrecord") == 0 || strcmp(a->from, "hdf5") == 0) {
        /* the format's defaults ("image" + "label", "images" + "labels") unless --features */
        bool tfr = strcmp(a->from, "tfrecord") == 0;
        cJSON_AddStringToObject(e, "path", a->src);
        if (a->features) {
            const char *comma = strchr(a->features, ',');
            char input[256];
            snprintf(input, sizeof input, "%.*s", (int)(comma - a->features), a->features);
            cJSON_AddStringToObject(e, tfr ? "input" : "images", input);
            cJSON_AddStringToObject(e, tfr ? "label" : "labels", comma + 1);
        }
    } else {
        cJSON_AddStringToObject(e, "root", a->src);
    }
    /* the format's opener, from its row (a->from is one of them: pack_parse) */
    int n_formats, rc = -1;
    const ct_data_format *formats = ct_dataset_formats(&n_formats);
    for (int i = 0; i < n_formats && rc < 0; i++)
        if (strcmp(formats[i].name, a->from) == 0) rc = formats[i].open(&cfg, e, "pack", ds, err);
    if (rc < 0) rc = ct_errf(err, CT_ERR_CONFIG, "pack: --from %s: no such dataset format", a->from);
    cJSON_Delete(e);
    if (rc) return rc;
    /* Shards hold a class index per record and pixels as bytes, or floats */
    if ((strcmp(a->from, "tfrecord") == 0 || strcmp(a->from, "hdf5") == 0) && !(*ds)->decode_u8) *enc = CT_SHARD_F32;
    if ((*ds)->target_dtype != CT_I32 || (*ds)->target_shape.ndim != 0) {
        rc = ct_errf(err, CT_ERR_DATA, "pack: %s: %s; ctrain shards hold one class index per record", a->src,
                     (*ds)->label_note);
        ct_dataset_close(*ds);
        *ds = NULL;
    }
    return rc;
}

static int pack_images(const pack_args *a, ct_err *err) {
    ct_dataset *ds;
    uint32_t enc;
    int rc = open_source(a, &ds, &enc, err);
    if (rc) return rc;
    int64_t numel = ct_shape_numel(&ds->sample_shape);
    float *x = ct_xmalloc((size_t)numel * sizeof *x);
    uint8_t *u8 = ct_xmalloc((size_t)numel);
    ct_shard_writer w;
    rc = ct_shard_writer_open(&w, a->out, enc, &ds->sample_shape, (uint32_t)ds->classes,
                              (size_t)(a->shard_mb * 1048576.0), a->compress, err);
    double t0 = ct_now();
    for (int64_t i = 0; i < ds->count && !rc; i++) {
        int32_t label = 0;
        rc = ds->decode(ds, i, x, &label, err);
        if (rc) break;
        if (enc == CT_SHARD_U8)
            for (int64_t k = 0; k < numel; k++) u8[k] = (uint8_t)lrintf(x[k] * 255.0f);
        rc = ct_shard_write(&w, enc == CT_SHARD_U8 ? (void *)u8 : (void *)x, label, err);
    }
    if (rc) ct_shard_writer_discard(&w);
    else rc = ct_shard_writer_close(&w, err);
    if (!rc)
        printf("packed %lld records of [%s %lld values] from %s into %d shard(s) in %s%s (%.1f s)\n",
               (long long)w.total, enc == CT_SHARD_U8 ? "u8" : "f32", (long long)numel, a->src,
               w.shard_no, a->out, a->compress ? ", zlib-compressed" : "", ct_now() - t0);
    free(x);
    free(u8);
    ct_dataset_close(ds);
    return rc;
}

int ct_pack_main(int argc, char **argv, ct_err *err) {
    pack_args a;
    int rc = parse_args(argc, argv, &a, err);
    if (rc) return rc;
    return strcmp(a.from, "text") == 0 ? pack_text(&a, err) : pack_images(&a, err);
}
