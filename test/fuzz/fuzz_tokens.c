/* fuzz_tokens.c: libFuzzer harness for the tokens format (core/data/tokens.c): the input is one
 * token file, ctrain's own or an llm.c shard. Opening it and decoding its windows must succeed or
 * fail with CT_ERR_DATA, never crash or read outside the mapping. The last input byte picks
 * seq_len (1..8) and whether the entry gives "vocab" (llm.c files then check tokens against a small
 * vocabulary, so the out-of-vocabulary path gets reached). Seeds: test/fuzz/seeds-fuzz_tokens/
 * (small valid files of both kinds, uint16 and uint32). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "test/fuzz/fuzz_file.h"
#include "core/config/config.h"
#include "core/data/dataset.h"
#include "core/data/formats.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void wr32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *copy = NULL;
    /* The header CRC stops nearly every mutation of a ctrain file at open: half of the runs
     * repair it so the size and vocabulary checks and decoding get fuzzed. */
    if (size >= 32 && memcmp(data, "CTTOKENS", 8) == 0 && (data[size - 1] & 1)) {
        copy = malloc(size);
        memcpy(copy, data, size);
        wr32(copy + 28, (uint32_t)crc32(0, copy, 28));
        data = copy;
    }
    int seq_len = size ? 1 + (data[size - 1] >> 1) % 8 : 1;
    bool vocab = size && (data[size - 1] & 0x20);
    char path[64];
    fuzz_write_file(path, sizeof path, "tokens", ".bin", data, size);
    ct_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "format", "tokens");
    cJSON_AddStringToObject(e, "path", path);
    cJSON_AddNumberToObject(e, "seq_len", seq_len);
    if (vocab) cJSON_AddNumberToObject(e, "vocab", 300);
    ct_dataset *ds = NULL;
    ct_err err = {0};
    int rc = ct_tokens_open(&cfg, e, "data.train", &ds, &err);
    /* "vocab" on a ctrain file whose header says otherwise is a config error, by design */
    if (rc != CT_OK && rc != CT_ERR_DATA && !(vocab && rc == CT_ERR_CONFIG)) abort();
    if (ds) {
        int32_t x[8], y[8];
        for (int64_t i = 0; i < ds->count && i < 256; i++) {
            rc = ds->decode(ds, i, x, y, &err);
            if (rc != CT_OK && rc != CT_ERR_DATA) abort();
        }
        /* the last window reads the file's last token */
        if (ds->count > 256 && (rc = ds->decode(ds, ds->count - 1, x, y, &err)) != CT_OK && rc != CT_ERR_DATA)
            abort();
        ct_dataset_close(ds);
    }
    cJSON_Delete(e);
    free(copy);
    return 0;
}
