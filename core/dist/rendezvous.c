/* rendezvous.c: the TCP bootstrap of a torchrun-style launch (rendezvous.h). */
#include "core/dist/rendezvous.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* The first line each rank sends: a word no other program says first, the protocol's version,
 * who it is (rank, world size, and pid and host for messages about two processes). */
#define HELLO_WORD "ctrain-rendezvous"
#define HELLO HELLO_WORD " 2"
/* The line rank 0 sends every rank it has heard in place of the next one it expects, when the
 * rendezvous fails for a reason of the launch (a rank twice, another world size): the others end
 * with the same message and status, not with "rank 0 closed the connection". */
#define REFUSAL "ctrain-rendezvous-refused "

/* The end of a wait: a deadline (1e300: none), and the CLI's stop flag, which cuts it short. */
typedef struct until {
    double deadline;
    volatile int *stop;
} until;

/* A wait of the rendezvous's timeout that starts now (an infinite one for timeout 0). */
static until until_timeout(const ct_rdzv *r) {
    return (until){r->timeout_s > 0 ? ct_now() + r->timeout_s : 1e300, r->stop};
}

static bool stop_asked(const until *u) { return u->stop && *u->stop > 0; }

/* Milliseconds left until the deadline, for poll (-1: no deadline; 0: passed); at most `slice` when
 * a stop flag must be looked at now and then (a signal may land on another thread, and poll then
 * goes on). */
static int ms_left(const until *u, int slice) {
    int ms = -1;
    if (u->deadline < 1e299) {
        double left = u->deadline - ct_now();
        ms = left <= 0 ? 0 : left > 3600 ? 3600000 : (int)(left * 1000) + 1;
    }
    return u->stop && (ms < 0 || ms > slice) ? slice : ms;
}

enum { WAIT_STOPPED = -1, WAIT_TIMEOUT = 0, WAIT_READY = 1 };

/* Waits until fd is ready for `events`, the deadline passes or a stop is asked. */
static int wait_fd(int fd, short events, const until *u) {
    for (;;) {
        if (stop_asked(u)) return WAIT_STOPPED;
        struct pollfd p = {.fd = fd, .events = events};
        int rc = poll(&p, 1, ms_left(u, 200));
        if (rc > 0) return WAIT_READY;
        if (rc == 0 && ms_left(u, 200) == 0) return WAIT_TIMEOUT;
        if (rc < 0 && errno != EINTR) return WAIT_READY; /* the read or write that follows reports the error */
    }
}

static const char *timeout_text(const ct_rdzv *r, char *buf, size_t n) {
    snprintf(buf, n, "%d s (CTRAIN_COMM_TIMEOUT)", r->timeout_s);
    return buf;
}

/* A stop signal came while this rank waited for `what`: nothing was trained yet, so the rank ends
 * at once with 128 + the signal (the CLI has said which signal). */
static int stopped(const ct_rdzv *r, const char *what, ct_err *err) {
    int sig = r->stop ? *r->stop : 0;
    return ct_errf(err, 128 + sig, "rank %d of %d: stopped by signal %d while waiting for %s", r->rank, r->world,
                   sig, what);
}

int ct_rdzv_port(const ct_launch *l) {
    const char *agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
    return l->master_port + (agent && strcmp(agent, "True") == 0 ? 1 : 0);
}

/* ---- lines over a socket ---- */

enum { IO_OK = 0, IO_CLOSED = -1, IO_TIMEOUT = -2, IO_LONG = -3, IO_STOPPED = -4 };

static int io_of_wait(int w) { return w == WAIT_STOPPED ? IO_STOPPED : IO_TIMEOUT; }

static int write_all(int fd, const char *p, size_t n, const until *u) {
    while (n) {
        int w = wait_fd(fd, POLLOUT, u);
        if (w != WAIT_READY) return io_of_wait(w);
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return IO_CLOSED;
        p += k;
        n -= (size_t)k;
    }
    return IO_OK;
}

/* One line into line[CT_RDZV_LINE_MAX] (newline dropped). A byte at a time: a rendezvous reads a
 * handful of short lines. */
