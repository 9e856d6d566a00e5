/* rendezvous.c: the TCP bootstrap of a torchrun-style launch (rendezvous.h). */
#include "core/dist/rendezvous.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* The first line each rank sends: a word no other program says first, the protocol's version,
 * who it is. */
#define HELLO "ctrain-rendezvous 1"

/* The deadline of a wait that starts now (an infinite one for timeout 0). */
static double deadline_of(const ct_rdzv *r) { return r->timeout_s > 0 ? ct_now() + r->timeout_s : 1e300; }

/* Milliseconds left until the deadline, for poll (-1: no deadline; 0: passed). */
static int ms_left(double deadline) {
    if (deadline >= 1e299) return -1;
    double left = deadline - ct_now();
    if (left <= 0) return 0;
    return left > 3600 ? 3600000 : (int)(left * 1000) + 1;
}

/* Waits until fd is ready for `events` or the deadline: 1 ready, 0 timed out. */
static int wait_fd(int fd, short events, double deadline) {
    for (;;) {
        struct pollfd p = {.fd = fd, .events = events};
        int rc = poll(&p, 1, ms_left(deadline));
        if (rc > 0) return 1;
        if (rc == 0) return 0;
        if (errno != EINTR) return 1; /* the read or write that follows reports the error */
    }
}

static const char *timeout_text(const ct_rdzv *r, char *buf, size_t n) {
    snprintf(buf, n, "%d s (CTRAIN_COMM_TIMEOUT)", r->timeout_s);
    return buf;
}

int ct_rdzv_port(const ct_launch *l) {
    const char *agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
    return l->master_port + (agent && strcmp(agent, "True") == 0 ? 1 : 0);
}

/* ---- lines over a socket ---- */

static int write_all(int fd, const char *p, size_t n, double deadline) {
    while (n) {
        if (!wait_fd(fd, POLLOUT, deadline)) return -1;
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

/* One line into line[CT_RDZV_LINE_MAX] (newline dropped): 0; -1 the peer closed or failed; -2 timed
 * out; -3 longer than the limit. A byte at a time: a rendezvous reads a handful of short lines. */
static int read_line(int fd, char *line, double deadline) {
    size_t n = 0;
    for (;;) {
        if (!wait_fd(fd, POLLIN, deadline)) return -2;
        char ch;
        ssize_t k = recv(fd, &ch, 1, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return -1;
        if (ch == '\n') {
            line[n] = '\0';
            return 0;
        }
        if (n + 1 >= CT_RDZV_LINE_MAX) return -3;
        line[n++] = ch;
    }
}

static int send_line(int fd, const char *line, double deadline) {
    char buf[CT_RDZV_LINE_MAX + 1];
    int n = snprintf(buf, sizeof buf, "%s\n", line);
    if (n < 0 || (size_t)n >= sizeof buf) return -1;
    return write_all(fd, buf, (size_t)n, deadline);
}

/* ---- rank 0: listen and hear every other rank ---- */

/* A listening socket on every address of this host (IPv6 with IPv4 mapped, else IPv4): MASTER_ADDR
 * names this host, whichever of its addresses it is. */
static int listen_any(int port, char *why, size_t why_n) {
    int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int off = 0, on = 1;
    if (fd >= 0) {
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off);
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
        struct sockaddr_in6 a = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port), .sin6_addr = in6addr_any};
        if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 128) == 0) return fd;
        close(fd);
    }
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(why, why_n, "%s", strerror(errno));
        return -1;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_ANY)};
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 128) == 0) return fd;
    snprintf(why, why_n, "%s", strerror(errno));
    close(fd);
    return -1;
}

/* "1, 3, 4" (the first few) of the ranks that have not connected, into buf. */
static void missing_ranks(const ct_rdzv *r, char *buf, size_t n) {
    size_t used = 0;
    int shown = 0, more = 0;
    buf[0] = '\0';
    for (int i = 1; i < r->world; i++) {
        if (r->peer[i] >= 0) continue;
        if (shown == 8) {
            more++;
            continue;
        }
        used += (size_t)snprintf(buf + used, n - used, "%s%d", shown ? ", " : "", i);
        if (used >= n) return;
        shown++;
    }
    if (more) snprintf(buf + used, n - used, " and %d more", more);
}

