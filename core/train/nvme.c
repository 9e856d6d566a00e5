/* nvme.c: the trainer's side of NVMe offload (nvme.h). */
#include "core/train/nvme.h"

#include <stdlib.h>
#include <string.h>

#include "core/report/report.h"
#include "core/train/internal.h"
#include "core/train/plan.h"

/* One array of the swap as ckpt's memory without addresses. */
typedef struct swap_array {
    ct_nvme *nv;
    int k;
} swap_array;

struct ct_nvme {
    ct_swap *swap;
    const char *names[CT_NVME_MAX_ARRAYS];
    int n_arrays;
    ct_backend *pin, *host;      /* the buffers' allocator: pin's pinned memory, else host's */
    swap_array arrays[CT_NVME_MAX_ARRAYS];
    ct_ckpt_mem mem[CT_NVME_MAX_ARRAYS];
};

/* The arrays: the master, then the optimizer's slots (ct_optim_slots' order). */
static int array_names(const ct_config *cfg, const char **names) {
    names[0] = "master";
    return 1 + ct_optim_slot_names(cfg->optimizer.type, cfg->optimizer.momentum, names + 1);
}

void ct_nvme_swap_opts(const ct_config *cfg, int64_t n, int rank, const char **names, ct_swap_opts *out) {
    int k = array_names(cfg, names);
    int64_t chunk = ct_zero_offload_chunk(cfg);
    if (chunk > n) chunk = n > 0 ? n : 1;
    int buffers = (int)cfg->zero.offload_optimizer.nvme.buffer_count;
    /* the budget: buffer_count buffers of one chunk of every array, and one block to align them
     * (the allocator's memory is 64-byte aligned, direct I/O needs CT_AIO_ALIGN) */
    size_t per = (size_t)ct_aio_round_up(chunk * (int64_t)sizeof(float));
    *out = (ct_swap_opts){.nvme_path = cfg->zero.offload_optimizer.nvme.path, .tag = "optimizer", .rank = rank,
                          .n_arrays = k, .names = names, .n = n > 0 ? n : 1, .buffer_count = buffers,
                          .host_bytes = per * (size_t)k * (size_t)buffers + CT_AIO_ALIGN,
                          .max_chunk = chunk < n ? chunk : 0,   /* 0: the whole part in one chunk */
                          .aio = ct_aio_from_config(&cfg->aio)};
}

size_t ct_nvme_host_bytes(const ct_config *cfg, int64_t n) {
    const char *names[CT_NVME_MAX_ARRAYS];
    ct_swap_opts o;
    ct_nvme_swap_opts(cfg, n, 0, names, &o);
    int64_t chunk = ct_swap_chunk_for(&o);
    return (size_t)chunk * sizeof(float) * (size_t)o.n_arrays * (size_t)o.buffer_count + CT_AIO_ALIGN;
}

int64_t ct_nvme_disk_bytes(const ct_config *cfg, int64_t n) {
    const char *names[CT_NVME_MAX_ARRAYS];
    ct_swap_opts o;
    ct_nvme_swap_opts(cfg, n, 0, names, &o);
    return ct_swap_file_bytes(&o);
}

/* The swap's buffers: pinned by the device backend (its copies may read them), or the host CPU
 * backend's memory; either way counted as optimizer state in the run's host figures. */
static void *alloc_buffers(void *ctx, size_t bytes) {
    ct_nvme *nv = ctx;
    return nv->pin ? nv->pin->mem.alloc_host_pinned(nv->pin, bytes, CT_MEM_OPTIM)
                   : nv->host->mem.alloc(nv->host, bytes, CT_MEM_OPTIM);
}

static void free_buffers(void *ctx, void *p) {
    ct_nvme *nv = ctx;
    if (nv->pin) nv->pin->mem.free_host_pinned(nv->pin, p);
    else nv->host->mem.free(nv->host, p);
}

static int array_to_host(void *ctx, const float *base, int64_t at, int64_t n, float *dst, ct_err *err) {
    const swap_array *a = ctx;
    return ct_swap_read(a->nv->swap, a->k, at, n, dst, err);
}

static int array_from_host(void *ctx, float *base, int64_t at, int64_t n, const float *src, ct_err *err) {
    const swap_array *a = ctx;
    return ct_swap_write(a->nv->swap, a->k, at, n, src, err);
}

