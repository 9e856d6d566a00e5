/* test_rendezvous.c: the TCP bootstrap of a torchrun-style launch (core/dist/rendezvous.h), with
 * forked processes as the other ranks on the loopback: lines go both ways once the ranks have met;
 * a connection that is not a ctrain rank is ignored; a rank of another world size or ctrain
 * version, a rank twice (rank 0 too), a rank that never comes and a rank 0 that is not there are
 * errors naming what went wrong, each within the timeout, and the processes rank 0 refuses end with
 * its message; a stop signal ends a wait at once; the port is MASTER_PORT, or MASTER_PORT + 1 under
 * torchrun's agent store. (test/e2e_dist.sh trains over it, with MPI joined on top.) */
#include <check.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/dist/rendezvous.h"

/* A TCP port nobody listens on now (the kernel's pick for port 0, released). */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static ct_launch launch_of(int rank, int world, int port, int timeout_s) {
    ct_launch l;
    ct_launch_given(&l, world);
    l.launcher = CT_LAUNCH_ENV;
    l.rank = rank;
    l.rank_given = true;
    l.master_port = port;
    l.comm_timeout_s = timeout_s;
    snprintf(l.master_addr, sizeof l.master_addr, "127.0.0.1");
    return l;
}

/* A child process that is rank `rank` of `world`: meets rank 0 and reads one line from it, which
 * must be "hello RANK"; exits 0 when it was, 2 when the rendezvous refused it (CT_ERR_CONFIG: rank
 * 0 said why), 1 when anything else failed. delay_ms: waits that long before it starts. */
static pid_t spawn_rank(int rank, int world, int port, int delay_ms) {
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid) return pid;
    usleep((useconds_t)delay_ms * 1000);
    ct_launch l = launch_of(rank, world, port, 5);
    ct_rdzv r;
    ct_err err = {0};
    char line[CT_RDZV_LINE_MAX];
    int rc = ct_rdzv_open(&r, &l, &err);
    if (!rc) rc = ct_rdzv_recv(&r, line, &err);
    char want[32];
    snprintf(want, sizeof want, "hello %d", rank);
    int ok = !rc && strcmp(line, want) == 0;
    ct_rdzv_close(&r);
    _exit(ok ? 0 : rc == CT_ERR_CONFIG ? 2 : 1);
}

