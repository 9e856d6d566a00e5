/* hdf5_probe.c: libhdf5 in a child process (hdf5_probe.h): the child's work with libhdf5, and
 * running it (fork, or posix_spawn of $CTRAIN_HDF5_PROBE) and reading its reply. */
#include "core/data/hdf5_probe.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/data/hdf5_lib.h"

extern char **environ;

#ifdef CT_HAVE_HDF5

/* A probe that runs longer than this is stopped (SIGALRM) and its file reported like a crash:
 * a metadata walk of a real file takes milliseconds; a corrupt one can loop. */
enum { PROBE_SECONDS = 120, MAX_NAME = 256, INFO_LINKS = 200 };
/* And may grow its address space by at most this much: libhdf5 sizes allocations by numbers read
 * from the file (4 GB, memset, for a mutated 168-byte file: test/fuzz/regress/
 * hdf5-libhdf5-4gb-alloc.h5), which a probe must not take from the machine it trains on. A real
 * file's metadata, even 4M chunks' index, takes a few hundred MB at most. */
#define PROBE_MEMORY ((uint64_t)2 << 30)

/* The address-space limit of this process: what it maps now plus PROBE_MEMORY (a fork of ctrain
 * may map much already: a CUDA context reserves tens of GB). Past it malloc returns NULL, which
 * libhdf5 reports (or crashes on: a probe crash either way). */
static void limit_memory(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long pages = 0;
    if (!f) return;
    bool ok = fscanf(f, "%llu", &pages) == 1;
    fclose(f);
    long page = sysconf(_SC_PAGESIZE);
    if (!ok || page <= 0) return;
    struct rlimit r;
    if (getrlimit(RLIMIT_AS, &r) != 0) return;
    rlim_t want = (rlim_t)(pages * (unsigned long long)page + PROBE_MEMORY);
    if (r.rlim_cur == RLIM_INFINITY || want < r.rlim_cur) {
        r.rlim_cur = want;
        setrlimit(RLIMIT_AS, &r);
    }
}

/* ---------------- the child: resolving a dataset with libhdf5 ---------------- */

/* The element type of t into l (class, bytes, order, sign). */
static void read_type(const ct_h5 *h5, hid_t t, ct_h5_layout *l) {
    H5T_class_t cls = h5->H5Tget_class(t);
    size_t size = h5->H5Tget_size(t);
    l->cls = (int)cls >= 0 && (int)cls <= (int)CT_H5_CLASS_LAST ? (ct_h5_class)cls : CT_H5_CLASS_LAST;
    l->elem = size >= 1 && size <= 65536 ? (uint32_t)size : 65536;
    l->little = size == 1 || h5->H5Tget_order(t) == H5T_ORDER_LE;
    l->is_signed = cls == H5T_INTEGER && h5->H5Tget_sign(t) == H5T_SGN_2;
}

/* "a, b, c" of the links in the file's root group, for a missing dataset's message. */
static void root_names(const ct_h5 *h5, hid_t file, char *out, size_t n) {
    H5G_info_t info;
    size_t used = 0;
    out[0] = '\0';
    if (h5->H5Gget_info(file, &info) < 0) return;
    for (hsize_t k = 0; k < info.nlinks; k++) {
        char name[MAX_NAME];
        if (h5->H5Lget_name_by_idx(file, ".", H5_INDEX_NAME, H5_ITER_INC, k, name, sizeof name, H5P_DEFAULT) < 0)
            break;
        char shown[4 * MAX_NAME];   /* a name from the file: control bytes escaped */
        ct_printable_name(shown, sizeof shown, name);
        if (used + strlen(shown) + 8 >= n) { /* room for ", ..." */
            memcpy(out + used, ", ...", 6);
            return;
        }
        used += (size_t)snprintf(out + used, n - used, "%s%s", used ? ", " : "", shown);
    }
}

