/* cuda_transform.cu: data.transform.on_device — uint8 pixels to normalised activations.
 *
 * y[b, ch, iy, ix] = (x[b, ch, iy, sx] / 255 - mean[ch]) / std[ch] with sx = w-1-ix when
 * flip[b] != 0, else ix; fp32 arithmetic in the CPU backend's order, one rounding at the store. */
#include "cuda/cuda_dtype.cuh"
#include "cuda/cuda_internal.h"

template <typename T>
__global__ void k_normalize_u8(T *y, const uint8_t *x, const uint8_t *flip, ct_u8_normalize p,
                               int64_t total) {
    int64_t plane = p.h * p.w;
    GRID_STRIDE(idx, total) {
        int64_t ix = idx % p.w;
        int64_t b = idx / (p.c * plane);
        int ch = (int)((idx / plane) % p.c);
        int64_t src = (flip && flip[b]) ? idx - ix + (p.w - 1 - ix) : idx;
        float v = (float)x[src] / 255.0f;
        y[idx] = ct_st<T>((v - p.mean[ch]) / p.std[ch]);
    }
}

void ct_cuda_normalize_u8(ct_backend *be, void *y, const uint8_t *x, const uint8_t *flip,
                          const ct_u8_normalize *p, ct_dtype dt) {
    CT_CUDA_REQUIRE(p->c >= 1 && p->c <= CT_NORM_MAX_CHANNELS && p->h >= 0 && p->w >= 0 && p->n >= 0,
                    "normalize_u8: bad shape");
    int64_t total = p->n * p->c * p->h * p->w;
    CT_DT_DISPATCH(dt, T, LAUNCH(be, total, k_normalize_u8<T>, (T *)y, x, flip, *p, total));
}
