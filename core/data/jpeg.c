/* jpeg.c: JPEG decoding from memory with libjpeg (Debian's libjpeg62-turbo), and the PNG-or-JPEG
 * dispatch of imagedec.h.
 *
 * libjpeg reports a fatal error by calling error_exit, which must not return: it longjmps back to
 * the decode call here, which frees everything and returns CT_ERR_DATA with libjpeg's message.
 * Warnings (a premature end of data, corrupt entropy data that libjpeg recovers from) are errors
 * too: a truncated file would otherwise decode to gray padding without a word. */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>

#include "core/data/imagedec.h"

typedef struct jpeg_fail {
    struct jpeg_error_mgr mgr;   /* first: libjpeg hands back a pointer to it */
    jmp_buf back;
    char msg[JMSG_LENGTH_MAX];
} jpeg_fail;

static void fail_exit(j_common_ptr cinfo) {
    jpeg_fail *f = (jpeg_fail *)cinfo->err;
    (*cinfo->err->format_message)(cinfo, f->msg);
    longjmp(f->back, 1);
}

static void fail_on_warning(j_common_ptr cinfo, int level) {
    if (level < 0) fail_exit(cinfo); /* level -1: a warning (level >= 0: trace messages) */
}

/* One decode: the header (and the pixels, when out). channels 0: the image's own. */
typedef struct jpeg_job {
    const unsigned char *buf;
    size_t len;
    int want;                    /* 0..4 */
    size_t max_bytes;
    ct_image8 *out;              /* NULL: header only */
    int h, w, c;
    const char *refusal;         /* set when the image is valid but not decodable here */
    size_t out_of_memory;        /* set to the bytes asked when its pixels found no memory */
} jpeg_job;

/* The part that can longjmp: no locals of this frame are used after a jump (the caller's are). */
static int run_job(struct jpeg_decompress_struct *cinfo, jpeg_fail *fail, jpeg_job *job) {
    if (setjmp(fail->back)) return -1;
    jpeg_create_decompress(cinfo);
    jpeg_mem_src(cinfo, job->buf, (unsigned long)job->len);
    jpeg_read_header(cinfo, TRUE);
    bool gray = cinfo->jpeg_color_space == JCS_GRAYSCALE;
    if (cinfo->jpeg_color_space == JCS_CMYK || cinfo->jpeg_color_space == JCS_YCCK) {
        job->refusal = "a CMYK JPEG (expected grayscale or colour)";
        return 0;
    }
    job->h = (int)cinfo->image_height;
    job->w = (int)cinfo->image_width;
    job->c = job->want ? job->want : gray ? 1 : 3;
    if (!job->out) return 0;
    if ((size_t)job->h * (size_t)job->w * (size_t)job->c > job->max_bytes) {
        job->refusal = "an image larger than the decode limit";
        return 0;
    }
    /* 1 and 2 channels decode as gray, 3 as RGB, 4 as RGBA (libjpeg-turbo's JCS_EXT_RGBA) */
    cinfo->out_color_space = job->c <= 2 ? JCS_GRAYSCALE : job->c == 3 ? JCS_RGB : JCS_EXT_RGBA;
    jpeg_start_decompress(cinfo);
    ct_image8 *im = job->out;
    size_t need = (size_t)job->h * (size_t)job->w * (size_t)job->c;
    if (im->cap < need) {
        free(im->px);
        im->cap = 0;
        if (!(im->px = malloc(need))) {   /* the header's size: an error, not the end of the process */
            job->out_of_memory = need;
            return 0;
        }
        im->cap = need;
    }
    im->h = job->h, im->w = job->w, im->c = job->c;
    size_t stride = (size_t)job->w * (size_t)cinfo->output_components;
    while (cinfo->output_scanline < cinfo->output_height) {
        /* rows land at the start of their [w, c] slot; gray+alpha spreads them out below */
        unsigned char *row = im->px + (size_t)cinfo->output_scanline * (size_t)job->w * (size_t)job->c;
        JSAMPROW rows[1] = {row};
        jpeg_read_scanlines(cinfo, rows, 1);
        if (job->c == 2)
            for (size_t x = stride; x-- > 0;) {
                row[2 * x] = row[x];
                row[2 * x + 1] = 255;
            }
    }
    jpeg_finish_decompress(cinfo);
    return 0;
}

static int jpeg_run(jpeg_job *job, const char *name, ct_err *err) {
    struct jpeg_decompress_struct cinfo;
    jpeg_fail fail;
    memset(&cinfo, 0, sizeof cinfo);
    cinfo.err = jpeg_std_error(&fail.mgr);
    fail.mgr.error_exit = fail_exit;
    fail.mgr.emit_message = fail_on_warning;
    fail.msg[0] = '\0';
    if (job->want < 0 || job->want > 4) return ct_errf(err, CT_ERR_DATA, "%s: %d channels requested", name, job->want);
    int r = run_job(&cinfo, &fail, job);
    jpeg_destroy_decompress(&cinfo);
    if (r < 0) return ct_errf(err, CT_ERR_DATA, "%s: corrupt JPEG: %s", name, fail.msg[0] ? fail.msg : "unknown error");
    if (job->refusal) return ct_errf(err, CT_ERR_DATA, "%s: %s", name, job->refusal);
    if (job->out_of_memory)
        return ct_errf(err, CT_ERR_RUNTIME, "%s: out of host memory: %zu bytes for its %dx%d pixels", name,
                       job->out_of_memory, job->w, job->h);
    return CT_OK;
}

int ct_jpeg_info(const void *buf, size_t len, const char *name, int *h, int *w, int *channels, ct_err *err) {
    jpeg_job job = {.buf = buf, .len = len};
    int rc = jpeg_run(&job, name, err);
    if (!rc) *h = job.h, *w = job.w, *channels = job.c;
    return rc;
}

int ct_jpeg_decode(const void *buf, size_t len, const char *name, int channels, size_t max_bytes,
                   ct_image8 *out, ct_err *err) {
    jpeg_job job = {.buf = buf, .len = len, .want = channels, .max_bytes = max_bytes, .out = out};
    return jpeg_run(&job, name, err);
}

ct_image_format ct_image_sniff(const void *buf, size_t len) {
    const unsigned char *p = buf;
    if (len >= 8 && !memcmp(p, "\x89PNG\r\n\x1a\n", 8)) return CT_IMAGE_PNG;
    if (len >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF) return CT_IMAGE_JPEG;
    return CT_IMAGE_UNKNOWN;
}

int ct_image_info(const void *buf, size_t len, const char *name, int *h, int *w, int *channels, ct_err *err) {
    switch (ct_image_sniff(buf, len)) {
    case CT_IMAGE_PNG: return ct_png_info(buf, len, name, h, w, channels, err);
    case CT_IMAGE_JPEG: return ct_jpeg_info(buf, len, name, h, w, channels, err);
    default: return ct_errf(err, CT_ERR_DATA, "%s: not a PNG or JPEG image (no PNG signature, no JPEG SOI marker)", name);
    }
}

int ct_image_decode(const void *buf, size_t len, const char *name, int channels, size_t max_bytes,
                    ct_image8 *out, ct_err *err) {
    switch (ct_image_sniff(buf, len)) {
    case CT_IMAGE_PNG: return ct_png_decode(buf, len, name, channels, max_bytes, out, err);
    case CT_IMAGE_JPEG: return ct_jpeg_decode(buf, len, name, channels, max_bytes, out, err);
    default: return ct_errf(err, CT_ERR_DATA, "%s: not a PNG or JPEG image (no PNG signature, no JPEG SOI marker)", name);
    }
}
