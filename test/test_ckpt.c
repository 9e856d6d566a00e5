/* test_ckpt.c: checkpoint directories: bitwise round trip, latest, keep_last, crash safety (fault
 * hook and a real kill -9 during a save), incomplete directories ignored, shape mismatches named,
 * best/, init_from strict and partial, config diff, export and info; export never writing into a
 * checkpoint or over its input; keep_last removing only complete checkpoints of the run's own
 * experiment (also at the start of a run), never an incomplete or foreign directory; the run
 * directory's lock. Per-rank shards (shards.h): saved by W ranks and loaded by parts of M (the
 * range-intersection reads, also of a file set), only the files of a part's range read, hostile
 * shard descriptions and indexes refused naming the file (and fuzzed), and tensors in a device's
 * memory moved through a bounded staging buffer. */
#include <check.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/ckpt/ckpt.h"
#include "core/ckpt/shards.h"
#include "core/dist/comm.h"
#include "cmd/commands.h"
#include "core/util/rng.h"
#include "core/ckpt/safetensors.h"
#include "core/util/fs.h"

static char tmpdir[256], save_dir[300];

static void setup(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ct_test_ckpt_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    snprintf(save_dir, sizeof save_dir, "%s/ckpts", tmpdir);
}
static void teardown(void) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    ck_assert_int_eq(system(cmd), 0);
}

/* A small model: fc1 [4,3] + [4], fc2 [2,4] (params 24), bn running mean [4] (buffer). */
enum { NP = 24, NB = 4 };
typedef struct model {
    ct_param_view views[4];
    float params[NP], buffers[NB], m[NP], v[NP];
    ct_ckpt_tensors t;
} model;

static ct_param_view mkview(const char *name, int nd, int64_t d0, int64_t d1, int64_t off,
                            bool trainable) {
    ct_param_view v = {0};
    snprintf(v.name, sizeof v.name, "%s", name);
    int64_t d[] = {d0, d1};
    v.shape = ct_shape_make(nd, d);
    v.offset = off;
    v.numel = ct_shape_numel(&v.shape);
    v.trainable = trainable;
    v.weight_decay = nd == 2;
    return v;
}

static void fill(float *p, int n, uint64_t seed) {
    ct_rng r;
    ct_rng_init(&r, seed, 77, 0);
    for (int i = 0; i < n; i++) p[i] = ct_rng_uniform(&r) * 2.0f - 1.0f;
}

static void model_init(model *md, uint64_t seed) {
    memset(md, 0, sizeof *md);
    md->views[0] = mkview("fc1.weight", 2, 4, 3, 0, true);
    md->views[1] = mkview("fc1.bias", 1, 4, 0, 12, true);
    md->views[2] = mkview("bn.running_mean", 1, 4, 0, 0, false);
    md->views[3] = mkview("fc2.weight", 2, 2, 4, 16, true);
    if (seed) {
        fill(md->params, NP, seed);
        fill(md->buffers, NB, seed + 1);
        fill(md->m, NP, seed + 2);
        fill(md->v, NP, seed + 3);
    }
    ct_ckpt_tensors *t = &md->t;
    t->views = md->views;
    t->n_views = 4;
    t->params = md->params;
    t->buffers = md->buffers;
    t->n_params = NP;
    t->lo = 0;
    t->hi = NP;
    t->n_buffers = NB;
    t->n_slots = 2;
    t->slot_name[0] = "exp_avg";
    t->slot_name[1] = "exp_avg_sq";
    t->slot[0] = md->m;
    t->slot[1] = md->v;
    snprintf(t->optimizer, sizeof t->optimizer, "AdamW");
}

static ct_ckpt_state mkstate(long step) {
    ct_ckpt_state s;
    ct_ckpt_state_init(&s);
    s.step = step;
    s.applied = step - 1;
    s.sched_t = step - 2;
    s.skipped_steps = 1;
    s.epoch = 2;
    s.epoch_step = 17;
    s.epoch_sample = 17 * 32 + 5;
    s.samples_seen = step * 32;
    s.micro_step = step * 4;
    s.seed = 0xfedcba9876543210ull;
    s.loss_scale = 32768.0;
    s.scaler_good_steps = 123;
    s.scaler_hysteresis = 2;
    s.best_value = 0.1 + 0.2; /* 0.30000000000000004: cJSON's 15-digit printing would lose it */
    s.best_step = step / 2;
    s.es_bad_evals = 1;
    s.es_best = 0.7 * 3.0;
    s.train_loss = 1.0 / 3.0;
    s.epoch_loss_sum = 12.345678901234567;
    s.epoch_loss_n = 5;
    s.last_eval_step = step - 3;
    snprintf(s.config_hash, sizeof s.config_hash, "0123456789abcdef");
    snprintf(s.train_data, sizeof s.train_data, "v1 files=2 bytes=%ld content=%016lx mtime=%016lx", step * 1000,
             (unsigned long)step * 0x9e3779b97f4a7c15ul, (unsigned long)step * 0x2545f4914f6cdd1dul);
    return s;
}

static cJSON *mkconfig(double lr) {
    cJSON *c = cJSON_CreateObject();
    cJSON *o = cJSON_AddObjectToObject(c, "optimizer");
    cJSON_AddStringToObject(o, "type", "AdamW");
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(o, "params"), "lr", lr);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(c, "train"), "epochs", 3);
    return c;
}

/* A config as a run holds it, whose resolved JSON is `resolved` (taken over): the keys outside
 * its experiment come from the flags on core/config/'s rows, as they do for a run (a loaded
 * config that reads the sections they are in). */
static ct_config *owner_of(cJSON *resolved) {
    char path[400];
    snprintf(path, sizeof path, "%s/owner.json", tmpdir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("{\"train_batch_size\": 8, \"zero_optimization\": {\"stage\": 1, \"offload_optimizer\": "
          "{\"device\": \"cpu\"}}}", f);
    fclose(f);
    ct_config_opts o = {.path = path, .world_size = 1};
    ct_config *cfg = NULL;
    ct_warnings w = {0};
    ct_err err = {0};
    ck_assert_msg(ct_config_load(&o, &cfg, &w, &err) == CT_OK, "%s", err.msg);
    ct_warnings_free(&w);
    cJSON_Delete(cfg->resolved);
    cfg->resolved = resolved;
    return cfg;
}

static void save(const model *md, long step, int keep_last) {
    ct_ckpt_state s = mkstate(step);
    cJSON *c = mkconfig(1e-3);
    ct_ckpt_save_opts o = {.keep_last = keep_last};
    ct_err err = {0};
    char out[1024];
    ck_assert_msg(ct_ckpt_save(save_dir, &md->t, &s, c, &o, out, sizeof out, &err) == CT_OK, "%s",
                  err.msg);
    char want[1024];
    snprintf(want, sizeof want, "%s/global_step%ld", save_dir, step);
    ck_assert_str_eq(out, want);
    cJSON_Delete(c);
}

static void read_latest(char *buf, size_t n) {
    char path[512];
    snprintf(path, sizeof path, "%s/latest", save_dir);
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    size_t k = fread(buf, 1, n - 1, f);
    buf[k] = 0;
    fclose(f);
}

static void resolve_auto(char *out, size_t n) {
    ct_err err = {0};
    ct_warnings w = {0};
    ck_assert_int_eq(ct_ckpt_resolve("auto", save_dir, out, n, &w, &err), CT_OK);
    ct_warnings_free(&w);
}

static bool models_equal(const model *a, const model *b) {
    return !memcmp(a->params, b->params, sizeof a->params) &&
           !memcmp(a->buffers, b->buffers, sizeof a->buffers) && !memcmp(a->m, b->m, sizeof a->m) &&
           !memcmp(a->v, b->v, sizeof a->v);
}

START_TEST(roundtrip_bitwise) {
    model a, b;
    model_init(&a, 1);
    model_init(&b, 0);
    save(&a, 10, 0);
    char dir[1024];
    resolve_auto(dir, sizeof dir);
    ct_ckpt_state s;
    cJSON *cfg = NULL;
    ct_err err = {0};
    ck_assert_msg(ct_ckpt_load(dir, &b.t, CT_CKPT_LOAD_ALL, &s, &cfg, &err) == CT_OK, "%s", err.msg);
    ck_assert(models_equal(&a, &b));
    ct_ckpt_state w = mkstate(10);
    ck_assert_int_eq(s.step, 10);
    ck_assert_int_eq(s.applied, w.applied);
    ck_assert_int_eq(s.sched_t, w.sched_t);
    ck_assert_int_eq(s.epoch, 2);
    ck_assert_int_eq(s.epoch_step, 17);
    ck_assert_int_eq(s.epoch_sample, w.epoch_sample);
    ck_assert_str_eq(s.train_data, w.train_data);
    ck_assert_str_eq(s.eval_data, ""); /* none recorded */
    ck_assert_int_eq(s.micro_step, 40);
    ck_assert(s.seed == w.seed);
    ck_assert(s.loss_scale == w.loss_scale && s.best_value == w.best_value &&
              s.train_loss == w.train_loss);
    ck_assert_int_eq(s.scaler_good_steps, 123);
    ck_assert_int_eq(s.scaler_hysteresis, 2);
    ck_assert_int_eq(s.es_bad_evals, 1);
    ck_assert(s.es_best == w.es_best);
    ck_assert(s.epoch_loss_sum == w.epoch_loss_sum);
    ck_assert_int_eq(s.epoch_loss_n, 5);
    ck_assert_int_eq(s.last_eval_step, 7);
    ck_assert_str_eq(s.config_hash, w.config_hash);
    ck_assert_str_eq(s.version, CT_VERSION);
    cJSON *c = mkconfig(1e-3);
    ck_assert(cJSON_Compare(cfg, c, 1));
    cJSON_Delete(c);
    cJSON_Delete(cfg);
    /* model only (eval): optimizer state untouched */
    model e;
    model_init(&e, 0);
    ck_assert_int_eq(ct_ckpt_load(dir, &e.t, CT_CKPT_LOAD_MODEL, NULL, NULL, &err), CT_OK);
    ck_assert(!memcmp(e.params, a.params, sizeof a.params));
    ck_assert(e.m[3] == 0.0f);
}
END_TEST

START_TEST(latest_and_keep_last) {
    model a;
    model_init(&a, 2);
    for (long s = 1; s <= 5; s++) save(&a, s * 10, 2);
    char buf[64], dir[1024];
    read_latest(buf, sizeof buf);
    ck_assert_str_eq(buf, "global_step50"); /* no trailing newline, as DeepSpeed writes it */
    resolve_auto(dir, sizeof dir);
    ck_assert_ptr_nonnull(strstr(dir, "global_step50"));
    for (long s = 1; s <= 5; s++) {
        char p[600];
        snprintf(p, sizeof p, "%s/global_step%ld", save_dir, s * 10);
        ck_assert_int_eq(access(p, F_OK) == 0, s >= 4);
    }
    /* keep_last 0 keeps everything */
    save(&a, 60, 0);
    save(&a, 70, 0);
    char p[600];
    snprintf(p, sizeof p, "%s/global_step40", save_dir);
    ck_assert_int_eq(access(p, F_OK), 0);
    /* re-saving the same step replaces it */
    a.params[0] = 42.0f;
    save(&a, 70, 0);
    model b;
    model_init(&b, 0);
    ct_err err = {0};
    resolve_auto(dir, sizeof dir);
    ck_assert_int_eq(ct_ckpt_load(dir, &b.t, CT_CKPT_LOAD_ALL, NULL, NULL, &err), CT_OK);
    ck_assert(b.params[0] == 42.0f);
    /* nothing found: start fresh */
    char none[600];
    ct_warnings w = {0};
    snprintf(none, sizeof none, "%s/nothing", tmpdir);
    ck_assert_int_eq(ct_ckpt_resolve("auto", none, dir, sizeof dir, &w, &err), CT_OK);
    ck_assert_str_eq(dir, "");
}
END_TEST

static int fail_at(void *ctx, const char *stage) { return strcmp(stage, (const char *)ctx) == 0; }

static int count_entries(const char *prefix) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ls -a %s | grep -c '^%s' > %s/count", save_dir, prefix, tmpdir);
    if (system(cmd) < 0) return -1;
    snprintf(cmd, sizeof cmd, "%s/count", tmpdir);
    FILE *f = fopen(cmd, "r");
    int n = -1;
    if (fscanf(f, "%d", &n) != 1) n = -1;
    fclose(f);
    return n;
}

