/* test_json.c: the config file reader (core/util/json.c): strict JSON, the accepted Hjson forms and
 * their warnings, positions, every error class, and robustness against malformed input. */
#include <check.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/util/json.h"

/* A byte-for-byte copy of the shared corpus, kept in the repository so a fresh clone can test it. */
#define CORPUS_DIR "test/conformance/ds_configs"

/* Parse exactly len bytes from a heap copy with no terminator, so any read past len is a bug
 * that AddressSanitizer (or the fuzzer build) reports. */
static ct_json_doc *parse_n(const char *src, size_t len, ct_warnings *w, ct_err *e) {
    char *copy = malloc(len ? len : 1);
    ck_assert_ptr_nonnull(copy);
    memcpy(copy, src, len);
    memset(e, 0, sizeof *e);
    ct_json_doc *doc = ct_json_parse(copy, len, "t.json", w, e);
    free(copy);
    return doc;
}

static ct_json_doc *parse_s(const char *src, ct_warnings *w, ct_err *e) { return parse_n(src, strlen(src), w, e); }

/* Parse src (len bytes) and require failure with CT_ERR_CONFIG and `want` in the message. */
static void expect_error_n(const char *src, size_t len, const char *want) {
    ct_warnings w = {0};
    ct_err e;
    ct_json_doc *doc = parse_n(src, len, &w, &e);
    ck_assert_msg(doc == NULL, "expected an error containing [%s] for input [%.*s]", want, (int)len, src);
    ck_assert_int_eq(e.code, CT_ERR_CONFIG);
    ck_assert_msg(strncmp(e.msg, "t.json:", 7) == 0, "message lacks FILE: prefix: %s", e.msg);
    ck_assert_msg(strstr(e.msg, want) != NULL, "message [%s] lacks [%s]", e.msg, want);
    ct_warnings_free(&w);
}

static void expect_error(const char *src, const char *want) { expect_error_n(src, strlen(src), want); }

/* Parse src, require success, the given unformatted print and exactly nwarn warnings. */
static void expect_ok(const char *src, const char *printed, int nwarn) {
    ct_warnings w = {0};
    ct_err e;
    ct_json_doc *doc = parse_s(src, &w, &e);
    ck_assert_msg(doc != NULL, "parse of [%s] failed: %s", src, e.msg);
    char *out = cJSON_PrintUnformatted(ct_json_root(doc));
    ck_assert_str_eq(out, printed);
    ck_assert_msg(w.n == nwarn, "[%s]: %d warnings, expected %d (first: %s)", src, w.n, nwarn, w.n ? w.items[0] : "");
    free(out);
    ct_json_free(doc);
    ct_warnings_free(&w);
}

static void expect_pos(const ct_json_doc *doc, const cJSON *node, int line, int col) {
    int l, c;
    ck_assert_ptr_nonnull(node);
    ck_assert(ct_json_pos(doc, node, &l, &c));
    ck_assert_msg(l == line && c == col, "position %d:%d, expected %d:%d", l, c, line, col);
}

/* Every node of the tree has a position inside the document. */
static void check_all_positions(const ct_json_doc *doc, const cJSON *node) {
    for (; node; node = node->next) {
        int l, c;
        ck_assert(ct_json_pos(doc, node, &l, &c));
        ck_assert(l >= 1 && c >= 1);
        check_all_positions(doc, node->child);
    }
}

START_TEST(test_strict_round_trip) {
    expect_ok("{\"a\": 1, \"b\": [true, false, null], \"c\": {\"d\": \"x\\\"y\\\\z\\/\\b\\f\\n\\r\\t\"},"
              " \"e\": -0.5e-3, \"f\": 5e8, \"g\": 1E14, \"h\": [], \"i\": {}, \"j\": \"\\u00e9\\u4e2d\"}",
              "{\"a\":1,\"b\":[true,false,null],\"c\":{\"d\":\"x\\\"y\\\\z/\\b\\f\\n\\r\\t\"},\"e\":-0.0005,"
              "\"f\":500000000,\"g\":100000000000000,\"h\":[],\"i\":{},\"j\":\"\xc3\xa9\xe4\xb8\xad\"}",
              0);
    expect_ok("\r\n\t [ 0 , -0 , 123456789 , 1.5 , 2e-2 , 2E+2 ] \n", "[0,-0,123456789,1.5,0.02,200]", 0);
    expect_ok("\"top\"", "\"top\"", 0);
    expect_ok("42", "42", 0);
    expect_ok("null", "null", 0);
    /* surrogate pair -> one 4-byte UTF-8 character */
    expect_ok("[\"\\ud83d\\ude00\", \"\\uD834\\uDD1E\"]", "[\"\xf0\x9f\x98\x80\",\"\xf0\x9d\x84\x9e\"]", 0);
    /* raw multi-byte UTF-8 passes through */
    expect_ok("{\"k\xc3\xa9y\": \"\xe2\x82\xac \xf0\x9f\x98\x80\"}", "{\"k\xc3\xa9y\":\"\xe2\x82\xac \xf0\x9f\x98\x80\"}", 0);
    /* large integers used by DeepSpeed configs are exact in a double */
    ct_warnings w = {0};
    ct_err e;
    ct_json_doc *doc = parse_s("[5e8, 1e14, 9007199254740992, 1e-999]", &w, &e);
    ck_assert_ptr_nonnull(doc);
    cJSON *r = ct_json_root(doc);
    ck_assert(cJSON_GetArrayItem(r, 0)->valuedouble == 5e8);
    ck_assert(cJSON_GetArrayItem(r, 1)->valuedouble == 1e14);
    ck_assert(cJSON_GetArrayItem(r, 2)->valuedouble == 9007199254740992.0);
    ck_assert(cJSON_GetArrayItem(r, 3)->valuedouble == 0.0); /* underflow is zero, as in Python */
    ct_json_free(doc);
}
END_TEST

