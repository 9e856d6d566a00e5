/* fuzz_json.c: libFuzzer target for the config reader (core/util/json.c).
 *
 * Besides "no crash, no out-of-bounds read" (the sanitizers' job), it checks what the reader
 * promises: a failure is a config error located as "fuzz.json:LINE:COL: ..."; a success gives a
 * tree whose every node has a position, and that tree printed by cJSON reads back as strict JSON
 * (no warnings) into an equal tree. Build and run: test/fuzz/run_fuzz.sh fuzz_json SECONDS. */
#include <stdlib.h>
#include <string.h>

#include "core/util/json.h"

static void check(int ok) {
    if (!ok) __builtin_trap();
}

static void check_positions(const ct_json_doc *doc, const cJSON *node) {
    for (; node; node = node->next) {
        int line, col;
        check(ct_json_pos(doc, node, &line, &col) && line >= 1 && col >= 1);
        check(ct_json_value_pos(doc, node, &line, &col) && line >= 1 && col >= 1);
        check_positions(doc, node->child);
    }
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    ct_warnings warn = {0};
    ct_err err = {0};
    ct_json_doc *doc = ct_json_parse((const char *)data, size, "fuzz.json", &warn, &err);
    check(warn.n <= 3); /* one per accepted form at most */
    if (!doc) {
        check(err.code == CT_ERR_CONFIG);
        check(strncmp(err.msg, "fuzz.json:", 10) == 0 && err.msg[10] >= '1' && err.msg[10] <= '9');
        ct_warnings_free(&warn);
        return 0;
    }
    cJSON *root = ct_json_root(doc);
    check(root != NULL);
    check_positions(doc, root);
    char where[64];
    ct_json_where(doc, root, where, sizeof where);
    check(strncmp(where, "fuzz.json:", 10) == 0);

    char *text = cJSON_PrintUnformatted(root);
    check(text != NULL);
    ct_warnings warn2 = {0};
    ct_json_doc *again = ct_json_parse(text, strlen(text), "again.json", &warn2, &err);
    check(again != NULL && warn2.n == 0);
    check(cJSON_Compare(root, ct_json_root(again), 1));
    ct_json_free(again);
    free(text);
    ct_warnings_free(&warn2);
    ct_json_free(doc);
    ct_warnings_free(&warn);
    return 0;
}