int ct_nvme_open(const ct_config *cfg, ct_backend *be, ct_backend *host, int64_t lo, int64_t hi, int rank,
                 ct_nvme **out, ct_warnings *w, ct_err *err) {
    *out = NULL;
    ct_nvme *nv = ct_xcalloc(1, sizeof *nv);
    ct_swap_opts o;
    ct_nvme_swap_opts(cfg, hi - lo, rank, nv->names, &o);
    nv->n_arrays = o.n_arrays;
    nv->pin = cfg->zero.offload_optimizer.pin_memory ? be : NULL;
    nv->host = host;
    o.alloc = alloc_buffers;
    o.free = free_buffers;
    o.alloc_ctx = nv;
    int rc = ct_swap_check_dir(o.nvme_path, ct_swap_file_bytes(&o), CT_NVME_PATH_KEY, err);
    if (!rc) rc = ct_swap_open(&o, &nv->swap, w, err);
    if (rc) {
        free(nv);
        return rc;
    }
    for (int k = 0; k < nv->n_arrays; k++) {
        nv->arrays[k] = (swap_array){nv, k};
        nv->mem[k] = (ct_ckpt_mem){.ctx = &nv->arrays[k], .to_host = array_to_host, .from_host = array_from_host};
    }
    *out = nv;
    return CT_OK;
}

int ct_nvme_close(ct_nvme *nv, ct_err *err) {
    if (!nv) return CT_OK;
    int rc = ct_swap_close(nv->swap, err);
    free(nv);
    return rc;
}

ct_swap *ct_nvme_swap(ct_nvme *nv) { return nv->swap; }

typedef struct init_ctx {
    const ct_param_store *p;
    uint64_t seed;
} init_ctx;

static int init_chunk(void *ctx, int k, int64_t lo, int64_t n, float *dst, ct_err *err) {
    const init_ctx *c = ctx;
    ct_param_store_init_master(c->p, c->seed, c->p->lo + lo, c->p->lo + lo + n, dst);
    return CT_OK;
}

int ct_nvme_init_master(ct_nvme *nv, const ct_param_store *p, uint64_t seed, ct_err *err) {
    init_ctx c = {p, seed};
    /* the moments need nothing: the files were created zeroed (fallocate, or a sparse ftruncate) */
    return ct_swap_fill(nv->swap, 1u, init_chunk, &c, err);
}

static int refresh_chunk(void *ctx, int k, int64_t lo, int64_t n, const float *src, ct_err *err) {
    ct_param_store *p = ctx;
    ct_param_store_refresh_range(p, p->lo + lo, p->lo + lo + n, src);
    return CT_OK;
}

int ct_nvme_refresh(ct_nvme *nv, ct_param_store *p, ct_err *err) {
    /* the casts read the swap's buffer before it is released; the uploads read the staging */
    int rc = ct_swap_drain(nv->swap, 1u, refresh_chunk, p, err);
    ct_param_store_uploads_wait(p);
    return rc;
}

void ct_nvme_ckpt_tensors(ct_nvme *nv, ct_ckpt_tensors *ck) {
    ck->params = NULL;
    ck->params_mem = &nv->mem[0];
    for (int s = 0; s < ck->n_slots && s + 1 < nv->n_arrays; s++) {
        ck->slot[s] = NULL;
        ck->slot_mem[s] = &nv->mem[1 + s];
    }
}

int ct_trainer_refresh_params(ct_trainer *t, ct_err *err) {
    if (t->m.nvme) return ct_nvme_refresh(t->m.nvme, t->m.params, err);
    ct_param_store_refresh(t->m.params);
    return CT_OK;
}

void ct_nvme_describe(const ct_config *cfg, const ct_run_plan *p, char *out, size_t n) {
    const char *names[CT_NVME_MAX_ARRAYS];
    ct_swap_opts o;
    ct_nvme_swap_opts(cfg, p->swap_elems, 0, names, &o);
    int64_t chunk = ct_swap_chunk_for(&o);
    char disk[32], buf[32], elems[32], arrays[128] = "";
    for (int k = 0; k < o.n_arrays; k++)
        snprintf(arrays + strlen(arrays), sizeof arrays - strlen(arrays), "%s%s", k ? ", " : "", names[k]);
    snprintf(out, n, "NVMe swap: %s of files under %s (%s: %s elements%s), %d host buffers of %d × %s "
             "(sub_group_size, buffer_count)", ct_fmt_bytes((double)p->swap_disk, disk, sizeof disk), o.nvme_path, arrays,
             ct_fmt_count((double)p->swap_elems, elems, sizeof elems), cfg->world_size > 1 ? " per rank" : "",
             o.buffer_count, o.n_arrays, ct_fmt_bytes((double)chunk * sizeof(float), buf, sizeof buf));
}

#define GIB 1073741824.0

static size_t gib_bytes(double gb) { return gb > 0 ? (gb * GIB < 1 ? 1 : (size_t)(gb * GIB)) : 0; }

/* The host limit and the key it comes from (0: none). */
static size_t host_limit(const ct_config *cfg, bool device, const char **key) {
    size_t limit = gib_bytes(cfg->train.host_memory_limit_gb), cpu = device ? 0 : gib_bytes(cfg->train.memory_limit_gb);
    *key = "train.host_memory_limit_gb";
    if (cpu && (!limit || cpu < limit)) limit = cpu, *key = "train.memory_limit_gb";
    return limit;
}

static size_t host_planned(const ct_run_plan *p) { return p->host_total + (p->device ? 0 : p->total); }