/* Every grid cell's chunk: address, stored size, filter mask (unwritten: CT_H5_UNALLOCATED). */
static void read_chunk_index(const ct_h5 *h5, hid_t dset, ct_h5_layout *l) {
    l->chunks = ct_xcalloc((size_t)l->nchunks, sizeof *l->chunks);
    int64_t g[CT_H5_MAX_RANK] = {0};
    for (uint64_t k = 0; k < l->nchunks; k++) {
        hsize_t offset[CT_H5_MAX_RANK];
        for (int d = 0; d < l->ndim; d++) offset[d] = (hsize_t)(g[d] * l->chunk[d]);
        unsigned mask = 0;
        haddr_t addr = HADDR_UNDEF;
        hsize_t size = 0;
        if (h5->H5Dget_chunk_info_by_coord(dset, offset, &mask, &addr, &size) < 0) h5->H5Eclear2(H5E_DEFAULT);
        bool written = addr != HADDR_UNDEF && size > 0;
        l->chunks[k] = (ct_h5_chunk){written ? (uint64_t)addr : CT_H5_UNALLOCATED, written ? size : 0, mask};
        for (int d = l->ndim - 1; d >= 0 && ++g[d] == l->grid[d]; d--) g[d] = 0;
    }
}

/* The storage of dataset dset (its shape and type already in l). CT_OK or the reason in err. */
static int read_storage(const ct_h5 *h5, hid_t dset, hid_t ftype, const char *path, const char *name,
                        const char *role, const hsize_t *maxdims, ct_h5_layout *l, ct_err *err) {
    hid_t dcpl = h5->H5Dget_create_plist(dset);
    if (dcpl < 0)
        return ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (%s): libhdf5 cannot read its storage properties", path,
                       name, role);
    int rc = CT_OK;
    H5D_layout_t layout = h5->H5Pget_layout(dcpl);
    H5D_fill_value_t fill_state = H5D_FILL_VALUE_UNDEFINED;
    if (l->elem <= CT_H5_MAX_ELEM && h5->H5Pfill_value_defined(dcpl, &fill_state) >= 0 &&
        fill_state != H5D_FILL_VALUE_UNDEFINED && h5->H5Pget_fill_value(dcpl, ftype, l->fill) < 0)
        memset(l->fill, 0, sizeof l->fill);
    if (h5->H5Pget_external_count(dcpl) > 0) {
        rc = ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (%s) keeps its data in external files: not read by ctrain "
                     "(copy it into the file: h5repack -l CONTI)", path, name, role);
    } else if (layout == H5D_CONTIGUOUS) {
        haddr_t off = h5->H5Dget_offset(dset);
        l->storage = off == HADDR_UNDEF ? CT_H5_NOT_WRITTEN : CT_H5_CONTIGUOUS;
        l->addr = off == HADDR_UNDEF ? 0 : (uint64_t)off;
        l->size = h5->H5Dget_storage_size(dset);
    } else if (layout == H5D_COMPACT) {
        uint64_t total = 0;
        l->storage = CT_H5_COMPACT;
        if (!ct_h5_block_bytes(l->dims, 0, l->ndim, l->elem, &total) || total > CT_H5_COMPACT_MAX) {
            rc = ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (%s): compact data of more than 64 KiB: a corrupt layout "
                         "message", path, name, role);
        } else {
            l->size = total;
            l->compact = ct_xmalloc((size_t)total);
            if (h5->H5Dread(dset, ftype, H5S_ALL, H5S_ALL, H5P_DEFAULT, l->compact) < 0) {
                char why[400];
                ct_h5_why(h5, why, sizeof why);
                rc = ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (%s): cannot read its compact data: %s", path, name,
                             role, why);
            }
        }
    } else if (layout == H5D_CHUNKED) {
        hsize_t chunk[H5S_MAX_RANK];
        int cn = h5->H5Pget_chunk(dcpl, H5S_MAX_RANK, chunk);
        /* A chunk larger than a fixed dimension cannot be written (H5Pset_chunk refuses it): it is a
         * corrupt layout message, on which libhdf5 1.10 reads past its chunk buffer (fuzz_hdf5). */
        bool bad = cn != l->ndim;
        for (int d = 0; d < l->ndim && !bad; d++)
            bad = chunk[d] < 1 || (maxdims[d] != H5S_UNLIMITED && chunk[d] > maxdims[d]) || chunk[d] > ((hsize_t)1 << 32);
        uint64_t cells = 1;
        for (int d = 0; d < l->ndim && !bad; d++) {
            l->chunk[d] = (int64_t)chunk[d];
            l->grid[d] = (l->dims[d] + l->chunk[d] - 1) / l->chunk[d];
            cells = cells > CT_H5_MAX_CHUNKS ? cells : cells * (uint64_t)l->grid[d];
        }
        int nf = bad ? 0 : h5->H5Pget_nfilters(dcpl);
        if (bad) {
            char text[200] = "[";
            for (int d = 0; d < cn && d < H5S_MAX_RANK; d++)
                snprintf(text + strlen(text), sizeof text - strlen(text), "%s%llu", d ? ", " : "", (unsigned long long)chunk[d]);
            rc = ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (%s): chunks %s] do not fit its fixed shape of %d "
                         "dimensions: a corrupt layout message", path, name, role, text, l->ndim);
        } else if (cells > CT_H5_MAX_CHUNKS) {
            rc = ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (%s): %llu chunks or more (ctrain reads at most %llu; "
                         "rewrite it with larger chunks: h5repack -l CHUNK=...)", path, name, role,
                         (unsigned long long)cells, (unsigned long long)CT_H5_MAX_CHUNKS);
        } else if (nf < 0 || nf > CT_H5_MAX_FILTERS) {
            rc = ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (%s): %d filters (ctrain reads up to %d)", path, name,
                         role, nf, CT_H5_MAX_FILTERS);
        } else {
            l->storage = CT_H5_CHUNKED;
            l->nchunks = cells;
            l->nfilters = nf;
            for (int k = 0; k < nf; k++) {
                ct_h5_filter *f = &l->filters[k];
                char fname[64];
                unsigned config = 0;
                size_t ncd = CT_H5_MAX_CD;
                H5Z_filter_t id = h5->H5Pget_filter2(dcpl, (unsigned)k, &f->flags, &ncd, f->cd, sizeof fname, fname, &config);
                f->id = id >= 0 && id <= 65535 ? (uint32_t)id : 65535;
                f->ncd = ncd < CT_H5_MAX_CD ? (uint32_t)ncd : CT_H5_MAX_CD;
            }
            read_chunk_index(h5, dset, l);
        }
    } else {
        rc = ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (%s): a virtual or unknown storage layout: not read by ctrain "
                     "(h5repack -l CONTI writes it contiguous)", path, name, role);
    }
    h5->H5Pclose(dcpl);
    h5->H5Eclear2(H5E_DEFAULT);
    return rc;
}

