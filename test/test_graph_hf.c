/* test_graph_hf.c: the maps of Hugging Face's tensor names read off the graph
 * (core/graph/hf_gpt2.c, hf_llama.c): what each entry fills and how, for the block shorthands and
 * the same layers written by hand, every value at its position, and a refusal naming the layer for
 * a model of another shape. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test/graph_fixture.h"

/* The map of GPT-2's names read off the graph (core/graph/hf_gpt2.c): what each entry fills and
 * how, the same for the block shorthand and for the layers written by hand under other names,
 * and a clear refusal naming the layer for every model of another shape. */
static const ct_tmap_entry *map_entry(const ct_tensor_map *m, const char *name) {
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->entries[i].name, name) == 0) return &m->entries[i];
    ck_abort_msg("no map entry %s", name);
    return NULL;
}

static void expect_map_refused(const char *text, const char *part1, const char *part2) {
    built b;
    expect_ok(text, &b);
    ct_tensor_map m;
    ct_err err = {0};
    ck_assert_int_eq(ct_hf_gpt2_map(b.g, &m, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, part1) && strstr(err.msg, part2), "message lacks \"%s\"/\"%s\": %s", part1,
                  part2, err.msg);
    ck_assert_ptr_null(m.entries);
    unbuild(&b);
}

#define GPT_PADDED_TAIL "]}, {\"type\": \"layernorm\", \"name\": \"ln_f\"}, {\"type\": \"linear\", \"name\": \"head\", \"out\": 32," \
                        " \"bias\": false, \"tie\": \"wte.weight\"}], \"loss\": {\"type\": \"cross_entropy\", \"classes\": 27}}"