START_TEST(interrupted_save_keeps_previous) {
    model a, b, c;
    model_init(&a, 3);
    model_init(&b, 4);
    save(&a, 1, 3);
    static const char *stages[] = {"model.safetensors", "optimizer.safetensors", "state.json",
                                   "config.json", "COMPLETE", "rename"};
    for (int i = 0; i < (int)(sizeof stages / sizeof stages[0]); i++) {
        ct_ckpt_state s = mkstate(2);
        ct_ckpt_save_opts o = {.keep_last = 1, .fault = fail_at, .fault_ctx = (void *)stages[i]};
        ct_err err = {0};
        ck_assert_int_eq(ct_ckpt_save(save_dir, &b.t, &s, NULL, &o, NULL, 0, &err), CT_ERR_RUNTIME);
        char buf[64], dir[1024];
        read_latest(buf, sizeof buf);
        ck_assert_str_eq(buf, "global_step1");
        resolve_auto(dir, sizeof dir);
        ck_assert_msg(strstr(dir, "global_step1") != NULL, "stage %s: %s", stages[i], dir);
        model_init(&c, 0);
        ck_assert_int_eq(ct_ckpt_load(dir, &c.t, CT_CKPT_LOAD_ALL, NULL, NULL, &err), CT_OK);
        ck_assert(models_equal(&a, &c));
    }
    /* the next good save cleans up what the failed ones left */
    save(&b, 3, 0);
    ck_assert_int_eq(count_entries(".tmp-"), 0);
}
END_TEST

START_TEST(failed_save_cleans_up) {
    model a;
    model_init(&a, 17);
    save(&a, 1, 0);
    a.views[3].offset = 20; /* runs past the 24 parameters: the writer refuses */
    ct_ckpt_state s = mkstate(2);
    ct_err err = {0};
    ck_assert_int_eq(ct_ckpt_save(save_dir, &a.t, &s, NULL, NULL, NULL, 0, &err), CT_ERR_RUNTIME);
    ck_assert_ptr_nonnull(strstr(err.msg, "fc2.weight"));
    ck_assert_int_eq(count_entries(".tmp-"), 0);
    char buf[64];
    read_latest(buf, sizeof buf);
    ck_assert_str_eq(buf, "global_step1");
}
END_TEST

static int kill_self(void *ctx, const char *stage) {
    if (strcmp(stage, (const char *)ctx) == 0) raise(SIGKILL);
    return 0;
}

START_TEST(kill9_during_save) {
    model a, b, c;
    model_init(&a, 5);
    model_init(&b, 6);
    save(&a, 100, 2);
    static const char *stages[] = {"optimizer.safetensors", "COMPLETE"};
    for (int i = 0; i < 2; i++) {
        fflush(NULL);
        pid_t pid = fork();
        ck_assert_int_ge(pid, 0);
        if (pid == 0) {
            ct_ckpt_state s = mkstate(200);
            ct_ckpt_save_opts o = {.keep_last = 1, .fault = kill_self, .fault_ctx = (void *)stages[i]};
            ct_err err = {0};
            ct_ckpt_save(save_dir, &b.t, &s, NULL, &o, NULL, 0, &err);
            _exit(0); /* not reached */
        }
        int status = 0;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
        ck_assert_int_eq(count_entries(".tmp-"), 1); /* the dead save's directory */
        char buf[64], dir[1024];
        read_latest(buf, sizeof buf);
        ck_assert_str_eq(buf, "global_step100");
        resolve_auto(dir, sizeof dir);
        model_init(&c, 0);
        ct_err err = {0};
        ck_assert_int_eq(ct_ckpt_load(dir, &c.t, CT_CKPT_LOAD_ALL, NULL, NULL, &err), CT_OK);
        ck_assert(models_equal(&a, &c));
        save(&a, 150 + i, 5); /* removes the dead process's leftovers */
        ck_assert_int_eq(count_entries(".tmp-"), 0);
        save(&a, 100, 0);
    }
}
END_TEST

/* A save that died between moving the old checkpoint aside (".old-<tag>-<pid>") and renaming the
 * new one into place leaves no <tag>; the next save must put the complete copy back, never
 * delete it as a leftover. */
START_TEST(dead_save_between_renames_recovered) {
    model a;
    model_init(&a, 3);
    a.params[0] = 7.0f;
    save(&a, 10, 0);
    char final[600], aside[600];
    snprintf(final, sizeof final, "%s/global_step10", save_dir);
    snprintf(aside, sizeof aside, "%s/.old-global_step10-999999", save_dir); /* a dead pid */
    ck_assert_int_eq(rename(final, aside), 0);
    save(&a, 20, 0);
    ck_assert_int_eq(access(aside, F_OK), -1);
    model b;
    model_init(&b, 0);
    ct_err err = {0};
    ck_assert_int_eq(ct_ckpt_load(final, &b.t, CT_CKPT_LOAD_ALL, NULL, NULL, &err), CT_OK);
    ck_assert(b.params[0] == 7.0f);
}
END_TEST

START_TEST(incomplete_is_never_loaded) {
    model a, b;
    model_init(&a, 7);
    model_init(&b, 8);
    save(&a, 5, 0);
    save(&b, 9, 0);
    char p[700], dir[1024];
    snprintf(p, sizeof p, "%s/global_step9/COMPLETE", save_dir);
    ck_assert_int_eq(unlink(p), 0); /* latest still says global_step9 */
    ct_warnings w = {0};
    ct_err err = {0};
    ck_assert_int_eq(ct_ckpt_resolve("auto", save_dir, dir, sizeof dir, &w, &err), CT_OK);
    ck_assert_ptr_nonnull(strstr(dir, "global_step5"));
    ck_assert_int_eq(w.n, 1);
    ck_assert_ptr_nonnull(strstr(w.items[0], "incomplete"));
    ct_warnings_free(&w);
    snprintf(p, sizeof p, "%s/global_step9", save_dir);
    model c;
    model_init(&c, 0);
    ck_assert_int_eq(ct_ckpt_load(p, &c.t, CT_CKPT_LOAD_ALL, NULL, NULL, &err), CT_ERR_DATA);
    ck_assert_ptr_nonnull(strstr(err.msg, "incomplete"));
    ck_assert(c.params[0] == 0.0f);
    ck_assert_int_eq(ct_ckpt_resolve(p, NULL, dir, sizeof dir, NULL, &err), CT_ERR_DATA);
    ck_assert_ptr_nonnull(strstr(err.msg, "global_step9"));
    /* a save_dir given as --resume resolves through latest / fallback */
    ck_assert_int_eq(ct_ckpt_resolve(save_dir, NULL, dir, sizeof dir, NULL, &err), CT_OK);
    ck_assert_ptr_nonnull(strstr(dir, "global_step5"));
}
END_TEST

START_TEST(corrupt_files_named) {
    model a, b;
    model_init(&a, 9);
    model_init(&b, 0);
    save(&a, 3, 0);
    char dir[600], p[700];
    snprintf(dir, sizeof dir, "%s/global_step3", save_dir);
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    ct_err err = {0};
    /* same size, broken header: the safetensors reader names the file */
    FILE *f = fopen(p, "r+b");
    fseek(f, 8, SEEK_SET);
    fputc('x', f);
    fclose(f);
    ck_assert_int_eq(ct_ckpt_load(dir, &b.t, CT_CKPT_LOAD_ALL, NULL, NULL, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, p) != NULL, "%s", err.msg);
    /* truncated: caught by the marker's sizes */
    ck_assert_int_eq(truncate(p, 50), 0);
    ck_assert_int_eq(ct_ckpt_load(dir, &b.t, CT_CKPT_LOAD_ALL, NULL, NULL, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "model.safetensors") && strstr(err.msg, "truncated"), "%s",
                  err.msg);
    ck_assert(b.params[1] == 0.0f);
    /* state.json with a wrong type */
    save(&a, 4, 0);
    snprintf(dir, sizeof dir, "%s/global_step4", save_dir);
    snprintf(p, sizeof p, "%s/state.json", dir);
    f = fopen(p, "r+b");
    char text[4096];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    char *at = strstr(text, "\"epoch\":");
    ck_assert_ptr_nonnull(at);
    at[9] = '"'; /* "epoch": "... keeps the size, breaks the type or the JSON */
    fseek(f, 0, SEEK_SET);
    fwrite(text, 1, n, f);
    fclose(f);
    ck_assert_int_eq(ct_ckpt_load(dir, &b.t, CT_CKPT_LOAD_ALL, NULL, NULL, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "state.json") != NULL, "%s", err.msg);
}
END_TEST

/* `ctrain info PATH`: its exit status and what it printed. */
static char *info_text(const char *path, int *rc, ct_err *err) {
    char out[700];
    snprintf(out, sizeof out, "%s/info.txt", tmpdir);
    char *argv[] = {"info", (char *)path, NULL};
    fflush(stdout);
    FILE *saved = stdout;
    stdout = fopen(out, "w");
    ck_assert_ptr_nonnull(stdout);
    *rc = ct_info_main(2, argv, err);
    fclose(stdout);
    stdout = saved;
    char *text = ct_fs_read_small(out, 1 << 20, NULL);
    ck_assert_ptr_nonnull(text);
    return text;
}

/* Flip one bit of the tensor data (past the safetensors header) of dir/name at a random offset;
 * returns the offset, so the caller can flip it back. */