static int read_line(int fd, char *line, const until *u) {
    size_t n = 0;
    for (;;) {
        int w = wait_fd(fd, POLLIN, u);
        if (w != WAIT_READY) return io_of_wait(w);
        char ch;
        ssize_t k = recv(fd, &ch, 1, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return IO_CLOSED;
        if (ch == '\n') {
            line[n] = '\0';
            return IO_OK;
        }
        if (n + 1 >= CT_RDZV_LINE_MAX) return IO_LONG;
        line[n++] = ch;
    }
}

static int send_line(int fd, const char *line, const until *u) {
    char buf[CT_RDZV_LINE_MAX + 1];
    int n = snprintf(buf, sizeof buf, "%s\n", line);
    if (n < 0 || (size_t)n >= sizeof buf) return IO_LONG;
    return write_all(fd, buf, (size_t)n, u);
}

/* "pid 123 on host h": who this process is, for messages about two processes of one rank. */
static void who_am_i(char *buf, size_t n) {
    char host[256] = "?";
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = '\0';
    snprintf(buf, n, "pid %ld on host %s", (long)getpid(), host);
}

/* The hello line of rank `rank` of `world`. */
static void hello_of(int rank, int world, char *buf, size_t n) {
    char who[300];
    who_am_i(who, sizeof who);
    snprintf(buf, n, HELLO " rank %d world %d %s", rank, world, who);
}

/* ---- rank 0: listen and hear every other rank ---- */

/* A listening socket on every address of this host (IPv6 with IPv4 mapped, else IPv4): MASTER_ADDR
 * names this host, whichever of its addresses it is. -1 with the reason in why and *why_errno. */
static int listen_any(int port, char *why, size_t why_n, int *why_errno) {
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
        *why_errno = errno;
        snprintf(why, why_n, "%s", strerror(errno));
        return -1;
    }
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_ANY)};
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && listen(fd, 128) == 0) return fd;
    *why_errno = errno;
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

/* A hello's parts; false when the line is not a hello of this protocol version. */
typedef struct hello {
    int rank, world;
    char who[300];               /* "pid P on host H" */
    bool other_version;          /* a ctrain rendezvous hello of another version */
} hello;

static bool parse_hello(const char *line, hello *h) {
    size_t word = strlen(HELLO_WORD), head = strlen(HELLO);
    *h = (hello){.rank = -1, .world = -1};
    if (strncmp(line, HELLO_WORD " ", word + 1) != 0) return false;
    if (strncmp(line, HELLO " ", head + 1) != 0) {
        h->other_version = true;
        return false;
    }
    int used = 0;
    if (sscanf(line + head, " rank %d world %d %n", &h->rank, &h->world, &used) != 2 || !used) return false;
    snprintf(h->who, sizeof h->who, "%s", line + head + used);
    return true;
}

/* Rank 0 refuses the launch: the message goes to every rank it has heard (and to fd, the one that
 * caused it), which end with it too (ct_rdzv_recv), then rank 0 returns it as its own error. */