START_TEST(test_positions) {
    const char *src = "{\n"
                      "  \"a\": 1,\n"
                      "  \"b\": {\"c\": [10, {\"d\": true}]},\n"
                      "\t\"e\": \"x\"\n"
                      "}";
    ct_warnings w = {0};
    ct_err e;
    ct_json_doc *doc = parse_s(src, &w, &e);
    ck_assert_ptr_nonnull(doc);
    cJSON *root = ct_json_root(doc);
    expect_pos(doc, root, 1, 1);
    expect_pos(doc, cJSON_GetObjectItem(root, "a"), 2, 3);
    cJSON *b = cJSON_GetObjectItem(root, "b");
    expect_pos(doc, b, 3, 3);
    cJSON *c = cJSON_GetObjectItem(b, "c");
    expect_pos(doc, c, 3, 9);
    expect_pos(doc, cJSON_GetArrayItem(c, 0), 3, 15);
    cJSON *inner = cJSON_GetArrayItem(c, 1);
    expect_pos(doc, inner, 3, 19);
    expect_pos(doc, cJSON_GetObjectItem(inner, "d"), 3, 20);
    expect_pos(doc, cJSON_GetObjectItem(root, "e"), 4, 2); /* a tab is one column */
    int l, col;
    ck_assert(ct_json_value_pos(doc, b, &l, &col));
    ck_assert_int_eq(l, 3);
    ck_assert_int_eq(col, 8);
    ck_assert(ct_json_value_pos(doc, cJSON_GetObjectItem(inner, "d"), &l, &col));
    ck_assert_int_eq(col, 25);
    ck_assert(ct_json_value_pos(doc, cJSON_GetObjectItem(root, "e"), &l, &col));
    ck_assert_int_eq(l, 4);
    ck_assert_int_eq(col, 7);
    char buf[64];
    ck_assert_str_eq(ct_json_where(doc, cJSON_GetObjectItem(root, "e"), buf, sizeof buf), "t.json:4:2");
    ck_assert_str_eq(ct_json_filename(doc), "t.json");
    ck_assert_int_eq(w.n, 0);
    check_all_positions(doc, root);
    ct_json_free(doc);
}
END_TEST

START_TEST(test_origin) {
    ct_warnings w = {0};
    ct_err e;
    ct_json_doc *doc = parse_s("{\"a\": 1, \"b\": 2}", &w, &e);
    ck_assert_ptr_nonnull(doc);
    cJSON *root = ct_json_root(doc);
    char buf[64];
    cJSON *added = cJSON_CreateNumber(3);
    int l = -1, c = -1;
    ck_assert(!ct_json_pos(doc, added, &l, &c));
    ck_assert(l == 0 && c == 0);
    ck_assert_ptr_null(ct_json_origin(doc, added));
    ck_assert_str_eq(ct_json_where(doc, added, buf, sizeof buf), "t.json");
    ct_json_set_origin(doc, added, "--set");
    ck_assert_str_eq(ct_json_origin(doc, added), "--set");
    ck_assert_str_eq(ct_json_where(doc, added, buf, sizeof buf), "--set");
    ck_assert(!ct_json_pos(doc, added, &l, &c));
    ct_json_set_origin(doc, added, "--set train_batch_size=8"); /* replacing an origin */
    ck_assert_str_eq(ct_json_where(doc, added, buf, sizeof buf), "--set train_batch_size=8");
    cJSON_AddItemToObject(root, "c", added);
    ck_assert_ptr_null(ct_json_origin(doc, cJSON_GetObjectItem(root, "a")));
    /* forgetting a node drops its position; a small buffer truncates safely */
    cJSON *a = cJSON_GetObjectItem(root, "a");
    ck_assert_str_eq(ct_json_where(doc, a, buf, 5), "t.js");
    ct_json_forget(doc, a);
    ck_assert(!ct_json_pos(doc, a, &l, &c));
    expect_pos(doc, cJSON_GetObjectItem(root, "b"), 1, 10);
    /* many later insertions (table growth) keep earlier entries */
    cJSON *arr = cJSON_AddArrayToObject(root, "many");
    for (int i = 0; i < 500; i++) {
        cJSON *n = cJSON_CreateNumber(i);
        cJSON_AddItemToArray(arr, n);
        ct_json_set_origin(doc, n, i % 2 ? "--set" : "--model");
    }
    ck_assert_str_eq(ct_json_origin(doc, cJSON_GetArrayItem(arr, 7)), "--set");
    ck_assert_str_eq(ct_json_origin(doc, cJSON_GetArrayItem(arr, 8)), "--model");
    expect_pos(doc, cJSON_GetObjectItem(root, "b"), 1, 10);
    ck_assert(!ct_json_pos(doc, a, &l, &c));
    ck_assert_str_eq(ct_json_where(NULL, NULL, buf, sizeof buf), "<config>");
    ct_json_free(doc);
}
END_TEST

/* Each accepted Hjson form alone: exactly one warning, naming its line:column. */
START_TEST(test_hjson_forms) {
    static const struct {
        const char *src, *printed, *warning;
    } cases[] = {
        {"{\"a\": 1,}", "{\"a\":1}", "t.json:1:8: trailing comma (accepted, as DeepSpeed does)"},
        {"[1,\n 2,\n]", "[1,2]", "t.json:2:3: trailing comma (accepted, as DeepSpeed does)"},
        {"{\"a\": [1,], \"b\": {\"c\": 2,},}", "{\"a\":[1],\"b\":{\"c\":2}}",
         "t.json:1:9: trailing comma (accepted, as DeepSpeed does)"},
        {"{\n  \"a\": 1\n  \"b\": 2\n  \"c\": 3\n}", "{\"a\":1,\"b\":2,\"c\":3}",
         "t.json:2:9: missing comma between members; a newline separates them (accepted, as DeepSpeed does)"},
        {"{\"a\": {\"x\": 1}\n\n\t\"b\": [1\n2]}", "{\"a\":{\"x\":1},\"b\":[1,2]}",
         "t.json:1:15: missing comma between members; a newline separates them (accepted, as DeepSpeed does)"},
        {"[\"a\"\n \"b\"]", "[\"a\",\"b\"]",
         "t.json:1:5: missing comma between elements; a newline separates them (accepted, as DeepSpeed does)"},
        {"// header\n{\"a\": 1} // tail", "{\"a\":1}", "t.json:1:1: comment (accepted, as DeepSpeed does)"},
        {"{\"a\": 1, # why\n \"b\": 2 # more\n}", "{\"a\":1,\"b\":2}",
         "t.json:1:10: comment (accepted, as DeepSpeed does)"},
        {"{\"a\": /* one\n two * / */ 1 /**/}", "{\"a\":1}", "t.json:1:7: comment (accepted, as DeepSpeed does)"},
        {"{\"a\": 1 // comment, then newline\n \"b\": 2}", NULL, NULL}, /* two kinds: checked below */
    };
    for (int i = 0; i < CT_ARRAY_LEN(cases); i++) {
        if (!cases[i].warning) continue;
        ct_warnings w = {0};
        ct_err e;
        ct_json_doc *doc = parse_s(cases[i].src, &w, &e);
        ck_assert_msg(doc != NULL, "case %d: %s", i, e.msg);
        char *out = cJSON_PrintUnformatted(ct_json_root(doc));
        ck_assert_str_eq(out, cases[i].printed);
        ck_assert_msg(w.n == 1, "case %d: %d warnings", i, w.n);
        ck_assert_str_eq(w.items[0], cases[i].warning);
        free(out);
        ct_json_free(doc);
        ct_warnings_free(&w);
    }
}
END_TEST