START_TEST(hf_gpt2_map_from_structure) {
    const char *names[] = {"wte.weight", "transformer.h.11.attn.c_attn.weight"};
    ck_assert(ct_hf_gpt2_names(names, 2));
    const char *ours[] = {"wte.weight", "h.ln1.0.weight", "qkv.0.weight", "h.x", "h.1x"};
    ck_assert(!ct_hf_gpt2_names(ours, 5));

    built a, b;
    expect_ok(GPT_HEAD "{\"type\": \"transformer_block\", \"heads\": 2}" GPT_PADDED_TAIL, &a);
    /* the same network by hand, every layer under another name */
    expect_ok(GPT_HEAD "{\"type\": \"layernorm\", \"name\": \"n1\"}, " LIN("a", 48, "0.02") ","
              " {\"type\": \"causal_self_attention\", \"name\": \"sa\", \"heads\": 2}, " LIN("b", 16, "0.01") ","
              " {\"type\": \"add\", \"name\": \"r1\", \"inputs\": [\"block_input\", \"b\"]},"
              " {\"type\": \"layernorm\", \"name\": \"n2\"}, " LIN("c", 64, "0.02") ", {\"type\": \"gelu\", \"approximate\": \"tanh\"},"
              " " LIN("d", 16, "0.01") ", {\"type\": \"add\", \"name\": \"r2\", \"inputs\": [\"r1\", \"d\"]}" GPT_PADDED_TAIL, &b);
    ct_tensor_map ma, mb;
    ct_err err = {0};
    ck_assert_int_eq(ct_hf_gpt2_map(a.g, &ma, &err), CT_OK);
    ck_assert_int_eq(ct_hf_gpt2_map(b.g, &mb, &err), CT_OK);
    ck_assert_int_eq(ma.n, 2 + 2 * 12 + 2 + 1);
    ck_assert_int_eq(mb.n, ma.n);
    const ct_param_layout *L = ct_graph_layout(a.g);
    for (int i = 0; i < ma.n; i++) {
        ck_assert_str_eq(ma.entries[i].name, mb.entries[i].name);
        ck_assert_int_eq(ma.entries[i].view, mb.entries[i].view);
        ck_assert_int_eq(ma.entries[i].transpose, mb.entries[i].transpose);
        ck_assert_int_eq(ma.entries[i].rows, mb.entries[i].rows);
    }
    const ct_tmap_entry *e = map_entry(&ma, "h.1.attn.c_attn.weight");
    ck_assert_str_eq(L->views[e->view].name, "qkv.1.weight");
    ck_assert(e->transpose && e->rows == 48 && !e->duplicate);
    e = map_entry(&ma, "h.0.mlp.c_proj.weight");
    ck_assert_str_eq(L->views[e->view].name, "fc2.0.weight");
    ck_assert(e->transpose && e->rows == 16);
    e = map_entry(&ma, "h.0.mlp.c_fc.bias");
    ck_assert_str_eq(L->views[e->view].name, "fc1.0.bias");
    ck_assert(!e->transpose && e->rows == 64);
    e = map_entry(&ma, "h.1.ln_2.weight");
    ck_assert_str_eq(L->views[e->view].name, "ln2.1.weight");
    /* the padded vocabulary: 27 of wte's 32 rows are GPT-2's; lm_head is an optional copy */
    e = map_entry(&ma, "wte.weight");
    ck_assert(e->rows == 27 && !e->transpose && !e->duplicate);
    const ct_tmap_entry *head = map_entry(&ma, "lm_head.weight");
    ck_assert(head->duplicate && head->view == e->view && head->rows == 27);
    ck_assert_int_eq(map_entry(&ma, "wpe.weight")->rows, 8);
    ck_assert_int_eq(ma.n_ignored, 4);
    ck_assert_str_eq(ma.ignored[3], "h.1.attn.masked_bias");
    ck_assert_str_eq(ma.prefix, "transformer.");
    char cfg[512];
    ct_hf_gpt2_config(a.g, cfg, sizeof cfg);
    ck_assert_msg(strstr(cfg, "vocab_size=27, n_positions=8, n_embd=16, n_layer=2, n_head=2"), "%s", cfg);
    ct_tensor_map_free(&ma);
    ct_tensor_map_free(&mb);
    unbuild(&a);
    unbuild(&b);

    /* other shapes: each refused naming the layer */
    expect_map_refused(GPT_HEAD "{\"type\": \"transformer_block\", \"heads\": 2, \"bias\": false}" GPT_TAIL,
                       "\"qkv.0\" (linear)", "without bias");
    expect_map_refused(GPT_HEAD "{\"type\": \"transformer_block\", \"heads\": 2}" "]}, {\"type\": \"layernorm\", "
                       "\"name\": \"ln_f\"}, {\"type\": \"linear\", \"name\": \"head\", \"out\": 32, \"bias\": false}], "
                       "\"loss\": {\"type\": \"cross_entropy\"}}", "\"head\" (linear)", "tied to wte");
    expect_map_refused(GPT_HEAD "{\"type\": \"layernorm\", \"name\": \"n1\"}, " LIN("a", 48, "0.02") ","
                       " {\"type\": \"causal_self_attention\", \"name\": \"sa\", \"heads\": 2}, " LIN("b", 16, "0.01") ","
                       " {\"type\": \"add\", \"name\": \"r1\", \"inputs\": [\"block_input\", \"b\"]},"
                       " {\"type\": \"layernorm\", \"name\": \"n2\"}, " LIN("c", 64, "0.02") ", {\"type\": \"gelu\"},"
                       " " LIN("d", 16, "0.01") ", {\"type\": \"add\", \"name\": \"r2\", \"inputs\": [\"r1\", \"d\"]}" GPT_TAIL,
                       "\"c.0\" (linear)", "gelu with approximate tanh");
    expect_map_refused("{\"input\": [8], \"layers\": [" LIN("fc", 4, "0.1") "], \"loss\": {\"type\": \"mse\"}}",
                       "not GPT-2's shape", "layers holding parameters: 1, expected 4 + 6 per block");
}
END_TEST

/* Values at their places, not only shapes: a GPT-2 file whose every element says where it is
 * (tensor, row, column) is loaded through the map, checked element by element in ctrain's views
 * against GPT-2's layout as written here (independently of hf_gpt2.c's table: Conv1D weights are
 * [in, out], so the view holds their transpose; the vocabulary's padded rows are zero), then
 * exported back and compared with the file bit for bit. The square attn.c_proj.weight [C, C] is
 * what a shape check cannot tell from its transpose. */
typedef struct hf_tensor {
    const char *hf;              /* after "h.<b>." in a block */
    const char *ours;            /* ctrain's view: "<ours>.<b>.<suffix>" in a block, else as is */
    const char *suffix;
    int64_t rows, cols;          /* as GPT-2 stores it; cols 0: a vector */
    bool conv1d;
} hf_tensor;

static float hf_code(int t, int64_t i, int64_t j) { return (float)(t * 4096 + i * 64 + j) / 64.0f; }