static int refuse(ct_rdzv *r, int fd, ct_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int refuse(ct_rdzv *r, int fd, ct_err *err, int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char msg[CT_ERR_MSG];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char line[CT_RDZV_LINE_MAX];
    /* one line: the message's own newlines become " / " for the others, who print it back whole */
    snprintf(line, sizeof line, REFUSAL "%d %s", code, msg);
    for (char *p = line; (p = strchr(p, '\n'));) *p = '\x1f';
    until u = {ct_now() + 2, NULL};
    for (int i = 1; i < r->world; i++)
        if (r->peer[i] >= 0) (void)send_line(r->peer[i], line, &u);
    if (fd >= 0) (void)send_line(fd, line, &u);
    return ct_errf(err, code, "%s", msg);
}

/* A connection's hello, read and checked: the peer's rank (> 0) in *rank_out, or -1 for one that is
 * not a ctrain rank of a launch (ignored: a port scanner, a health check), or an error (sent to the
 * ranks heard so far as well) for one of another world size or version, or a rank seen already. */
static int hear_hello(ct_rdzv *r, int fd, const ct_launch *l, int *rank_out, ct_err *err) {
    char line[CT_RDZV_LINE_MAX], me[300];
    *rank_out = -1;
    /* a peer that connected says hello at once: a few seconds is plenty, and bounds a silent one */
    until u = {ct_now() + 5, r->stop};
    if (read_line(fd, line, &u) != IO_OK) return CT_OK;
    hello h;
    if (!parse_hello(line, &h)) {
        if (!h.other_version) return CT_OK;
        return refuse(r, -1, err, CT_ERR_CONFIG, "rank 0 of %d: a process of another ctrain version connected to "
                      "port %d (it said \"%.60s\"): every rank of a job must run the same ctrain", r->world,
                      ct_rdzv_port(l), line);
    }
    if (h.world != r->world)
        return refuse(r, fd, err, CT_ERR_CONFIG, "rank 0 of %d: a rank %d of WORLD_SIZE=%d (%s) connected to port %d: "
                      "ranks of two launches met on MASTER_ADDR=%s.\n  Give every rank of one job the same "
                      "WORLD_SIZE, and each job its own MASTER_PORT", r->world, h.rank, h.world, h.who,
                      ct_rdzv_port(l), l->master_addr);
    if (h.rank == 0 || (h.rank > 0 && h.rank < r->world && r->peer[h.rank] >= 0)) {
        char first[400];
        who_am_i(me, sizeof me);
        if (h.rank == 0) snprintf(first, sizeof first, "%s (listening on port %d)", me, ct_rdzv_port(l));
        else snprintf(first, sizeof first, "%s (connected first)", r->who[h.rank]);
        return refuse(r, fd, err, CT_ERR_CONFIG, "two processes say they are RANK=%d of WORLD_SIZE=%d: %s and %s.\n  "
                      "Every process of the job needs its own RANK, 0 to %d", h.rank, r->world, first, h.who,
                      r->world - 1);
    }
    if (h.rank < 0 || h.rank >= r->world) return CT_OK;
    r->who[h.rank] = ct_xstrdup(h.who);
    *rank_out = h.rank;
    return CT_OK;
}

/* A refusal line from rank 0 as this rank's error (its code and message); CT_OK when the line is
 * not one. */
static int refused_by_root(const char *line, ct_err *err) {
    size_t k = strlen(REFUSAL);
    int code = 0, used = 0;
    if (strncmp(line, REFUSAL, k) != 0 || sscanf(line + k, "%d %n", &code, &used) != 1 || code <= 0) return CT_OK;
    ct_errf(err, code, "%s", line + k + used);
    for (char *p = err->msg; (p = strchr(p, '\x1f'));) *p = '\n';
    return code;
}

/* One connection attempt to any address of host:port, bounded by u: the socket, or -1 with the
 * reason in why; -2 when host is a name that does not resolve. */
static int connect_once(const char *host, int port, const until *u, char *why, size_t why_n) {
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *list = NULL;
    int g = getaddrinfo(host, service, &hints, &list);
    if (g) {   /* -2: a name that does not resolve, which no retry changes (EAI_AGAIN is retried) */
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
            if (wait_fd(fd, POLLOUT, u) == WAIT_READY) getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
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

/* Rank 0 cannot listen because the port is taken: when what holds it is another rank 0 of this
 * job, it says so (it refuses this process's hello as a second RANK=0); that refusal, or CT_OK
 * when something else holds the port. */
static int probe_second_root(ct_rdzv *r, const ct_launch *l, int port, ct_err *err) {
    char why[256], line[CT_RDZV_LINE_MAX];
    until u = {ct_now() + 3, r->stop};
    int fd = connect_once(l->master_addr, port, &u, why, sizeof why), rc = CT_OK;
    if (fd < 0) return CT_OK;
    hello_of(0, r->world, line, sizeof line);
    if (send_line(fd, line, &u) == IO_OK && read_line(fd, line, &u) == IO_OK) rc = refused_by_root(line, err);
    close(fd);
    return rc;
}

static int open_root(ct_rdzv *r, const ct_launch *l, ct_err *err) {
    int port = ct_rdzv_port(l), why_errno = 0;
    char why[256] = "", t[64];
    int lfd = listen_any(port, why, sizeof why, &why_errno);
    if (lfd < 0 && why_errno == EADDRINUSE && probe_second_root(r, l, port, err)) return err->code;
    if (lfd < 0)
        return ct_errf(err, CT_ERR_RUNTIME, "rank 0 of %d: cannot listen on TCP port %d for the other ranks: %s.\n  "
                       "Choose a free MASTER_PORT%s", r->world, port, why,
                       port != l->master_port ? " (under torchrun ctrain listens on MASTER_PORT + 1: torchrun's "
                       "agent holds MASTER_PORT)" : "");
    until u = until_timeout(r);
    int heard = 0, rc = CT_OK;
    while (heard < r->world - 1) {
        int w = wait_fd(lfd, POLLIN, &u);
        if (w == WAIT_STOPPED) {
            rc = stopped(r, "the other ranks to connect", err);
            break;
        }
        if (w == WAIT_TIMEOUT) {
            char missing[160];
            missing_ranks(r, missing, sizeof missing);
            rc = ct_errf(err, CT_ERR_RUNTIME, "rank 0 of %d: waited %s on port %d for rank%s %s to connect.\n  Start "
                         "every rank with the same MASTER_ADDR (an address of rank 0's host), MASTER_PORT and "
                         "WORLD_SIZE=%d (and only one with RANK=0: the others may have met another)", r->world,
                         timeout_text(r, t, sizeof t), port, r->world - 1 - heard > 1 ? "s" : "", missing, r->world);
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

static int open_peer(ct_rdzv *r, const ct_launch *l, ct_err *err) {
    int port = ct_rdzv_port(l);
    until u = until_timeout(r);
    char why[256] = "", t[64], what[320];
    for (;;) {
        r->to_root = connect_once(l->master_addr, port, &u, why, sizeof why);
        if (r->to_root >= 0) break;
        if (r->to_root == -2)   /* at once: waiting out the timeout would not make the name resolve */
            return ct_errf(err, CT_ERR_CONFIG, "rank %d of %d: MASTER_ADDR %s does not resolve (%s): set it to the "
                           "host name or address of rank 0's host", r->rank, r->world, l->master_addr, why);
        snprintf(what, sizeof what, "rank 0 at %s port %d", l->master_addr, port);
        if (stop_asked(&u)) return stopped(r, what, err);
        if (ms_left(&u, 200) == 0)
            return ct_errf(err, CT_ERR_RUNTIME, "rank %d of %d: could not reach rank 0 at %s port %d for %s (%s).\n  Is "
                           "rank 0 running, and MASTER_ADDR an address of its host that this host can reach? (Or "
                           "rank 0 had met %d other ranks already: was RANK=%d given to two processes?)", r->rank,
                           r->world, l->master_addr, port, timeout_text(r, t, sizeof t), why, r->world - 1, r->rank);
        usleep(100 * 1000); /* rank 0 is not listening yet */
    }
    char hello[CT_RDZV_LINE_MAX];
    hello_of(r->rank, r->world, hello, sizeof hello);
    int io = send_line(r->to_root, hello, &u);
    if (io == IO_STOPPED) return stopped(r, "rank 0", err);
    if (io != IO_OK)
        return ct_errf(err, CT_ERR_RUNTIME, "rank %d of %d: the connection to rank 0 at %s port %d failed: %s", r->rank,
                       r->world, l->master_addr, port, io == IO_TIMEOUT ? "timed out" : strerror(errno));
    return CT_OK;
}

int ct_rdzv_open(ct_rdzv *r, const ct_launch *l, ct_err *err) {
    *r = (ct_rdzv){.rank = l->rank, .world = l->world, .timeout_s = l->comm_timeout_s, .to_root = -1,
                   .stop = l->stop_signal};
    if (!l->master_addr[0] || !l->master_port) /* ct_comm_open says which variable to set */
        return ct_errf(err, CT_ERR_CONFIG, "rank %d: no MASTER_ADDR and MASTER_PORT to meet at", l->rank);
    if (l->rank != 0) return open_peer(r, l, err);
    r->peer = ct_xcalloc((size_t)r->world, sizeof *r->peer);
    r->who = ct_xcalloc((size_t)r->world, sizeof *r->who);
    for (int i = 0; i < r->world; i++) r->peer[i] = -1;
    return open_root(r, l, err);
}

int ct_rdzv_send(ct_rdzv *r, int to, const char *line, ct_err *err) {
    until u = until_timeout(r);
    int io = send_line(r->peer[to], line, &u);
    if (io == IO_OK) return CT_OK;
    if (io == IO_STOPPED) return stopped(r, "the other ranks", err);
    return ct_errf(err, CT_ERR_RUNTIME, "rank 0 of %d: rank %d's rendezvous connection failed (%s): did rank %d "
                   "end?", r->world, to, io == IO_TIMEOUT ? "timed out" : errno ? strerror(errno) : "closed", to);
}

int ct_rdzv_recv(ct_rdzv *r, char *line, ct_err *err) {
    char t[64];
    until u = until_timeout(r);
    int io = read_line(r->to_root, line, &u);
    if (io == IO_OK) {
        int rc = refused_by_root(line, err);
        return rc ? rc : CT_OK;
    }
    if (io == IO_STOPPED) return stopped(r, "rank 0", err);
    if (io == IO_TIMEOUT)
        return ct_errf(err, CT_ERR_RUNTIME, "rank %d of %d: rank 0 said nothing for %s while the ranks joined",
                       r->rank, r->world, timeout_text(r, t, sizeof t));
    return ct_errf(err, CT_ERR_RUNTIME, "rank %d of %d: rank 0 closed the rendezvous connection (%s): rank 0's "
                   "output says why", r->rank, r->world, io == IO_LONG ? "a line too long" : "it ended or failed");
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
        if (r->stop && *r->stop > 0) {
            rc = stopped(r, "ompi-server to start", err);
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
    for (int i = 0; r->who && i < r->world; i++) free(r->who[i]);
    free(r->who);
    r->who = NULL;
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