/* Dataset `name` of the file: shape, element type, storage; CT_OK or the reason in err. */
static int resolve(const ct_h5 *h5, hid_t file, const char *path, const char *name, const char *role, ct_h5_layout *l,
                   ct_err *err) {
    char why[400];
    htri_t exists = h5->H5Lexists(file, name, H5P_DEFAULT);
    if (exists <= 0) {
        char names[400];
        h5->H5Eclear2(H5E_DEFAULT);
        root_names(h5, file, names, sizeof names);
        return ct_errf(err, CT_ERR_DATA, "%s: no dataset \"%s\" (%s) in the file; its root group has: %s (set the "
                       "entry's \"%s\", or pack's --features, to one of them)", path, name, role,
                       names[0] ? names : "nothing", role);
    }
    hid_t dset = h5->H5Dopen2(file, name, H5P_DEFAULT);
    if (dset < 0) {
        ct_h5_why(h5, why, sizeof why);
        return ct_errf(err, CT_ERR_DATA, "%s: \"%s\" (%s) is not a dataset that can be opened (a group?): %s", path,
                       name, role, why);
    }
    hid_t space = h5->H5Dget_space(dset), t = h5->H5Dget_type(dset);
    int rc = CT_OK;
    int nd = space < 0 ? -1 : h5->H5Sget_simple_extent_type(space) == H5S_SIMPLE ? h5->H5Sget_simple_extent_ndims(space) : 0;
    hsize_t dims[H5S_MAX_RANK], maxdims[H5S_MAX_RANK];
    if (space < 0 || t < 0) {
        ct_h5_why(h5, why, sizeof why);
        rc = ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (%s): cannot read its shape or type: %s", path, name, role, why);
    } else if (nd < 1 || nd > CT_H5_MAX_RANK || h5->H5Sget_simple_extent_dims(space, dims, maxdims) != nd) {
        rc = ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (%s) has %d dimensions (%s): expected the samples along "
                     "the first of 1 to %d", path, name, role, nd, nd ? "too many" : "a scalar or empty", CT_H5_MAX_RANK);
    }
    if (!rc) {
        read_type(h5, t, l);
        l->ndim = nd;
        for (int d = 0; d < nd && !rc; d++) {
            if (dims[d] == 0 || dims[d] > ((hsize_t)1 << 40))
                rc = ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (%s): dimension %d has %llu elements", path, name,
                             role, d, (unsigned long long)dims[d]);
            l->dims[d] = (int64_t)dims[d];
        }
    }
    /* Never trust the header with an allocation: what the dataset declares must be stored in the
     * file, compressed at most 1032:1 (deflate's limit), before anything is sized by it (the
     * reading process checks it again on what this reply says). */
    uint64_t declared = 0, stored = rc ? 0 : h5->H5Dget_storage_size(dset);
    bool fits = !rc && ct_h5_block_bytes(l->dims, 0, l->ndim, l->elem, &declared);
    if (!rc && (!fits || (declared > (1 << 20) && (declared - (1 << 20)) / 1032 > stored)))
        rc = ct_errf(err, CT_ERR_DATA, "%s: dataset \"%s\" (%s) declares %s%llu bytes but the file stores %llu for it: a "
                     "corrupt header, or chunks never written (write every sample)", path, name, role,
                     fits ? "" : "more than ", fits ? (unsigned long long)declared : (1ull << 62), (unsigned long long)stored);
    if (!rc) rc = read_storage(h5, dset, t, path, name, role, maxdims, l, err);
    if (t >= 0) h5->H5Tclose(t);
    if (space >= 0) h5->H5Sclose(space);
    h5->H5Dclose(dset);
    h5->H5Eclear2(H5E_DEFAULT);
    return rc;
}

