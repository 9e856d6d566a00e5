/* plan.c: the memory plan of a run (plan.h), from the same size functions the allocations use:
 * the parameter store's, the optimizer's, the graph's arena and the loader's. */
#include "core/device/device.h"
#include "core/train/plan.h"

#include <string.h>

#include "core/data/loader.h"
#include "core/dist/comm.h"
#include "core/optim/amp.h"
#include "core/optim/optim.h"
#include "core/params/store.h"
#include "core/train/nvme.h"
#include "core/zero/partition.h"

int ct_run_plan_target(const ct_config *cfg, bool has_gpu, ct_plan_target *out, ct_err *err) {
    const char *d = cfg->train.device[0] ? cfg->train.device : "auto";
    bool cuda = strncmp(d, "cuda", 4) == 0 || (strcmp(d, "auto") == 0 && has_gpu);
    *out = (ct_plan_target){.device = cuda, .name = cuda ? "cuda" : "cpu"};
    if (cuda) return CT_OK;
    bool capped;
    double gbps;
    int rc = ct_capped_env(&capped, &out->capacity, &gbps, err);
    if (!rc && capped) out->device = true, out->name = "capped";
    return rc;
}

/* The optimizer's state over n elements of the trainable space (Lamb: plus its scratch, as large
 * as the largest tensor). */
static size_t optimizer_bytes(const ct_config *cfg, const ct_param_layout *L, int64_t n) {
    size_t b = ct_optim_state_bytes_for(cfg->optimizer.type, cfg->optimizer.momentum, n);
    if (cfg->optimizer.type != CT_OPT_LAMB) return b;
    int64_t max = 0;
    for (int i = 0; i < L->n_views; i++)
        if (L->views[i].trainable && L->views[i].numel > max) max = L->views[i].numel;
    return b + (size_t)((max + 15) & ~(int64_t)15) * sizeof(float);
}

/* Device copies of the train and eval loaders' batches (the model's input and target shapes). */
static size_t loader_bytes(const ct_config *cfg, const ct_graph_info *gi, ct_dtype compute) {
    const cJSON *tr = cJSON_GetObjectItemCaseSensitive(cfg->data, "transform");
    bool u8 = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(tr, "on_device")) && gi->input_dtype != CT_I32;
    size_t one = ct_loader_device_bytes(cfg->micro_batch, ct_shape_numel(&gi->input_shape), gi->input_dtype,
                                        ct_shape_numel(&gi->target_shape), gi->target_dtype, u8, compute);
    bool eval = cJSON_GetObjectItemCaseSensitive(cfg->data, "eval") != NULL;
    return one * (eval ? 2 : 1);
}

void ct_run_plan_forward_only(ct_run_plan *p) {
    p->total -= p->bytes[CT_MEM_GRADS] + p->bytes[CT_MEM_OPTIM];
    p->host_total -= p->host[CT_MEM_GRADS] + p->host[CT_MEM_OPTIM];
    p->bytes[CT_MEM_GRADS] = p->bytes[CT_MEM_OPTIM] = p->host[CT_MEM_GRADS] = p->host[CT_MEM_OPTIM] = 0;
}

void ct_run_plan_make(const ct_config *cfg, const ct_graph *g, bool device, ct_run_plan *out) {
    memset(out, 0, sizeof *out);
    const ct_param_layout *L = ct_graph_layout(g);
    const ct_graph_info *gi = ct_graph_info_get(g);
    ct_dtype compute = ct_graph_compute_dtype(g);
    out->device = device;
    out->act = *ct_graph_plan(g);
    int64_t lo = 0, hi = L->n_params;
    int stage = ct_zero_stage(cfg, device);
    out->offload = ct_zero_offload(cfg, device);
    if (stage > 0) ct_comm_shard(L->n_params, cfg->world_size, 0, &lo, &hi);
    out->nvme = ct_zero_nvme(cfg, device);
    ct_store_offload so = {.pinned = cfg->zero.offload_optimizer.pin_memory, .chunk = ct_zero_offload_chunk(cfg),
                           .params = ct_zero_offload_params(cfg, device), .swapped = out->nvme};
    ct_param_store_plan_in(L, compute, lo, hi, ct_zero_store_parts(stage), out->offload ? &so : NULL, out->bytes,
                           out->host);
    (out->offload ? out->host : out->bytes)[CT_MEM_OPTIM] = optimizer_bytes(cfg, L, hi - lo);
    if (out->nvme) {   /* the master and the state in swap files: host memory holds their buffers */
        out->swap_host = out->host[CT_MEM_OPTIM] = ct_nvme_host_bytes(cfg, hi - lo);
        out->swap_disk = ct_nvme_disk_bytes(cfg, hi - lo);
        out->swap_elems = hi - lo;
    }
    /* The arena is one allocation, its shared layer workspace included; the trainer's loss
     * accumulator and, on a device, the ops' own scratch are the workspace category's. */
    out->bytes[CT_MEM_ACTIVATIONS] = out->act.total;
    out->bytes[CT_MEM_WORKSPACE] = 4 * sizeof(float) + (device ? out->act.device_scratch : 0);
    out->bytes[CT_MEM_LOADER] = device ? loader_bytes(cfg, gi, compute) : 0;
    if (stage >= 2) {   /* the gradient scratch; stage 3: the gather scratch and persistent views */
        size_t part[CT_MEM_CAT_COUNT], part_host[CT_MEM_CAT_COUNT];
        ct_partition_opts po = ct_partition_opts_from(&cfg->zero);
        po.offload = out->offload;
        ct_partition_plan(L, compute, stage, &po, cfg->world_size, part, part_host);
        for (int c = 0; c < CT_MEM_CAT_COUNT; c++) out->bytes[c] += part[c], out->host[c] += part_host[c];
    }
    if (device) out->host[CT_MEM_ACTIVATIONS] += out->act.host;   /* cpu_checkpointing's pinned copies */
    for (int c = 0; c < CT_MEM_CAT_COUNT; c++) out->total += out->bytes[c], out->host_total += out->host[c];
}
