/* test_conformance.c: the 40 real DeepSpeed configs of test/conformance/ds_configs at world
 * size 1 and 8, against the outcome SOURCES.md records for DeepSpeed.
 *
 * The corpus is a byte-for-byte copy of the shared one, kept in test/conformance/ds_configs so
 * a fresh clone tests it; a missing corpus is a failure, not a skip.
 *
 * Accepted where DeepSpeed accepts (with the same derived batch triple), rejected where DeepSpeed
 * rejects, and rejected with a message naming the key where the file needs a feature ctrain does
 * not implement (1-bit / 0-1 optimizers) or asks for another kind of training than ctrain's
 * (progressive layer drop, random-LTD: DeepSpeed accepts these files and trains with layers or
 * tokens dropped, which ctrain would silently not do). Every rejection message must start with the file name
 * and contain the JSON path. Files whose batch keys are "auto" (filled by HF tooling before
 * DeepSpeed sees them) are accepted with ctrain's "auto" rule: micro-batch
 * CT_CONFIG_DEFAULT_MICRO_BATCH, accumulation 1. */
#include <check.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/data/dataset.h"
#include "core/config/config.h"

/* The corpus: a copy inside the repository when there is one, else the shared checkout beside it. */
static const char *const corpus_dirs[] = {"test/conformance/ds_configs"};
static const char *corpus;
#define A CT_CONFIG_DEFAULT_MICRO_BATCH

typedef struct outcome {
    const char *error; /* NULL: accepted; else a text the message must contain (the JSON path) */
    long tb, mb, ga;   /* accepted: the derived triple */
} outcome;

typedef struct corpus_case {
    const char *file;
    outcome w1, w8;
} corpus_case;

#define OK(t, m, g) {NULL, t, m, g}
#define ERR(s) {s, 0, 0, 0}
#define AUTO OK(A, A, 1), OK(8 * A, A, 1)