static long flip_tensor_bit(const char *dir, const char *name, ct_rng *r, int *bit) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "r+b");
    ck_assert_ptr_nonnull(f);
    uint8_t h[8];
    ck_assert_int_eq(fread(h, 1, 8, f), 8);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | h[i];
    fseek(f, 0, SEEK_END);
    long size = ftell(f), start = 8 + (long)hlen;
    ck_assert_int_gt(size, start);
    long at = start + (long)ct_rng_below(r, (uint32_t)(size - start));
    *bit = (int)ct_rng_below(r, 8);
    fseek(f, at, SEEK_SET);
    int c = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(c ^ (1 << *bit), f);
    fclose(f);
    return at;
}

static void flip_back(const char *dir, const char *name, long at, int bit) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "r+b");
    fseek(f, at, SEEK_SET);
    int c = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(c ^ (1 << bit), f);
    fclose(f);
}

/* A bit flipped in a checkpoint's tensor data (the file keeps its size and a valid header) is
 * found by the checksum the marker records, before anything is loaded: CT_ERR_DATA naming the
 * file, the checkpoint and the previous complete checkpoint to resume from; `ctrain info` says
 * the checksums do not match. The optimizer's file is not read by a model-only load (eval). A
 * checkpoint whose marker records no checksums (written before them) still loads. */
START_TEST(checksum_mismatch_refused) {
    model a, b, c;
    model_init(&a, 21);
    model_init(&c, 22);
    save(&c, 3, 0);
    save(&a, 6, 0);
    char dir[600], file[700];
    snprintf(dir, sizeof dir, "%s/global_step6", save_dir);
    ct_rng r;
    ct_rng_init(&r, 2024, 5, 0);
    ct_err err = {0};
    int rc, bit;
    char *text = info_text(dir, &rc, &err);
    ck_assert_int_eq(rc, CT_OK);
    ck_assert_msg(strstr(text, "checksums: match"), "%s", text);
    free(text);
    for (int trial = 0; trial < 4; trial++) {
        long at = flip_tensor_bit(dir, "model.safetensors", &r, &bit);
        ck_assert(ct_ckpt_is_complete(dir)); /* same size: the marker's sizes cannot tell */
        model_init(&b, 0);
        ck_assert_int_eq(ct_ckpt_load(dir, &b.t, CT_CKPT_LOAD_ALL, NULL, NULL, &err), CT_ERR_DATA);
        snprintf(file, sizeof file, "%s/model.safetensors", dir);
        ck_assert_msg(strstr(err.msg, file) && strstr(err.msg, "checksum"), "%s", err.msg);
        ck_assert_msg(strstr(err.msg, "--resume") && strstr(err.msg, "global_step3"), "%s", err.msg);
        ck_assert(b.params[0] == 0.0f && b.m[0] == 0.0f && b.buffers[0] == 0.0f); /* nothing loaded */
        text = info_text(dir, &rc, &err);
        ck_assert_int_eq(rc, CT_ERR_DATA);
        ck_assert_msg(strstr(text, "checksums: MISMATCH") && strstr(text, "model.safetensors"), "%s", text);
        free(text);
        flip_back(dir, "model.safetensors", at, bit);
    }
    model_init(&b, 0);
    ck_assert_msg(ct_ckpt_load(dir, &b.t, CT_CKPT_LOAD_ALL, NULL, NULL, &err) == CT_OK, "%s", err.msg);
    ck_assert(models_equal(&a, &b));
    /* the optimizer's file: refused for a resume, not read by a model-only load */
    long at = flip_tensor_bit(dir, "optimizer.safetensors", &r, &bit);
    model_init(&b, 0);
    ck_assert_int_eq(ct_ckpt_load(dir, &b.t, CT_CKPT_LOAD_ALL, NULL, NULL, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "optimizer.safetensors") && strstr(err.msg, "global_step3"), "%s", err.msg);
    ck_assert_msg(ct_ckpt_load(dir, &b.t, CT_CKPT_LOAD_MODEL, NULL, NULL, &err) == CT_OK, "%s", err.msg);
    flip_back(dir, "optimizer.safetensors", at, bit);
    /* the oldest checkpoint has no other to name */
    snprintf(dir, sizeof dir, "%s/global_step3", save_dir);
    flip_tensor_bit(dir, "model.safetensors", &r, &bit);
    ck_assert_int_eq(ct_ckpt_load(dir, &b.t, CT_CKPT_LOAD_MODEL, NULL, NULL, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "no other complete checkpoint"), "%s", err.msg);
    /* written before checksums: the marker lists sizes only; it loads, and info says so */
    save(&a, 9, 0);
    snprintf(dir, sizeof dir, "%s/global_step9", save_dir);
    snprintf(file, sizeof file, "%s/COMPLETE", dir);
    char *marker = ct_fs_read_small(file, 1 << 16, NULL);
    cJSON *m = cJSON_Parse(marker);
    free(marker);
    cJSON_DeleteItemFromObjectCaseSensitive(m, "crc32");
    marker = cJSON_Print(m);
    cJSON_Delete(m);
    ck_assert_int_eq(ct_fs_write_sync(file, marker, strlen(marker), &err), CT_OK);
    free(marker);
    model_init(&b, 0);
    ck_assert_msg(ct_ckpt_load(dir, &b.t, CT_CKPT_LOAD_ALL, NULL, NULL, &err) == CT_OK, "%s", err.msg);
    ck_assert(models_equal(&a, &b));
    text = info_text(dir, &rc, &err);
    ck_assert_int_eq(rc, CT_OK);
    ck_assert_msg(strstr(text, "checksums: none recorded"), "%s", text);
    free(text);
}
END_TEST

/* state.json may be edited by hand: a changed byte is loaded, and flagged so the resume warns. */
START_TEST(state_change_flagged) {
    model a, b;
    model_init(&a, 23);
    save(&a, 4, 0);
    char dir[600], file[700];
    snprintf(dir, sizeof dir, "%s/global_step4", save_dir);
    snprintf(file, sizeof file, "%s/state.json", dir);
    ct_err err = {0};
    ct_ckpt_state st;
    model_init(&b, 0);
    ck_assert_msg(ct_ckpt_load(dir, &b.t, CT_CKPT_LOAD_ALL, &st, NULL, &err) == CT_OK, "%s", err.msg);
    ck_assert(!st.state_changed);
    size_t len = 0;
    char *text = ct_fs_read_small(file, 1 << 16, &len);
    char *at = strstr(text, "\"micro_step\":");
    ck_assert_ptr_nonnull(at);
    at += strcspn(at, "0123456789");
    *at = *at == '7' ? '8' : '7';   /* same size: the marker's sizes cannot tell */
    ck_assert_int_eq(ct_fs_write_sync(file, text, len, &err), CT_OK);
    free(text);
    ck_assert_msg(ct_ckpt_load(dir, &b.t, CT_CKPT_LOAD_ALL, &st, NULL, &err) == CT_OK, "%s", err.msg);
    ck_assert(st.state_changed);
}
END_TEST

START_TEST(shape_mismatch_names_tensor) {
    model a, b;
    model_init(&a, 10);
    save(&a, 1, 0);
    model_init(&b, 0);
    b.views[0] = mkview("fc1.weight", 2, 3, 4, 0, true); /* same size, other shape */
    char dir[600];
    snprintf(dir, sizeof dir, "%s/global_step1", save_dir);
    ct_err err = {0};
    ck_assert_int_eq(ct_ckpt_load(dir, &b.t, CT_CKPT_LOAD_ALL, NULL, NULL, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "fc1.weight: [4, 3]") && strstr(err.msg, "[3, 4] in the model"),
                  "%s", err.msg);
    ck_assert(b.params[0] == 0.0f && b.m[0] == 0.0f); /* nothing loaded */
    /* a renamed layer: missing and extra both listed */
    model_init(&b, 0);
    snprintf(b.views[3].name, sizeof b.views[3].name, "head.weight");
    ck_assert_int_eq(ct_ckpt_load(dir, &b.t, CT_CKPT_LOAD_MODEL, NULL, NULL, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "head.weight [2, 4]: in the model") &&
                  strstr(err.msg, "fc2.weight: in "), "%s", err.msg);
    /* another optimizer */
    model_init(&b, 0);
    b.t.n_slots = 1;
    b.t.slot_name[0] = "momentum_buffer";
    snprintf(b.t.optimizer, sizeof b.t.optimizer, "SGD");
    ck_assert_int_eq(ct_ckpt_load(dir, &b.t, CT_CKPT_LOAD_ALL, NULL, NULL, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "AdamW") && strstr(err.msg, "momentum_buffer"), "%s", err.msg);
    ck_assert(b.params[0] == 0.0f);
}
END_TEST

START_TEST(best_dir) {
    model a, b, c;
    model_init(&a, 11);
    model_init(&b, 12);
    ct_ckpt_state s = mkstate(7);
    ct_err err = {0};
    ck_assert_int_eq(ct_ckpt_save_best(save_dir, &a.t, &s, NULL, &err), CT_OK);
    s.step = 9;
    ck_assert_int_eq(ct_ckpt_save_best(save_dir, &b.t, &s, NULL, &err), CT_OK);
    char dir[600];
    snprintf(dir, sizeof dir, "%s/best", save_dir);
    ck_assert(ct_ckpt_is_complete(dir));
    model_init(&c, 0);
    ct_ckpt_state r;
    ck_assert_int_eq(ct_ckpt_load(dir, &c.t, CT_CKPT_LOAD_ALL, &r, NULL, &err), CT_OK);
    ck_assert(models_equal(&b, &c));
    ck_assert_int_eq(r.step, 9);
    ck_assert_int_eq(count_entries(".old-"), 0);
    ck_assert_int_eq(access(save_dir, F_OK), 0);
    char p[700];
    snprintf(p, sizeof p, "%s/latest", save_dir);
    ck_assert_int_ne(access(p, F_OK), 0); /* best does not move latest */
}
END_TEST

static void write_init_file(const char *path, const float *w) {
    int64_t d1[] = {4, 3}, d2[] = {5}, d3[] = {2};
    float other[5] = {1, 2, 3, 4, 5};
    ct_st_entry e[] = {
        {.name = "fc1.weight", .dtype = CT_BF16, .shape = ct_shape_make(2, d1), .from_f32 = w},
        {.name = "fc1.bias", .dtype = CT_F32, .shape = ct_shape_make(1, d2), .data = other},
        {.name = "extra.weight", .dtype = CT_F32, .shape = ct_shape_make(1, d3), .data = other}};
    ct_err err = {0};
    ck_assert_int_eq(ct_st_write(path, e, 3, NULL, NULL, 0, &err), CT_OK);
}