/* All forms in one file, several times each: one warning per kind, the first occurrence. */
START_TEST(test_hjson_once_per_kind) {
    const char *src = "{\n"
                      "  // c1\n"
                      "  \"a\": 1,   # c2\n"
                      "  \"b\": [1, 2,],\n"
                      "  \"c\": 3\n"
                      "  \"d\": [4\n"
                      "        5],\n"
                      "  /* c3 */ \"e\": {\"f\": 1,},\n"
                      "}\n";
    ct_warnings w = {0};
    ct_err e;
    ct_json_doc *doc = parse_s(src, &w, &e);
    ck_assert_msg(doc != NULL, "%s", e.msg);
    char *out = cJSON_PrintUnformatted(ct_json_root(doc));
    ck_assert_str_eq(out, "{\"a\":1,\"b\":[1,2],\"c\":3,\"d\":[4,5],\"e\":{\"f\":1}}");
    free(out);
    ck_assert_int_eq(w.n, 3);
    ck_assert_str_eq(w.items[0], "t.json:2:3: comment (accepted, as DeepSpeed does)");
    ck_assert_str_eq(w.items[1], "t.json:4:13: trailing comma (accepted, as DeepSpeed does)");
    ck_assert_str_eq(w.items[2],
                     "t.json:5:9: missing comma between members; a newline separates them (accepted, as DeepSpeed "
                     "does)");
    expect_pos(doc, cJSON_GetObjectItem(ct_json_root(doc), "e"), 8, 12);
    ct_json_free(doc);
    ct_warnings_free(&w);
    /* a newline inside a comment counts as the separating newline */
    expect_ok("{\"a\": 1 /* x\n */ \"b\": 2}", "{\"a\":1,\"b\":2}", 2);
    /* no newline: not accepted */
    expect_error("{\"a\": 1 /* x */ \"b\": 2}", "1:17: expected ',' or '}' after member \"a\", got '\"'");
    expect_error("[1 2]", "1:4: expected ',' or ']' after element [0], got '2'");
}
END_TEST

START_TEST(test_duplicate_keys) {
    expect_error("{\n  \"fp16\": {},\n  \"bf16\": {},\n\n  \"fp16\": {}\n}",
                 "t.json:5:3: duplicate key \"fp16\" (first at 2:3)");
    expect_error("{\"zero_optimization\": {\n    \"stage\": 2,\n    \"stage\": 3}}",
                 "t.json:3:5: zero_optimization: duplicate key \"stage\" (first at 2:5)");
    expect_error("{\"a\": [{\"x\": 1}, {\"y\": 1, \"y\": 2}]}", "t.json:1:27: a[1]: duplicate key \"y\" (first at 1:19)");
    /* decoded keys are compared: \u0061 is "a" */
    expect_error("{\"a\": 1, \"\\u0061\": 2}", "1:10: duplicate key \"a\" (first at 1:2)");
    /* the same key in different objects is fine */
    expect_ok("{\"a\": {\"k\": 1}, \"b\": {\"k\": 2}, \"k\": [{\"k\": 3}, {\"k\": 4}]}",
              "{\"a\":{\"k\":1},\"b\":{\"k\":2},\"k\":[{\"k\":3},{\"k\":4}]}", 0);
    expect_ok("{\"\": 1, \"A\": 2, \"a\": 3}", "{\"\":1,\"A\":2,\"a\":3}", 0);
    expect_error("{\"\": 1, \"\": 2}", "duplicate key \"\" (first at 1:2)");
}
END_TEST

START_TEST(test_placeholders) {
    expect_error("{\n  \"train_batch_size\": GBSIZE,\n  \"x\": 1\n}",
                 "t.json:2:23: train_batch_size: unquoted word GBSIZE: looks like a template placeholder; replace it "
                 "with a value");
    expect_error("{\"a\": {\"min\": CL_1st_MIN}}", "t.json:1:15: a.min: unquoted word CL_1st_MIN: looks like a template");
    expect_error("[${BATCH}]", "1:2: [0]: unquoted word ${BATCH}: looks like a template placeholder");
    expect_error("[$BATCH]", "unquoted word $BATCH: looks like a template placeholder");
    /* the other placeholders are listed (not those in strings, comments or lowercase words) */
    expect_error("{\"a\": GBSIZE, \"b\": \"MBSIZE\", /* X_Y */ \"c\": [MBSIZE, 1e5, adam],\n \"d\": ${LR}}",
                 "1:7: a: unquoted word GBSIZE: looks like a template placeholder; replace it with a value\n"
                 "  2 more placeholders follow: MBSIZE (1:46), ${LR} (2:7); this file is a template");
    expect_error("[A_B, C_D, E_F, G_H, I_J, K_L]", "5 more placeholders follow: C_D (1:7), E_F (1:12), G_H (1:17), "
                                                    "I_J (1:22), ...; this file");
    expect_error("[A_B, \"C_D]", "[0]: unquoted word A_B: looks like a template placeholder; replace it with a value");
    expect_error("{\"type\": adam}", "1:10: type: unquoted word adam: strings must be in double quotes (\"adam\")");
    expect_error("{\"enabled\": True}", "unquoted word True: JSON literals are lowercase; write true");
    expect_error("[FALSE]", "write false");
    expect_error("[None]", "write null");
    expect_error("[NaN]", "1:2: [0]: NaN is not a JSON number");
    expect_error("[Infinity]", "Infinity is not a JSON number");
    expect_error("[-Infinity]", "1:2: [0]: -Infinity is not a JSON number");
    expect_error("[truex]", "unquoted word truex");
    expect_error("[nul]", "unquoted word nul");
    expect_error("{a: 1}", "1:2: unquoted key a: object keys must be in double quotes (\"a\")");
    /* a very long word is shortened in the message */
    char longw[300];
    memset(longw, 'Q', sizeof longw);
    longw[0] = '[';
    memcpy(longw + sizeof longw - 2, "]", 2);
    ct_warnings w = {0};
    ct_err e;
    ck_assert_ptr_null(parse_s(longw, &w, &e));
    ck_assert(strstr(e.msg, "QQQ...") != NULL);
    ck_assert(strlen(e.msg) < 200);
}
END_TEST