static const corpus_case cases[] = {
    /* 1 */ {"CarperAI__trlx__examples_summarize_rlhf_configs_ds_config_trlx_gptj_summarize.json", OK(8, 2, 4), OK(64, 2, 4)},
    /* 2: offload blocks given as false */
    {"LambdaLabsML__distributed-training-guide__alternative-frameworks_deepspeed_ds_config.json",
     ERR("zero_optimization.offload_"), ERR("zero_optimization.offload_")},
    /* 3 */ {"QwenLM__Qwen__finetune_ds_config_zero2.json", AUTO},
    /* 4 */ {"axolotl-ai-cloud__axolotl__deepspeed_configs_zero1.json", AUTO},
    /* 5 */ {"axolotl-ai-cloud__axolotl__deepspeed_configs_zero3_bf16_cpuoffload_all.json", AUTO},
    /* 6: engine init rejects max_grad_norm */
    {"bigscience-workshop__Megatron-DeepSpeed__examples_curriculum_learning_ds_config_cl.json",
     ERR("optimizer.params.max_grad_norm"), ERR("optimizer.params.max_grad_norm")},
    /* 7 */ {"bigscience-workshop__Megatron-DeepSpeed__tests_ds_config_cl.json", OK(16, 1, 16), OK(16, 1, 2)},
    /* 8 */ {"haotian-liu__LLaVA__scripts_zero3_offload.json", AUTO},
    /* 9 */ {"hiyouga__LLaMA-Factory__examples_deepspeed_ds_z3_config.json", AUTO},
    /* 10 */ {"hiyouga__LLaMA-Factory__examples_deepspeed_ds_z3_fp8_config.json", AUTO},
    /* 11 */ {"huggingface__accelerate__examples_deepspeed_config_templates_zero_stage2_offload_config.json", AUTO},
    /* 12 */ {"huggingface__accelerate__tests_deepspeed_ds_config_zero3.json", AUTO},
    /* 13 */ {"huggingface__transformers__tests_deepspeed_ds_config_zero2.json", AUTO},
    /* 14 */ {"huggingface__transformers__tests_deepspeed_ds_config_zero3.json", AUTO},
    /* 15 */ {"huggingface__transformers__tests_deepspeed_ds_config_zero3_bf16.json", AUTO},
    /* 16: misspelled ZeRO keys */
    {"microsoft__DeepSpeedExamples__Megatron-LM-v1.1.5-ZeRO3_examples_ds_zero_stage_3_config_release.json",
     ERR("zero_optimization.stage3_param_persitance_threshold"), ERR("zero_optimization.stage3_param_persitance_threshold")},
    /* 17: misspelled ZeRO key (before its NVMe offload, which ctrain would also refuse) */
    {"microsoft__DeepSpeedExamples__Megatron-LM-v1.1.5-ZeRO3_examples_ds_zero_stage_infinity_config.json",
     ERR("zero_optimization.stage3_param_persitence_threshold"), ERR("zero_optimization.stage3_param_persitence_threshold")},
    /* 18 */ {"microsoft__DeepSpeedExamples__Megatron-LM_scripts_ds_zero-offload_10B_config.json", OK(10, 10, 1), OK(80, 10, 1)},
    /* 19 */ {"microsoft__DeepSpeedExamples__cifar_ds_config.json", OK(16, 16, 1), OK(16, 2, 1)},
    /* 20 (Hjson) */ {"microsoft__DeepSpeedExamples__pipeline_parallelism_ds_config.json", OK(256, 16, 16), OK(256, 16, 2)},
    /* 21-23: DeepSpeed's 1-bit / 0-1 optimizers, not implemented by ctrain */
    {"microsoft__DeepSpeedExamples__training_bing_bert_01_adam_nccl_deepspeed_bsz4k_01adam_config_seq512_nccl.json",
     ERR("optimizer.type"), ERR("optimizer.type")},
    {"microsoft__DeepSpeedExamples__training_bing_bert_1-bit_adam_nccl_deepspeed_bsz4k_onebitadam_config_seq128_nccl.json",
     ERR("optimizer.type"), ERR("optimizer.type")},
    {"microsoft__DeepSpeedExamples__training_bing_bert_1-bit_lamb_nccl_deepspeed_bsz64k_onebitlamb_config_seq128_nccl.json",
     ERR("optimizer.type"), ERR("optimizer.type")},
    /* 24: DeepSpeed accepts (4096 = 16 x 256 at W=1, 16 x 32 at W=8) and drops layers as it trains;
       ctrain would train every layer: refused naming the switch */
    {"microsoft__DeepSpeedExamples__training_bing_bert_deepspeed_bsz4k_progressive_layer_drop_config_seq128.json",
     ERR("progressive_layer_drop.enabled"), ERR("progressive_layer_drop.enabled")},
    /* 25 */ {"microsoft__DeepSpeedExamples__training_bing_bert_deepspeed_bsz64k_lamb_config_seq128.json",
     OK(65536, 64, 1024), OK(65536, 64, 128)},
    /* 26: DeepSpeed accepts at W=1 (GAS 2) and drops tokens (random-LTD), and fails the batch rule at
       W=8; ctrain refuses random-LTD at both, before the batch rule */
    {"microsoft__DeepSpeedExamples__training_data_efficiency_gpt_finetuning_config_ds_config_gpt_base_random_ltd.json",
     ERR("data_efficiency.data_routing.random_ltd.enabled"), ERR("data_efficiency.data_routing.random_ltd.enabled")},
    /* 27 (Hjson) */ {"microsoft__DeepSpeedExamples__training_imagenet_config_ds_fp16_config.json", OK(256, 256, 1), OK(256, 32, 1)},
    /* 28 */ {"microsoft__DeepSpeedExamples__training_imagenet_config_ds_fp16_z1_config.json", OK(256, 256, 1), OK(256, 32, 1)},
    /* 29 (Hjson): a ZeRO fragment without batch keys */
    {"microsoft__DeepSpeed__deepspeed_autotuning_config_templates_template_zero3.json", ERR("train_batch_size: missing"),
     ERR("train_batch_size: missing")},
    /* 30: autotuning list syntax */
    {"microsoft__DeepSpeed__deepspeed_autotuning_tests_ds_config.json", ERR("zero_optimization.overlap_comm"),
     ERR("zero_optimization.overlap_comm")},
    /* 31 */ {"microsoft__DeepSpeed__tests_model_BingBertSquad_deepspeed_bsz24_fp16_eigenvalue_quantize_config.json",
     OK(24, 3, 8), OK(24, 3, 1)},
    /* 32 */ {"microsoft__DeepSpeed__tests_model_Megatron_GPT2_ds_config_func_bs4_zero2_offload.json", OK(4, 4, 1),
     ERR("train_micro_batch_size_per_gpu: derived")},
    /* 33 */ {"microsoft__DeepSpeed__tests_model_Megatron_GPT2_ds_config_func_bs8_zero0_gas3.json", OK(24, 8, 3), OK(192, 8, 3)},
    /* 34 */ {"microsoft__DeepSpeed__tests_torch_compile_ds_config_z3.json", OK(8, 8, 1), OK(8, 1, 1)},
    /* 35-38: templates with unquoted placeholders */
    {"microsoft__Megatron-DeepSpeed__examples_deepspeed_curriculum_learning_ds_zero_stage_1_config_curriculum_fixed_linear.json",
     ERR("curriculum_learning.min_difficulty: unquoted word CONFIG_CL_MIN"),
     ERR("curriculum_learning.min_difficulty: unquoted word CONFIG_CL_MIN")},
    {"microsoft__Megatron-DeepSpeed__examples_deepspeed_data_efficiency_gpt_pretrain_ds_config_gpt_1clmetric_TEMPLATE.json",
     ERR("train_batch_size: unquoted word GBSIZE"), ERR("train_batch_size: unquoted word GBSIZE")},
    {"microsoft__Megatron-DeepSpeed__examples_deepspeed_deepspeed4science_megatron_long_seq_support_ds_config_gpt_TEMPLATE.json",
     ERR("train_batch_size: unquoted word GBSIZE"), ERR("train_batch_size: unquoted word GBSIZE")},
    {"microsoft__Megatron-DeepSpeed__examples_deepspeed_offload_pp_ds_config_gpt_TEMPLATE.json",
     ERR("train_batch_size: unquoted word CONFIG_BATCH_SIZE"), ERR("train_batch_size: unquoted word CONFIG_BATCH_SIZE")},
    /* 39 */ {"microsoft__Megatron-DeepSpeed__examples_deepspeed_universal_checkpointing_ds_config.json", OK(16, 16, 1),
     ERR("gradient_accumulation_steps: derived")},
    /* 40 */ {"tatsu-lab__stanford_alpaca__configs_default_offload_opt_param.json", AUTO},
};