/* A connection's hello: the peer's rank (> 0), or -1 for one that is not a ctrain rank of a
 * launch (ignored: a port scanner, a health check), or an error for one that is of another
 * world or a rank seen already. */
static int hear_hello(ct_rdzv *r, int fd, const ct_launch *l, int *rank_out, ct_err *err) {
    char line[CT_RDZV_LINE_MAX];
    *rank_out = -1;
    /* a peer that connected says hello at once: a few seconds is plenty, and bounds a silent one */
    if (read_line(fd, line, ct_now() + 5) != 0) return CT_OK;
    int rank = -1, world = -1, used = 0;
    if (strncmp(line, HELLO " ", strlen(HELLO) + 1) != 0 ||
        sscanf(line + strlen(HELLO), " rank %d world %d%n", &rank, &world, &used) != 2 || line[strlen(HELLO) + (size_t)used])
        return CT_OK;
    if (world != r->world)
        return ct_errf(err, CT_ERR_CONFIG, "rank 0 of %d: a rank %d of WORLD_SIZE=%d connected to port %d: ranks of "
                       "two launches met on MASTER_ADDR=%s.\n  Give every rank of one job the same WORLD_SIZE, and "
                       "each job its own MASTER_PORT", r->world, rank, world, ct_rdzv_port(l), l->master_addr);
    if (rank <= 0 || rank >= r->world || r->peer[rank] >= 0)
        return ct_errf(err, CT_ERR_CONFIG, "rank 0 of %d: a second process says it is RANK=%d: every process of "
                       "the job needs its own RANK, 0 to %d", r->world, rank, r->world - 1);
    *rank_out = rank;
    return CT_OK;
}

static int open_root(ct_rdzv *r, const ct_launch *l, ct_err *err) {
    int port = ct_rdzv_port(l);
    char why[256] = "", t[64];
    int lfd = listen_any(port, why, sizeof why);
    if (lfd < 0)
        return ct_errf(err, CT_ERR_RUNTIME, "rank 0 of %d: cannot listen on TCP port %d for the other ranks: %s.\n  "
                       "Choose a free MASTER_PORT%s", r->world, port, why,
                       port != l->master_port ? " (under torchrun ctrain listens on MASTER_PORT + 1: torchrun's "
                       "agent holds MASTER_PORT)" : "");
    double deadline = deadline_of(r);
    int heard = 0, rc = CT_OK;
    while (heard < r->world - 1) {
        if (!wait_fd(lfd, POLLIN, deadline)) {
            char missing[160];
            missing_ranks(r, missing, sizeof missing);
            rc = ct_errf(err, CT_ERR_RUNTIME, "rank 0 of %d: waited %s on port %d for rank%s %s to connect.\n  Start "
                         "every rank with the same MASTER_ADDR (an address of rank 0's host), MASTER_PORT and "
                         "WORLD_SIZE=%d", r->world, timeout_text(r, t, sizeof t), port,
                         r->world - 1 - heard > 1 ? "s" : "", missing, r->world);
            break;
        }
        int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) {
            usleep(10 * 1000); /* out of descriptors, a connection gone: not a busy loop */
            continue;
        }
        int rank;
        if ((rc = hear_hello(r, fd, l, &rank, err))) {
            close(fd);
            break;
        }
        if (rank < 0) {
            close(fd);
            continue;
        }
        r->peer[rank] = fd;
        heard++;
    }
    close(lfd);
    return rc;
}

/* ---- other ranks: reach rank 0 ---- */

/* One connection attempt to any address of host:port, bounded by the deadline: the socket, or -1
 * with the reason in why; -2 when host is a name that does not resolve (no retry changes that; a
 * resolver that cannot answer now, EAI_AGAIN, is -1 and retried). */