START_TEST(test_syntax_errors) {
    static const struct {
        const char *src, *want;
    } cases[] = {
        {"", "t.json:1:1: empty file: expected a JSON object"},
        {"  \n\t ", "t.json:1:1: empty file: expected a JSON object"},
        {"{\"a\": 1", "t.json:1:8: expected ',' or '}' (the object opened at 1:1 is not closed), got end of file"},
        {"[1, 2", "1:6: expected ',' or ']' (the array opened at 1:1 is not closed)"},
        {"{\"a\": 1 \"b\": 2}", "1:9: expected ',' or '}' after member \"a\", got '\"'"},
        {"{\"a\" 1}", "1:6: expected ':' after key \"a\", got '1'"},
        {"{\"a\":}", "1:6: a: expected a value, got '}'"},
        {"{\"a\":", "1:6: a: unexpected end of file: expected a value"},
        {"{\"a\": \"abc", "1:7: a: unterminated string: no closing quote"},
        {"{\"a\": \"ab\ncd\"}", "1:7: a: unterminated string: the line ends before the closing quote"},
        {"[\"a\\", "1:4: [0]: unterminated string: the file ends after a backslash"},
        {"{\"a\": \"a\\qb\"}", "1:9: a: invalid escape: backslash followed by 'q'"},
        {"[\"\\x41\"]", "invalid escape: backslash followed by 'x'"},
        {"[\"\\u12G4\"]", "1:3: [0]: invalid \\u escape: expected 4 hex digits"},
        {"[\"\\u12", "invalid \\u escape"},
        {"[\"\\ud83d\"]", "1:3: [0]: lone high surrogate \\uD83D"},
        {"[\"\\ud83d\\u0041\"]", "lone high surrogate \\uD83D"},
        {"[\"\\ud83dx\"]", "lone high surrogate"},
        {"[\"\\ude00\"]", "lone low surrogate \\uDE00"},
        {"[\"\\u0000\"]", "\\u0000 (NUL) is not supported"},
        {"[\"a\tb\"]", "1:4: [0]: control character 0x09 inside a string"},
        {"[\"a\x1f\"]", "control character 0x1F"},
        {"[1e999]", "1:2: [0]: number out of range: 1e999 does not fit in a double"},
        {"[-1e999]", "number out of range: -1e999"},
        {"[1" "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
         "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
         "000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
         "0000000000000000000000]",
         "number out of range"},
        {"[007]", "1:2: [0]: invalid number 007: leading zeros are not allowed"},
        {"[-01]", "invalid number -01: leading zeros"},
        {"[-]", "invalid number -: expected a digit after '-'"},
        {"[1.]", "invalid number 1.: expected a digit after '.'"},
        {"[1.e5]", "invalid number 1.e5: expected a digit after '.'"},
        {"[1e]", "invalid number 1e: expected digits in the exponent"},
        {"[1e+]", "expected digits in the exponent"},
        {"[.5]", "invalid number .5: JSON numbers need a digit before '.'"},
        {"[+1]", "invalid number +1: JSON numbers cannot start with '+'"},
        {"[0x1F]", "invalid number 0x1F: unexpected characters after the number"},
        {"[1.2.3]", "invalid number 1.2.3"},
        {"[12abc]", "invalid number 12abc"},
        {"{\"a\": 1} x", "1:10: expected end of file after the value that starts at 1:1, got 'x'"},
        {"{\"a\": 1}}", "1:9: expected end of file"},
        {"{} {}", "expected end of file"},
        {"{'a': 1}", "1:2: single-quoted key"},
        {"['a']", "1:2: [0]: single-quoted string"},
        {"[1,,2]", "1:4: [1]: expected a value, got ','"},
        {"[,]", "1:2: [0]: expected a value, got ','"},
        {"{,}", "1:2: expected a key in double quotes, got ','"},
        {"{\"a\": 1,,}", "expected a key in double quotes, got ','"},
        {"[1,]]", "expected end of file"},
        {"/* open", "1:1: unterminated block comment"},
        {"{\"a\": 1 /* x", "unterminated block comment"},
        {"/ 1", "1:1: expected a value, got '/'"},
        {"{\"a\": 1}\n/", "2:1: expected end of file"},
        {"{\"a\": @}", "1:7: a: expected a value, got '@'"},
        {"{\"a\": \xe2\x80\x9cx\xe2\x80\x9d}", "1:7: a: typographic quote U+201C"},
        {"{\"a\": \xc2\xa0 1}", "expected a value, got U+00A0"},
        {"{\"a\": 1\n b: 2}", "2:2: unquoted key b: object keys must be in double quotes"},
        {"[1,\n 2\n GBSIZE]", "3:2: unquoted word GBSIZE: looks like a template placeholder"},
        {"[1\n adam]", "2:2: unquoted word adam: strings must be in double quotes"},
        {"{\"a\": 1 b: 2}", "1:9: expected ',' or '}' after member \"a\", got 'b'"},
        {"[\"x\"}", "1:5: expected ',' or ']' after element [0], got '}'"},
        {"{\"a\": 1]", "1:8: expected ',' or '}' after member \"a\", got ']'"},
    };
    for (int i = 0; i < CT_ARRAY_LEN(cases); i++) expect_error(cases[i].src, cases[i].want);
}
END_TEST

START_TEST(test_depth) {
    char buf[2 * CT_JSON_MAX_DEPTH + 4];
    int n = CT_JSON_MAX_DEPTH;
    for (int i = 0; i < n; i++) buf[i] = '[', buf[n + i] = ']';
    ct_warnings w = {0};
    ct_err e;
    ct_json_doc *doc = parse_n(buf, 2 * (size_t)n, &w, &e);
    ck_assert_msg(doc != NULL, "%d levels must parse: %s", n, e.msg);
    ct_json_free(doc);
    /* one more level is an error, with the column of the offending bracket */
    n = CT_JSON_MAX_DEPTH + 1;
    for (int i = 0; i < n; i++) buf[i] = '[', buf[n + i] = ']';
    expect_error_n(buf, 2 * (size_t)n, "t.json:1:65: [0][0]");
    expect_error_n(buf, 2 * (size_t)n, "nesting deeper than 64 levels");
    /* 10000 levels must not overflow the stack, for objects and arrays */
    size_t big = 10000;
    char *deep = malloc(big * 6);
    memset(deep, '[', big);
    expect_error_n(deep, big, "nesting deeper than 64 levels");
    for (size_t i = 0; i < big; i++) memcpy(deep + 6 * i, "{\"a\":[", 6);
    expect_error_n(deep, big * 6, "nesting deeper than 64 levels");
    free(deep);
}
END_TEST