START_TEST(init_from_strict_and_partial) {
    model a;
    model_init(&a, 13);
    float w[12];
    fill(w, 12, 99);
    char path[600];
    snprintf(path, sizeof path, "%s/init.safetensors", tmpdir);
    write_init_file(path, w);
    float before[NP];
    memcpy(before, a.params, sizeof before);
    ct_err err = {0};
    ct_warnings warn = {0};
    int n = -1;
    ck_assert_int_eq(ct_ckpt_init_from(path, &a.t, true, &n, &warn, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "fc1.bias: [5] in") && strstr(err.msg, "fc2.weight [2, 4]") &&
                  strstr(err.msg, "extra.weight: in") && strstr(err.msg, "init_strict"),
                  "%s", err.msg);
    ck_assert_int_eq(n, 0);
    ck_assert(!memcmp(before, a.params, sizeof before));
    ck_assert_int_eq(ct_ckpt_init_from(path, &a.t, false, &n, &warn, &err), CT_OK);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(warn.n, 4); /* fc1.bias, bn.running_mean, fc2.weight, extra.weight */
    for (int i = 0; i < 12; i++) ck_assert(a.params[i] == ct_bf16_to_f32(ct_f32_to_bf16(w[i])));
    ck_assert(!memcmp(before + 12, a.params + 12, sizeof(float) * 12));
    ct_warnings_free(&warn);
    /* nothing matching at all is an error even when not strict */
    model_init(&a, 14);
    for (int i = 0; i < 4; i++) snprintf(a.views[i].name, sizeof a.views[i].name, "z%d", i);
    ck_assert_int_eq(ct_ckpt_init_from(path, &a.t, false, &n, &warn, &err), CT_ERR_CONFIG);
    ct_warnings_free(&warn);
    /* a checkpoint's model file round-trips through init_from */
    model b, c;
    model_init(&b, 15);
    model_init(&c, 0);
    save(&b, 1, 0);
    snprintf(path, sizeof path, "%s/global_step1/model.safetensors", save_dir);
    ck_assert_int_eq(ct_ckpt_init_from(path, &c.t, true, &n, &warn, &err), CT_OK);
    ck_assert_int_eq(n, 4);
    ck_assert(!memcmp(b.params, c.params, sizeof b.params));
    ck_assert(!memcmp(b.buffers, c.buffers, sizeof b.buffers));
}
END_TEST

START_TEST(config_diff_lists_changes) {
    cJSON *a = mkconfig(1e-3), *b = mkconfig(3e-4);
    cJSON_AddNumberToObject(cJSON_GetObjectItem(b, "train"), "max_steps", 100);
    char buf[1024];
    ck_assert_int_eq(ct_ckpt_config_diff(a, a, buf, sizeof buf), 0);
    ck_assert_int_eq(ct_ckpt_config_diff(a, b, buf, sizeof buf), 2);
    ck_assert_msg(strstr(buf, "optimizer.params.lr: 0.001 -> 0.0003") &&
                  strstr(buf, "train.max_steps: (absent) -> 100"), "%s", buf);
    cJSON_Delete(a);
    cJSON_Delete(b);
    char h1[17], h2[17];
    a = mkconfig(1e-3);
    b = mkconfig(1e-3);
    ct_ckpt_config_hash(a, h1);
    ct_ckpt_config_hash(b, h2);
    ck_assert_str_eq(h1, h2);
    cJSON_Delete(b);
    b = mkconfig(2e-3);
    ct_ckpt_config_hash(b, h2);
    ck_assert_str_ne(h1, h2);
    cJSON_Delete(a);
    cJSON_Delete(b);
}
END_TEST

START_TEST(export_and_info) {
    model a;
    model_init(&a, 16);
    save(&a, 8, 0);
    char out[600];
    snprintf(out, sizeof out, "%s/exp.safetensors", tmpdir);
    char *argv[] = {"export", "--checkpoint", save_dir, "--out", out, "--dtype=bf16", NULL};
    ct_err err = {0};
    ck_assert_msg(ct_export_main(6, argv, &err) == CT_OK, "%s", err.msg);
    ct_st_file *f = ct_st_open(out, &err);
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(f->n_tensors, 4);
    const ct_st_tensor *t = ct_st_find(f, "fc2.weight");
    ck_assert_str_eq(t->dtype, "BF16");
    float back[8];
    ck_assert(ct_st_read_f32(t, back, 8));
    for (int i = 0; i < 8; i++) ck_assert(back[i] == ct_bf16_to_f32(ct_f32_to_bf16(a.params[16 + i])));
    ck_assert_str_eq(ct_st_meta(f, "dtype"), "BF16");
    ct_st_close(f);
    char *bad[] = {"export", "--checkpoint", save_dir, "--out", out, "--dtype", "fp8", NULL};
    ck_assert_int_eq(ct_export_main(7, bad, &err), CT_ERR_CONFIG);
    ck_assert_ptr_nonnull(strstr(err.msg, "fp8"));
    char *noout[] = {"export", "--checkpoint", save_dir, NULL};
    ck_assert_int_eq(ct_export_main(3, noout, &err), CT_ERR_CONFIG);

    FILE *saved = stdout;
    stdout = fopen("/dev/null", "w");
    char dir[700];
    snprintf(dir, sizeof dir, "%s/global_step8", save_dir);
    char *i1[] = {"info", out, NULL}, *i2[] = {"info", dir, NULL}, *i3[] = {"info", save_dir, NULL};
    int r1 = ct_info_main(2, i1, &err), r2 = ct_info_main(2, i2, &err),
        r3 = ct_info_main(2, i3, &err);
    ck_assert_int_eq(truncate(out, 30), 0);
    int r4 = ct_info_main(2, i1, &err);
    fclose(stdout);
    stdout = saved;
    ck_assert_int_eq(r1, CT_OK);
    ck_assert_int_eq(r2, CT_OK);
    ck_assert_int_eq(r3, CT_OK);
    ck_assert_int_eq(r4, CT_ERR_DATA);
    ck_assert_ptr_nonnull(strstr(err.msg, "exp.safetensors"));
}
END_TEST

/* export never writes into a checkpoint directory or over a file it reads: --out naming the
 * checkpoint's own model.safetensors (directly, by another spelling, through a symlink or a hard
 * link) or a new file inside the checkpoint directory is refused with CT_ERR_CONFIG naming the
 * path, and the checkpoint stays complete and bit for bit what was saved. An --out whose
 * directory cannot be written is refused before anything is read. */
START_TEST(export_never_overwrites_inputs) {
    model a, b;
    model_init(&a, 21);
    save(&a, 8, 0);
    char dir[600], model_p[700], outs[6][800];
    snprintf(dir, sizeof dir, "%s/global_step8", save_dir);
    snprintf(model_p, sizeof model_p, "%s/model.safetensors", dir);
    snprintf(outs[0], sizeof outs[0], "%s", model_p);
    snprintf(outs[1], sizeof outs[1], "%s/../global_step8/./model.safetensors", dir);
    snprintf(outs[2], sizeof outs[2], "%s/w16.safetensors", dir);
    snprintf(outs[3], sizeof outs[3], "%s/link.safetensors", tmpdir);
    snprintf(outs[4], sizeof outs[4], "%s/hard.safetensors", tmpdir);
    snprintf(outs[5], sizeof outs[5], "%s/COMPLETE", dir);
    ck_assert_int_eq(symlink(model_p, outs[3]), 0);
    ck_assert_int_eq(link(model_p, outs[4]), 0);
    FILE *saved = stdout;
    stdout = fopen("/dev/null", "w");
    for (int i = 0; i < 6; i++) {
        char *argv[] = {"export", "--checkpoint", i % 2 ? save_dir : dir, "--out", outs[i],
                        "--dtype", "fp16", NULL};
        ct_err err = {0};
        int rc = ct_export_main(7, argv, &err);
        ck_assert_msg(rc == CT_ERR_CONFIG, "--out %s: exit %d (%s)", outs[i], rc, err.msg);
        ck_assert_msg(strstr(err.msg, outs[i]) != NULL, "%s", err.msg);
    }
    char nodir[700];
    snprintf(nodir, sizeof nodir, "%s/plain", tmpdir);
    FILE *f = fopen(nodir, "w");
    fputs("not a directory", f);
    fclose(f);
    snprintf(nodir, sizeof nodir, "%s/plain/w.safetensors", tmpdir);
    char *argv[] = {"export", "--checkpoint", dir, "--out", nodir, NULL};
    ct_err err = {0};
    int rc = ct_export_main(5, argv, &err);
    fclose(stdout);
    stdout = saved;
    ck_assert_msg(rc == CT_ERR_CONFIG && strstr(err.msg, nodir), "exit %d: %s", rc, err.msg);
    ck_assert(ct_ckpt_is_complete(dir));
    model_init(&b, 0);
    ck_assert_int_eq(ct_ckpt_load(dir, &b.t, CT_CKPT_LOAD_ALL, NULL, NULL, &err), CT_OK);
    ck_assert(models_equal(&a, &b));
    ck_assert_int_eq(access(outs[2], F_OK), -1);
    snprintf(nodir, sizeof nodir, "ls -a %s | grep -q tmp", dir);
    ck_assert_int_ne(system(nodir), 0); /* no temporary file left in the checkpoint */
}
END_TEST

static bool exists_step(long step) {
    char p[600];
    snprintf(p, sizeof p, "%s/global_step%ld", save_dir, step);
    return access(p, F_OK) == 0;
}

static bool warned(const ct_warnings *w, const char *what) {
    for (int i = 0; i < w->n; i++)
        if (strstr(w->items[i], what)) return true;
    return false;
}

/* keep_last removes only complete checkpoints of the run's own experiment: not a directory
 * without a valid COMPLETE (an interrupted copy, a DeepSpeed checkpoint: same names), nor one
 * saved by another config; those are reported. A save killed between updating latest and
 * pruning leaves too many checkpoints; ct_ckpt_prune at the next start finishes the job. */
