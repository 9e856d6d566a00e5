/* png.c: PNG decoding with libpng's transforms (see pngdec.h).
 *
 * libpng reports errors by longjmp. Everything that must be freed after a jump lives in a
 * png_job owned by the caller's frame (png_run), so no local of the function calling setjmp is
 * modified between setjmp and longjmp: the cleanup in png_decode_job reads only the job. */
#include "core/util/fs.h"
#include "core/data/pngdec.h"

#include <errno.h>
#include <fcntl.h>
#include <png.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

typedef struct png_job {
    const uint8_t *buf;
    size_t len, pos;
    const char *name;
    int want;                    /* requested channels, 0 = native */
    size_t max_bytes;
    bool info_only;
    ct_image8 *out;
    png_structp png;
    png_infop info;
    png_bytep *rows;             /* interlaced images: one pointer per row */
    char msg[256];               /* libpng's error text */
    int h, w, native;            /* from the header */
} png_job;

static void job_error(png_structp png, png_const_charp msg) {
    png_job *job = png_get_error_ptr(png);
    snprintf(job->msg, sizeof job->msg, "%s", msg);
    png_longjmp(png, 1);
}

static void job_warning(png_structp png, png_const_charp msg) {
    (void)png;
    (void)msg; /* ancillary problems (bad gAMA, unknown chunks) do not affect the pixels */
}

static void job_read(png_structp png, png_bytep data, size_t n) {
    png_job *job = png_get_io_ptr(png);
    if (n > job->len - job->pos) png_error(png, "file truncated");
    memcpy(data, job->buf + job->pos, n);
    job->pos += n;
}

static int native_channels(int color_type, bool trns) {
    switch (color_type) {
    case PNG_COLOR_TYPE_GRAY: return trns ? 2 : 1;
    case PNG_COLOR_TYPE_GRAY_ALPHA: return 2;
    case PNG_COLOR_TYPE_RGB: return trns ? 4 : 3;
    case PNG_COLOR_TYPE_RGB_ALPHA: return 4;
    default: return trns ? 4 : 3; /* palette */
    }
}

