/* info_export.c: `ctrain info` and `ctrain export` (commands.h). */
#include "cmd/commands.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/ckpt/ckpt.h"
#include "core/ckpt/mapped.h"
#include "core/ckpt/shards.h"
#include "core/ckpt/source.h"
#include "core/ckpt/owned.h"
#include "core/graph/hf_gpt2.h"
#include "core/graph/hf_llama.h"
#include "core/util/fs.h"
#include "core/data/shard.h"
#include "core/data/hdf5_info.h"
#include "core/data/tfrecord.h"
#include "core/data/webdataset.h"
#include "core/ckpt/safetensors.h"

#define CLI_PATH 4096

static void print_tensors(const ct_st_file *f, FILE *out) {
    int width = 8;
    for (int i = 0; i < f->n_tensors; i++) {
        int l = (int)strlen(f->tensors[i].name);
        if (l > width) width = l < 60 ? l : 60;
    }
    for (int i = 0; i < f->n_tensors; i++) {
        const ct_st_tensor *t = &f->tensors[i];
        char shape[128], name[1024];   /* names from the file: control bytes escaped */
        fprintf(out, "  %-*s  %-5s %s\n", width, ct_printable_name(name, sizeof name, t->name), t->dtype,
                ct_shape_str(&t->shape, shape, sizeof shape));
    }
}

static void print_file_summary(const ct_st_file *f, FILE *out) {
    uint64_t values = 0;
    for (int i = 0; i < f->n_tensors; i++) values += (uint64_t)ct_st_numel(&f->tensors[i]);
    fprintf(out, "%s: safetensors, %d tensors, %llu values, %.1f MiB data, header %llu bytes\n",
            f->path, f->n_tensors, (unsigned long long)values,
            (double)(f->file_size - 8 - f->header_len) / (1024.0 * 1024.0),
            (unsigned long long)f->header_len);
    if (f->n_meta) {
        fprintf(out, "  metadata:");
        char key[1024], val[84];
        for (int i = 0; i < f->n_meta; i++)
            fprintf(out, " %s=%s", ct_printable_name(key, sizeof key, f->meta_keys[i]),
                    ct_printable_name(val, sizeof val, f->meta_vals[i]));
        fprintf(out, "\n");
    }
}

/* Whether a file starts as a safetensors file does: an 8-byte header length that fits the file,
 * then '{'. A file that does not is not described as a damaged safetensors file. */
static bool looks_like_safetensors(const char *path) {
    FILE *f = fopen(path, "rb");
    uint8_t h[9];
    bool got = f && fread(h, 1, sizeof h, f) == sizeof h;
    long size = got && fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (f) fclose(f);
    uint64_t n = 0;
    for (int i = 7; got && i >= 0; i--) n = n << 8 | h[i];
    return got && size > 8 && n <= (uint64_t)size - 8 && h[8] == '{';
}

static int info_file(const char *path, FILE *out, ct_err *err) {
    ct_st_file *f = ct_st_open(path, err);
    if (!f && err->code == CT_ERR_DATA && !looks_like_safetensors(path))
        return ct_errf(err, CT_ERR_DATA, "info: %s is not a file ctrain describes: not safetensors (no header length "
                       "and '{' at its start), nor a TFRecord file (plain or gzip/zlib of records), a WebDataset .tar, "
                       "an HDF5 file or a ctrain shard. It takes: %s", path,
                       ct_info_usage + strlen("usage: ctrain info "));
    if (!f) return err->code;
    print_file_summary(f, out);
    print_tensors(f, out);
    ct_st_close(f);
    return CT_OK;
}