START_TEST(test_utf8) {
    static const struct {
        const char *src;
        size_t len;
        const char *want;
    } cases[] = {
        {"[\"\xff\"]", 5, "1:3: [0]: invalid UTF-8 at byte offset 2 (byte 0xFF)"},
        {"[\"\xc0\x80\"]", 6, "invalid UTF-8 at byte offset 2 (byte 0xC0)"},          /* overlong NUL */
        {"[\"\xe0\x80\xaf\"]", 7, "invalid UTF-8 at byte offset 2 (byte 0xE0)"},      /* overlong '/' */
        {"[\"\xed\xa0\x80\"]", 7, "invalid UTF-8 at byte offset 2 (byte 0xED)"},      /* surrogate */
        {"[\"\xf4\x90\x80\x80\"]", 8, "invalid UTF-8 at byte offset 2 (byte 0xF4)"},  /* > U+10FFFF */
        {"[\"ab\xe2\x82\"]", 8, "invalid UTF-8 at byte offset 4 (byte 0xE2)"},        /* truncated */
        {"[\"\xe2\x82", 4, "invalid UTF-8 at byte offset 2"},                          /* truncated at EOF */
        {"[\"\x80\"]", 5, "invalid UTF-8 at byte offset 2 (byte 0x80)"},              /* lone continuation */
        {"\xff", 1, "1:1: invalid UTF-8 at byte offset 0 (byte 0xFF)"},
        {"{\"a\": 1}\n// \xfe\n", 14, "2:4: invalid UTF-8 at byte offset 12 (byte 0xFE)"}, /* in a comment */
        {"/* \xc3 */ 1", 10, "invalid UTF-8 at byte offset 3"},
        {"{\"\xc3\x28\": 1}", 9, "invalid UTF-8 at byte offset 2"}, /* in a key */
    };
    for (int i = 0; i < CT_ARRAY_LEN(cases); i++) expect_error_n(cases[i].src, cases[i].len, cases[i].want);
}
END_TEST

START_TEST(test_nul_bytes_and_length) {
    expect_error_n("{\"a\":\0 1}", 9, "1:6: a: unexpected NUL byte at byte offset 5");
    expect_error_n("[\"a\0b\"]", 7, "1:4: [0]: control character 0x00 inside a string");
    expect_error_n("{\"a\": 1}\0", 9, "1:9: unexpected NUL byte at byte offset 8");
    expect_error_n("\0", 1, "unexpected NUL byte at byte offset 0");
    expect_error_n("{\0\"\0a\0\"\0", 8, "1:2: unexpected NUL byte"); /* UTF-16 without a byte order mark */
    expect_error_n("\xff\xfe{\0}\0", 6, "t.json:1:1: the file is UTF-16 encoded");
    expect_error_n("\xfe\xff\0{\0}", 6, "the file is UTF-16 encoded");
    /* the length is respected: bytes after len are never read */
    ct_warnings w = {0};
    ct_err e;
    ct_json_doc *doc = ct_json_parse("123", 2, "t.json", &w, &e);
    ck_assert_ptr_nonnull(doc);
    ck_assert(ct_json_root(doc)->valuedouble == 12);
    ct_json_free(doc);
    expect_error_n("true", 3, "unquoted word tru");
    expect_error_n("[1]", 2, "not closed");
    expect_error_n("\"ab\"", 3, "unterminated string");
    memset(&e, 0, sizeof e);
    ck_assert_ptr_null(ct_json_parse(NULL, 0, NULL, &w, &e));
    ck_assert_str_eq(e.msg, "<config>:1:1: empty file: expected a JSON object");
}
END_TEST

START_TEST(test_bom) {
    ct_warnings w = {0};
    ct_err e;
    ct_json_doc *doc = parse_s("\xef\xbb\xbf{\"a\": 1}", &w, &e);
    ck_assert_msg(doc != NULL, "%s", e.msg);
    ck_assert_int_eq(w.n, 0);
    expect_pos(doc, ct_json_root(doc), 1, 1);
    expect_pos(doc, cJSON_GetObjectItem(ct_json_root(doc), "a"), 1, 2);
    ct_json_free(doc);
    expect_error("\xef\xbb\xbf{\"a\": x}", "t.json:1:7: a: unquoted word x");
    expect_error("\xef\xbb\xbf", "t.json:1:1: empty file");
    expect_error("\xef\xbb\xbf\n\n  {\"a\": 1,, }", "t.json:3:11: expected a key in double quotes, got ','");
    expect_error("{\"a\": 1}\xef\xbb\xbf", "1:9: expected end of file after the value that starts at 1:1, got U+FEFF");
}
END_TEST

/* Every prefix of a document using every feature parses or fails cleanly. */
START_TEST(test_truncated_prefixes) {
    const char *src = "\xef\xbb\xbf// ds config\n"
                      "{\n"
                      "  \"train_batch_size\": 256, # note\n"
                      "  \"optimizer\": {\"type\": \"Adam\", \"params\": {\"lr\": 1.5e-3, \"betas\": [0.9, 0.999],}},\n"
                      "  /* block\n   comment */\n"
                      "  \"s\": \"esc \\\"\\\\\\/\\b\\f\\n\\r\\t \\u00e9 \\ud83d\\ude00 \xe4\xb8\xad\"\n"
                      "  \"n\": [-0, 0.5, -12e+3, 7E-2, true, false, null, {}, []],\n"
                      "}\n";
    size_t len = strlen(src);
    int ok = 0;
    for (size_t n = 0; n <= len; n++) {
        ct_warnings w = {0};
        ct_err e;
        ct_json_doc *doc = parse_n(src, n, &w, &e);
        if (doc) {
            ok++;
            check_all_positions(doc, ct_json_root(doc));
            ct_json_free(doc);
        } else {
            ck_assert_int_eq(e.code, CT_ERR_CONFIG);
            ck_assert_msg(strncmp(e.msg, "t.json:", 7) == 0, "prefix %zu: %s", n, e.msg);
        }
        ct_warnings_free(&w);
    }
    /* the whole document and the one without the final newline parse */
    ck_assert_int_eq(ok, 2);
    expect_ok(src,
              "{\"train_batch_size\":256,\"optimizer\":{\"type\":\"Adam\",\"params\":{\"lr\":0.0015,\"betas\":[0.9,0.999]}},"
              "\"s\":\"esc \\\"\\\\/\\b\\f\\n\\r\\t \xc3\xa9 \xf0\x9f\x98\x80 \xe4\xb8\xad\",\"n\":[-0,0.5,-12000,0.07,true,"
              "false,null,{},[]]}",
              3);
}
END_TEST