static int connect_once(const char *host, int port, double deadline, char *why, size_t why_n) {
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *list = NULL;
    int g = getaddrinfo(host, service, &hints, &list);
    if (g) {
        snprintf(why, why_n, "%s", gai_strerror(g));
        return g == EAI_NONAME || g == EAI_FAIL ? -2 : -1;
    }
    int fd = -1;
    for (struct addrinfo *a = list; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
        if (fd < 0) continue;
        int rc = connect(fd, a->ai_addr, a->ai_addrlen);
        if (rc < 0 && errno == EINPROGRESS) {
            int soerr = ETIMEDOUT;
            socklen_t len = sizeof soerr;
            if (wait_fd(fd, POLLOUT, deadline)) getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
            rc = soerr ? -1 : 0;
            errno = soerr;
        }
        if (rc == 0) break;
        snprintf(why, why_n, "%s", strerror(errno));
        close(fd);
        fd = -1;
    }
    freeaddrinfo(list);
    if (fd >= 0) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

static int open_peer(ct_rdzv *r, const ct_launch *l, ct_err *err) {
    int port = ct_rdzv_port(l);
    double deadline = deadline_of(r);
    char why[256] = "", t[64];
    for (;;) {
        r->to_root = connect_once(l->master_addr, port, deadline, why, sizeof why);
        if (r->to_root >= 0) break;
        if (r->to_root == -2)   /* at once: waiting out the timeout would not make the name resolve */
            return ct_errf(err, CT_ERR_CONFIG, "rank %d of %d: MASTER_ADDR %s does not resolve (%s): set it to the "
                           "host name or address of rank 0's host", r->rank, r->world, l->master_addr, why);
        if (ms_left(deadline) == 0)
            return ct_errf(err, CT_ERR_RUNTIME, "rank %d of %d: could not reach rank 0 at %s port %d for %s (%s).\n  Is "
                           "rank 0 running, and MASTER_ADDR an address of its host that this host can reach?",
                           r->rank, r->world, l->master_addr, port, timeout_text(r, t, sizeof t), why);
        usleep(100 * 1000); /* rank 0 is not listening yet */
    }
    char hello[96];
    snprintf(hello, sizeof hello, HELLO " rank %d world %d", r->rank, r->world);
    if (send_line(r->to_root, hello, deadline))
        return ct_errf(err, CT_ERR_RUNTIME, "rank %d of %d: the connection to rank 0 at %s port %d failed: %s", r->rank,
                       r->world, l->master_addr, port, strerror(errno));
    return CT_OK;
}

int ct_rdzv_open(ct_rdzv *r, const ct_launch *l, ct_err *err) {
    *r = (ct_rdzv){.rank = l->rank, .world = l->world, .timeout_s = l->comm_timeout_s, .to_root = -1};
    if (!l->master_addr[0] || !l->master_port) /* ct_comm_open says which variable to set */
        return ct_errf(err, CT_ERR_CONFIG, "rank %d: no MASTER_ADDR and MASTER_PORT to meet at", l->rank);
    if (l->rank != 0) return open_peer(r, l, err);
    r->peer = ct_xcalloc((size_t)r->world, sizeof *r->peer);
    for (int i = 0; i < r->world; i++) r->peer[i] = -1;
    return open_root(r, l, err);
}

int ct_rdzv_send(ct_rdzv *r, int to, const char *line, ct_err *err) {
    if (send_line(r->peer[to], line, deadline_of(r)))
        return ct_errf(err, CT_ERR_RUNTIME, "rank 0 of %d: rank %d's rendezvous connection failed (%s): did rank %d "
                       "end?", r->world, to, errno ? strerror(errno) : "timed out", to);
    return CT_OK;
}

int ct_rdzv_recv(ct_rdzv *r, char *line, ct_err *err) {
    char t[64];
    int rc = read_line(r->to_root, line, deadline_of(r));
    if (rc == 0) return CT_OK;
    if (rc == -2)
        return ct_errf(err, CT_ERR_RUNTIME, "rank %d of %d: rank 0 said nothing for %s while the ranks joined",
                       r->rank, r->world, timeout_text(r, t, sizeof t));
    return ct_errf(err, CT_ERR_RUNTIME, "rank %d of %d: rank 0 closed the rendezvous connection (%s): rank 0's "
                   "output says why", r->rank, r->world, rc == -3 ? "a line too long" : "it ended or failed");
}

int ct_rdzv_share(ct_rdzv *r, char *line, ct_err *err) {
    if (r->rank != 0) return ct_rdzv_recv(r, line, err);
    int rc = CT_OK;
    for (int to = 1; !rc && to < r->world; to++) rc = ct_rdzv_send(r, to, line, err);
    return rc;
}

/* ---- rank 0: OpenMPI's data server ---- */

/* The first line of a small file into line (newline dropped): 1 when a whole line is there. */
static int read_first_line(const char *path, char *line, size_t n) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    int whole = fgets(line, (int)n, f) && strchr(line, '\n');
    fclose(f);
    if (whole) line[strcspn(line, "\n")] = '\0';
    return whole;
}