START_TEST(prune_only_own_complete_checkpoints) {
    model a, f;
    model_init(&a, 31);
    model_init(&f, 32);
    cJSON *own = mkconfig(1e-3), *other = mkconfig(5e-3);
    for (long s = 10; s <= 30; s += 10) save(&a, s, 0);
    ct_ckpt_state st = mkstate(5);
    ct_ckpt_save_opts keep_all = {0};
    ct_err err = {0};
    ck_assert_int_eq(ct_ckpt_save(save_dir, &f.t, &st, other, &keep_all, NULL, 0, &err), CT_OK);
    save(&a, 15, 0);
    char p[700];
    snprintf(p, sizeof p, "%s/global_step15/COMPLETE", save_dir);
    ck_assert_int_eq(unlink(p), 0);
    snprintf(p, sizeof p, "%s/global_step1", save_dir); /* DeepSpeed's layout: no marker */
    ck_assert_int_eq(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/global_step1/mp_rank_00_model_states.pt", save_dir);
    FILE *fp = fopen(p, "wb");
    for (int i = 0; i < 64; i++) fputc((int)(i * 37 % 251), fp);
    fclose(fp);
    /* killed after latest moved to global_step40, before keep_last 2 was applied */
    st = mkstate(40);
    ct_config *own_cfg = owner_of(own);
    ct_ckpt_save_opts o = {.keep_last = 2, .owner = own_cfg, .fault = fail_at, .fault_ctx = "latest"};
    ck_assert_int_eq(ct_ckpt_save(save_dir, &a.t, &st, own, &o, NULL, 0, &err), CT_ERR_RUNTIME);
    for (long s = 10; s <= 40; s += 10) ck_assert(exists_step(s));
    /* the next run's start */
    ct_warnings w = {0};
    ct_ckpt_prune(save_dir, 40, 2, own_cfg, &w);
    ck_assert(exists_step(40) && exists_step(30));
    ck_assert(!exists_step(20) && !exists_step(10));
    ck_assert(exists_step(15) && exists_step(5) && exists_step(1));
    ck_assert(warned(&w, "global_step15: not a complete checkpoint"));
    ck_assert(warned(&w, "global_step1: not a complete checkpoint"));
    ck_assert(warned(&w, "global_step5: saved by another config"));
    ck_assert_int_eq(w.n, 3);
    ct_warnings_free(&w);
    /* keep_last during a run: the same rule */
    st = mkstate(50);
    o.fault = NULL;
    ck_assert_int_eq(ct_ckpt_save(save_dir, &a.t, &st, own, &o, NULL, 0, &err), CT_OK);
    ck_assert(exists_step(50) && exists_step(40) && !exists_step(30));
    ck_assert(exists_step(15) && exists_step(5) && exists_step(1));
    /* without an owner every complete checkpoint counts (global_step5 too), still no incomplete */
    ct_ckpt_prune(save_dir, 50, 1, NULL, NULL);
    ck_assert(exists_step(50) && !exists_step(40) && !exists_step(5));
    ck_assert(exists_step(15) && exists_step(1));
    /* the identity ignores run length, outputs and logging, not hyperparameters */
    cJSON *longer = mkconfig(1e-3);
    ct_config *longer_cfg = owner_of(longer);
    cJSON *train = cJSON_GetObjectItem(longer, "train");
    cJSON_ReplaceItemInObject(train, "epochs", cJSON_CreateNumber(9));
    cJSON_AddStringToObject(train, "run_dir", "elsewhere");
    cJSON_AddNumberToObject(longer, "steps_per_print", 7);
    cJSON_AddNumberToObject(longer, "train_micro_batch_size_per_gpu", 8);
    cJSON_AddNumberToObject(train, "new_key", 4); /* only one side has it: not recorded there */
    /* where and how NVMe offload swaps */
    cJSON *configs[2] = {own, longer};
    for (int i = 0; i < 2; i++) {
        cJSON *aio = cJSON_AddObjectToObject(configs[i], "aio");
        cJSON_AddNumberToObject(aio, "block_size", i ? 262144 : 1048576);
        cJSON *oo = cJSON_AddObjectToObject(cJSON_AddObjectToObject(configs[i], "zero_optimization"),
                                            "offload_optimizer");
        cJSON_AddStringToObject(oo, "nvme_path", i ? "/nvme1" : "/nvme0");
        cJSON_AddNumberToObject(oo, "buffer_count", 4 + i);
        cJSON_AddStringToObject(oo, "device", "cpu");
    }
    ck_assert(ct_ckpt_same_experiment(longer, own_cfg));
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(cJSON_GetObjectItem(longer, "zero_optimization"),
                                                  "offload_optimizer"), "device", cJSON_CreateString("none"));
    ck_assert(!ct_ckpt_same_experiment(longer, own_cfg)); /* the offload device is compared */
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(cJSON_GetObjectItem(longer, "zero_optimization"),
                                                  "offload_optimizer"), "device", cJSON_CreateString("cpu"));
    ck_assert(ct_ckpt_same_experiment(longer, own_cfg));
    ck_assert(!ct_ckpt_same_experiment(other, own_cfg));
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(longer, "optimizer"), "type",
                              cJSON_CreateString("SGD"));
    char diff[256];
    ck_assert_int_eq(ct_ckpt_experiment_diff(own, longer_cfg, diff, sizeof diff), 1);
    ck_assert_str_eq(diff, "optimizer.type: \"AdamW\" -> \"SGD\"");
    ct_config_free(longer_cfg);
    ct_config_free(own_cfg);
    cJSON_Delete(other);
}
END_TEST

/* --resume auto where checkpoints were saved but none can be loaded stops with CT_ERR_DATA naming
 * the damaged file and how to start fresh deliberately (it started from scratch with a warning, so
 * a restart loop quietly began the run again from step 0); a latest that names nothing, with no
 * global_step* at all, too. Only a save_dir where nothing was ever saved starts fresh. */
START_TEST(resume_auto_refuses_when_none_loads) {
    model a;
    model_init(&a, 33);
    save(&a, 4, 0);
    save(&a, 8, 0);
    char p[700], dir[1024];
    snprintf(p, sizeof p, "%s/global_step8/model.safetensors", save_dir);
    ck_assert_int_eq(truncate(p, 100), 0);   /* the newest cut short */
    snprintf(p, sizeof p, "%s/global_step4/COMPLETE", save_dir);
    ck_assert_int_eq(unlink(p), 0);
    ct_warnings w = {0};
    ct_err err = {0};
    ck_assert_int_eq(ct_ckpt_resolve("auto", save_dir, dir, sizeof dir, &w, &err), CT_ERR_DATA);
    ck_assert_str_eq(dir, "");
    ck_assert_msg(strstr(err.msg, "--resume auto: ") && strstr(err.msg, "holds no checkpoint that can be loaded") &&
                  strstr(err.msg, "global_step8/model.safetensors: 100 bytes, the checkpoint wrote") &&
                  strstr(err.msg, "To start fresh deliberately, run without --resume"), "%s", err.msg);
    /* the old ones removed: latest names global_step8, which is gone */
    snprintf(p, sizeof p, "rm -r %s/global_step4 %s/global_step8", save_dir, save_dir);
    ck_assert_int_eq(system(p), 0);
    ck_assert_int_eq(ct_ckpt_resolve("auto", save_dir, dir, sizeof dir, &w, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "latest names \"global_step8\", which is not there"), "%s", err.msg);
    /* nothing ever saved: a fresh start */
    snprintf(p, sizeof p, "%s/latest", save_dir);
    ck_assert_int_eq(unlink(p), 0);
    ck_assert_int_eq(ct_ckpt_resolve("auto", save_dir, dir, sizeof dir, &w, &err), CT_OK);
    ck_assert_str_eq(dir, "");
    ct_warnings_free(&w);
}
END_TEST

/* A latest that cannot be read (a symbolic link loop) is said to be unreadable, with the reason,
 * not "missing", as the resume falls back to the newest complete checkpoint. */
START_TEST(resume_auto_latest_unreadable) {
    model a;
    model_init(&a, 35);
    save(&a, 6, 0);
    char p[700], dir[1024];
    snprintf(p, sizeof p, "%s/latest", save_dir);
    ck_assert_int_eq(unlink(p), 0);
    ck_assert_int_eq(symlink("latest", p), 0);   /* latest -> latest */
    ct_warnings w = {0};
    ct_err err = {0};
    ck_assert_int_eq(ct_ckpt_resolve("auto", save_dir, dir, sizeof dir, &w, &err), CT_OK);
    ck_assert_ptr_nonnull(strstr(dir, "global_step6"));
    ck_assert_msg(warned(&w, "latest cannot be read: Too many levels of symbolic links; resuming from the newest "
                         "complete checkpoint"), "%s", w.n ? w.items[0] : "no warning");
    ct_warnings_free(&w);
}
END_TEST

/* A save of global_step<N> where a directory of that name exists that is not a complete
 * checkpoint (another tool's, an interrupted copy) keeps it, renamed <name>.incomplete-<pid>,
 * instead of removing it as it removes a checkpoint it replaces. */
START_TEST(save_keeps_same_named_foreign_directory) {
    model a;
    model_init(&a, 34);
    char p[700];
    snprintf(p, sizeof p, "%s", save_dir);
    ck_assert_int_eq(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/global_step20", save_dir);
    ck_assert_int_eq(mkdir(p, 0755), 0);
    snprintf(p, sizeof p, "%s/global_step20/mp_rank_00_model_states.pt", save_dir);
    FILE *f = fopen(p, "wb");
    fputs("deepspeed's weights", f);
    fclose(f);
    save(&a, 20, 0);
    snprintf(p, sizeof p, "%s/global_step20", save_dir);
    ck_assert(ct_ckpt_is_complete(p));
    snprintf(p, sizeof p, "%s/global_step20.incomplete-%ld/mp_rank_00_model_states.pt", save_dir,
             (long)getpid());
    ck_assert_msg(access(p, F_OK) == 0, "%s is gone", p);
    /* a complete checkpoint of the same name is replaced, as before */
    save(&a, 20, 0);
    ck_assert_int_eq(count_entries("global_step20"), 2);
}
END_TEST

/* The run directory's lock: held by a live process, it is refused with that process's note;
 * once the holder is killed (-9: no clean-up of its own) the kernel has dropped it. */
START_TEST(lock_held_until_holder_dies) {
    char path[600], note[128];
    snprintf(path, sizeof path, "%s/.lock", tmpdir);
    int ready[2];
    ck_assert_int_eq(pipe(ready), 0);
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fd;
        ct_err e = {0};
        char mine[64];
        snprintf(mine, sizeof mine, "%ld\nholder.json\n", (long)getpid());
        if (ct_fs_lock(path, &fd, NULL, 0, &e) || fd < 0 || ct_fs_lock_note(fd, path, mine, &e))
            _exit(1);
        if (write(ready[1], "x", 1) != 1) _exit(1);
        pause();
        _exit(0);
    }
    char c;
    ck_assert_int_eq(read(ready[0], &c, 1), 1);
    int fd = 0;
    ct_err err = {0};
    ck_assert_int_eq(ct_fs_lock(path, &fd, note, sizeof note, &err), CT_OK);
    ck_assert_int_eq(fd, -1);
    ck_assert_int_eq(strtol(note, NULL, 10), pid);
    ck_assert_ptr_nonnull(strstr(note, "holder.json"));
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    ck_assert_int_eq(ct_fs_lock(path, &fd, note, sizeof note, &err), CT_OK);
    ck_assert_int_ge(fd, 0);
    ck_assert_ptr_nonnull(strstr(note, "holder.json")); /* the last holder's note stays readable */
    int fd2 = 0;
    ck_assert_int_eq(ct_fs_lock(path, &fd2, NULL, 0, &err), CT_OK);
    ck_assert_int_eq(fd2, -1); /* a second open in the same process is refused too */
    close(fd);
    close(ready[0]);
    close(ready[1]);
}
END_TEST

/* ---------------------------------------------------------------- per-rank shards */

/* The tensors of rank r of `world` over md (ct_comm_shard's partition of its NP parameters). */
static ct_ckpt_tensors part_of(model *md, int world, int r) {
    ct_ckpt_tensors t = md->t;
    ct_comm_shard(NP, world, r, &t.lo, &t.hi);
    t.params = md->params + t.lo;
    t.slot[0] = md->m + t.lo;
    t.slot[1] = md->v + t.lo;
    return t;
}

/* <save_dir>/global_step<step> saved by `world` ranks, each writing its part as the trainer's
 * ranks do (here one after another in one process: the protocol without its collectives). */