/* Deterministic pseudo-random numbers (xorshift64*), so failures reproduce. */
static uint64_t rng_next(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static void random_string(uint64_t *s, char *out, int maxlen) {
    static const char *const pieces[] = {"a", "Z", "0", " ", "\"", "\\", "/", "\n", "\t", "\x01", "\x1f",
                                         "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "\x7f", "{", "]", "#"};
    int n = (int)(rng_next(s) % (uint64_t)maxlen), o = 0;
    for (int i = 0; i < n; i++) {
        const char *p = pieces[rng_next(s) % CT_ARRAY_LEN(pieces)];
        size_t l = strlen(p);
        memcpy(out + o, p, l);
        o += (int)l;
    }
    out[o] = '\0';
}

static cJSON *random_tree(uint64_t *s, int depth) {
    int kind = (int)(rng_next(s) % (depth > 5 ? 5 : 7));
    char str[256];
    switch (kind) {
    case 0: return cJSON_CreateNull();
    case 1: return cJSON_CreateBool(rng_next(s) & 1);
    case 2: return cJSON_CreateNumber((double)(int64_t)(rng_next(s) % 2000001) - 1000000.0);
    case 3: {
        double m = (double)(rng_next(s) >> 11) / 9007199254740992.0; /* [0, 1) */
        return cJSON_CreateNumber((rng_next(s) & 1 ? -m : m) * pow(10.0, (double)(rng_next(s) % 40) - 20));
    }
    case 4: random_string(s, str, 20); return cJSON_CreateString(str);
    case 5: {
        cJSON *a = cJSON_CreateArray();
        int n = (int)(rng_next(s) % 6);
        for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, random_tree(s, depth + 1));
        return a;
    }
    default: {
        cJSON *o = cJSON_CreateObject();
        int n = (int)(rng_next(s) % 6);
        for (int i = 0; i < n; i++) {
            char key[300];
            random_string(s, str, 8);
            snprintf(key, sizeof key, "%d%s", i, str); /* unique within the object */
            cJSON_AddItemToObject(o, key, random_tree(s, depth + 1));
        }
        return o;
    }
    }
}

/* Random trees printed by cJSON read back identically (strict JSON: no warnings). */
START_TEST(test_random_round_trip) {
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int iter = 0; iter < 3000; iter++) {
        cJSON *tree = random_tree(&s, 0);
        char *text = iter % 2 ? cJSON_Print(tree) : cJSON_PrintUnformatted(tree);
        ct_warnings w = {0};
        ct_err e;
        ct_json_doc *doc = parse_s(text, &w, &e);
        ck_assert_msg(doc != NULL, "iteration %d: %s\n%s", iter, e.msg, text);
        ck_assert_msg(cJSON_Compare(tree, ct_json_root(doc), 1), "iteration %d differs:\n%s", iter, text);
        ck_assert_int_eq(w.n, 0);
        check_all_positions(doc, ct_json_root(doc));
        ct_json_free(doc);
        free(text);
        cJSON_Delete(tree);
    }
}
END_TEST

/* Random byte mutations of a valid file never crash and always fail with a located message. */
START_TEST(test_random_mutations) {
    const char *base = "{\n  \"train_batch_size\": 16, // c\n  \"fp16\": {\"enabled\": true, \"loss_scale\": 0},\n"
                       "  \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 3e-4, \"betas\": [0.9, 0.95]}}\n"
                       "  \"name\": \"r\\u00e9s \\ud83d\\ude00 \xe2\x82\xac\",\n}\n";
    static const char alphabet[] = "{}[]:,\"\\/*#\n tfn0-.eE+u\x00\xff\xc3\xed\xa0";
    size_t blen = strlen(base);
    char *buf = malloc(blen + 16);
    uint64_t s = 12345;
    int parsed = 0, failed = 0;
    for (int iter = 0; iter < 20000; iter++) {
        memcpy(buf, base, blen);
        size_t len = blen;
        int edits = 1 + (int)(rng_next(&s) % 3);
        for (int k = 0; k < edits; k++) {
            size_t at = rng_next(&s) % len;
            char c = (rng_next(&s) & 1) ? alphabet[rng_next(&s) % (sizeof alphabet - 1)] : (char)rng_next(&s);
            switch (rng_next(&s) % 3) {
            case 0: buf[at] = c; break;                                                  /* replace */
            case 1: memmove(buf + at, buf + at + 1, len - at - 1), len--; break;         /* delete */
            default: memmove(buf + at + 1, buf + at, len - at), buf[at] = c, len++; break; /* insert */
            }
        }
        ct_warnings w = {0};
        ct_err e;
        ct_json_doc *doc = parse_n(buf, len, &w, &e);
        if (doc) {
            parsed++;
            check_all_positions(doc, ct_json_root(doc));
            ct_json_free(doc);
        } else {
            failed++;
            ck_assert_int_eq(e.code, CT_ERR_CONFIG);
            ck_assert_msg(strncmp(e.msg, "t.json:", 7) == 0 && e.msg[7] >= '1' && e.msg[7] <= '9', "%s", e.msg);
        }
        ct_warnings_free(&w);
    }
    free(buf);
    ck_assert(parsed > 100 && failed > 1000); /* the mutations exercise both outcomes */
}
END_TEST