/* Ask libpng to convert whatever is stored to `want` 8-bit channels. */
static void set_transforms(png_structp png, png_infop info, int color_type, int depth, int want) {
    bool trns = png_get_valid(png, info, PNG_INFO_tRNS) != 0;
    bool want_color = want >= 3, want_alpha = want == 2 || want == 4;
    bool src_color = (color_type & PNG_COLOR_MASK_COLOR) != 0;
    bool src_alpha = (color_type & PNG_COLOR_MASK_ALPHA) != 0;
    if (color_type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (color_type == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    /* Expanding a palette also turns its tRNS into alpha, wanted or not. */
    if (trns && color_type == PNG_COLOR_TYPE_PALETTE) src_alpha = true;
    if (trns && want_alpha) {
        png_set_tRNS_to_alpha(png);
        src_alpha = true;
    }
    if (depth == 16) png_set_scale_16(png);
    if (src_color && !want_color) png_set_rgb_to_gray_fixed(png, 1, -1, -1);
    if (!src_color && want_color) png_set_gray_to_rgb(png);
    if (src_alpha && !want_alpha) png_set_strip_alpha(png);
    if (!src_alpha && want_alpha) png_set_add_alpha(png, 0xff, PNG_FILLER_AFTER);
}

/* Runs under setjmp; returns CT_OK or CT_ERR_DATA with job->msg set. */
static int png_decode_job(png_job *job) {
    if (setjmp(png_jmpbuf(job->png))) return CT_ERR_DATA;
    png_set_read_fn(job->png, job, job_read);
    png_set_user_limits(job->png, 1u << 20, 1u << 20);
    png_read_info(job->png, job->info);
    png_uint_32 w, h;
    int depth, color_type, interlace;
    png_get_IHDR(job->png, job->info, &w, &h, &depth, &color_type, &interlace, NULL, NULL);
    job->h = (int)h;
    job->w = (int)w;
    job->native = native_channels(color_type, png_get_valid(job->png, job->info, PNG_INFO_tRNS) != 0);
    if (job->info_only) return CT_OK;
    int want = job->want ? job->want : job->native;
    if ((uint64_t)w * h * (uint64_t)want > job->max_bytes)
        png_error(job->png, "image too large to decode");
    set_transforms(job->png, job->info, color_type, depth, want);
    int passes = png_set_interlace_handling(job->png);
    png_read_update_info(job->png, job->info);
    size_t row = (size_t)w * (size_t)want;
    if (png_get_rowbytes(job->png, job->info) != row || png_get_channels(job->png, job->info) != want)
        png_error(job->png, "unsupported pixel layout after conversion");
    ct_image8 *im = job->out;
    size_t bytes = row * h;
    if (im->cap < bytes) {
        uint8_t *p = realloc(im->px, bytes);
        if (!p) png_error(job->png, "out of memory");
        im->px = p;
        im->cap = bytes;
    }
    im->h = (int)h;
    im->w = (int)w;
    im->c = want;
    if (passes > 1) {
        job->rows = malloc(h * sizeof *job->rows);
        if (!job->rows) png_error(job->png, "out of memory");
        for (png_uint_32 y = 0; y < h; y++) job->rows[y] = im->px + y * row;
        png_read_image(job->png, job->rows);
    } else {
        for (png_uint_32 y = 0; y < h; y++) png_read_row(job->png, im->px + y * row, NULL);
    }
    return CT_OK;
}


/* ---- fast path ----
 * libpng inflates row by row, which keeps zlib off its fast loop; for tiny images (28x28) that and
 * the decoder setup dominate. Plain files (8-bit gray, gray+alpha, RGB or RGBA, not interlaced, no
 * tRNS, decoded to their own channel count) are decoded here with one inflate over all IDAT
 * chunks, every chunk CRC checked. Anything unusual, including any error, falls back to libpng,
 * which then decides (and words the error). */

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static int paeth(int a, int b, int c) {
    int p = a + b - c, pa = abs(p - a), pb = abs(p - b), pc = abs(p - c);
    return pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
}

/* Undo the per-row filters of raw ([h, 1 + row]) into out ([h, row]); false on a bad filter.
 * The first row reads a zero row above it. */
static bool unfilter(const uint8_t *raw, uint8_t *out, size_t row, uint32_t h, int bpp, const uint8_t *zero) {
    for (uint32_t y = 0; y < h; y++) {
        const uint8_t *src = raw + (size_t)y * (row + 1) + 1;
        uint8_t *cur = out + (size_t)y * row;
        const uint8_t *up = y ? cur - row : zero;
        size_t i = 0, k = (size_t)bpp;
        switch (src[-1]) {
        case 0: memcpy(cur, src, row); break;
        case 1:
            for (; i < k; i++) cur[i] = src[i];
            for (; i < row; i++) cur[i] = (uint8_t)(src[i] + cur[i - k]);
            break;
        case 2:
            for (; i < row; i++) cur[i] = (uint8_t)(src[i] + up[i]);
            break;
        case 3:
            for (; i < k; i++) cur[i] = (uint8_t)(src[i] + (up[i] >> 1));
            for (; i < row; i++) cur[i] = (uint8_t)(src[i] + ((cur[i - k] + up[i]) >> 1));
            break;
        case 4:
            for (; i < k; i++) cur[i] = (uint8_t)(src[i] + up[i]);
            for (; i < row; i++) cur[i] = (uint8_t)(src[i] + paeth(cur[i - k], up[i], up[i - k]));
            break;
        default: return false;
        }
    }
    return true;
}

/* Returns true when the image was decoded into job->out. */
static bool fast_decode(png_job *job) {
    const uint8_t *p = job->buf;
    size_t n = job->len;
    if (n < 8 + 25 || rd32(p + 8) != 13 || memcmp(p + 12, "IHDR", 4) != 0) return false;
    uint32_t w = rd32(p + 16), h = rd32(p + 20);
    int depth = p[24], ct = p[25];
    int ch = ct == 0 ? 1 : ct == 4 ? 2 : ct == 2 ? 3 : ct == 6 ? 4 : 0;
    if (depth != 8 || !ch || p[26] || p[27] || p[28] || w == 0 || h == 0 || w > (1u << 20) ||
        h > (1u << 20) || (job->want && job->want != ch) ||
        (uint64_t)w * h * (uint64_t)ch > job->max_bytes || rd32(p + 29) != (uint32_t)crc32(0, p + 12, 17))
        return false;
    size_t row = (size_t)w * (size_t)ch, raw_n = (size_t)h * (row + 1);
    if (raw_n + row >= UINT32_MAX) return false; /* zlib counts in 32 bits */
    uint8_t *raw = malloc(raw_n + row); /* + a zero row for the first row's "up" */
    z_stream z;
    memset(&z, 0, sizeof z);
    if (!raw || inflateInit(&z) != Z_OK) {
        free(raw);
        return false;
    }
    z.next_out = raw;
    z.avail_out = (uInt)raw_n;
    bool ok = true, ended = false, in_idat = false;
    size_t off = 33;
    while (ok && !ended) {
        if (n - off < 12) {
            ok = false;
            break;
        }
        uint32_t len = rd32(p + off);
        const uint8_t *type = p + off + 4;
        if (len > n - off - 12 || rd32(p + off + 8 + len) != (uint32_t)crc32(0, type, len + 4)) {
            ok = false;
            break;
        }
        bool idat = memcmp(type, "IDAT", 4) == 0;
        if (idat) {
            z.next_in = (Bytef *)(p + off + 8);
            z.avail_in = len;
            /* Z_FINISH: a stream that ends in this call needs no 32 KB window; a longer one
             * returns Z_BUF_ERROR with its input used up and goes on with the next chunk. */
            int zr = inflate(&z, Z_FINISH);
            ok = zr == Z_OK || zr == Z_STREAM_END || (zr == Z_BUF_ERROR && z.avail_in == 0 && z.avail_out > 0);
            ended = zr == Z_STREAM_END;
            ok &= ended ? z.avail_in == 0 : true;
        } else if (in_idat || memcmp(type, "tRNS", 4) == 0 ||
                   (!(type[0] & 0x20) && (memcmp(type, "PLTE", 4) || ch < 3))) {
            /* IDATs not consecutive, transparency, or a critical chunk other than a colour
             * image's suggested palette: libpng decides */
            ok = false;
        }
        in_idat |= idat;
        off += 12 + (size_t)len;
    }
    ok &= ended && z.avail_out == 0;
    inflateEnd(&z);
    ct_image8 *im = job->out;
    if (ok && im->cap < row * h) {
        uint8_t *q = realloc(im->px, row * h);
        ok = q != NULL;
        if (q) {
            im->px = q;
            im->cap = row * h;
        }
    }
    if (ok) memset(raw + raw_n, 0, row);
    ok = ok && unfilter(raw, im->px, row, h, ch, raw + raw_n);
    free(raw);
    if (ok) {
        im->h = (int)h;
        im->w = (int)w;
        im->c = ch;
    }
    return ok;
}

static int png_run(png_job *job, ct_err *err) {
    if (job->len < 8 || png_sig_cmp(job->buf, 0, 8) != 0)
        return ct_errf(err, CT_ERR_DATA, "%s: not a PNG file (bad signature in the first 8 bytes)",
                       job->name);
    job->png = png_create_read_struct(PNG_LIBPNG_VER_STRING, job, job_error, job_warning);
    if (job->png) job->info = png_create_info_struct(job->png);
    int rc = job->info ? png_decode_job(job) : CT_ERR_RUNTIME;
    free(job->rows);
    png_destroy_read_struct(job->png ? &job->png : NULL, job->info ? &job->info : NULL, NULL);
    if (rc == CT_ERR_RUNTIME) return ct_errf(err, rc, "%s: out of memory creating a PNG decoder", job->name);
    if (rc) return ct_errf(err, rc, "%s: corrupt PNG: %s", job->name, job->msg);
    return CT_OK;
}

int ct_png_info(const void *buf, size_t len, const char *name, int *h, int *w, int *channels,
                ct_err *err) {
    png_job job = {.buf = buf, .len = len, .name = name, .info_only = true};
    int rc = png_run(&job, err);
    *h = job.h;
    *w = job.w;
    *channels = job.native;
    return rc;
}

int ct_png_decode(const void *buf, size_t len, const char *name, int channels, size_t max_bytes,
                  ct_image8 *out, ct_err *err) {
    if (channels < 0 || channels > 4)
        return ct_errf(err, CT_ERR_CONFIG, "%s: cannot decode to %d channels (expected 1..4)", name,
                       channels);
    png_job job = {.buf = buf, .len = len, .name = name, .want = channels, .max_bytes = max_bytes,
                   .out = out};
    if (len >= 8 && png_sig_cmp(buf, 0, 8) == 0 && fast_decode(&job)) return CT_OK;
    return png_run(&job, err);
}

void ct_image8_free(ct_image8 *im) {
    free(im->px);
    memset(im, 0, sizeof *im);
}

void ct_image8_planar(const ct_image8 *img, const float *lut, uint8_t *u8, float *f32) {
    size_t plane = (size_t)img->h * (size_t)img->w;
    for (int ch = 0; ch < img->c; ch++)
        for (size_t j = 0; j < plane; j++) {
            uint8_t v = img->px[j * (size_t)img->c + ch];
            if (u8) u8[ch * plane + j] = v;
            else f32[ch * plane + j] = lut[256 * ch + v];
        }
}

int ct_read_file(const char *path, uint8_t **buf, size_t *cap, size_t *len, ct_err *err) {
    int fd, rc = ct_fs_open_regular(path, CT_ERR_DATA, NULL, &fd, err);   /* a FIFO: refused, not waited on */
    if (rc) return rc;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return ct_errf(err, ct_err_io(e, CT_ERR_DATA), "%s: cannot stat: %s", path, strerror(e));
    }
    size_t n = (size_t)st.st_size;
    if (*cap < n + 1) {
        uint8_t *p = realloc(*buf, n + 1);
        if (!p) {
            close(fd);
            return ct_errf(err, CT_ERR_RUNTIME, "%s: out of memory reading %zu bytes", path, n);
        }
        *buf = p;
        *cap = n + 1;
    }
    size_t done = 0;
    while (done < n) {
        ssize_t got = read(fd, *buf + done, n - done);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            int e = errno;
            close(fd);
            return ct_errf(err, got < 0 ? ct_err_io(e, CT_ERR_DATA) : CT_ERR_DATA,
                           "%s: read failed at byte offset %zu: %s", path, done,
                           got < 0 ? strerror(e) : "file shrank while reading");
        }
        done += (size_t)got;
    }
    close(fd);
    *len = n;
    return CT_OK;
}