static void save_sharded(model *md, long step, int world) {
    char tag[CT_CKPT_TAG], tmp[1024];
    ct_ckpt_tag(step, tag);
    long pid = (long)getpid();
    ct_err err = {0};
    ck_assert_msg(ct_ckpt_begin(save_dir, tag, pid, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(ct_ckpt_tmp_dir(save_dir, tag, pid, tmp, sizeof tmp, &err), CT_OK);
    uint32_t crc[16];
    for (int r = 0; r < world; r++) {
        ct_ckpt_tensors t = part_of(md, world, r);
        ck_assert_msg(ct_ckpt_shard_write(tmp, &t, r, world, &crc[r], &err) == CT_OK, "%s", err.msg);
    }
    ct_ckpt_state s = mkstate(step);
    ck_assert_msg(ct_ckpt_commit_shards(save_dir, tag, pid, &md->t, world, crc, &s, NULL, NULL, NULL, 0, &err) == CT_OK,
                  "%s", err.msg);
}

static void nan_fill(model *md) {
    for (int i = 0; i < NP; i++) md->params[i] = md->m[i] = md->v[i] = NAN;
    for (int i = 0; i < NB; i++) md->buffers[i] = NAN;
}

/* Load dir by the parts of `world` ranks into a model that starts as NaN: each part writes its own
 * range and nothing past it; all parts together give back `want` bit for bit. */
static void load_by_parts(const char *dir, int world, const model *want) {
    model b;
    model_init(&b, 0);
    nan_fill(&b);
    for (int r = 0; r < world; r++) {
        ct_ckpt_tensors t = part_of(&b, world, r);
        ct_err err = {0};
        ck_assert_msg(ct_ckpt_load(dir, &t, CT_CKPT_LOAD_ALL, NULL, NULL, &err) == CT_OK, "%s", err.msg);
        for (int64_t i = t.hi; i < NP; i++)
            ck_assert_msg(isnan(b.params[i]) && isnan(b.m[i]) && isnan(b.v[i]),
                          "rank %d of %d wrote element %lld past its part [%lld, %lld)", r, world, (long long)i,
                          (long long)t.lo, (long long)t.hi);
    }
    ck_assert_msg(models_equal(want, &b), "%s loaded by %d ranks", dir, world);
}

START_TEST(shards_resume_on_any_world) {
    model a;
    model_init(&a, 21);
    static const int saved_by[] = {2, 3, 7};   /* 7: parts of 4, the last one empty */
    static const int loaded_by[] = {1, 2, 3, 5};
    for (int i = 0; i < 3; i++) {
        save_sharded(&a, 10 * saved_by[i], saved_by[i]);
        char dir[700];
        snprintf(dir, sizeof dir, "%s/global_step%d", save_dir, 10 * saved_by[i]);
        ck_assert(ct_ckpt_is_complete(dir));
        char shard[800];
        snprintf(shard, sizeof shard, "%s/zero_shard_%d_of_%d.safetensors", dir, saved_by[i] - 1, saved_by[i]);
        ck_assert_int_eq(access(shard, F_OK), 0);
        for (int j = 0; j < 4; j++) load_by_parts(dir, loaded_by[j], &a);
    }
    /* one file set (a run without ZeRO), loaded by parts: the same range reads */
    save(&a, 5, 0);
    char dir[700];
    snprintf(dir, sizeof dir, "%s/global_step5", save_dir);
    for (int j = 0; j < 4; j++) load_by_parts(dir, loaded_by[j], &a);
    /* latest names the newest, and resolve and verify take a sharded checkpoint as any other */
    char buf[64], out[1024];
    save_sharded(&a, 90, 3);
    read_latest(buf, sizeof buf);
    ck_assert_str_eq(buf, "global_step90");
    resolve_auto(out, sizeof out);
    ck_assert_ptr_nonnull(strstr(out, "global_step90"));
    int n = 0;
    ct_err err = {0};
    ck_assert_int_eq(ct_ckpt_verify(out, &n, &err), CT_OK);
    ck_assert_int_eq(n, 5);   /* 3 shards, the index, the buffers */
}
END_TEST

/* Overwrite one byte of dir/name at `at` bytes from its end. */
static void poke_from_end(const char *dir, const char *name, long at, int value) {
    char p[800];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "r+b");
    ck_assert_ptr_nonnull(f);
    fseek(f, -at, SEEK_END);
    fputc(value, f);
    fclose(f);
}

/* A part reads (and checks the checksums of) only the shards its range meets. */
START_TEST(shard_reads_only_its_range) {
    model a;
    model_init(&a, 22);
    save_sharded(&a, 1, 3);   /* [0, 8), [8, 16), [16, 24) */
    char dir[700];
    snprintf(dir, sizeof dir, "%s/global_step1", save_dir);
    poke_from_end(dir, "zero_shard_2_of_3.safetensors", 1, 0x5a);   /* a flipped byte of its data */
    model b;
    model_init(&b, 0);
    ct_err err = {0};
    for (int world = 2; world <= 3; world++)
        for (int r = 0; r < world; r++) {
            ct_ckpt_tensors t = part_of(&b, world, r);
            int rc = ct_ckpt_load(dir, &t, CT_CKPT_LOAD_ALL, NULL, NULL, &err);
            if (t.hi <= 16) {
                ck_assert_msg(rc == CT_OK, "[%lld, %lld): %s", (long long)t.lo, (long long)t.hi, err.msg);
                ck_assert(!memcmp(b.params + t.lo, a.params + t.lo, (size_t)(t.hi - t.lo) * sizeof(float)));
            } else {
                ck_assert_int_eq(rc, CT_ERR_DATA);
                ck_assert_msg(strstr(err.msg, "zero_shard_2_of_3.safetensors: checksum mismatch"), "%s", err.msg);
            }
        }
}
END_TEST

START_TEST(shard_set_range_reads) {
    model a;
    model_init(&a, 23);
    save_sharded(&a, 1, 5);   /* [0, 5), [5, 10), [10, 15), [15, 20), [20, 24) */
    char dir[700];
    snprintf(dir, sizeof dir, "%s/global_step1", save_dir);
    ct_ckpt_shard_set *set = NULL;
    ct_err err = {0};
    ck_assert_msg(ct_ckpt_shard_set_open(dir, &set, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(set->world, 5);
    ck_assert_int_eq(set->n_params, NP);
    ct_rng r;
    ct_rng_init(&r, 5, 1, 0);
    const float *want[] = {a.params, a.m, a.v};
    for (int k = 0; k < 300; k++) {
        int64_t x = (int64_t)(ct_rng_uniform(&r) * (NP + 1)), y = (int64_t)(ct_rng_uniform(&r) * (NP + 1));
        int64_t lo = x < y ? x : y, hi = x < y ? y : x;
        int slot = (int)(ct_rng_uniform(&r) * 3) - 1;
        float got[NP + 1];
        ck_assert(ct_ckpt_shard_set_read(set, slot, lo, hi, got));
        ck_assert_msg(!memcmp(got, want[slot + 1] + lo, (size_t)(hi - lo) * sizeof(float)), "[%lld, %lld) slot %d",
                      (long long)lo, (long long)hi, slot);
    }
    float got[NP + 1];
    ck_assert(!ct_ckpt_shard_set_read(set, -1, 3, NP + 1, got));
    ck_assert(!ct_ckpt_shard_set_read(set, -1, 5, 4, got));
    ck_assert(!ct_ckpt_shard_set_read(set, 2, 0, 4, got));
    ck_assert(!ct_ckpt_shard_set_read(set, -2, 0, 4, got));
    ct_ckpt_shard_set_close(set);
}
END_TEST

/* The file of rank `rank` of 3 with the description given (range, n_params, world, slots metadata)
 * and its three tensors of (hi - lo + extra) random values; meta_slots NULL: no description. */
static void write_shard(const char *dir, int rank, int world, int64_t lo, int64_t hi, int64_t n_params,
                        const char *meta_slots, int64_t extra) {
    int64_t k = hi - lo + extra;
    float *v = ct_xcalloc((size_t)(k > 0 ? k : 1), sizeof *v);
    fill(v, (int)k, (uint64_t)(lo * 31 + hi));
    ct_shape shape = ct_shape_make(1, &k);
    ct_st_entry e[3] = {{.name = "master", .dtype = CT_F32, .shape = shape, .data = v},
                        {.name = "exp_avg", .dtype = CT_F32, .shape = shape, .data = v},
                        {.name = "exp_avg_sq", .dtype = CT_F32, .shape = shape, .data = v}};
    char desc[200], name[CT_SHARDS_NAME], path[800];
    snprintf(desc, sizeof desc, "{\"rank\": %d, \"world\": %d, \"lo\": %lld, \"hi\": %lld, \"n_params\": %lld}", rank,
             world, (long long)lo, (long long)hi, (long long)n_params);
    const char *mk[] = {"slots", CT_SHARD_META}, *mv[] = {meta_slots ? meta_slots : "exp_avg,exp_avg_sq", desc};
    ct_ckpt_shard_file_name(rank, 3, name);
    snprintf(path, sizeof path, "%s/%s", dir, name);
    ct_err err = {0};
    ck_assert_int_eq(ct_st_write(path, e, 3, mk, mv, meta_slots ? 2 : 1, &err), CT_OK);
    free(v);
}

/* ct_ckpt_shard_set_open of dir refuses (CT_ERR_DATA) naming `file` and saying `what`. */
static void refused(const char *dir, const char *file, const char *what, const char *why) {
    ct_ckpt_shard_set *set = NULL;
    ct_err err = {0};
    int rc = ct_ckpt_shard_set_open(dir, &set, &err);
    ck_assert_msg(rc == CT_ERR_DATA, "%s: rc %d (%s)", why, rc, err.msg);
    ck_assert_msg(strstr(err.msg, file) && strstr(err.msg, what), "%s: \"%s\" lacks %s / %s", why, err.msg, file, what);
    ck_assert_ptr_null(set);
}

static void write_text(const char *dir, const char *name, const char *text) {
    char p[800];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

START_TEST(shard_descriptions_hostile) {
    model a;
    model_init(&a, 24);
    save_sharded(&a, 1, 3);   /* [0, 8), [8, 16), [16, 24) */
    char dir[700];
    snprintf(dir, sizeof dir, "%s/global_step1", save_dir);
    char *index = ct_fs_read_small(strcat(strcpy((char[800]){0}, dir), "/shards.json"), 1 << 20, NULL);
    ck_assert_ptr_nonnull(index);
    /* the description of each shard against the others and the index */
    write_shard(dir, 1, 3, 6, 16, NP, "exp_avg,exp_avg_sq", 0);
    refused(dir, "zero_shard_1_of_3.safetensors", "overlaps [0, 8) of", "overlapping ranges");
    write_shard(dir, 1, 3, 9, 16, NP, "exp_avg,exp_avg_sq", 0);
    refused(dir, "zero_shard_1_of_3.safetensors", "leaves elements [8, 9) in no shard", "a gap");
    write_shard(dir, 1, 3, 8, 16, NP, "exp_avg,exp_avg_sq", 0);
    write_shard(dir, 2, 3, 16, 23, NP, "exp_avg,exp_avg_sq", 0);
    refused(dir, "zero_shard_2_of_3.safetensors", "leaving elements [23, 24) in no shard", "a gap at the end");
    write_shard(dir, 2, 3, 16, 24, NP + 1, "exp_avg,exp_avg_sq", 0);
    refused(dir, "zero_shard_2_of_3.safetensors", "a shard of 25 parameters", "n_params disagrees");
    write_shard(dir, 2, 4, 16, 24, NP, "exp_avg,exp_avg_sq", 0);
    refused(dir, "zero_shard_2_of_3.safetensors", "a shard of 4 ranks", "world disagrees");
    write_shard(dir, 2, 3, 16, 30, NP, "exp_avg,exp_avg_sq", 0);
    refused(dir, "zero_shard_2_of_3.safetensors", "is not inside [0, 24)", "a range past n_params");
    write_shard(dir, 2, 3, 16, 24, NP, "exp_avg,exp_avg_sq", 1);
    refused(dir, "zero_shard_2_of_3.safetensors", "tensor \"master\" is F32 of 9 elements", "a tensor of another size");
    write_shard(dir, 2, 3, 16, 24, NP, "exp_avg", 0);
    refused(dir, "zero_shard_2_of_3.safetensors", "optimizer slots \"exp_avg\"", "other slots");
    write_shard(dir, 2, 3, 16, 24, NP, NULL, 0);
    refused(dir, "zero_shard_2_of_3.safetensors", "no valid shard description", "no description");
    write_shard(dir, 2, 3, 16, 24, NP, "exp_avg,exp_avg_sq", 0);
    char p[800];
    snprintf(p, sizeof p, "%s/zero_shard_0_of_3.safetensors", dir);
    struct stat st;
    ck_assert_int_eq(stat(p, &st), 0);
    ck_assert_int_eq(truncate(p, st.st_size - 3), 0);
    refused(dir, "zero_shard_0_of_3.safetensors", "", "a truncated shard");
    ck_assert_int_eq(unlink(p), 0);
    refused(dir, "zero_shard_0_of_3.safetensors", "cannot open", "a missing shard");
    write_shard(dir, 0, 3, 0, 8, NP, "exp_avg,exp_avg_sq", 0);
    ct_ckpt_shard_set *set = NULL;
    ct_err err = {0};
    ck_assert_msg(ct_ckpt_shard_set_open(dir, &set, &err) == CT_OK, "%s", err.msg);   /* whole again */
    ct_ckpt_shard_set_close(set);
    /* the same refusals through a load and `ctrain info`: exit 3 (CT_ERR_DATA) naming the file */
    write_shard(dir, 1, 3, 6, 16, NP, "exp_avg,exp_avg_sq", 0);
    model b;
    model_init(&b, 0);
    ck_assert_int_eq(ct_ckpt_load(dir, &b.t, CT_CKPT_LOAD_ALL, NULL, NULL, &err), CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "zero_shard"), "%s", err.msg);
    int rc;
    free(info_text(dir, &rc, &err));
    ck_assert_int_eq(rc, CT_ERR_DATA);
    ck_assert_msg(strstr(err.msg, "zero_shard_1_of_3.safetensors"), "%s", err.msg);
    write_shard(dir, 1, 3, 8, 16, NP, "exp_avg,exp_avg_sq", 0);
    /* the index */
    static const struct { const char *text, *what; } bad[] = {
        {"not json", "not valid JSON"},
        {"{\"format\": \"other\", \"version\": 1}", "not an index of checkpoint shards"},
        {"{\"format\": \"ctrain_zero_shards\", \"version\": 2}", "version 2"},
        {"{\"format\": \"ctrain_zero_shards\", \"version\": 1, \"world\": 0, \"n_params\": 24, \"n_buffers\": 4, "
         "\"optimizer\": \"AdamW\"}", "\"world\""},
        {"{\"format\": \"ctrain_zero_shards\", \"version\": 1, \"world\": 3, \"n_params\": 24, \"n_buffers\": 4, "
         "\"optimizer\": \"AdamW\", \"slots\": [], \"shards\": [\"a\", \"b\"]}", "an array of 3 file names"},
        {"{\"format\": \"ctrain_zero_shards\", \"version\": 1, \"world\": 1, \"n_params\": 24, \"n_buffers\": 4, "
         "\"optimizer\": \"AdamW\", \"slots\": [], \"shards\": [\"../x\"]}", "a file name in the checkpoint directory"},
        {"{\"format\": \"ctrain_zero_shards\", \"version\": 1, \"world\": 1, \"n_params\": 24, \"n_buffers\": 4, "
         "\"optimizer\": \"AdamW\", \"slots\": [], \"shards\": [\"a\"], \"views\": [{\"name\": \"w\", \"shape\": [5, 5], "
         "\"offset\": 0, \"trainable\": true}]}", "outside the parameter space of 24"},
        {"{\"format\": \"ctrain_zero_shards\", \"version\": 1, \"world\": 1, \"n_params\": 24, \"n_buffers\": 4, "
         "\"optimizer\": \"AdamW\", \"slots\": [], \"shards\": [\"a\"], \"views\": [{\"name\": \"w\", \"shape\": [-2], "
         "\"offset\": 0, \"trainable\": true}]}", "not an integer >= 0"},
        {"{\"format\": \"ctrain_zero_shards\", \"version\": 1, \"world\": 1, \"n_params\": 24, \"n_buffers\": 4, "
         "\"optimizer\": \"AdamW\", \"slots\": [], \"shards\": [\"a\"], \"views\": [{\"name\": \"w\", \"shape\": [2], "
         "\"offset\": 0, \"trainable\": true}, {\"name\": \"w\", \"shape\": [2], \"offset\": 2, \"trainable\": true}]}",
         "names w twice"},
    };
    for (int i = 0; i < CT_ARRAY_LEN(bad); i++) {
        write_text(dir, CT_SHARDS_INDEX, bad[i].text);
        refused(dir, CT_SHARDS_INDEX, bad[i].what, bad[i].text);
    }
    write_text(dir, CT_SHARDS_INDEX, index);
    /* fuzz: random bytes of the index, and of a shard's header, changed; every outcome is a clean
     * refusal naming a file of the checkpoint (or, for a harmless change, success) */
    ct_rng r;
    ct_rng_init(&r, 99, 2, 0);
    size_t len = strlen(index);
    char *text = ct_xmalloc(len + 1);
    snprintf(p, sizeof p, "%s/zero_shard_1_of_3.safetensors", dir);
    size_t shard_len = 0;
    char *shard = ct_fs_read_small(p, 1 << 20, &shard_len);
    ck_assert_ptr_nonnull(shard);
    for (int k = 0; k < 600; k++) {
        bool in_index = k % 2 == 0;
        char *buf = in_index ? text : ct_xmalloc(shard_len);
        memcpy(buf, in_index ? index : shard, in_index ? len + 1 : shard_len);
        size_t n = in_index ? len : shard_len, span = in_index ? len : 8 + 200;
        for (int m = 1 + (int)(ct_rng_uniform(&r) * 3); m > 0; m--)
            buf[(size_t)(ct_rng_uniform(&r) * (double)span) % n] = (char)(ct_rng_uniform(&r) * 256);
        if (ct_rng_uniform(&r) < 0.2) n = (size_t)(ct_rng_uniform(&r) * (double)n);   /* truncated too */
        FILE *f = fopen(in_index ? strcat(strcpy((char[800]){0}, dir), "/shards.json") : p, "wb");
        fwrite(buf, 1, n, f);
        fclose(f);
        set = NULL;
        err = (ct_err){0};
        int got = ct_ckpt_shard_set_open(dir, &set, &err);
        ck_assert_msg(got == CT_OK || got == CT_ERR_DATA, "fuzz %d: rc %d (%s)", k, got, err.msg);
        ck_assert_msg(got == CT_OK || strstr(err.msg, ".safetensors") || strstr(err.msg, "shards.json"),
                      "fuzz %d: %s", k, err.msg);
        ct_ckpt_shard_set_close(set);
        if (!in_index) free(buf);
        write_text(dir, CT_SHARDS_INDEX, index);
        f = fopen(p, "wb");
        fwrite(shard, 1, shard_len, f);
        fclose(f);
    }
    free(text);
    free(shard);
    free(index);
}
END_TEST

/* A "device" for ckpt: host memory reached only through counted copies. */
typedef struct fake_device {
    long calls;
    int64_t most;
} fake_device;

static int fake_to_host(void *ctx, const float *base, int64_t at, int64_t n, float *dst, ct_err *err) {
    fake_device *d = ctx;
    d->calls++;
    if (n > d->most) d->most = n;
    memcpy(dst, base + at, (size_t)n * sizeof *dst);
    return CT_OK;
}

static int fake_from_host(void *ctx, float *base, int64_t at, int64_t n, const float *src, ct_err *err) {
    fake_device *d = ctx;
    d->calls++;
    if (n > d->most) d->most = n;
    memcpy(base + at, src, (size_t)n * sizeof *src);
    return CT_OK;
}

/* A view of 2.5 M floats: a save and a load through a device's memory go in chunks of at most
 * CT_CKPT_STAGE_FLOATS through one staging buffer, never a whole copy; the values bit for bit. */
START_TEST(device_memory_staged_in_chunks) {
    enum { BIG = 2500000 };
    ct_param_view views[2] = {mkview("big.weight", 2, 2500, 1000, 0, true), mkview("bn.mean", 1, 3, 0, 0, false)};
    float *src[4], *dst[4];
    int64_t sizes[4] = {BIG, 3, BIG, BIG};
    for (int i = 0; i < 4; i++) {
        src[i] = ct_xmalloc((size_t)sizes[i] * sizeof(float));
        dst[i] = ct_xcalloc((size_t)sizes[i], sizeof(float));
        fill(src[i], (int)sizes[i], 40 + (uint64_t)i);
    }
    fake_device dev = {0};
    ct_ckpt_mem mem = {.ctx = &dev, .to_host = fake_to_host, .from_host = fake_from_host};
    ct_ckpt_tensors t = {.views = views, .n_views = 2, .n_params = BIG, .lo = 0, .hi = BIG, .params = src[0],
                         .buffers = src[1], .n_buffers = 3, .n_slots = 2, .slot_name = {"exp_avg", "exp_avg_sq"},
                         .slot = {src[2], src[3]}, .params_mem = &mem, .buffers_mem = &mem,
                         .slot_mem = {&mem, &mem}};
    snprintf(t.optimizer, sizeof t.optimizer, "AdamW");
    ct_ckpt_state s = mkstate(3);
    ct_err err = {0};
    char dir[1024];
    ck_assert_msg(ct_ckpt_save(save_dir, &t, &s, NULL, NULL, dir, sizeof dir, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_ge(dev.calls, 3 * 3);   /* each of the three big tensors in at least 3 chunks */
    ck_assert_int_le(dev.most, CT_ST_FILL_FLOATS);
    dev = (fake_device){0};
    ct_ckpt_tensors u = t;
    u.params = dst[0], u.buffers = dst[1], u.slot[0] = dst[2], u.slot[1] = dst[3];
    ck_assert_msg(ct_ckpt_load(dir, &u, CT_CKPT_LOAD_ALL, NULL, NULL, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_ge(dev.calls, 3 * 3);
    ck_assert_int_le(dev.most, CT_CKPT_STAGE_FLOATS);
    for (int i = 0; i < 4; i++) ck_assert(!memcmp(src[i], dst[i], (size_t)sizes[i] * sizeof(float)));
    for (int i = 0; i < 4; i++) {
        free(src[i]);
        free(dst[i]);
    }
}
END_TEST

/* Memory without addresses (an NVMe swap's files): an array reached only by element index, the
 * pointer NULL; a copy may fail, as an I/O error does, naming its "file". */
typedef struct indexed_mem {
    float *values;
    int64_t n;
    long calls;
    int fail;                    /* 1: to_host fails, 2: from_host fails */
    ct_ckpt_mem mem;
} indexed_mem;

static int indexed_to_host(void *ctx, const float *base, int64_t at, int64_t n, float *dst, ct_err *err) {
    indexed_mem *m = ctx;
    ck_assert_ptr_null(base);
    ck_assert(at >= 0 && n >= 0 && at + n <= m->n);
    m->calls++;
    if (m->fail == 1) return ct_errf(err, CT_ERR_RUNTIME, "/nvme/swap/master.swap: read at %lld: EIO", (long long)at);
    memcpy(dst, m->values + at, (size_t)n * sizeof *dst);
    return CT_OK;
}

static int indexed_from_host(void *ctx, float *base, int64_t at, int64_t n, const float *src, ct_err *err) {
    indexed_mem *m = ctx;
    ck_assert_ptr_null(base);
    ck_assert(at >= 0 && n >= 0 && at + n <= m->n);
    m->calls++;
    if (m->fail == 2) return ct_errf(err, CT_ERR_RUNTIME, "/nvme/swap/master.swap: write at %lld: ENOSPC", (long long)at);
    memcpy(m->values + at, src, (size_t)n * sizeof *src);
    return CT_OK;
}

/* t over [t->lo, t->hi) with params and slots in indexed memory over md's arrays (element lo at
 * index 0); mem[3]: params, exp_avg, exp_avg_sq. */
static void addressless(model *md, ct_ckpt_tensors *t, indexed_mem mem[3]) {
    float *arrays[3] = {md->params, md->m, md->v};
    for (int k = 0; k < 3; k++) {
        mem[k] = (indexed_mem){.values = arrays[k] + t->lo, .n = t->hi - t->lo};
        mem[k].mem = (ct_ckpt_mem){.ctx = &mem[k], .to_host = indexed_to_host, .from_host = indexed_from_host};
    }
    t->params = t->slot[0] = t->slot[1] = NULL;
    t->params_mem = &mem[0].mem;
    t->slot_mem[0] = &mem[1].mem;
    t->slot_mem[1] = &mem[2].mem;
}

/* Two safetensors files hold the same tensors, byte for byte (their metadata may differ: a tag). */
static bool same_tensors(const char *a, const char *b) {
    ct_err err = {0};
    ct_st_file *x = ct_st_open(a, &err), *y = ct_st_open(b, &err);
    bool same = x && y && x->n_tensors == y->n_tensors;
    for (int i = 0; same && i < x->n_tensors; i++) {
        const ct_st_tensor *p = &x->tensors[i], *q = ct_st_find(y, p->name);
        same = q && p->end - p->begin == q->end - q->begin && !memcmp(p->data, q->data, p->end - p->begin);
    }
    ct_st_close(x);
    ct_st_close(y);
    return same;
}

/* Tensors with no addresses at all, reached by element index (an NVMe swap's files): a save writes
 * the files a save from host memory writes, byte for byte, for one file set and per-rank shards;
 * a load, shards on another world size and init_from fill them; a failing copy ends the save
 * (nothing installed, latest unchanged) or the load with its own error, naming its file. */
START_TEST(memory_without_addresses) {
    model a, b;
    model_init(&a, 31);
    save(&a, 1, 0);
    indexed_mem mem[3];
    ct_ckpt_tensors t = a.t;
    addressless(&a, &t, mem);
    ct_ckpt_state st = mkstate(2);
    ct_err err = {0};
    char dir[1024], ref[1024];
    ck_assert_msg(ct_ckpt_save(save_dir, &t, &st, NULL, NULL, dir, sizeof dir, &err) == CT_OK, "%s", err.msg);
    ck_assert(mem[0].calls > 0 && mem[1].calls > 0 && mem[2].calls > 0);
    static const char *const files[] = {"model.safetensors", "optimizer.safetensors"};
    for (int i = 0; i < 2; i++) {
        char x[1200], y[1200];
        snprintf(x, sizeof x, "%s/%s", dir, files[i]);
        snprintf(y, sizeof y, "%s/global_step1/%s", save_dir, files[i]);
        ck_assert_msg(same_tensors(x, y), "%s differs from the save from host memory", files[i]);
    }
    /* a load into indexed memory, whole and by the parts of 3 ranks */
    for (int world = 1; world <= 3; world += 2) {
        model_init(&b, 0);
        nan_fill(&b);
        for (int r = 0; r < world; r++) {
            ct_ckpt_tensors u = part_of(&b, world, r);
            indexed_mem bm[3];
            addressless(&b, &u, bm);
            ck_assert_msg(ct_ckpt_load(dir, &u, CT_CKPT_LOAD_ALL, NULL, NULL, &err) == CT_OK, "%s", err.msg);
        }
        ck_assert_msg(models_equal(&a, &b), "loaded by %d ranks", world);
    }
    /* shards written by 2 ranks from indexed memory equal those from host memory; read back by 3 */
    save_sharded(&a, 3, 2);
    snprintf(ref, sizeof ref, "%s/global_step3", save_dir);
    char tag[CT_CKPT_TAG], tmp[1024];
    ct_ckpt_tag(4, tag);
    ck_assert_int_eq(ct_ckpt_begin(save_dir, tag, (long)getpid(), &err), CT_OK);
    ck_assert_int_eq(ct_ckpt_tmp_dir(save_dir, tag, (long)getpid(), tmp, sizeof tmp, &err), CT_OK);
    uint32_t crc[2];
    for (int r = 0; r < 2; r++) {
        ct_ckpt_tensors u = part_of(&a, 2, r);
        indexed_mem am[3];
        addressless(&a, &u, am);
        ck_assert_msg(ct_ckpt_shard_write(tmp, &u, r, 2, &crc[r], &err) == CT_OK, "%s", err.msg);
        char x[1200], y[1200];
        snprintf(x, sizeof x, "%s/zero_shard_%d_of_2.safetensors", tmp, r);
        snprintf(y, sizeof y, "%s/zero_shard_%d_of_2.safetensors", ref, r);
        ck_assert_msg(same_tensors(x, y), "shard %d differs from the one written from host memory", r);
    }
    ct_ckpt_state s4 = mkstate(4);
    ck_assert_int_eq(ct_ckpt_commit_shards(save_dir, tag, (long)getpid(), &a.t, 2, crc, &s4, NULL, NULL, NULL, 0, &err),
                     CT_OK);
    model_init(&b, 0);
    nan_fill(&b);
    snprintf(dir, sizeof dir, "%s/global_step4", save_dir);
    for (int r = 0; r < 3; r++) {
        ct_ckpt_tensors u = part_of(&b, 3, r);
        indexed_mem bm[3];
        addressless(&b, &u, bm);
        ck_assert_msg(ct_ckpt_load(dir, &u, CT_CKPT_LOAD_ALL, NULL, NULL, &err) == CT_OK, "%s", err.msg);
    }
    ck_assert(models_equal(&a, &b));
    /* init_from: a model file's weights into indexed memory */
    model_init(&b, 0);
    ct_ckpt_tensors u = b.t;
    indexed_mem bm[3];
    addressless(&b, &u, bm);
    char path[1200];
    snprintf(path, sizeof path, "%s/global_step1/model.safetensors", save_dir);
    int n = 0;
    ck_assert_msg(ct_ckpt_init_from(path, &u, true, &n, NULL, &err) == CT_OK, "%s", err.msg);
    ck_assert(n == 4 && !memcmp(a.params, b.params, sizeof a.params));
    /* a copy that fails: the save ends with its error and installs nothing; so does the load */
    char before[64], after[64];
    read_latest(before, sizeof before);
    mem[1].fail = 1;
    st = mkstate(5);
    ck_assert_int_eq(ct_ckpt_save(save_dir, &t, &st, NULL, NULL, dir, sizeof dir, &err), CT_ERR_RUNTIME);
    ck_assert_msg(strstr(err.msg, "/nvme/swap/master.swap: read at"), "%s", err.msg);
    snprintf(path, sizeof path, "%s/global_step5", save_dir);
    ck_assert_int_ne(access(path, F_OK), 0);
    read_latest(after, sizeof after);
    ck_assert_str_eq(before, after);
    bm[2].fail = 2;
    snprintf(dir, sizeof dir, "%s/global_step1", save_dir);
    ck_assert_int_eq(ct_ckpt_load(dir, &u, CT_CKPT_LOAD_ALL, NULL, NULL, &err), CT_ERR_RUNTIME);
    ck_assert_msg(strstr(err.msg, "/nvme/swap/master.swap: write at"), "%s", err.msg);
}
END_TEST

int main(void) {
    Suite *s = suite_create("ckpt");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, roundtrip_bitwise);
    tcase_add_test(tc, latest_and_keep_last);
    tcase_add_test(tc, interrupted_save_keeps_previous);
    tcase_add_test(tc, failed_save_cleans_up);
    tcase_add_test(tc, kill9_during_save);
    tcase_add_test(tc, dead_save_between_renames_recovered);
    tcase_add_test(tc, incomplete_is_never_loaded);
    tcase_add_test(tc, corrupt_files_named);
    tcase_add_test(tc, checksum_mismatch_refused);
    tcase_add_test(tc, state_change_flagged);
    tcase_add_test(tc, shape_mismatch_names_tensor);
    tcase_add_test(tc, best_dir);
    tcase_add_test(tc, init_from_strict_and_partial);
    tcase_add_test(tc, config_diff_lists_changes);
    tcase_add_test(tc, export_and_info);
    tcase_add_test(tc, export_never_overwrites_inputs);
    tcase_add_test(tc, prune_only_own_complete_checkpoints);
    tcase_add_test(tc, resume_auto_refuses_when_none_loads);
    tcase_add_test(tc, resume_auto_latest_unreadable);
    tcase_add_test(tc, save_keeps_same_named_foreign_directory);
    tcase_add_test(tc, lock_held_until_holder_dies);
    tcase_add_test(tc, shards_resume_on_any_world);
    tcase_add_test(tc, shard_reads_only_its_range);
    tcase_add_test(tc, shard_set_range_reads);
    tcase_add_test(tc, shard_descriptions_hostile);
    tcase_add_test(tc, device_memory_staged_in_chunks);
    tcase_add_test(tc, memory_without_addresses);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