/* ---------------- the child: `ctrain info`'s listing ---------------- */

/* One line for the link `name` of the root group. */
static void info_link(const ct_h5 *h5, hid_t file, const char *link, FILE *out) {
    char name[1024];   /* a name from the file: control bytes escaped */
    ct_printable_name(name, sizeof name, link);
    hid_t dset = h5->H5Dopen2(file, link, H5P_DEFAULT);
    if (dset < 0) {
        h5->H5Eclear2(H5E_DEFAULT);
        fprintf(out, "    %s: not a dataset (a group or another object)\n", name);
        return;
    }
    ct_h5_layout l = {0};
    char type[64] = "unknown type";
    hid_t t = h5->H5Dget_type(dset);
    if (t >= 0) {
        read_type(h5, t, &l);
        ct_h5_type_text(&l, type, sizeof type);
        h5->H5Tclose(t);
    }
    hid_t space = h5->H5Dget_space(dset);
    hsize_t dims[H5S_MAX_RANK];
    int nd = space >= 0 ? h5->H5Sget_simple_extent_dims(space, dims, NULL) : -1;
    fprintf(out, "    %s: %s [", name, type);
    for (int d = 0; d < nd; d++) fprintf(out, "%s%llu", d ? ", " : "", (unsigned long long)dims[d]);
    fprintf(out, "]");
    hid_t dcpl = h5->H5Dget_create_plist(dset);
    H5D_layout_t layout = dcpl >= 0 ? h5->H5Pget_layout(dcpl) : H5D_LAYOUT_ERROR;
    if (layout == H5D_CHUNKED) {
        hsize_t chunk[H5S_MAX_RANK];
        int cn = h5->H5Pget_chunk(dcpl, H5S_MAX_RANK, chunk);
        fprintf(out, ", chunked [");
        for (int d = 0; d < cn; d++) fprintf(out, "%s%llu", d ? ", " : "", (unsigned long long)chunk[d]);
        fprintf(out, "]");
        int nf = h5->H5Pget_nfilters(dcpl);
        for (int k = 0; k < nf; k++) {
            char fname[64] = "";
            unsigned flags, config, cd[8];
            size_t ncd = 8;
            h5->H5Pget_filter2(dcpl, (unsigned)k, &flags, &ncd, cd, sizeof fname, fname, &config);
            fprintf(out, "%s%s", k ? ", " : ", filters: ", fname[0] ? fname : "unnamed");
        }
    } else {
        fprintf(out, ", %s", layout == H5D_CONTIGUOUS ? "contiguous" : layout == H5D_COMPACT ? "compact" : "other layout");
    }
    fputc('\n', out);
    if (dcpl >= 0) h5->H5Pclose(dcpl);
    if (space >= 0) h5->H5Sclose(space);
    h5->H5Dclose(dset);
    h5->H5Eclear2(H5E_DEFAULT);
}