static void print_state(const char *dir, FILE *out) {
    char path[CLI_PATH];
    snprintf(path, sizeof path, "%s/state.json", dir);
    char *text = ct_fs_read_small(path, 1 << 20, NULL);
    cJSON *j = text ? cJSON_Parse(text) : NULL;
    free(text);
    if (!j) {
        fprintf(out, "  state.json: unreadable\n");
        return;
    }
    const char *keys[] = {"step", "epoch", "epoch_step", "samples_seen", "applied", "sched_t", "last_eval_step",
                          "skipped_steps", "loss_scale", "train_loss", "best_value", "best_step",
                          "es_best", "es_bad_evals", "seed", "optimizer", "config_hash", "ctrain_version"};
    fprintf(out, "  state:");
    for (int i = 0; i < CT_ARRAY_LEN(keys); i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, keys[i]);
        if (!v) continue;
        char *s = cJSON_IsString(v) ? NULL : cJSON_PrintUnformatted(v);
        fprintf(out, "%s %s=%s", i % 6 == 0 && i ? "\n        " : "", keys[i],
                s ? s : v->valuestring);
        free(s);
    }
    fprintf(out, "\n");
    cJSON_Delete(j);
}

/* A Hugging Face model directory (ct_ckpt_is_hf_dir): what config.json says of the shape, then
 * every weight file. */
static int info_hf_dir(const char *dir, FILE *out, ct_err *err) {
    static const char *const keys[] = {"model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                                       "num_attention_heads", "num_key_value_heads", "vocab_size", "rope_theta",
                                       "tie_word_embeddings", "torch_dtype"};
    char path[CLI_PATH + 48];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = ct_fs_read_small(path, (size_t)1 << 20, NULL);
    cJSON *cfg = text ? cJSON_Parse(text) : NULL;
    free(text);
    fprintf(out, "Hugging Face model directory %s (model.init_from reads it into a model of its shape)\n", dir);
    fprintf(out, "  config.json:%s", cfg ? "" : " unreadable");
    for (int i = 0; cfg && i < CT_ARRAY_LEN(keys); i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, keys[i]);
        if (!v) continue;
        char *val = cJSON_PrintUnformatted(v);
        fprintf(out, " %s %s", keys[i], val);
        free(val);
    }
    fprintf(out, "\n");
    cJSON_Delete(cfg);
    char **files = NULL;
    int n = 0, rc = ct_ckpt_hf_weight_files(dir, &files, &n, err);
    for (int i = 0; !rc && i < n; i++) rc = info_file(files[i], out, err);
    ct_ckpt_free_files(files, n);
    return rc;
}

/* A sharded checkpoint: each rank's file and the range it holds, then the model's tensors. */
static int info_shards(const char *dir, FILE *out, ct_err *err) {
    ct_ckpt_source src;
    ct_err e = {0};
    if (ct_ckpt_source_open_dir(dir, true, &src, &e)) {
        fprintf(out, "  %s\n", e.msg);
        return ct_errf(err, e.code, "%s", e.msg);
    }
    const ct_ckpt_shard_set *set = src.shards;
    fprintf(out, "  shards: %d (ZeRO, one per rank), %lld parameters, optimizer %s (%s)\n", set->world,
            (long long)set->n_params, set->optimizer, set->slots[0] ? set->slots : "no state");
    for (int r = 0; r < set->world; r++) {
        const ct_ckpt_shard *sh = &set->shards[r];
        fprintf(out, "  %s: [%lld, %lld), %.1f MiB\n", sh->file, (long long)sh->lo, (long long)sh->hi,
                (double)sh->f->file_size / (1024.0 * 1024.0));
    }
    int width = 8;
    for (int i = 0; i < src.n_tensors; i++) {
        int l = (int)strlen(src.tensors[i].name);
        if (l > width) width = l < 60 ? l : 60;
    }
    fprintf(out, "  model: %d tensors\n", src.n_tensors);
    for (int i = 0; i < src.n_tensors; i++) {
        char shape[128];
        fprintf(out, "  %-*s  %-5s %s\n", width, src.tensors[i].name, src.tensors[i].dtype,
                ct_shape_str(&src.tensors[i].shape, shape, sizeof shape));
    }
    ct_ckpt_source_close(&src);
    return CT_OK;
}

