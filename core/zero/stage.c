/* stage.c: the stage rule (stage.h). */
#include "core/zero/stage.h"

#include "core/params/store.h"

bool ct_zero_offload(const ct_config *cfg, bool device) {
    if (cfg->zero.stage < 1) return false;
    /* NVMe offload acts on the CPU backend too: its files take the master and the state out of
     * host memory, which is the CPU's memory */
    if (cfg->zero.offload_optimizer.device == CT_OFFLOAD_NVME) return true;
    return device && cfg->zero.offload_optimizer.device == CT_OFFLOAD_CPU;
}

bool ct_zero_nvme(const ct_config *cfg, bool device) {
    return ct_zero_offload(cfg, device) && cfg->zero.offload_optimizer.device == CT_OFFLOAD_NVME;
}

int64_t ct_zero_offload_chunk(const ct_config *cfg) {
    double n = cfg->zero.sub_group_size;
    return n >= 1 && n < (double)CT_OFFLOAD_MAX_CHUNK ? (int64_t)n : CT_OFFLOAD_MAX_CHUNK;
}

bool ct_zero_offload_params(const ct_config *cfg, bool device) {
    return device && ct_zero_offload(cfg, device) && cfg->zero.stage == 3 &&
           cfg->zero.offload_param.device == CT_OFFLOAD_CPU;
}

int ct_zero_partition_stage(const ct_config *cfg) {
    int stage = cfg->zero.stage >= 1 && cfg->zero.stage <= 3 ? cfg->zero.stage : 0;
    return cfg->world_size > 1 ? stage : 0;
}

int ct_zero_stage(const ct_config *cfg, bool device) {
    int stage = cfg->zero.stage >= 1 && cfg->zero.stage <= 3 ? cfg->zero.stage : 0;
    if (ct_zero_offload_params(cfg, device)) return 3;
    if (ct_zero_offload(cfg, device)) return cfg->world_size <= 1 || stage < 2 ? 2 : stage;
    return ct_zero_partition_stage(cfg);
}

unsigned ct_zero_store_parts(int stage) {
    return stage == 3 ? CT_STORE_PART_GRADS | CT_STORE_PART_PARAMS : stage == 2 ? CT_STORE_PART_GRADS : CT_STORE_WHOLE;
}