static int exit_code(pid_t pid) {
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

START_TEST(three_ranks_meet) {
    int port = free_port();
    /* the others start first and retry until rank 0 listens; one starts after rank 0 */
    pid_t p2 = spawn_rank(2, 3, port, 0), p1 = spawn_rank(1, 3, port, 300);
    /* and something that is not a rank connects, says nothing useful, and is ignored */
    pid_t stray = fork();
    if (stray == 0) {
        usleep(100 * 1000);
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        for (int i = 0; i < 50 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0; i++) usleep(20 * 1000);
        (void)!write(fd, "GET / HTTP/1.0\n", 15);
        usleep(200 * 1000);
        _exit(0);
    }
    ct_launch l = launch_of(0, 3, port, 10);
    ct_rdzv r;
    ct_err err = {0};
    ck_assert_msg(ct_rdzv_open(&r, &l, &err) == CT_OK, "%s", err.msg);
    for (int to = 1; to < 3; to++) {
        char line[32];
        snprintf(line, sizeof line, "hello %d", to);
        ck_assert_msg(ct_rdzv_send(&r, to, line, &err) == CT_OK, "%s", err.msg);
    }
    ct_rdzv_close(&r);
    ck_assert_int_eq(exit_code(p1), 0);
    ck_assert_int_eq(exit_code(p2), 0);
    exit_code(stray);
}
END_TEST

/* Rank 0's error when one process of world w2 and rank r connects to a world of 2. */
static void root_refuses(int rank, int world, const char *expect) {
    int port = free_port();
    pid_t p = spawn_rank(rank, world, port, 0);
    ct_launch l = launch_of(0, 2, port, 10);
    ct_rdzv r;
    ct_err err = {0};
    ck_assert_int_ne(ct_rdzv_open(&r, &l, &err), CT_OK);
    ck_assert_msg(strstr(err.msg, expect), "%s", err.msg);
    ct_rdzv_close(&r);
    ck_assert_int_eq(exit_code(p), 2); /* the child ends with rank 0's refusal */
}

START_TEST(another_world) {
    root_refuses(1, 3, "a rank 1 of WORLD_SIZE=3 (pid ");
}
END_TEST

START_TEST(rank_twice) {
    /* world 3: ranks 1 and 1; both processes are named, and both end with rank 0's message */
    int port = free_port();
    pid_t a = spawn_rank(1, 3, port, 0), b = spawn_rank(1, 3, port, 200);
    ct_launch l = launch_of(0, 3, port, 10);
    ct_rdzv r;
    ct_err err = {0};
    ck_assert_int_eq(ct_rdzv_open(&r, &l, &err), CT_ERR_CONFIG);
    char first[64], second[64];
    snprintf(first, sizeof first, "pid %d on host ", (int)a);
    snprintf(second, sizeof second, "(connected first) and pid %d on host ", (int)b);
    ck_assert_msg(strstr(err.msg, "two processes say they are RANK=1 of WORLD_SIZE=3: ") && strstr(err.msg, first) &&
                  strstr(err.msg, second) && strstr(err.msg, "needs its own RANK, 0 to 2"), "%s", err.msg);
    ct_rdzv_close(&r);
    ck_assert_int_eq(exit_code(a), 2);
    ck_assert_int_eq(exit_code(b), 2);
}
END_TEST

/* Two processes with RANK=0: the second finds the port taken, asks what holds it, and both end
 * naming both. */
START_TEST(root_twice) {
    int port = free_port();
    pid_t second = spawn_rank(0, 2, port, 300);
    ct_launch l = launch_of(0, 2, port, 10);
    ct_rdzv r;
    ct_err err = {0};
    double t0 = ct_now();
    ck_assert_int_eq(ct_rdzv_open(&r, &l, &err), CT_ERR_CONFIG);
    char want[64];
    snprintf(want, sizeof want, "(listening on port %d) and pid %d on host ", port, (int)second);
    ck_assert_msg(strstr(err.msg, "two processes say they are RANK=0 of WORLD_SIZE=2: pid ") && strstr(err.msg, want),
                  "%s", err.msg);
    ck_assert_double_lt(ct_now() - t0, 5.0);
    ct_rdzv_close(&r);
    ck_assert_int_eq(exit_code(second), 2);
}
END_TEST

/* A rendezvous hello of another protocol version: another ctrain, refused by name. */
START_TEST(another_version) {
    int port = free_port();
    pid_t old = fork();
    if (old == 0) {
        usleep(100 * 1000);
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        for (int i = 0; i < 50 && connect(fd, (struct sockaddr *)&a, sizeof a) != 0; i++) usleep(20 * 1000);
        (void)!write(fd, "ctrain-rendezvous 1 rank 1 world 2\n", 35);
        usleep(300 * 1000);
        _exit(0);
    }
    ct_launch l = launch_of(0, 2, port, 10);
    ct_rdzv r;
    ct_err err = {0};
    ck_assert_int_eq(ct_rdzv_open(&r, &l, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "a process of another ctrain version connected"), "%s", err.msg);
    ct_rdzv_close(&r);
    exit_code(old);
}
END_TEST

/* A stop signal (the CLI's flag, set here by a thread after 300 ms) ends a rendezvous that would
 * wait forever (timeout 0), with 128 + the signal, on rank 0 and on a rank that cannot reach it. */
static volatile int stop_flag;
static void *stop_later(void *arg) {
    (void)arg;
    usleep(300 * 1000);
    stop_flag = SIGTERM;
    return NULL;
}

START_TEST(stop_ends_waits) {
    for (int rank = 0; rank < 2; rank++) {
        int port = free_port();
        ct_launch l = launch_of(rank, 2, port, 0);
        l.stop_signal = &stop_flag;
        stop_flag = 0;
        pthread_t th;
        pthread_create(&th, NULL, stop_later, NULL);
        ct_rdzv r;
        ct_err err = {0};
        double t0 = ct_now();
        ck_assert_int_eq(ct_rdzv_open(&r, &l, &err), 128 + SIGTERM);
        ck_assert_msg(strstr(err.msg, "stopped by signal 15 while waiting for"), "%s", err.msg);
        ck_assert_double_lt(ct_now() - t0, 2.0);
        pthread_join(th, NULL);
        ct_rdzv_close(&r);
    }
}
END_TEST

START_TEST(bounded_waits) {
    int port = free_port();
    ct_rdzv r;
    ct_err err = {0};
    /* rank 0 alone: names the missing ranks after the timeout */
    ct_launch l = launch_of(0, 4, port, 1);
    double t0 = ct_now();
    ck_assert_int_eq(ct_rdzv_open(&r, &l, &err), CT_ERR_RUNTIME);
    ck_assert_msg(strstr(err.msg, "for ranks 1, 2, 3 to connect"), "%s", err.msg);
    ck_assert_double_lt(ct_now() - t0, 3.0);
    ct_rdzv_close(&r);
    /* rank 1 alone: names the address it could not reach */
    l = launch_of(1, 2, port, 1);
    t0 = ct_now();
    ck_assert_int_eq(ct_rdzv_open(&r, &l, &err), CT_ERR_RUNTIME);
    ck_assert_msg(strstr(err.msg, "could not reach rank 0 at 127.0.0.1 port"), "%s", err.msg);
    ck_assert_double_lt(ct_now() - t0, 3.0);
    ct_rdzv_close(&r);
    /* no MASTER_ADDR */
    l = launch_of(1, 2, port, 1);
    l.master_addr[0] = '\0';
    ck_assert_int_eq(ct_rdzv_open(&r, &l, &err), CT_ERR_CONFIG);
    /* a MASTER_ADDR that does not resolve: at once, naming it (it waited out the timeout) */
    l = launch_of(1, 2, port, 30);
    snprintf(l.master_addr, sizeof l.master_addr, "no-such-host.invalid");
    t0 = ct_now();
    ck_assert_int_eq(ct_rdzv_open(&r, &l, &err), CT_ERR_CONFIG);
    ck_assert_msg(strstr(err.msg, "MASTER_ADDR no-such-host.invalid does not resolve"), "%s", err.msg);
    ck_assert_double_lt(ct_now() - t0, 5.0);
    ct_rdzv_close(&r);
}
END_TEST

START_TEST(port_under_torchrun) {
    ct_launch l = launch_of(0, 2, 29500, 1);
    unsetenv("TORCHELASTIC_USE_AGENT_STORE");
    ck_assert_int_eq(ct_rdzv_port(&l), 29500);
    setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
    ck_assert_int_eq(ct_rdzv_port(&l), 29501);
    setenv("TORCHELASTIC_USE_AGENT_STORE", "False", 1); /* c10d rendezvous: MASTER_PORT is free */
    ck_assert_int_eq(ct_rdzv_port(&l), 29500);
    unsetenv("TORCHELASTIC_USE_AGENT_STORE");
}
END_TEST

int main(void) {
    Suite *s = suite_create("rendezvous");
    TCase *tc = tcase_create("tcp");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, three_ranks_meet);
    tcase_add_test(tc, another_world);
    tcase_add_test(tc, rank_twice);
    tcase_add_test(tc, root_twice);
    tcase_add_test(tc, another_version);
    tcase_add_test(tc, stop_ends_waits);
    tcase_add_test(tc, bounded_waits);
    tcase_add_test(tc, port_under_torchrun);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
