/* test_backend.c: loading the CUDA backend library: a library built for another op table is
 * refused with a message naming both versions (the table crosses the dlopen boundary). */
#include <check.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/backend/backend.h"

#ifdef CT_HAVE_CUDA
/* build/test/<name>: the fixtures sit beside this binary, the real library one folder up. */
static void beside_me(const char *name, char *out, size_t n) {
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    ck_assert(len > 0);
    exe[len] = '\0';
    *strrchr(exe, '/') = '\0';
    snprintf(out, n, "%s/%s", exe, name);
}

START_TEST(other_abi_refused) {
    char path[PATH_MAX + 64], want[64];
    beside_me("libfake_cuda_v1.so", path, sizeof path);
    ct_err err = {0};
    ct_cuda_lib lib;
    ck_assert_int_eq(ct_cuda_lib_open(path, &lib, &err), CT_ERR_RUNTIME);
    ck_assert_msg(strstr(err.msg, "built for op table version 1 (123 bytes)"), "%s", err.msg);
    snprintf(want, sizeof want, "this ctrain has version %d", CT_BACKEND_ABI);
    ck_assert_msg(strstr(err.msg, want) && strstr(err.msg, path), "%s", err.msg);
}
END_TEST

START_TEST(unversioned_refused) {
    char path[PATH_MAX + 64];
    beside_me("libfake_cuda_noabi.so", path, sizeof path);
    ct_err err = {0};
    ct_cuda_lib lib;
    ck_assert_int_eq(ct_cuda_lib_open(path, &lib, &err), CT_ERR_RUNTIME);
    ck_assert_msg(strstr(err.msg, "built by an older ctrain"), "%s", err.msg);
}
END_TEST

START_TEST(own_library_accepted) {
    char path[PATH_MAX + 64];
    beside_me("../libctrain_cuda.so", path, sizeof path);
    if (access(path, F_OK) != 0) return; /* a bundle without the library: nothing to check */
    ct_err err = {0};
    ct_cuda_lib lib = {0};
    ck_assert_msg(ct_cuda_lib_open(path, &lib, &err) == CT_OK, "%s", err.msg);
    ck_assert(lib.probe && lib.create);
}
END_TEST

START_TEST(missing_library_named) {
    ct_err err = {0};
    ct_cuda_lib lib;
    ck_assert_int_eq(ct_cuda_lib_open("/nonexistent/libctrain_cuda.so", &lib, &err), CT_ERR_RUNTIME);
    ck_assert_msg(strstr(err.msg, "/nonexistent/libctrain_cuda.so"), "%s", err.msg);
}
END_TEST
#endif

int main(void) {
#ifndef CT_HAVE_CUDA
    printf("built without CUDA: no library to load\n");
    return 77;
#else
    Suite *s = suite_create("backend");
    TCase *tc = tcase_create("cuda library");
    tcase_add_test(tc, other_abi_refused);
    tcase_add_test(tc, unversioned_refused);
    tcase_add_test(tc, own_library_accepted);
    tcase_add_test(tc, missing_library_named);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
#endif
}
