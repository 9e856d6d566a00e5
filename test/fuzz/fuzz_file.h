/* fuzz_file.h: the fuzz input written to a file of this process, for openers that take a path. */
#ifndef CT_FUZZ_FILE_H
#define CT_FUZZ_FILE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* path (n bytes) = /tmp/fuzz_<name>_<pid><ext>, holding data[0, size). */
static inline void fuzz_write_file(char *path, size_t n, const char *name, const char *ext, const uint8_t *data,
                                   size_t size) {
    snprintf(path, n, "/tmp/fuzz_%s_%d%s", name, (int)getpid(), ext);
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    fclose(f);
}

#endif