static void corpus_path(const char *file, char *out, size_t n) { snprintf(out, n, "%s/%s", corpus, file); }

static void check_one(const corpus_case *c, int world, const outcome *want) {
    char path[1024];
    corpus_path(c->file, path, sizeof path);
    ct_config_opts o = {.path = path, .world_size = world};
    o.formats = ct_dataset_formats(&o.n_formats);
    ct_config *cfg = NULL;
    ct_warnings w = {0};
    ct_err e = {0};
    int rc = ct_config_load(&o, &cfg, &w, &e);
    if (want->error) {
        ck_assert_msg(rc == CT_ERR_CONFIG, "%s at W=%d: accepted, DeepSpeed rejects", c->file, world);
        ck_assert_msg(strncmp(e.msg, path, strlen(path)) == 0, "%s W=%d: message does not start with the file: %s",
                      c->file, world, e.msg);
        ck_assert_msg(strstr(e.msg, want->error), "%s W=%d: message lacks \"%s\": %s", c->file, world, want->error,
                      e.msg);
    } else {
        ck_assert_msg(rc == CT_OK, "%s at W=%d: rejected: %s", c->file, world, e.msg);
        ck_assert_msg(cfg->train_batch_size == want->tb && cfg->micro_batch == want->mb && cfg->grad_accum == want->ga,
                      "%s W=%d: batch %ld = %ld x %ld, want %ld = %ld x %ld", c->file, world, cfg->train_batch_size,
                      cfg->micro_batch, cfg->grad_accum, want->tb, want->mb, want->ga);
        ck_assert_ptr_null(cfg->model); /* DeepSpeed files carry no model/data: still loadable */
        ck_assert_ptr_nonnull(cfg->resolved);
    }
    ct_config_free(cfg);
    ct_warnings_free(&w);
}

START_TEST(corpus_world_1) {
    check_one(&cases[_i], 1, &cases[_i].w1);
}
END_TEST

START_TEST(corpus_world_8) {
    check_one(&cases[_i], 8, &cases[_i].w8);
}
END_TEST