static int info_checkpoint(const char *dir, FILE *out, ct_err *err) {
    bool complete = ct_ckpt_is_complete(dir);
    fprintf(out, "checkpoint %s (%s)\n", dir, complete ? "complete" : "INCOMPLETE: never loaded");
    int rc = CT_OK, n = 0;
    ct_err e = {0};
    if (complete && ct_ckpt_verify(dir, &n, &e) != CT_OK) {
        fprintf(out, "  checksums: MISMATCH: %.*s\n", (int)strcspn(e.msg, "\n"), e.msg);
        rc = ct_errf(err, e.code, "%s", e.msg);
    } else if (complete) {
        fprintf(out, n ? "  checksums: match (CRC-32 of the %d tensor files)\n"
                       : "  checksums: none recorded (saved before ctrain recorded them; sizes match)\n", n);
    }
    print_state(dir, out);
    if (ct_ckpt_dir_sharded(dir)) {
        int src = info_shards(dir, out, err);
        if (!rc) rc = src;
        if (!complete && !rc)
            rc = ct_errf(err, CT_ERR_DATA, "%s: incomplete checkpoint (no valid COMPLETE marker)", dir);
        return rc;
    }
    static const char *files[] = {"model.safetensors", "optimizer.safetensors"};
    for (int i = 0; i < 2; i++) {
        char path[CLI_PATH];
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        e = (ct_err){0};
        ct_st_file *f = ct_st_open(path, &e);
        if (!f) {
            fprintf(out, "  %s\n", e.msg);
            if (!rc) rc = ct_errf(err, e.code, "%s", e.msg);
            continue;
        }
        print_file_summary(f, out);
        if (i == 0) print_tensors(f, out);
        ct_st_close(f);
    }
    if (!complete && !rc)
        rc = ct_errf(err, CT_ERR_DATA, "%s: incomplete checkpoint (no valid COMPLETE marker)", dir);
    return rc;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* A save_dir: list its checkpoint directories, then show the one `latest` resolves to. */
static int info_save_dir(const char *dir, FILE *out, ct_err *err) {
    DIR *d = opendir(dir);
    if (!d) return ct_errf(err, CT_ERR_DATA, "%s: cannot open: %s", dir, strerror(errno));
    char *names[512];
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < 512)
        if (strncmp(de->d_name, "global_step", 11) == 0 || strcmp(de->d_name, "best") == 0)
            names[n++] = ct_xstrdup(de->d_name);
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    char path[CLI_PATH];
    snprintf(path, sizeof path, "%s/latest", dir);
    char *latest = ct_fs_read_small(path, 255, NULL);
    fprintf(out, "%s: %d checkpoint directories, latest = %s\n", dir, n, latest ? latest : "(none)");
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        fprintf(out, "  %-24s %s\n", names[i], ct_ckpt_is_complete(path) ? "complete" : "incomplete");
        free(names[i]);
    }
    free(latest);
    ct_warnings warn = {0};
    char chosen[CLI_PATH];
    int rc = ct_ckpt_resolve(dir, NULL, chosen, sizeof chosen, &warn, err);
    for (int i = 0; i < warn.n; i++) fprintf(out, "  note: %s\n", warn.items[i]);
    ct_warnings_free(&warn);
    if (rc) return rc;
    fprintf(out, "\n");
    return info_checkpoint(chosen, out, err);
}

/* A shard file (by its magic number) or a directory holding *.cts shard files. */
static bool is_shard(const char *p, const struct stat *st) {
    if (S_ISDIR(st->st_mode)) {
        DIR *d = opendir(p);
        if (!d) return false;
        bool found = false;
        for (struct dirent *e; !found && (e = readdir(d));) {
            size_t n = strlen(e->d_name);
            found = n > 4 && strcmp(e->d_name + n - 4, ".cts") == 0;
        }
        closedir(d);
        return found;
    }
    char magic[8];
    FILE *f = fopen(p, "rb");
    if (!f) return false;
    bool ok = fread(magic, 1, 8, f) == 8 && memcmp(magic, CT_SHARD_MAGIC, 8) == 0;
    fclose(f);
    return ok;
}

const char ct_info_usage[] =
    "usage: ctrain info FILE.safetensors | CHECKPOINT_DIR | SAVE_DIR | HF_MODEL_DIR | SHARD_FILE | SHARD_DIR | FILE.tar | "
    "FILE.tfrecord | FILE.h5";

