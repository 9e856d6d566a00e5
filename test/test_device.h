/* test_device.h: the device the trainer-level tests run on (CT_TEST_DEVICE, default "cpu";
 * `make test-cuda` runs them again with "cuda"), shared by test_amp.c and test_train.c. */
#ifndef CT_TEST_DEVICE_H
#define CT_TEST_DEVICE_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend/backend.h"
#include "core/device/device.h"

/* CT_TEST_DEVICE=capped runs them on the CPU's capped device: train.device "cpu" with
 * CTRAIN_CAPPED_DEVICE set (run_tests.sh sets both), so this is the train.device to use. */
static inline const char *test_device(void) {
    const char *d = getenv("CT_TEST_DEVICE");
    return d && *d && strcmp(d, "capped") != 0 ? d : "cpu";
}

/* 77 (skipped) after one line when a GPU is asked for and none is usable, else 0; 1 when the
 * capped device is asked for without its size. */
static inline int test_device_unusable(void) {
    const char *d = getenv("CT_TEST_DEVICE");
    if (d && strcmp(d, "capped") == 0 && !getenv("CTRAIN_CAPPED_DEVICE")) {
        printf("CT_TEST_DEVICE=capped needs CTRAIN_CAPPED_DEVICE (the device's size, e.g. 1GiB)\n");
        return 1;
    }
    if (strcmp(test_device(), "cpu") == 0 || ct_cuda_available()) return 0;
    printf("CT_TEST_DEVICE=%s but no CUDA device is usable: skipped\n", test_device());
    return 77;
}

/* ct_cuda_available initialised CUDA in this process, and CUDA does not survive a fork: on a GPU
 * the tests run in the runner's process. */
static inline void test_device_runner(SRunner *sr) {
    if (strcmp(test_device(), "cpu") != 0) srunner_set_fork_status(sr, CK_NOFORK);
}

#endif