static int info_listing(const ct_h5 *h5, hid_t file, const char *path, FILE *out, ct_err *err) {
    H5G_info_t info;
    if (h5->H5Gget_info(file, &info) < 0) {
        char why[400];
        ct_h5_why(h5, why, sizeof why);
        return ct_errf(err, CT_ERR_DATA, "%s: libhdf5 cannot read it: %s", path, why);
    }
    fprintf(out, "hdf5 file: %s\n  root group: %llu links\n", path, (unsigned long long)info.nlinks);
    for (hsize_t k = 0; k < info.nlinks && k < INFO_LINKS; k++) {
        char name[MAX_NAME];
        if (h5->H5Lget_name_by_idx(file, ".", H5_INDEX_NAME, H5_ITER_INC, k, name, sizeof name, H5P_DEFAULT) < 0)
            break;
        info_link(h5, file, name, out);
    }
    fprintf(out, "  read it with {\"format\": \"hdf5\", \"path\": \"%s\", \"images\": DATASET, \"labels\": "
            "DATASET}\n", path);
    return CT_OK;
}

/* ---------------- the child: the reply ---------------- */

static int write_all(int fd, const uint8_t *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Where libhdf5's chunk addresses start in the file. Before HDF5 1.14.4, H5Dget_chunk_info_by_coord
 * gave them relative to the base address, without the user block (HDFGroup/hdf5 issue 3003, fixed
 * by pull request 4236), while H5Dget_offset counts it: so the user block's size, the superblock's
 * offset, for those versions, and 0 for later ones. */
static uint64_t chunk_address_base(const ct_h5 *h5, const char *path) {
    unsigned major = 0, minor = 0, release = 0;
    h5->H5get_libversion(&major, &minor, &release);
    bool relative = major < 1 || (major == 1 && (minor < 14 || (minor == 14 && release < 4)));
    int64_t at = relative ? ct_h5_superblock_offset(path) : 0;
    return at > 0 ? (uint64_t)at : 0;
}

/* The layout's written chunks at file addresses (chunk_address_base added). */
static void absolute_chunks(ct_h5_layout *l, uint64_t base) {
    for (uint64_t k = 0; base && l->storage == CT_H5_CHUNKED && k < l->nchunks; k++)
        if (l->chunks[k].addr != CT_H5_UNALLOCATED) l->chunks[k].addr += base;
}

int ct_h5_probe_serve(const char *path, const char *images, const char *labels, int fd) {
    alarm(PROBE_SECONDS); /* SIGALRM's default action ends the probe: reported like a crash */
    limit_memory();
    ct_err err = {0};
    const ct_h5 *h5 = NULL;
    ct_h5_writer w = {0};
    ct_h5_layout l[2] = {{0}};
    int rc = ct_h5_load(&h5, &err);
    hid_t file = -1;
    if (!rc) {
        h5->H5Eset_auto2(H5E_DEFAULT, NULL, NULL); /* errors come back in the reply, not on stderr */
        file = h5->H5Fopen(path, CT_H5F_ACC_RDONLY, H5P_DEFAULT);
        if (file < 0) {
            char why[400];
            ct_h5_why(h5, why, sizeof why);
            rc = ct_errf(&err, CT_ERR_DATA, "%s: libhdf5 cannot open it: %s", path, why);
        }
    }
    if (!rc && images) {
        rc = resolve(h5, file, path, images, "images", &l[0], &err);
        if (!rc) rc = resolve(h5, file, path, labels, "labels", &l[1], &err);
        uint64_t base = rc ? 0 : chunk_address_base(h5, path);
        for (int k = 0; k < 2 && !rc; k++) absolute_chunks(&l[k], base);
        ct_h5_put_header(&w, rc, rc ? err.msg : "", rc ? 0 : 2);
        for (int k = 0; k < 2 && !rc; k++) ct_h5_put_layout(&w, &l[k]);
    } else if (!rc) {
        char *text = NULL;
        size_t n = 0;
        FILE *out = open_memstream(&text, &n);
        if (out) rc = info_listing(h5, file, path, out, &err);
        if (out) fclose(out);
        if (!out) rc = ct_errf(&err, CT_ERR_RUNTIME, "%s: out of memory listing it", path);
        ct_h5_put_header(&w, rc, rc ? err.msg : text, 0);
        free(text);
    } else {
        ct_h5_put_header(&w, rc, err.msg, 0);
    }
    if (file >= 0) h5->H5Fclose(file);
    for (int k = 0; k < 2; k++) ct_h5_layout_free(&l[k]);
    int wrote = write_all(fd, w.p, w.n);
    free(w.p);
    return wrote;
}

#else /* built without libhdf5's headers: the probe says so */

int ct_h5_probe_serve(const char *path, const char *images, const char *labels, int fd) {
    (void)images, (void)labels;
    ct_h5_writer w = {0};
    char text[600];
    snprintf(text, sizeof text, "%s: this ctrain was built without HDF5 support (libhdf5's headers were missing); "
             "install them and rebuild: make deps && make", path);
    ct_h5_put_header(&w, CT_ERR_RUNTIME, text, 0);
    ssize_t wrote = write(fd, w.p, w.n);
    free(w.p);
    return wrote == (ssize_t)w.n ? 0 : -1;
}

#endif

/* ---------------- the calling process: running the probe ---------------- */

/* Start the probe with its stdout on pipe_w: fork (the probe in the child) or posix_spawn of
 * $CTRAIN_HDF5_PROBE. The child's pid, or -1 with err set. */
static pid_t start_probe(const char *path, const char *images, const char *labels, int pipe_r, int pipe_w,
                         ct_err *err) {
    const char *exe = getenv("CTRAIN_HDF5_PROBE");
    pid_t pid = -1;
    if (exe && *exe) {
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, pipe_w, 1);
        posix_spawn_file_actions_addclose(&fa, pipe_r);
        posix_spawnattr_t attr; /* SIGALRM at its default (an ignored one survives exec): see PROBE_SECONDS */
        posix_spawnattr_init(&attr);
        sigset_t dfl;
        sigemptyset(&dfl);
        sigaddset(&dfl, SIGALRM);
        posix_spawnattr_setsigdefault(&attr, &dfl);
        posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
        char *argv[] = {(char *)exe, images ? "open" : "info", (char *)path, (char *)(images ? images : ""),
                        (char *)(labels ? labels : ""), NULL};
        int e = posix_spawn(&pid, exe, &fa, &attr, argv, environ);
        posix_spawn_file_actions_destroy(&fa);
        posix_spawnattr_destroy(&attr);
        if (e) {
            ct_errf(err, CT_ERR_RUNTIME, "cannot start the HDF5 probe %s ($CTRAIN_HDF5_PROBE): %s", exe, strerror(e));
            return -1;
        }
        return pid;
    }
#ifdef CT_HAVE_HDF5
    /* loaded before the fork (dlopen in a child of a threaded process can deadlock); the file
     * itself is parsed only in the child */
    const ct_h5 *h5 = NULL;
    if (ct_h5_load(&h5, err)) return -1;
#endif
    fflush(NULL); /* nothing buffered is written twice */
    pid = fork();
    if (pid < 0) {
        ct_errf(err, CT_ERR_RUNTIME, "%s: cannot start a process to parse the HDF5 file in: %s", path, strerror(errno));
        return -1;
    }
    if (pid == 0) {
        close(pipe_r);
        signal(SIGALRM, SIG_DFL); /* a handler of the parent's would keep a stuck probe alive */
        _exit(ct_h5_probe_serve(path, images, labels, pipe_w) ? 1 : 0);
    }
    return pid;
}