int ct_info_main(int argc, char **argv, ct_err *err) {
    if (argc != 2 || argv[1][0] == '-') return ct_errf(err, CT_ERR_CONFIG, "%s", ct_info_usage);
    const char *p = argv[1];
    struct stat st;
    if (stat(p, &st) != 0) return ct_errf(err, CT_ERR_DATA, "%s: %s", p, strerror(errno));
    /* Checked before anything opens it: opening a FIFO blocks until a writer comes. */
    if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
        return ct_errf(err, CT_ERR_CONFIG, "info: %s: not a regular file or directory (a %s); expected a "
                       "safetensors file, a checkpoint directory, a save_dir or shards", p,
                       S_ISFIFO(st.st_mode) ? "FIFO" : S_ISSOCK(st.st_mode) ? "socket"
                       : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "device" : "special file");
    if (is_shard(p, &st)) return ct_shard_info(p, stdout, err);
    if (S_ISREG(st.st_mode) && ct_webdataset_is_tar(p)) return ct_webdataset_info(p, stdout, err);
    if (S_ISREG(st.st_mode) && ct_tfrecord_is_file(p)) return ct_tfrecord_info(p, stdout, err);
    if (S_ISREG(st.st_mode) && ct_hdf5_is_file(p)) return ct_hdf5_info(p, stdout, err);
    if (!S_ISDIR(st.st_mode)) return info_file(p, stdout, err);
    char marker[CLI_PATH], model[CLI_PATH];
    snprintf(marker, sizeof marker, "%s/%s", p, CT_CKPT_MARKER);
    snprintf(model, sizeof model, "%s/model.safetensors", p);
    if (ct_ckpt_is_hf_dir(p)) return info_hf_dir(p, stdout, err);
    if (ct_fs_exists(marker) || ct_fs_exists(model) || ct_ckpt_dir_sharded(p)) return info_checkpoint(p, stdout, err);
    return info_save_dir(p, stdout, err);
}

/* ---------------------------------------------------------------- export */

/* --layout: ctrain's own names, GPT-2's (core/graph/hf_gpt2.h: one file) or Llama's
 * (core/graph/hf_llama.h: a directory transformers loads, config.json and model.safetensors). */
typedef enum { LAYOUT_CTRAIN, LAYOUT_HF_GPT2, LAYOUT_HF_LLAMA } export_layout;

typedef struct export_args {
    const char *checkpoint, *out;
    ct_dtype dtype;
    export_layout layout;
} export_args;

const char ct_export_usage[] =
    "usage: ctrain export --checkpoint DIR --out FILE.safetensors [--dtype fp32|fp16|bf16] "
    "[--layout ctrain|hf-gpt2]\n"
    "       ctrain export --checkpoint DIR --out OUT_DIR --layout hf-llama [--dtype fp32|fp16|bf16]";

static int export_parse(int argc, char **argv, export_args *a, ct_err *err) {
    a->dtype = CT_F32;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if ((v = ct_cli_option_value(argc, argv, &i, "--checkpoint"))) a->checkpoint = v;
        else if ((v = ct_cli_option_value(argc, argv, &i, "--out"))) a->out = v;
        else if ((v = ct_cli_option_value(argc, argv, &i, "--dtype"))) {
            if (strcmp(v, "fp32") == 0) a->dtype = CT_F32;
            else if (strcmp(v, "fp16") == 0) a->dtype = CT_F16;
            else if (strcmp(v, "bf16") == 0) a->dtype = CT_BF16;
            else return ct_errf(err, CT_ERR_CONFIG, "export: --dtype: expected fp32, fp16 or bf16, "
                                "got \"%s\"", v);
        } else if ((v = ct_cli_option_value(argc, argv, &i, "--layout"))) {
            if (strcmp(v, CT_HF_GPT2_LAYOUT) == 0) a->layout = LAYOUT_HF_GPT2;
            else if (strcmp(v, CT_HF_LLAMA_LAYOUT) == 0) a->layout = LAYOUT_HF_LLAMA;
            else if (strcmp(v, "ctrain") == 0) a->layout = LAYOUT_CTRAIN;
            else return ct_errf(err, CT_ERR_CONFIG, "export: --layout: expected ctrain, %s or %s, got \"%s\"",
                                CT_HF_GPT2_LAYOUT, CT_HF_LLAMA_LAYOUT, v);
        } else {
            return ct_errf(err, CT_ERR_CONFIG, "export: unexpected argument \"%s\"\n%s", argv[i],
                           ct_export_usage);
        }
    }
    if (!a->checkpoint || !*a->checkpoint || !a->out || !*a->out)
        return ct_errf(err, CT_ERR_CONFIG, "export: %s is required\n%s",
                       a->checkpoint && *a->checkpoint ? "--out" : "--checkpoint", ct_export_usage);
    return CT_OK;
}