/* The table covers every file of the corpus, and nothing else. */
START_TEST(table_covers_corpus) {
    DIR *d = opendir(corpus);
    ck_assert_msg(d != NULL, "cannot open %s (tests run from the repository root)", corpus);
    int n = 0;
    for (struct dirent *de; (de = readdir(d));) {
        size_t len = strlen(de->d_name);
        if (len < 5 || strcmp(de->d_name + len - 5, ".json")) continue;
        n++;
        bool found = false;
        for (int i = 0; i < CT_ARRAY_LEN(cases); i++) found |= strcmp(cases[i].file, de->d_name) == 0;
        ck_assert_msg(found, "%s is not in the table", de->d_name);
    }
    closedir(d);
    ck_assert_int_eq(n, CT_ARRAY_LEN(cases));
    ck_assert_int_eq(n, 40);
}
END_TEST

static int warnings_of(const char *file, const char *needle, ct_config_opts *o_in, ct_config **keep) {
    char path[1024];
    corpus_path(file, path, sizeof path);
    ct_config_opts o = o_in ? *o_in : (ct_config_opts){.world_size = 1};
    o.formats = ct_dataset_formats(&o.n_formats);
    o.path = path;
    ct_config *cfg = NULL;
    ct_warnings w = {0};
    ct_err e = {0};
    int rc = ct_config_load(&o, &cfg, &w, &e);
    ck_assert_msg(rc == CT_OK, "%s: %s", file, e.msg);
    int n = 0;
    for (int i = 0; i < w.n; i++) n += strstr(w.items[i], needle) != NULL;
    ct_warnings_free(&w);
    if (keep)
        *keep = cfg;
    else
        ct_config_free(cfg);
    return n;
}

