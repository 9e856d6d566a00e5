/* hdf5_probe.c: the HDF5 metadata probe as an executable (core/data/hdf5_probe.h), for
 * $CTRAIN_HDF5_PROBE: `hdf5_probe open FILE IMAGES LABELS` or `hdf5_probe info FILE`, the reply
 * on stdout. The fuzz target runs it (built without sanitizers by run_fuzz.sh: spawning it is
 * ~100x faster than forking an AddressSanitizer process), and test_hdf5 checks that it answers
 * as the fork does (Makefile: build/test/hdf5_probe). */
#include <stdio.h>
#include <string.h>

#include "core/data/hdf5_probe.h"

int main(int argc, char **argv) {
    bool open = argc == 5 && strcmp(argv[1], "open") == 0;
    if (!open && !(argc >= 3 && strcmp(argv[1], "info") == 0)) {
        fprintf(stderr, "usage: %s open FILE IMAGES LABELS | info FILE  (the reply goes to stdout)\n", argv[0]);
        return 2;
    }
    return ct_h5_probe_serve(argv[2], open ? argv[3] : NULL, open ? argv[4] : NULL, 1) ? 1 : 0;
}