/* The values of one F32 tensor of the source, asked for in chunks by the writer: an export reads
 * the shards piece by piece into the writer's one staging buffer, never a whole tensor. */
typedef struct export_fill {
    const ct_ckpt_source *src;
    const ct_ckpt_src_tensor *x;
} export_fill;

static int fill_from_source(void *ctx, int64_t first, int64_t n, float *dst, ct_err *err) {
    const export_fill *f = ctx;
    if (ct_ckpt_source_read(f->src, f->x, first, n, dst)) return CT_OK;
    return ct_errf(err, CT_ERR_DATA, "%s: tensor \"%s\" cannot be read", f->src->path, f->x->name);
}

/* Entries converting every F32 tensor to dtype (streamed from the source); others are copied as
 * they are. */
static int export_entries(const ct_ckpt_source *src, ct_dtype dtype, ct_st_entry *e, export_fill *fill,
                          ct_err *err) {
    for (int i = 0; i < src->n_tensors; i++) {
        const ct_ckpt_src_tensor *t = &src->tensors[i];
        if (t->ct_dtype < 0)
            return ct_errf(err, CT_ERR_DATA, "%s: tensor \"%s\" has dtype %s, which export cannot "
                           "write", src->path, t->name, t->dtype);
        e[i] = (ct_st_entry){.name = t->name, .dtype = (ct_dtype)t->ct_dtype, .shape = t->shape};
        if (t->ct_dtype != CT_F32) {
            e[i].data = t->st->data;
            continue;
        }
        fill[i] = (export_fill){.src = src, .x = t};
        e[i].dtype = dtype;
        e[i].fill = fill_from_source;
        e[i].fill_ctx = &fill[i];
    }
    return CT_OK;
}

static int export_write(const ct_ckpt_source *src, const export_args *a, const char *dir, ct_err *err) {
    ct_st_entry *e = ct_xcalloc((size_t)src->n_tensors + 1, sizeof *e);
    export_fill *fill = ct_xcalloc((size_t)src->n_tensors + 1, sizeof *fill);
    int rc = export_entries(src, a->dtype, e, fill, err);
    const char *mk[] = {"format", "ctrain_version", "source", "dtype"};
    const char *mv[] = {"pt", CT_VERSION, dir, ct_dtype_safetensors_name(a->dtype)};
    ct_fs_out out;   /* a temporary file renamed into place (a device is written through) */
    if (!rc) rc = ct_fs_out_begin(a->out, &out, err);
    if (!rc) rc = ct_fs_out_commit(&out, ct_st_write(out.write_to, e, src->n_tensors, mk, mv, 4, err), err);
    free(fill);
    free(e);
    return rc;
}

/* --out must not be inside a checkpoint directory (the source, or any directory holding a
 * COMPLETE marker: an export there would replace or add to files a resume reads, and an fp16
 * export over model.safetensors destroys the fp32 master for good), nor be any file export reads
 * (compared by device and inode, so another spelling, a symlink or a hard link is caught), and
 * its directory must take a new file: all checked before anything is read or written. */