/* What the corpus files exercise beyond the batch triple. */
START_TEST(corpus_details) {
    ct_config *cfg = NULL;
    /* Hjson-only files load with one warning naming line:column */
    ck_assert_int_eq(warnings_of(cases[19].file, "19:33: trailing comma", NULL, NULL), 1);
    ck_assert_int_eq(warnings_of(cases[26].file, "26:6: missing comma", NULL, NULL), 1);
    /* unknown top-level keys: warnings (DeepSpeed ignores them silently) */
    ck_assert_int_eq(warnings_of(cases[9].file, "comms_config: unknown key", NULL, NULL), 1);
    ck_assert_int_eq(warnings_of(cases[26].file, "cuda_visible_devices: unknown key", NULL, NULL), 1);
    /* fp16 keys DeepSpeed ignores inside bf16 */
    ck_assert_int_eq(warnings_of(cases[33].file, "bf16.loss_scale: unknown key", NULL, &cfg), 1);
    ck_assert(cfg->bf16 && !cfg->fp16.enabled && cfg->zero.stage == 3 && !cfg->zero.contiguous_gradients);
    ct_config_free(cfg);
    /* deprecated cpu_offload moves to offload_optimizer */
    ck_assert_int_eq(warnings_of(cases[17].file, "zero_optimization.cpu_offload: deprecated", NULL, &cfg), 1);
    ck_assert_int_eq(cfg->zero.offload_optimizer.device, CT_OFFLOAD_CPU);
    ct_config_free(cfg);
    /* legacy "bfloat16" with "auto": bf16 where the GPU supports it */
    ct_config_opts gpu = {.world_size = 1, .has_gpu = true, .gpu_supports_bf16 = true};
    warnings_of(cases[14].file, "", &gpu, &cfg);
    ck_assert(cfg->bf16 && !cfg->fp16.enabled);
    ct_config_free(cfg);
    /* stage3_ names without the prefix, and "auto" buckets -> DeepSpeed's defaults */
    warnings_of(cases[4].file, "", NULL, &cfg);
    ck_assert(cfg->zero.max_live_parameters == 0 && cfg->zero.max_reuse_distance == 0 && cfg->zero.sub_group_size == 0);
    ck_assert(cfg->zero.prefetch_bucket_size == 5e7 && cfg->zero.param_persistence_threshold == 1e5 &&
              cfg->zero.reduce_bucket_size == 5e8);
    ck_assert(cfg->zero.offload_param.device == CT_OFFLOAD_CPU && cfg->zero.offload_optimizer.device == CT_OFFLOAD_CPU);
    ct_config_free(cfg);
    /* Lamb and its parameters; sparse_attention said once, as a line of its own (the model's layers,
       not DeepSpeed's engine, read it), not in the generic list */
    ck_assert_int_eq(warnings_of(cases[24].file, "keys read but not used by ctrain: sparse_attention", NULL, &cfg), 0);
    ct_not_yet lines[CT_NOT_YET_MAX];
    int n_lines = ct_config_not_yet(cfg, lines, CT_NOT_YET_MAX), sparse = 0;
    for (int i = 0; i < n_lines && i < CT_NOT_YET_MAX; i++) sparse += strcmp(lines[i].path, "sparse_attention") == 0;
    ck_assert_int_eq(sparse, 1);
    ck_assert(cfg->optimizer.type == CT_OPT_LAMB && cfg->optimizer.max_coeff == 0.3 && cfg->optimizer.min_coeff == 0.01);
    ct_config_free(cfg);
    /* WarmupLR numbers; Adam betas; fp16 settings */
    warnings_of(cases[18].file, "", NULL, &cfg);
    ck_assert(cfg->scheduler.type == CT_SCHED_WARMUP_LR && cfg->optimizer.beta1 == 0.8);
    ck_assert(cfg->fp16.enabled && cfg->fp16.initial_scale_power == 15 && cfg->fp16.loss_scale_window == 500);
    ct_config_free(cfg);
    /* WarmupDecayLR with "auto" total: the run's total (-1 until the trainer knows it) */
    warnings_of(cases[10].file, "", NULL, &cfg);
    ck_assert(cfg->scheduler.type == CT_SCHED_WARMUP_DECAY_LR && cfg->scheduler.total_num_steps == -1);
    ct_config_free(cfg);
    /* steps_per_print written as a float */
    warnings_of(cases[7].file, "", NULL, &cfg);
    ck_assert_int_eq(cfg->steps_per_print, 100000);
    ct_config_free(cfg);
    /* legacy curriculum: accepted, difficulty_step 4 warned about (as DeepSpeed logs) */
    ck_assert_int_eq(warnings_of(cases[6].file, "difficulty_step: 4 is not a multiple of 8", NULL, NULL), 1);
    /* prescale + predivide factor (the file's progressive layer drop switched off: refused when on) */
    const char *no_pld[] = {"progressive_layer_drop.enabled=false"};
    ct_config_opts pld_off = {.world_size = 1, .overrides = no_pld, .n_overrides = 1};
    ck_assert_int_eq(warnings_of(cases[23].file, "keys read but not used by ctrain: progressive_layer_drop", &pld_off,
                                 &cfg), 1);
    ck_assert(cfg->prescale_gradients && cfg->gradient_predivide_factor == 8);
    ct_config_free(cfg);
    /* eigenvalue on, quantize_training without "enabled" (DeepSpeed's default: off): accepted, with
       a line saying the eigenvalues are not computed, which cannot change what is trained */
    warnings_of(cases[30].file, "", NULL, &cfg);
    ct_not_yet ny[CT_NOT_YET_MAX];
    int n = ct_config_not_yet(cfg, ny, CT_NOT_YET_MAX);
    ck_assert_int_eq(n, 1);
    ck_assert_str_eq(ny[0].path, "eigenvalue.enabled");
    ct_config_free(cfg);
}
END_TEST

int main(void) {
    for (int i = 0; i < CT_ARRAY_LEN(corpus_dirs) && !corpus; i++) {
        DIR *d = opendir(corpus_dirs[i]);
        if (d) {
            closedir(d);
            corpus = corpus_dirs[i];
        }
    }
    if (!corpus) {
        printf("DeepSpeed config corpus not found at %s (run from the repository root)\n", corpus_dirs[0]);
        return 1;
    }
    Suite *su = suite_create("conformance");
    TCase *tc = tcase_create("corpus");
    tcase_add_test(tc, table_covers_corpus);
    tcase_add_loop_test(tc, corpus_world_1, 0, CT_ARRAY_LEN(cases));
    tcase_add_loop_test(tc, corpus_world_8, 0, CT_ARRAY_LEN(cases));
    tcase_add_test(tc, corpus_details);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