int ct_h5_probe(const char *path, const char *images, const char *labels, ct_h5_reply *r, ct_err *err) {
    memset(r, 0, sizeof *r);
    struct stat st;
    if (stat(path, &st) != 0)
        return ct_errf(err, ct_err_io(errno, CT_ERR_DATA), "%s: cannot open: %s", path, strerror(errno));
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) return ct_errf(err, CT_ERR_RUNTIME, "%s: no pipe for the HDF5 probe: %s", path, strerror(errno));
    pid_t pid = start_probe(path, images, labels, p[0], p[1], err);
    close(p[1]);
    if (pid < 0) {
        close(p[0]);
        return err->code;
    }
    /* read to the end (the child blocks on a full pipe until then), at most CT_H5_REPLY_MAX */
    size_t n = 0, cap = 1 << 16;
    uint8_t *buf = ct_xmalloc(cap);
    bool too_long = false;
    for (;;) {
        if (n == cap) {
            if (cap >= CT_H5_REPLY_MAX) {
                too_long = true;
                kill(pid, SIGKILL); /* our own child, answering more than a reply can hold */
                break;
            }
            uint8_t *q = ct_xmalloc(cap * 2);
            memcpy(q, buf, n);
            free(buf);
            buf = q;
            cap *= 2;
        }
        ssize_t got = read(p[0], buf + n, cap - n);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) break;
        n += (size_t)got;
    }
    close(p[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    int rc = CT_OK;
    if (too_long) {
        rc = ct_errf(err, CT_ERR_DATA, "%s: the HDF5 metadata probe answered more than %zu MiB: a corrupt file", path,
                     CT_H5_REPLY_MAX >> 20);
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        char how[96]; /* a signal; or an exit status, as a sanitizer's crash handler leaves it */
        if (WIFSIGNALED(status)) snprintf(how, sizeof how, "signal %d, %s", WTERMSIG(status), strsignal(WTERMSIG(status)));
        else snprintf(how, sizeof how, "exit status %d", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        rc = ct_errf(err, CT_ERR_DATA, "%s: libhdf5 crashed (%s) reading the file's metadata: a corrupt file (libhdf5 "
                     "runs in a child process, so ctrain can say so)", path, how);
    } else {
        const char *const names[2] = {images ? images : "", labels ? labels : ""};
        rc = ct_h5_reply_decode(buf, n, (uint64_t)st.st_size, path, names, r, err);
        if (!rc && images && r->code == CT_OK && r->nlayouts != 2)
            rc = ct_errf(err, CT_ERR_DATA, "%s: the HDF5 metadata probe's reply is corrupt: no datasets", path);
        if (!rc && r->code != CT_OK) rc = ct_errf(err, r->code, "%s", r->text);
    }
    free(buf);
    if (rc) ct_h5_reply_free(r);
    return rc;
}