static int export_check_out(const char *out, const char *spec, const char *dir, ct_err *err) {
    static const char *const inputs[] = {"model.safetensors", CT_CKPT_MARKER, "latest"};
    char parent[CLI_PATH], path[CLI_PATH + 32];
    ct_fs_parent(out, parent, sizeof parent);
    snprintf(path, sizeof path, "%s/%s", parent, CT_CKPT_MARKER);
    if (ct_fs_same_file(parent, dir) || ct_fs_exists(path))
        return ct_errf(err, CT_ERR_CONFIG, "export: --out %s is inside the checkpoint directory "
                       "%s; writing there would change the checkpoint a resume reads. Write the "
                       "export elsewhere (e.g. --out model.safetensors in the current directory)",
                       out, parent);
    for (int i = 0; i < CT_ARRAY_LEN(inputs); i++) {
        snprintf(path, sizeof path, "%s/%s", i < 2 ? dir : spec, inputs[i]);
        if (ct_fs_same_file(out, path))
            return ct_errf(err, CT_ERR_CONFIG, "export: --out %s is %s (the same file), which "
                           "export reads; write the export to a new file", out, path);
    }
    DIR *d = opendir(dir);   /* a sharded checkpoint's files (a hard link to one elsewhere) */
    for (struct dirent *de; d && (de = readdir(d));) {
        if (de->d_name[0] == '.' || ct_fs_join(path, sizeof path, dir, de->d_name, NULL) != CT_OK) continue;
        if (ct_fs_same_file(out, path)) {
            closedir(d);
            return ct_errf(err, CT_ERR_CONFIG, "export: --out %s is %s (the same file), which "
                           "export reads; write the export to a new file", out, path);
        }
    }
    if (d) closedir(d);
    char why[2 * CLI_PATH + 100];
    if (ct_owned_output(out, why, sizeof why))   /* a run's latest, config.json, metrics.jsonl, ... */
        return ct_errf(err, CT_ERR_CONFIG, "export: --out %s is %s; writing there would replace a file ctrain "
                       "keeps. Write the export elsewhere (e.g. --out model.safetensors in the current directory)",
                       out, why);
    ct_err e = {0};
    if (ct_fs_check_output_file(out, &e))
        return ct_errf(err, CT_ERR_CONFIG, "export: --out: %s; give a file in a directory you can "
                       "write to", e.msg);
    return CT_OK;
}

/* The model of the checkpoint's own config.json, built for one sample (no data is opened). */
static int checkpoint_graph(const char *dir, ct_config **cfg, ct_graph **g, ct_err *err) {
    char path[CLI_PATH + 32];
    snprintf(path, sizeof path, "%s/config.json", dir);
    ct_config_opts co = {.path = path, .world_size = 1};
    ct_warnings warn = {0};
    int rc = ct_config_load(&co, cfg, &warn, err);
    ct_warnings_free(&warn);
    if (!rc) rc = ct_graph_build(*cfg, 1, CT_F32, g, err);
    return rc;
}

/* The dtype's name in a config.json (torch_dtype). */
static const char *torch_dtype(ct_dtype dt) {
    return dt == CT_BF16 ? "bfloat16" : dt == CT_F16 ? "float16" : "float32";
}

/* --layout hf-llama writes a directory: --out itself must not be a checkpoint's file, and neither
 * may OUT_DIR/model.safetensors be; then OUT_DIR is made. *file receives the weights' path. */
static int llama_out_dir(const export_args *a, const char *dir, char *file, size_t n, ct_err *err) {
    if (ct_fs_exists(a->out) && !ct_fs_is_dir(a->out))
        return ct_errf(err, CT_ERR_CONFIG, "export: --out %s is a file; --layout %s writes a directory "
                       "(config.json and model.safetensors), as transformers' save_pretrained does", a->out,
                       CT_HF_LLAMA_LAYOUT);
    int rc = export_check_out(a->out, a->checkpoint, dir, err);
    if (!rc) rc = ct_fs_mkdirs(a->out, err);
    snprintf(file, n, "%s/model.safetensors", a->out);
    if (!rc) rc = export_check_out(file, a->checkpoint, dir, err);
    return rc;
}

/* --layout hf-gpt2 / hf-llama: the checkpoint's tensors in Hugging Face's names and layout,
 * through the map of the model its config.json describes; Llama's directory gets the config.json
 * transformers reads. */