/* Many members: duplicate detection and appending stay linear (quadratic would time out). */
START_TEST(test_wide) {
    int n = 200000;
    size_t cap = (size_t)n * 24 + 64, o = 0;
    char *buf = malloc(cap);
    o += (size_t)snprintf(buf + o, cap - o, "{");
    for (int i = 0; i < n; i++) o += (size_t)snprintf(buf + o, cap - o, "\"k%d\": [%d],\n", i, i);
    size_t body = o;
    o += (size_t)snprintf(buf + o, cap - o, "\"end\": 1}");
    ct_warnings w = {0};
    ct_err e;
    ct_json_doc *doc = parse_n(buf, o, &w, &e);
    ck_assert_msg(doc != NULL, "%s", e.msg);
    ck_assert_int_eq(cJSON_GetArraySize(ct_json_root(doc)), n + 1);
    expect_pos(doc, cJSON_GetObjectItem(ct_json_root(doc), "k199999"), 200000, 1);
    ct_json_free(doc);
    o = body + (size_t)snprintf(buf + body, cap - body, "\"k7\": 1}");
    expect_error_n(buf, o, "t.json:200001:1: duplicate key \"k7\" (first at 8:1)");
    free(buf);
}
END_TEST

START_TEST(test_files) {
    ct_warnings w = {0};
    ct_err e = {0};
    ck_assert_ptr_null(ct_json_parse_file("/nonexistent/dir/x.json", &w, &e));
    ck_assert_int_eq(e.code, CT_ERR_CONFIG);
    ck_assert_str_eq(e.msg, "cannot read /nonexistent/dir/x.json: No such file or directory");
    ck_assert_ptr_null(ct_json_parse_file("test", &w, &e));
    ck_assert_str_eq(e.msg, "cannot read test: Is a directory");
    char path[] = "/tmp/test_json_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    const char *text = "{\n  \"a\": [1,\n  2,],\n}";
    ck_assert_int_eq(write(fd, text, strlen(text)), (int)strlen(text));
    close(fd);
    ct_json_doc *doc = ct_json_parse_file(path, &w, &e);
    ck_assert_ptr_nonnull(doc);
    ck_assert_str_eq(ct_json_filename(doc), path);
    ck_assert_int_eq(w.n, 1);
    char want[128];
    snprintf(want, sizeof want, "%s:3:4: trailing comma (accepted, as DeepSpeed does)", path);
    ck_assert_str_eq(w.items[0], want);
    ct_json_free(doc);
    ct_warnings_free(&w);
    unlink(path);
}
END_TEST

/* ---- the DeepSpeed corpus ----------------------------------------------------------------- */

typedef struct corpus_row {
    char file[256];
    char kind[16]; /* strict | hjson | template */
} corpus_row;

/* Rows of SOURCES.md's table: "| N | `file` | ... | JSON column | ...". */
static int read_sources(corpus_row *rows, int max) {
    FILE *f = fopen(CORPUS_DIR "/SOURCES.md", "r");
    ck_assert_msg(f != NULL, "cannot open " CORPUS_DIR "/SOURCES.md (run from the repository root)");
    char line[8192];
    int n = 0;
    while (fgets(line, sizeof line, f) && n < max) {
        int num;
        if (sscanf(line, "| %d |", &num) != 1) continue;
        char *cols[12] = {0};
        int nc = 0;
        for (char *p = strchr(line, '|'); p && nc < 12; p = strchr(p + 1, '|')) cols[nc++] = p + 1;
        ck_assert_int_ge(nc, 9);
        char *b = strchr(cols[1], '`'), *e = b ? strchr(b + 1, '`') : NULL;
        ck_assert(b && e && e - b - 1 < (long)sizeof rows[n].file);
        memcpy(rows[n].file, b + 1, (size_t)(e - b - 1));
        rows[n].file[e - b - 1] = '\0';
        const char *kinds[] = {"template", "hjson", "strict"};
        rows[n].kind[0] = '\0';
        for (int k = 0; k < 3; k++) {
            char *hit = strstr(cols[7], kinds[k]);
            if (hit && hit < cols[8]) {
                snprintf(rows[n].kind, sizeof rows[n].kind, "%s", kinds[k]);
                break;
            }
        }
        ck_assert_msg(rows[n].kind[0], "row %d: no JSON kind", num);
        n++;
    }
    fclose(f);
    return n;
}

/* The text at line:col of a file starts with token. */
static bool file_has_token_at(const char *path, int line, int col, const char *token) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    char buf[4096];
    int l = 1;
    bool found = false;
    while (fgets(buf, sizeof buf, f)) {
        if (l++ == line) {
            found = (int)strlen(buf) >= col && strncmp(buf + col - 1, token, strlen(token)) == 0;
            break;
        }
    }
    fclose(f);
    return found;
}

/* Every prefix of the file's bytes either parses or fails with a located config error. */
static void check_prefixes(const char *path) {
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    char data[1 << 16];
    size_t len = fread(data, 1, sizeof data, f);
    fclose(f);
    ck_assert(len > 0 && len < sizeof data);
    for (size_t n = 0; n < len; n++) {
        ct_warnings w = {0};
        ct_err e;
        ct_json_doc *doc = parse_n(data, n, &w, &e);
        ck_assert_msg(doc || (e.code == CT_ERR_CONFIG && strncmp(e.msg, "t.json:", 7) == 0), "%s[:%zu]: %s", path, n,
                      e.msg);
        ct_json_free(doc);
        ct_warnings_free(&w);
    }
}

START_TEST(test_deepspeed_corpus) {
    corpus_row rows[64];
    int n = read_sources(rows, 64);
    ck_assert_int_eq(n, 40);
    int counts[3] = {0};
    for (int i = 0; i < n; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%.255s", CORPUS_DIR, rows[i].file);
        ct_warnings w = {0};
        ct_err e = {0};
        ct_json_doc *doc = ct_json_parse_file(path, &w, &e);
        if (strcmp(rows[i].kind, "strict") == 0) {
            counts[0]++;
            ck_assert_msg(doc != NULL, "%s", e.msg);
            ck_assert_msg(w.n == 0, "%s: unexpected warning %s", rows[i].file, w.n ? w.items[0] : "");
            ck_assert(cJSON_IsObject(ct_json_root(doc)));
            check_all_positions(doc, ct_json_root(doc));
        } else if (strcmp(rows[i].kind, "hjson") == 0) {
            counts[1]++;
            ck_assert_msg(doc != NULL, "%s", e.msg);
            ck_assert_msg(w.n >= 1, "%s: no warning", rows[i].file);
            for (int k = 0; k < w.n; k++)
                ck_assert_msg(strncmp(w.items[k], path, strlen(path)) == 0 &&
                                  strstr(w.items[k], "(accepted, as DeepSpeed does)"),
                              "%s", w.items[k]);
        } else {
            counts[2]++;
            ck_assert_msg(doc == NULL, "%s: template parsed", rows[i].file);
            ck_assert_int_eq(e.code, CT_ERR_CONFIG);
            /* "PATH:L:C: json.path: unquoted word TOKEN: looks like a template placeholder; ..." */
            int line = 0, col = 0;
            ck_assert(strncmp(e.msg, path, strlen(path)) == 0);
            ck_assert_int_eq(sscanf(e.msg + strlen(path), ":%d:%d:", &line, &col), 2);
            const char *tok = strstr(e.msg, "unquoted word ");
            ck_assert_msg(tok && strstr(e.msg, ": looks like a template placeholder; replace it with a value"), "%s",
                          e.msg);
            char token[64];
            ck_assert_int_eq(sscanf(tok + strlen("unquoted word "), "%63[A-Za-z0-9_]", token), 1);
            ck_assert_msg(file_has_token_at(path, line, col, token), "%s: %s not at %d:%d", rows[i].file, token,
                          line, col);
        }
        ct_json_free(doc);
        ct_warnings_free(&w);
        check_prefixes(path);
    }
    ck_assert_int_eq(counts[1], 3);
    ck_assert_int_eq(counts[2], 4);
}
END_TEST

