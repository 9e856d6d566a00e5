/* fuzz_hdf5.c: libFuzzer harness for the HDF5 reader (core/data/hdf5*.c): the input is one HDF5
 * file, opened with "images"/"labels" and with "g/x"/"labels" (the group seed's path), every
 * sample decoded (floats and, for uint8 images, raw bytes), and `ctrain info` on it. Each must
 * succeed or fail with CT_ERR_DATA, never crash.
 *
 * libhdf5 (Debian's, not instrumented) runs only in the metadata probe, a separate process:
 * $CTRAIN_HDF5_PROBE, which run_fuzz.sh builds without sanitizers (build/fuzz/hdf5_probe) and
 * this target defaults to when it sits beside it (spawning it is ~100x faster than forking this
 * AddressSanitizer process). A probe that crashes is the reader's exit 3, not a finding; what the
 * target exercises under ASan is ctrain's own code: the checks before libhdf5 sees the file, the
 * decoding and checking of the probe's reply (a file that libhdf5 resolves to chunk addresses
 * past the end, chunk dims that do not fit, ...), and the chunk reader with its filters (inflate,
 * un-shuffle, fletcher32) on the file's bytes. The file's signature, superblock version and
 * end-of-file address are checked by ctrain first; half of the runs (the last byte's low bit)
 * rewrite the superblock's end-of-file address to the input's size, so that inserted and erased
 * bytes get past that check. Seeds: test/fuzz/seeds-fuzz_hdf5/ (test/make_hdf5.py OUT seeds:
 * h5py files, superblock v0). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test/fuzz/fuzz_decode.h"
#include "test/fuzz/fuzz_file.h"
#include "core/config/config.h"
#include "core/data/dataset.h"
#include "core/data/formats.h"
#include "core/data/hdf5_info.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* $CTRAIN_HDF5_PROBE, when unset: hdf5_probe beside this binary (run_fuzz.sh builds both), so that
 * reproducing a finding (build/fuzz/fuzz_hdf5 FILE) runs the probe the campaign ran. */
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const char *self = *argc > 0 ? (*argv)[0] : "";
    const char *slash = strrchr(self, '/');
    char probe[4096];
    snprintf(probe, sizeof probe, "%.*shdf5_probe", slash ? (int)(slash - self + 1) : 0, self);
    if (!getenv("CTRAIN_HDF5_PROBE") && access(probe, X_OK) == 0) setenv("CTRAIN_HDF5_PROBE", probe, 1);
    return 0;
}

/* Superblock v0 (h5py's default) with 8-byte addresses at offset 0: its end-of-file address
 * (offset 40) set to n. */
static void fix_eof(uint8_t *p, size_t n) {
    if (n < 56 || memcmp(p, "\211HDF\r\n\032\n", 8) || p[8] != 0 || p[13] != 8) return;
    for (int i = 0; i < 8; i++) p[40 + i] = (uint8_t)((uint64_t)n >> (8 * i));
}

static void open_and_decode(const char *path, const char *images, const char *labels) {
    ct_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "format", "hdf5");
    cJSON_AddStringToObject(e, "path", path);
    cJSON_AddStringToObject(e, "images", images);
    cJSON_AddStringToObject(e, "labels", labels);
    ct_dataset *ds = NULL;
    ct_err err = {0};
    int rc = ct_hdf5_open(&cfg, e, "data.train", &ds, &err);
    if (rc != CT_OK && rc != CT_ERR_DATA) abort();
    if (ds) {
        fuzz_decode_samples(ds, 1 << 16, 64);
        ct_dataset_close(ds);
    }
    cJSON_Delete(e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *copy = NULL;
    if (size && (data[size - 1] & 1)) {
        copy = malloc(size);
        memcpy(copy, data, size);
        fix_eof(copy, size);
        data = copy;
    }
    char path[64];
    fuzz_write_file(path, sizeof path, "hdf5", ".h5", data, size);
    open_and_decode(path, "images", "labels");
    open_and_decode(path, "g/x", "labels");
    ct_err err = {0};
    FILE *devnull = fopen("/dev/null", "w");
    int rc = ct_hdf5_info(path, devnull, &err);
    if (rc != CT_OK && rc != CT_ERR_DATA) abort();
    fclose(devnull);
    free(copy);
    unlink(path);
    return 0;
}