int ct_rdzv_start_server(ct_rdzv *r, char *uri, ct_err *err) {
    const char *tmp = getenv("TMPDIR");
    char dir[512], uri_path[600], log_path[600];
    snprintf(dir, sizeof dir, "%s/ctrain-rendezvous-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(dir))
        return ct_errf(err, CT_ERR_RUNTIME, "rank 0: cannot make a temporary folder in %s for ompi-server's "
                       "address: %s (set TMPDIR)", tmp && *tmp ? tmp : "/tmp", strerror(errno));
    snprintf(uri_path, sizeof uri_path, "%s/uri", dir);
    snprintf(log_path, sizeof log_path, "%s/log", dir);
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) return ct_errf(err, CT_ERR_RUNTIME, "rank 0: fork for ompi-server failed: %s", strerror(errno));
    if (pid == 0) {
        /* the server ends with rank 0, however rank 0 ends */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() != parent) _exit(126);
        int devnull = open("/dev/null", O_RDONLY), log = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (devnull >= 0) dup2(devnull, 0);
        if (log >= 0) dup2(log, 1), dup2(log, 2);
        execlp("ompi-server", "ompi-server", "--no-daemonize", "-r", uri_path, (char *)NULL);
        _exit(127);
    }
    r->server = pid;
    /* it starts in well under a second; 30 s covers a loaded host, the timeout a shorter wish */
    double wait_s = r->timeout_s > 0 && r->timeout_s < 30 ? r->timeout_s : 30, deadline = ct_now() + wait_s;
    int rc = CT_OK, status = 0;
    while (!read_first_line(uri_path, uri, CT_RDZV_LINE_MAX)) {
        if (waitpid(pid, &status, WNOHANG) == pid) {
            r->server = 0;
            char said[512] = "";
            read_first_line(log_path, said, sizeof said);
            if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
                rc = ct_errf(err, CT_ERR_RUNTIME, "the torchrun-style launch needs OpenMPI's ompi-server, which is not "
                             "on PATH (Debian: openmpi-bin).\n  Install it, or launch with mpirun -np %d", r->world);
            else
                rc = ct_errf(err, CT_ERR_RUNTIME, "rank 0: ompi-server ended before it gave its address%s%s",
                             said[0] ? ": " : "", said);
            break;
        }
        if (ct_now() > deadline) {
            rc = ct_errf(err, CT_ERR_RUNTIME, "rank 0: ompi-server gave no address in %.0f s", wait_s);
            break;
        }
        usleep(20 * 1000);
    }
    unlink(uri_path);
    unlink(log_path);
    rmdir(dir);
    return rc;
}

void ct_rdzv_close_sockets(ct_rdzv *r) {
    if (r->peer)
        for (int i = 0; i < r->world; i++)
            if (r->peer[i] >= 0) close(r->peer[i]), r->peer[i] = -1;
    if (r->to_root >= 0) close(r->to_root), r->to_root = -1;
}

void ct_rdzv_close(ct_rdzv *r) {
    ct_rdzv_close_sockets(r);
    free(r->peer);
    r->peer = NULL;
    if (r->server > 0) {
        kill(r->server, SIGTERM);
        /* bounded: a server that ignores SIGTERM for 2 s is killed */
        for (int i = 0; i < 100 && waitpid(r->server, NULL, WNOHANG) == 0; i++) usleep(20 * 1000);
        if (waitpid(r->server, NULL, WNOHANG) == 0) {
            kill(r->server, SIGKILL);
            waitpid(r->server, NULL, 0);
        }
        r->server = 0;
    }
}
