/* model_text.h: a config whose "model" section is the JSON text of a test (a model object with
 * "input", "layers" and "loss"), for the tests that build graphs from text. */
#ifndef CT_TEST_MODEL_TEXT_H
#define CT_TEST_MODEL_TEXT_H

#include <check.h>
#include <stdio.h>
#include <string.h>

#include "core/config/config.h"
#include "core/util/json.h"

/* Parse text as "m.json" into *doc and point cfg's path, doc and model at it (the rest of cfg is
 * the caller's); a test JSON that does not parse fails the test. Free *doc when done. */
static inline void model_text(const char *text, ct_config *cfg, ct_json_doc **doc) {
    ct_warnings w = {0};
    ct_err err = {0};
    *doc = ct_json_parse(text, strlen(text), "m.json", &w, &err);
    ct_warnings_free(&w);
    ck_assert_msg(*doc, "test JSON does not parse: %s", err.msg);
    snprintf(cfg->path, sizeof cfg->path, "m.json");
    cfg->doc = *doc;
    cfg->model = ct_json_root(*doc);
}

#endif