START_TEST(hf_gpt2_values_at_their_positions) {
    enum { C = 16, V = 27, VP = 32, T = 8, BLOCKS = 2 };
    const hf_tensor block[] = {
        {"ln_1.weight", "ln1", "weight", C, 0, false}, {"ln_1.bias", "ln1", "bias", C, 0, false},
        {"attn.c_attn.weight", "qkv", "weight", C, 3 * C, true}, {"attn.c_attn.bias", "qkv", "bias", 3 * C, 0, false},
        {"attn.c_proj.weight", "proj", "weight", C, C, true}, {"attn.c_proj.bias", "proj", "bias", C, 0, false},
        {"ln_2.weight", "ln2", "weight", C, 0, false}, {"ln_2.bias", "ln2", "bias", C, 0, false},
        {"mlp.c_fc.weight", "fc1", "weight", C, 4 * C, true}, {"mlp.c_fc.bias", "fc1", "bias", 4 * C, 0, false},
        {"mlp.c_proj.weight", "fc2", "weight", 4 * C, C, true}, {"mlp.c_proj.bias", "fc2", "bias", C, 0, false}};
    const hf_tensor outer[] = {{"wte.weight", "wte.weight", NULL, V, C, false},
                               {"wpe.weight", "wpe.weight", NULL, T, C, false},
                               {"ln_f.weight", "ln_f.weight", NULL, C, 0, false},
                               {"ln_f.bias", "ln_f.bias", NULL, C, 0, false}};
    enum { N = 4 + 12 * BLOCKS };
    char hf_names[N][64], our_names[N][64];
    const hf_tensor *kind[N];
    for (int t = 0; t < N; t++) {
        kind[t] = t < 4 ? &outer[t] : &block[(t - 4) % 12];
        int b = (t - 4) / 12;
        if (t < 4) {
            snprintf(hf_names[t], 64, "%s", kind[t]->hf);
            snprintf(our_names[t], 64, "%s", kind[t]->ours);
        } else {
            snprintf(hf_names[t], 64, "h.%d.%s", b, kind[t]->hf);
            snprintf(our_names[t], 64, "%s.%d.%s", kind[t]->ours, b, kind[t]->suffix);
        }
    }
    /* the file: every element its code */
    ct_st_entry e[N];
    float *vals[N];
    for (int t = 0; t < N; t++) {
        int64_t r = kind[t]->rows, c = kind[t]->cols ? kind[t]->cols : 1;
        vals[t] = malloc(sizeof(float) * (size_t)(r * c));
        for (int64_t i = 0; i < r; i++)
            for (int64_t j = 0; j < c; j++) vals[t][i * c + j] = hf_code(t, i, j);
        e[t] = (ct_st_entry){.name = hf_names[t], .dtype = CT_F32, .data = vals[t],
                             .shape = kind[t]->cols ? (ct_shape){2, {r, c}} : (ct_shape){1, {r}}};
    }
    char dir[] = "/tmp/ct_test_hf_XXXXXX", file[64], ours_file[64], out_file[64];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(file, sizeof file, "%s/gpt2.safetensors", dir);
    snprintf(ours_file, sizeof ours_file, "%s/ours.safetensors", dir);
    snprintf(out_file, sizeof out_file, "%s/export.safetensors", dir);
    ct_err err = {0};
    ck_assert_msg(ct_st_write(file, e, N, NULL, NULL, 0, &err) == CT_OK, "%s", err.msg);

    built g;
    expect_ok(GPT_HEAD "{\"type\": \"transformer_block\", \"heads\": 2}" GPT_PADDED_TAIL, &g);
    const ct_param_layout *L = ct_graph_layout(g.g);
    ct_tensor_map map;
    ck_assert_int_eq(ct_hf_gpt2_map(g.g, &map, &err), CT_OK);
    float *params = calloc((size_t)L->n_params + 1, sizeof(float));
    float *buffers = calloc((size_t)L->n_buffers + 1, sizeof(float));
    for (int64_t i = 0; i < L->n_params; i++) params[i] = NAN;   /* whatever is not loaded shows */
    ct_ckpt_tensors ck;
    ct_ckpt_tensors_for(L, NULL, 0, L->n_params, params, buffers, &ck);
    int loaded = 0;
    ck_assert_msg(ct_ckpt_init_from_map(file, &ck, &map, &loaded, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(loaded, N);
    for (int t = 0; t < N; t++) {
        int v = ct_param_layout_find(L, our_names[t]);
        ck_assert_msg(v >= 0, "no view %s", our_names[t]);
        const ct_param_view *pv = &L->views[v];
        const float *got = params + pv->offset;
        int64_t r = kind[t]->rows, c = kind[t]->cols ? kind[t]->cols : 1;
        for (int64_t i = 0; i < r; i++)
            for (int64_t j = 0; j < c; j++) {
                /* ctrain's linear weight is [out, in]: GPT-2's Conv1D [in, out] transposed */
                float want = hf_code(t, i, j), at = kind[t]->conv1d ? got[j * r + i] : got[i * c + j];
                ck_assert_msg(at == want, "%s [%lld, %lld] -> %s: %g, want %g", hf_names[t], (long long)i, (long long)j,
                              our_names[t], (double)at, (double)want);
            }
        if (t == 0)   /* wte's padded rows (27..31) */
            for (int64_t k = V * C; k < VP * C; k++) ck_assert_msg(got[k] == 0.0f, "wte padding [%lld]", (long long)k);
    }
    /* export: ctrain's names in, GPT-2's layout out, bit for bit the file's */
    ct_st_entry ours[64];
    int n_ours = 0;
    for (int v = 0; v < L->n_views; v++)
        if (L->views[v].trainable)   /* (the tied head reads wte's view: no view of its own) */
            ours[n_ours++] = (ct_st_entry){.name = L->views[v].name, .dtype = CT_F32, .shape = L->views[v].shape,
                                           .data = params + L->views[v].offset};
    ck_assert_msg(ct_st_write(ours_file, ours, n_ours, NULL, NULL, 0, &err) == CT_OK, "%s", err.msg);
    ct_ckpt_source src;
    ck_assert_msg(ct_ckpt_source_open_file(ours_file, &src, &err) == CT_OK, "%s", err.msg);
    ct_mapped_export x;
    ck_assert_msg(ct_ckpt_map_export(&src, L->views, &map, CT_F32, &x, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(x.n, N);
    for (int t = 0; t < N; t++) {
        int k = -1;
        char want_name[80];
        snprintf(want_name, sizeof want_name, "transformer.%s", hf_names[t]);
        for (int i = 0; i < x.n; i++)
            if (strcmp(x.entries[i].name, want_name) == 0) k = i;
        ck_assert_msg(k >= 0, "export lacks %s", want_name);
        ck_assert_msg(ct_shape_eq(&x.entries[k].shape, &e[t].shape), "%s: exported shape differs", want_name);
        int64_t numel = ct_shape_numel(&e[t].shape);
        const float *xd = x.entries[k].data ? x.entries[k].data : x.entries[k].from_f32;
        for (int64_t i = 0; i < numel; i++)
            ck_assert_msg(xd[i] == vals[t][i], "%s [%lld]: exported %g, file %g", want_name, (long long)i,
                          (double)xd[i], (double)vals[t][i]);
    }
    ct_mapped_export_free(&x);
    ct_ckpt_source_close(&src);
    ct_tensor_map_free(&map);
    unbuild(&g);
    for (int t = 0; t < N; t++) free(vals[t]);
    free(params), free(buffers);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* The map of Llama's names read off the graph (core/graph/hf_llama.c): q_proj, k_proj, v_proj as
 * row blocks of the fused qkv, gate_proj and up_proj as the halves of gate_up, lm_head a duplicate
 * only when tied; other shapes refused naming the layer; the config.json an export writes. */
START_TEST(hf_llama_map_from_structure) {
    built a, t;
    expect_ok(LLAMA_HEAD "{\"type\": \"llama_block\", \"heads\": 4, \"kv_heads\": 2, \"intermediate\": 24}" LLAMA_TAIL, &a);
    ct_tensor_map m;
    ct_err err = {0};
    ck_assert_msg(ct_hf_llama_map(a.g, &m, &err) == CT_OK, "%s", err.msg);
    ck_assert_int_eq(m.n, 1 + 2 * 9 + 2);
    const ct_param_layout *L = ct_graph_layout(a.g);
    const ct_tmap_entry *q = map_entry(&m, "model.layers.1.self_attn.q_proj.weight");
    const ct_tmap_entry *k = map_entry(&m, "model.layers.1.self_attn.k_proj.weight");
    const ct_tmap_entry *v = map_entry(&m, "model.layers.1.self_attn.v_proj.weight");
    ck_assert_str_eq(L->views[q->view].name, "qkv.1.weight");
    ck_assert(q->view == k->view && k->view == v->view);
    ck_assert(q->row0 == 0 && q->rows == 16 && k->row0 == 16 && k->rows == 8 && v->row0 == 24 && v->rows == 8);
    const ct_tmap_entry *gate = map_entry(&m, "model.layers.0.mlp.gate_proj.weight");
    const ct_tmap_entry *up = map_entry(&m, "model.layers.0.mlp.up_proj.weight");
    ck_assert_str_eq(L->views[up->view].name, "gate_up.0.weight");
    ck_assert(gate->row0 == 0 && gate->rows == 24 && up->row0 == 24 && up->rows == 24);
    ck_assert_str_eq(L->views[map_entry(&m, "model.layers.0.self_attn.o_proj.weight")->view].name, "proj.0.weight");
    ck_assert_str_eq(L->views[map_entry(&m, "model.norm.weight")->view].name, "norm.weight");
    ck_assert(!map_entry(&m, "lm_head.weight")->duplicate && !map_entry(&m, "lm_head.weight")->transpose);
    ck_assert_int_eq(m.n_ignored, 2);
    ck_assert_str_eq(m.ignored[1], "model.layers.1.self_attn.rotary_emb.inv_freq");
    char *json = ct_hf_llama_config_json(a.g, "bfloat16");
    cJSON *c = cJSON_Parse(json);
    ck_assert_int_eq(cJSON_GetObjectItem(c, "num_key_value_heads")->valueint, 2);
    ck_assert_int_eq(cJSON_GetObjectItem(c, "intermediate_size")->valueint, 24);
    ck_assert_int_eq(cJSON_GetObjectItem(c, "max_position_embeddings")->valueint, 8);
    ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(c, "tie_word_embeddings")));
    ck_assert_str_eq(cJSON_GetObjectItem(c, "torch_dtype")->valuestring, "bfloat16");
    cJSON_Delete(c);
    free(json);
    ct_tensor_map_free(&m);
    unbuild(&a);
    /* tied: lm_head an optional copy of the embedding */
    expect_ok(LLAMA_HEAD "{\"type\": \"llama_block\", \"heads\": 4, \"intermediate\": 24}]}, {\"type\": \"rmsnorm\"},"
              " {\"type\": \"linear\", \"out\": 32, \"bias\": false, \"tie\": \"wte.weight\"}], \"loss\":"
              " {\"type\": \"cross_entropy\"}}", &t);
    ck_assert_msg(ct_hf_llama_map(t.g, &m, &err) == CT_OK, "%s", err.msg);
    const ct_tmap_entry *head = map_entry(&m, "lm_head.weight");
    ck_assert(head->duplicate && head->view == map_entry(&m, "model.embed_tokens.weight")->view);
    ck_assert(map_entry(&m, "model.layers.0.self_attn.k_proj.weight")->rows == 16);
    ct_tensor_map_free(&m);
    unbuild(&t);
    /* other shapes: refused naming the layer */
    built g;
    expect_ok(GPT_HEAD "{\"type\": \"transformer_block\", \"heads\": 2}" GPT_TAIL, &g);
    ck_assert_int_eq(ct_hf_llama_map(g.g, &m, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "not Llama's shape") && strstr(err.msg, "expected 3 + 6 per block"), "%s", err.msg);
    unbuild(&g);
    expect_ok(LLAMA_HEAD "{\"type\": \"rmsnorm\"}, " LIN_NB("qkv", 48, "0.02") ", {\"type\": \"causal_self_attention\","
              " \"name\": \"sa\", \"heads\": 4}, " LIN_NB("proj", 16, "0.02") ", {\"type\": \"add\", \"inputs\":"
              " [\"block_input\", \"proj\"]}, {\"type\": \"rmsnorm\"}, " LIN_NB("gu", 48, "0.02") ", {\"type\": \"swiglu\"},"
              " " LIN_NB("down", 16, "0.02") ", {\"type\": \"add\", \"inputs\": [\"prev\", \"down\"]}" LLAMA_TAIL, &g);
    ck_assert_int_eq(ct_hf_llama_map(g.g, &m, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "\"sa.0\"") && strstr(err.msg, "rope_theta"), "%s", err.msg);
    unbuild(&g);
}
END_TEST

int main(void) {
    Suite *s = suite_create("graph_hf");
    TCase *tc = tcase_create("graph_hf");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, hf_llama_map_from_structure);
    tcase_add_test(tc, hf_gpt2_map_from_structure);
    tcase_add_test(tc, hf_gpt2_values_at_their_positions);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