/* The plan's host side by category ("grads 1.6 MiB, ..."): on the CPU backend both sides. */
static void describe_host(const ct_run_plan *p, char *out, size_t n) {
    size_t used = 0;
    char v[32];
    for (int c = 0; c < CT_MEM_CAT_COUNT && used < n; c++) {
        size_t b = p->host[c] + (p->device ? 0 : p->bytes[c]);
        if (!b) continue;
        const char *name = c == CT_MEM_OPTIM && p->nvme ? "optimizer (NVMe swap buffers)" : ct_mem_cat_name((ct_mem_cat)c);
        used += (size_t)snprintf(out + used, n - used, "%s%s %s", used ? ", " : "", name, ct_fmt_bytes((double)b, v, sizeof v));
    }
}

/* With NVMe offload already: the sub_group_size whose swap buffers fit what the rest leaves. */
static void suggest_smaller_chunk(const ct_config *cfg, const ct_run_plan *p, size_t limit, ct_err *err) {
    size_t rest = host_planned(p) - p->swap_host;
    char a[32], b[32];
    const char *names[CT_NVME_MAX_ARRAYS];
    int k = array_names(cfg, names);
    long buffers = cfg->zero.offload_optimizer.nvme.buffer_count;
    int64_t block = CT_AIO_ALIGN / (int64_t)sizeof(float);
    int64_t chunk = rest + CT_AIO_ALIGN < limit ? (int64_t)((limit - rest - CT_AIO_ALIGN) / ((size_t)k * (size_t)buffers * sizeof(float))) / block * block : 0;
    if (chunk >= block)
        ct_err_append(err, "  \"zero_optimization\": {\"sub_group_size\": %lld} fits: the swap's %ld buffers then take %s "
                      "(now %s)", (long long)chunk, buffers,
                      ct_fmt_bytes((double)((size_t)chunk * sizeof(float) * (size_t)k * (size_t)buffers + CT_AIO_ALIGN), a, sizeof a),
                      ct_fmt_bytes((double)p->swap_host, b, sizeof b));
    else
        ct_err_append(err, "  Without the swap's buffers the host plan still needs %s: the gradients of this rank's part "
                      "and the staging buffers do not fit in the limit (more ranks, or a smaller model)",
                      ct_fmt_bytes((double)rest, a, sizeof a));
}

/* Without NVMe offload: the same run with it, planned; whether it fits. */
static bool suggest_nvme(const ct_config *cfg, const ct_graph *g, bool device, size_t limit, ct_err *err) {
    ct_config *c = ct_xmalloc(sizeof *c);
    *c = *cfg;
    c->zero.offload_optimizer.device = CT_OFFLOAD_NVME;
    if (c->zero.stage == 0) c->zero.stage = 2;   /* offload needs a ZeRO stage: ZeRO-Offload's is 2 */
    ct_run_plan q;
    ct_run_plan_make(c, g, device, &q);
    int stage = c->zero.stage;
    free(c);
    char a[32], b[32];
    bool fits = host_planned(&q) <= limit;
    if (fits)
        ct_err_append(err, "  NVMe offload fits: \"zero_optimization\": {\"stage\": %d, \"offload_optimizer\": {\"device\": "
                      "\"nvme\", \"nvme_path\": DIR}} keeps the fp32 master and optimizer state (%s) in files under DIR "
                      "and plans %s of host memory", stage, ct_fmt_bytes((double)q.swap_disk, a, sizeof a),
                      ct_fmt_bytes((double)host_planned(&q), b, sizeof b));
    else
        ct_err_append(err, "  Even with NVMe offload (the fp32 master and optimizer state in files) the host plan is %s",
                      ct_fmt_bytes((double)host_planned(&q), a, sizeof a));
    return fits;
}

int ct_nvme_check_host_limit(const ct_config *cfg, const ct_graph *g, const ct_run_plan *p, ct_err *err) {
    const char *key;
    size_t limit = host_limit(cfg, p->device, &key), planned = host_planned(p);
    if (!limit || planned <= limit) return CT_OK;
    char a[32], l[32], line[512];
    describe_host(p, line, sizeof line);
    ct_errf(err, CT_ERR_RUNTIME, "%s: the host memory plan needs %s but %s %g allows %s; nothing was trained\n"
            "  planned host memory%s: %s", cfg->path, ct_fmt_bytes((double)planned, a, sizeof a), key,
            strcmp(key, "train.memory_limit_gb") ? cfg->train.host_memory_limit_gb : cfg->train.memory_limit_gb,
            ct_fmt_bytes((double)limit, l, sizeof l), cfg->world_size > 1 ? " per rank" : "", line);
    if (p->nvme) suggest_smaller_chunk(cfg, p, limit, err);
    else if (!suggest_nvme(cfg, g, p->device, limit, err) && !p->device && !p->offload) {
        if (err) *err = (ct_err){0};   /* the CPU's plan over memory_limit_gb: the fit's suggestions say more */
        return CT_OK;
    }
    return CT_ERR_RUNTIME;
}