/* The three Hjson files of the corpus, warning by warning. */
START_TEST(test_deepspeed_hjson_files) {
    static const struct {
        const char *file, *warning;
    } cases[] = {
        {"microsoft__DeepSpeedExamples__pipeline_parallelism_ds_config.json",
         ":19:33: trailing comma (accepted, as DeepSpeed does)"},
        {"microsoft__DeepSpeedExamples__training_imagenet_config_ds_fp16_config.json",
         ":26:6: missing comma between members; a newline separates them (accepted, as DeepSpeed does)"},
        {"microsoft__DeepSpeed__deepspeed_autotuning_config_templates_template_zero3.json",
         ":15:27: trailing comma (accepted, as DeepSpeed does)"},
    };
    for (int i = 0; i < CT_ARRAY_LEN(cases); i++) {
        char path[512], want[640];
        snprintf(path, sizeof path, "%s/%s", CORPUS_DIR, cases[i].file);
        snprintf(want, sizeof want, "%s%s", path, cases[i].warning);
        ct_warnings w = {0};
        ct_err e = {0};
        ct_json_doc *doc = ct_json_parse_file(path, &w, &e);
        ck_assert_msg(doc != NULL, "%s", e.msg);
        ck_assert_int_eq(w.n, 1);
        ck_assert_str_eq(w.items[0], want);
        ct_json_free(doc);
        ct_warnings_free(&w);
    }
    /* the imagenet file's values after the missing comma are all there */
    ct_warnings w = {0};
    ct_err e = {0};
    ct_json_doc *doc = ct_json_parse_file(CORPUS_DIR "/" "microsoft__DeepSpeedExamples__training_imagenet_config_"
                                                      "ds_fp16_config.json", &w, &e);
    ck_assert_ptr_nonnull(doc);
    cJSON *root = ct_json_root(doc);
    ck_assert_int_eq(cJSON_GetArraySize(root), 11);
    expect_pos(doc, cJSON_GetObjectItem(root, "gradient_clipping"), 27, 5);
    ct_json_free(doc);
    ct_warnings_free(&w);
}
END_TEST

/* Inputs that once misbehaved (found by test/fuzz/fuzz_json.c or by review). */
START_TEST(test_regressions) {
    static const struct {
        const char *src;
        size_t len;
        const char *want; /* NULL: must parse */
    } cases[] = {
        {"\xef\xbb", 2, "invalid UTF-8 at byte offset 0"},   /* half a byte order mark */
        {"\xef\xbb\xbf", 3, "1:1: empty file"},               /* only a byte order mark */
        {"[\"\\ud800\\", 9, "lone high surrogate"},          /* pair cut inside the second escape */
        {"[\"\\ud800\\u", 10, "lone high surrogate"},
        {"[\"\\ud800\\udc0", 13, "lone high surrogate"},
        {"-", 1, "invalid number -"},
        {"1e", 2, "expected digits in the exponent"},
        {"$", 1, "unquoted word $"},
        {"${", 2, "unquoted word $: looks like"},
        {"${ABC", 5, "unquoted word $: looks like"},
        {"#", 1, "empty file"},
        {"/", 1, "expected a value, got '/'"},
        {"/*", 2, "unterminated block comment"},
        {"/*/", 3, "unterminated block comment"},
        {"{\"\\u0041\"", 9, "expected ':' after key \"A\", got end of file"},
        {"[\n1\n", 4, "3:1: expected ',' or ']' (the array opened at 1:1 is not closed), got end of file"},
        {"0", 1, NULL},
        {"-0.0e-0", 7, NULL},
        {" [ ] ", 5, NULL},
    };
    for (int i = 0; i < CT_ARRAY_LEN(cases); i++) {
        if (cases[i].want) {
            expect_error_n(cases[i].src, cases[i].len, cases[i].want);
        } else {
            ct_warnings w = {0};
            ct_err e;
            ct_json_doc *doc = parse_n(cases[i].src, cases[i].len, &w, &e);
            ck_assert_msg(doc != NULL, "case %d: %s", i, e.msg);
            ct_json_free(doc);
        }
    }
}
END_TEST

static Suite *json_suite(void) {
    Suite *s = suite_create("json");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_strict_round_trip);
    tcase_add_test(tc, test_positions);
    tcase_add_test(tc, test_origin);
    tcase_add_test(tc, test_hjson_forms);
    tcase_add_test(tc, test_hjson_once_per_kind);
    tcase_add_test(tc, test_duplicate_keys);
    tcase_add_test(tc, test_placeholders);
    tcase_add_test(tc, test_syntax_errors);
    tcase_add_test(tc, test_depth);
    tcase_add_test(tc, test_utf8);
    tcase_add_test(tc, test_nul_bytes_and_length);
    tcase_add_test(tc, test_bom);
    tcase_add_test(tc, test_truncated_prefixes);
    tcase_add_test(tc, test_random_round_trip);
    tcase_add_test(tc, test_random_mutations);
    tcase_add_test(tc, test_wide);
    tcase_add_test(tc, test_files);
    tcase_add_test(tc, test_deepspeed_corpus);
    tcase_add_test(tc, test_deepspeed_hjson_files);
    tcase_add_test(tc, test_regressions);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    SRunner *sr = srunner_create(json_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
