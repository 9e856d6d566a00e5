/* hdf5_probe.h: libhdf5 in another process. It opens the file, resolves the two datasets a
 * reader needs (or lists the root group for `ctrain info`) and answers with one reply
 * (hdf5_layout.h); the calling process never runs libhdf5 on the file. Why: libhdf5 1.10 crashes
 * on corrupt files (fuzz_hdf5), and a crash in the probe is an exit-3 "corrupt file" here, not a
 * crash of the run.
 *
 * How the probe runs: a fork() of the calling process (libhdf5 loaded with dlopen first, then
 * the file parsed only in the child), so the shipped ctrain needs nothing beside itself; or, when
 * $CTRAIN_HDF5_PROBE names an executable (test/fuzz/hdf5_probe.c's main: the fuzz target, whose
 * AddressSanitizer process forks at 1-2 per second, and the tests), that executable, started with
 * posix_spawn as `PROBE open|info FILE [IMAGES LABELS]`, its reply on its stdout. */
#ifndef CT_DATA_HDF5_PROBE_H
#define CT_DATA_HDF5_PROBE_H

#include "core/data/hdf5_layout.h"
#include "core/util/common.h"

/* The reply for FILE: with images and labels, their layouts (r->nlayouts 2, or r->code and the
 * child's message); with images NULL, `ctrain info`'s listing as r->text. CT_ERR_DATA naming the
 * file when the probe crashed on it or answered something that does not decode; CT_ERR_RUNTIME
 * when no probe could run (libhdf5 not installed, no process to spare). The caller frees r. */
int ct_h5_probe(const char *path, const char *images, const char *labels, ct_h5_reply *r, ct_err *err);

/* The probe's own work, in the child or the probe executable: the reply written to fd. Returns
 * 0 when the reply was written (whatever it says), else -1. */
int ct_h5_probe_serve(const char *path, const char *images, const char *labels, int fd);

#endif