static int export_hf(const ct_ckpt_source *f, const export_args *a, const char *dir, int *n_out,
                     ct_err *err) {
    bool llama = a->layout == LAYOUT_HF_LLAMA;
    const char *name = llama ? CT_HF_LLAMA_LAYOUT : CT_HF_GPT2_LAYOUT;
    ct_config *cfg = NULL;
    ct_graph *g = NULL;
    ct_tensor_map map = {0};
    ct_mapped_export x = {0};
    char file[CLI_PATH + 32];
    snprintf(file, sizeof file, "%s", a->out);
    int rc = checkpoint_graph(dir, &cfg, &g, err);
    if (!rc && (rc = llama ? ct_hf_llama_map(g, &map, err) : ct_hf_gpt2_map(g, &map, err))) {
        char why[CT_ERR_MSG];
        snprintf(why, sizeof why, "%s", err->msg);
        rc = ct_errf(err, rc, "export: --layout %s: %s/config.json: %s", name, dir, why);
    }
    if (!rc && llama) rc = llama_out_dir(a, dir, file, sizeof file, err);
    if (!rc) rc = ct_ckpt_map_export(f, ct_graph_layout(g)->views, &map, a->dtype, &x, err);
    const char *mk[] = {"format", "ctrain_version", "source", "dtype", "layout"};
    const char *mv[] = {"pt", CT_VERSION, dir, ct_dtype_safetensors_name(a->dtype), name};
    ct_fs_out out;
    if (!rc) rc = ct_fs_out_begin(file, &out, err);
    if (!rc) rc = ct_fs_out_commit(&out, ct_st_write(out.write_to, x.entries, x.n, mk, mv, 5, err), err);
    if (!rc && llama) {
        char *json = ct_hf_llama_config_json(g, torch_dtype(a->dtype)), path[CLI_PATH + 32];
        snprintf(path, sizeof path, "%s/config.json", a->out);
        rc = ct_fs_write_atomic(path, json, strlen(json), err);
        free(json);
        if (!rc) printf("LlamaForCausalLM.from_pretrained(\"%s\") loads it\n", a->out);
    } else if (!rc) {
        char hf[512];
        ct_hf_gpt2_config(g, hf, sizeof hf);
        printf("GPT2LMHeadModel loads it with GPT2Config(%s)\n", hf);
    }
    if (!rc) *n_out = x.n;
    ct_mapped_export_free(&x);
    ct_tensor_map_free(&map);
    ct_graph_free(g);
    ct_config_free(cfg);
    return rc;
}

int ct_export_main(int argc, char **argv, ct_err *err) {
    export_args a = {0};
    int rc = export_parse(argc, argv, &a, err);
    if (rc) return rc;
    char dir[CLI_PATH];
    rc = ct_ckpt_resolve(a.checkpoint, NULL, dir, sizeof dir, NULL, err);
    if (!rc && a.layout != LAYOUT_HF_LLAMA) rc = export_check_out(a.out, a.checkpoint, dir, err);
    if (rc) return rc;
    /* one file set's model.safetensors, or per-rank shards consolidated (each tensor read from the
     * shards that hold it, in chunks) */
    ct_ckpt_source src;
    rc = ct_ckpt_source_open_dir(dir, false, &src, err);
    if (rc) return rc;
    int n = src.n_tensors;
    rc = a.layout != LAYOUT_CTRAIN ? export_hf(&src, &a, dir, &n, err) : export_write(&src, &a, dir, err);
    if (!rc && a.layout != LAYOUT_CTRAIN) {
        printf("exported %d tensors (%s, layout %s) from %s to %s\n", n, ct_dtype_safetensors_name(a.dtype),
               a.layout == LAYOUT_HF_LLAMA ? CT_HF_LLAMA_LAYOUT : CT_HF_GPT2_LAYOUT, dir, a.out);
    } else if (!rc) {
        uint64_t values = 0;
        for (int i = 0; i < src.n_tensors; i++) values += (uint64_t)ct_shape_numel(&src.tensors[i].shape);
        printf("exported %d tensors (%llu values, %s) from %s to %s%s\n", src.n_tensors,
               (unsigned long long)values, ct_dtype_safetensors_name(a.dtype), dir, a.out,
               src.shards ? " (consolidated from the per-rank shards)" : "");
    }
    ct_ckpt_source_close(&src);
    return rc;
}
