/* cuda_attention.cu: causal multi-head attention over a fused qkv (backend.h, ct_backend_attn).
 *
 * Layouts (E = the storage type: float, __half or __nv_bfloat16; everything else is fp32):
 *   qkv [B, T, 3, H, D]: token (b, t) starts at (b T + t) * 3HD; q of head h at + h D,
 *                        k at + HD + h D, v at + 2HD + h D.
 *   y, dy [B, T, H, D]:  row (b, t, h) at ((b T + t) H + h) D.
 *   lse, dsum [B, H, T]: row (b, h, t) at (bh) T + t with bh = b H + h.
 * s_tj = (q_t . k_j) * scale, scale = 1/sqrt(D), only j <= t (the causal bound) ever contributes.
 *
 * Forward (flash-attention style, one CTA per (query tile of 16 rows, bh), 4 warps, one warp per
 * query row at a time): the CTA keeps its 16 q rows in shared memory and walks the key tiles of
 * 32 keys from key 0 to its last row, loading k and v of the tile into shared memory. For one
 * row, lane j computes s of key k0 + j; the warp takes the tile's max and the online softmax
 * rescales the running sum l and the running output (each lane owns dims lane, lane+32, ...);
 * then the 32 probabilities are broadcast in key order and accumulated into the output. At the
 * end y = acc / l and lse = m + log(l). Attention dropout multiplies the probability used for y
 * (not the one summed into l) by keep(b,h,t,j), drawn from the Philox word e = (bh T + t) T + j.
 *   Memory traffic per (b, h): q, y, lse once; k and v of keys <= the tile's last row once per
 *   query tile, about T^2 D / 16 elements each (no T x T matrix anywhere).
 *
 * Backward (recomputes the scores; writes every element of dqkv exactly once, no atomics):
 *   1. k_attn_dsum: dsum_t = dy_t . y_t per row (one warp per row).
 *   2. k_attn_dq: one CTA per (query tile of 8 rows, bh), walking key tiles of 32 keys as the
 *      forward does: P_tj = exp(s_tj - lse_t), dP_tj = keep_tj * (dy_t . v_j),
 *      dS_tj = P_tj (dP_tj - dsum_t), dq_t = scale * sum_j dS_tj k_j (j in increasing order).
 *   3. k_attn_dkdv: one CTA per (key tile of 8 keys, bh), walking query tiles of 32 queries from
 *      the one holding the tile's first key to T - 1, one warp per key row at a time, lane i the
 *      query t0 + i: dv_j = sum_t P_tj keep_tj dy_t, dk_j = scale * sum_t dS_tj q_t (t in
 *      increasing order).
 *   Memory traffic per (b, h): k, v about T^2 D / 8 elements each (step 2), q and dy about
 *   T^2 D / 8 each (step 3), plus dq, dk, dv, lse and dsum once.
 * Every sum runs in a fixed order (sequential loops, butterfly warp reductions), so the results do
 * not depend on the grid or on scheduling. These kernels are plain fp32 FMA on CUDA cores, written
 * to be obviously right: they serve fp32, head dims that are not a multiple of 16 and unaligned
 * buffers. fp16/bf16 with D of 32, 64 or 128 run on tensor cores (cuda_attention_mma.cu; see
 * ATTN_AUTO below for how to choose). */
#include "cuda/cuda_attention.cuh"
#include "cuda/cuda_dtype.cuh"
#include "cuda/cuda_internal.h"

#include <stdlib.h>
#include <string.h>

extern "C" {
#include "core/util/rng.h"
}

#define ATT_DMAX 128                  /* the largest head dim (backend.h) */
#define ATT_DPL (ATT_DMAX / 32)       /* dims per lane: lane owns d = lane + 32 i, i < ATT_DPL */
#define ATT_WARPS 4
#define ATT_THREADS (ATT_WARPS * 32)
#define ATT_TILE 32                   /* keys (forward, dq) or queries (dkdv) per inner tile */
#define ATT_PAD (ATT_DMAX + 1)        /* row stride of tiles read lane-per-row: no bank conflicts */

#define FWD_ROWS_PER_WARP 4
#define FWD_BQ (ATT_WARPS * FWD_ROWS_PER_WARP)    /* 16 query rows per forward CTA */
#define DQ_ROWS_PER_WARP 2
#define DQ_BQ (ATT_WARPS * DQ_ROWS_PER_WARP)      /* 8 query rows per dq CTA */
#define DKV_ROWS_PER_WARP 2
#define DKV_BK (ATT_WARPS * DKV_ROWS_PER_WARP)    /* 8 key rows per dk/dv CTA */

/* Load rows [r0, r0 + n) of one head's q, k or v (`src` already points at the head's column
 * in token 0 of the sequence, row stride ld) into sh[r][d] (row stride `stride`) as fp32;
 * rows at or past T read as 0. Consecutive threads read consecutive d: coalesced. */
template <typename E>
__device__ __forceinline__ void attn_load_tile(float *sh, int stride, const E *src, int64_t ld,
                                               int64_t r0, int n, int64_t T, int D) {
    for (int i = threadIdx.x; i < n * D; i += blockDim.x) {
        int r = i / D, d = i - r * D;
        int64_t t = r0 + r;
        sh[r * stride + d] = t < T ? ct_ld(src[t * ld + d]) : 0.0f;
    }
}

/* Dot product of two fp32 rows of length D in shared memory, d in increasing order. */
__device__ __forceinline__ float attn_dot(const float *a, const float *b, int D) {
    float s = 0.0f;
    for (int d = 0; d < D; d++) s += a[d] * b[d];
    return s;
}

/* ---- forward ---- */

/* grid (ceil(T / FWD_BQ), B H), ATT_THREADS threads. */
template <typename E>
__global__ void __launch_bounds__(ATT_THREADS)
k_attn_forward(E *__restrict__ y, float *__restrict__ lse, const E *__restrict__ qkv, int64_t T,
               int64_t H, int D, float scale, uint64_t thresh, float keep_scale, uint64_t key,
               uint64_t stream) {
    __shared__ float qs[FWD_BQ][ATT_DMAX];     /* q rows of this tile (read as broadcasts) */
    __shared__ float ks[ATT_TILE][ATT_PAD];    /* k rows of the key tile (lane j reads row j) */
    __shared__ float vs[ATT_TILE][ATT_DMAX];   /* v rows of the key tile (lane reads its dims) */

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t bh = blockIdx.y, b = bh / H, h = bh - b * H;
    const int64_t q0 = (int64_t)blockIdx.x * FWD_BQ;           /* first query row of the tile */
    const int64_t ld = 3 * H * D;                               /* token stride of qkv */
    const E *qh = qkv + b * T * ld + h * D;                     /* q of head h, token 0 */
    const E *kh = qh + H * D, *vh = qh + 2 * H * D;
    const int64_t t_last = (q0 + FWD_BQ < T ? q0 + FWD_BQ : T) - 1;  /* last valid row here */

    attn_load_tile(&qs[0][0], ATT_DMAX, qh, ld, q0, FWD_BQ, T, D);

    /* per row this warp owns (r = warp * FWD_ROWS_PER_WARP + rr): running max, sum, output */
    float m[FWD_ROWS_PER_WARP], l[FWD_ROWS_PER_WARP], acc[FWD_ROWS_PER_WARP][ATT_DPL];
#pragma unroll
    for (int rr = 0; rr < FWD_ROWS_PER_WARP; rr++) {
        m[rr] = -INFINITY;
        l[rr] = 0.0f;
#pragma unroll
        for (int i = 0; i < ATT_DPL; i++) acc[rr][i] = 0.0f;
    }

    /* key tiles [k0, k0 + 32) up to the one holding t_last: later keys are all masked here */
    for (int64_t k0 = 0; k0 <= t_last; k0 += ATT_TILE) {
        __syncthreads(); /* the previous tile's k, v are no longer read (and q is loaded) */
        attn_load_tile(&ks[0][0], ATT_PAD, kh, ld, k0, ATT_TILE, T, D);
        attn_load_tile(&vs[0][0], ATT_DMAX, vh, ld, k0, ATT_TILE, T, D);
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < FWD_ROWS_PER_WARP; rr++) {
            const int r = warp * FWD_ROWS_PER_WARP + rr;
            const int64_t t = q0 + r;
            if (t >= T || k0 > t) continue; /* warp-uniform: no key of this tile is <= t */
            const int64_t j = k0 + lane;
            const bool valid = j <= t;      /* causal bound (also implies j < T) */
            float s = valid ? attn_dot(qs[r], ks[lane], D) * scale : -INFINITY;
            float m_new = fmaxf(m[rr], ct_warp_max(s));        /* finite: key k0 is valid */
            float corr = expf(m[rr] - m_new);                   /* 0 on the first tile */
            float pj = valid ? expf(s - m_new) : 0.0f;
            l[rr] = l[rr] * corr + ct_warp_sum(pj);             /* softmax sum: no dropout */
            if (thresh != 0 && valid)
                pj *= attn_keep(key, stream, ((uint64_t)bh * T + t) * T + j, thresh, keep_scale);
            m[rr] = m_new;
#pragma unroll
            for (int i = 0; i < ATT_DPL; i++) acc[rr][i] *= corr;
            /* acc[d] += sum over keys jj = 0 .. t - k0 of p_jj v_jj[d], in key order */
            const int n_keys = t - k0 + 1 < ATT_TILE ? (int)(t - k0 + 1) : ATT_TILE;
            for (int jj = 0; jj < n_keys; jj++) {
                float pb = __shfl_sync(0xffffffffu, pj, jj);
#pragma unroll
                for (int i = 0; i < ATT_DPL; i++) {
                    int d = lane + 32 * i;
                    if (d < D) acc[rr][i] += pb * vs[jj][d];
                }
            }
        }
    }

#pragma unroll
    for (int rr = 0; rr < FWD_ROWS_PER_WARP; rr++) {
        const int64_t t = q0 + warp * FWD_ROWS_PER_WARP + rr;
        if (t >= T) continue;
        E *yr = y + ((b * T + t) * H + h) * D;
#pragma unroll
        for (int i = 0; i < ATT_DPL; i++) {
            int d = lane + 32 * i;
            if (d < D) yr[d] = ct_st<E>(acc[rr][i] / l[rr]);
        }
        if (lane == 0) lse[bh * T + t] = m[rr] + logf(l[rr]);
    }
}

/* ---- backward ---- */

/* dsum[bh T + t] = dy_t . y_t, one warp per row (b, t, h); grid-stride over rows. */
template <typename E>
__global__ void k_attn_dsum(float *__restrict__ dsum, const E *__restrict__ dy,
                            const E *__restrict__ y, int64_t B, int64_t T, int64_t H, int D) {
    const int lane = threadIdx.x & 31;
    const int64_t n = B * T * H, warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t row = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; row < n;
         row += warps) {
        /* row = (b T + t) H + h */
        const int64_t h = row % H, bt = row / H, t = bt % T, b = bt / T;
        float s = 0.0f;
        for (int d = lane; d < D; d += 32) s += ct_ld(dy[row * D + d]) * ct_ld(y[row * D + d]);
        s = ct_warp_sum(s);
        if (lane == 0) dsum[(b * H + h) * T + t] = s;
    }
}

/* dq. grid (ceil(T / DQ_BQ), B H), ATT_THREADS threads. */
template <typename E>
__global__ void __launch_bounds__(ATT_THREADS)
k_attn_dq(E *__restrict__ dqkv, const E *__restrict__ dy, const E *__restrict__ qkv,
          const float *__restrict__ lse, const float *__restrict__ dsum, int64_t T, int64_t H,
          int D, float scale, uint64_t thresh, float keep_scale, uint64_t key, uint64_t stream) {
    __shared__ float qs[DQ_BQ][ATT_DMAX];      /* q rows (broadcast reads) */
    __shared__ float dys[DQ_BQ][ATT_DMAX];     /* dy rows (broadcast reads) */
    __shared__ float ks[ATT_TILE][ATT_PAD];    /* lane j reads row j for s; lanes read dims for dq */
    __shared__ float vs[ATT_TILE][ATT_PAD];    /* lane j reads row j for dP */

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t bh = blockIdx.y, b = bh / H, h = bh - b * H;
    const int64_t q0 = (int64_t)blockIdx.x * DQ_BQ;
    const int64_t ld = 3 * H * D;
    const E *qh = qkv + b * T * ld + h * D;
    const E *kh = qh + H * D, *vh = qh + 2 * H * D;
    const E *dyh = dy + b * T * H * D + h * D;                  /* dy of head h, token 0 */
    const int64_t t_last = (q0 + DQ_BQ < T ? q0 + DQ_BQ : T) - 1;

    attn_load_tile(&qs[0][0], ATT_DMAX, qh, ld, q0, DQ_BQ, T, D);
    attn_load_tile(&dys[0][0], ATT_DMAX, dyh, H * D, q0, DQ_BQ, T, D);

    float lse_r[DQ_ROWS_PER_WARP], ds_r[DQ_ROWS_PER_WARP], acc[DQ_ROWS_PER_WARP][ATT_DPL];
#pragma unroll
    for (int rr = 0; rr < DQ_ROWS_PER_WARP; rr++) {
        const int64_t t = q0 + warp * DQ_ROWS_PER_WARP + rr;
        lse_r[rr] = t < T ? lse[bh * T + t] : 0.0f;
        ds_r[rr] = t < T ? dsum[bh * T + t] : 0.0f;
#pragma unroll
        for (int i = 0; i < ATT_DPL; i++) acc[rr][i] = 0.0f;
    }

    for (int64_t k0 = 0; k0 <= t_last; k0 += ATT_TILE) {
        __syncthreads();
        attn_load_tile(&ks[0][0], ATT_PAD, kh, ld, k0, ATT_TILE, T, D);
        attn_load_tile(&vs[0][0], ATT_PAD, vh, ld, k0, ATT_TILE, T, D);
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < DQ_ROWS_PER_WARP; rr++) {
            const int r = warp * DQ_ROWS_PER_WARP + rr;
            const int64_t t = q0 + r;
            if (t >= T || k0 > t) continue; /* warp-uniform */
            const int64_t j = k0 + lane;
            float dS = 0.0f;
            if (j <= t) {
                float p = expf(attn_dot(qs[r], ks[lane], D) * scale - lse_r[rr]);
                float dp = attn_dot(dys[r], vs[lane], D);
                if (thresh != 0)
                    dp *= attn_keep(key, stream, ((uint64_t)bh * T + t) * T + j, thresh, keep_scale);
                dS = p * (dp - ds_r[rr]);
            }
            /* acc[d] += sum over keys jj = 0 .. t - k0 of dS_jj k_jj[d], in key order */
            const int n_keys = t - k0 + 1 < ATT_TILE ? (int)(t - k0 + 1) : ATT_TILE;
            for (int jj = 0; jj < n_keys; jj++) {
                float g = __shfl_sync(0xffffffffu, dS, jj);
#pragma unroll
                for (int i = 0; i < ATT_DPL; i++) {
                    int d = lane + 32 * i;
                    if (d < D) acc[rr][i] += g * ks[jj][d];
                }
            }
        }
    }

#pragma unroll
    for (int rr = 0; rr < DQ_ROWS_PER_WARP; rr++) {
        const int64_t t = q0 + warp * DQ_ROWS_PER_WARP + rr;
        if (t >= T) continue;
        E *dq = dqkv + (b * T + t) * ld + h * D;                /* q slot of token (b, t) */
#pragma unroll
        for (int i = 0; i < ATT_DPL; i++) {
            int d = lane + 32 * i;
            if (d < D) dq[d] = ct_st<E>(acc[rr][i] * scale);
        }
    }
}

/* dk and dv. grid (ceil(T / DKV_BK), B H), ATT_THREADS threads. */
template <typename E>
__global__ void __launch_bounds__(ATT_THREADS)
k_attn_dkdv(E *__restrict__ dqkv, const E *__restrict__ dy, const E *__restrict__ qkv,
            const float *__restrict__ lse, const float *__restrict__ dsum, int64_t T, int64_t H,
            int D, float scale, uint64_t thresh, float keep_scale, uint64_t key, uint64_t stream) {
    __shared__ float ks[DKV_BK][ATT_DMAX];     /* k rows of this key tile (broadcast reads) */
    __shared__ float vs[DKV_BK][ATT_DMAX];     /* v rows (broadcast reads) */
    __shared__ float qs[ATT_TILE][ATT_PAD];    /* q rows of the query tile: lane i reads row i */
    __shared__ float dys[ATT_TILE][ATT_PAD];   /* dy rows of the query tile: lane i reads row i */
    __shared__ float lse_s[ATT_TILE], ds_s[ATT_TILE];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t bh = blockIdx.y, b = bh / H, h = bh - b * H;
    const int64_t j0 = (int64_t)blockIdx.x * DKV_BK;            /* first key row of the tile */
    const int64_t ld = 3 * H * D;
    const E *qh = qkv + b * T * ld + h * D;
    const E *kh = qh + H * D, *vh = qh + 2 * H * D;
    const E *dyh = dy + b * T * H * D + h * D;

    attn_load_tile(&ks[0][0], ATT_DMAX, kh, ld, j0, DKV_BK, T, D);
    attn_load_tile(&vs[0][0], ATT_DMAX, vh, ld, j0, DKV_BK, T, D);

    float dk[DKV_ROWS_PER_WARP][ATT_DPL], dv[DKV_ROWS_PER_WARP][ATT_DPL];
#pragma unroll
    for (int rr = 0; rr < DKV_ROWS_PER_WARP; rr++)
#pragma unroll
        for (int i = 0; i < ATT_DPL; i++) dk[rr][i] = dv[rr][i] = 0.0f;

    /* query tiles [t0, t0 + 32) from the one holding key j0 (earlier queries see none of these
     * keys) to the last one */
    for (int64_t t0 = j0 - j0 % ATT_TILE; t0 < T; t0 += ATT_TILE) {
        __syncthreads();
        attn_load_tile(&qs[0][0], ATT_PAD, qh, ld, t0, ATT_TILE, T, D);
        attn_load_tile(&dys[0][0], ATT_PAD, dyh, H * D, t0, ATT_TILE, T, D);
        if (threadIdx.x < ATT_TILE) {
            int64_t t = t0 + threadIdx.x;
            lse_s[threadIdx.x] = t < T ? lse[bh * T + t] : 0.0f;
            ds_s[threadIdx.x] = t < T ? dsum[bh * T + t] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < DKV_ROWS_PER_WARP; rr++) {
            const int r = warp * DKV_ROWS_PER_WARP + rr;
            const int64_t j = j0 + r;
            if (j >= T || t0 + ATT_TILE - 1 < j) continue; /* warp-uniform: no query t >= j here */
            const int64_t t = t0 + lane;
            float pk = 0.0f, dS = 0.0f;  /* P keep (for dv) and dS (for dk) of query t, key j */
            if (t >= j && t < T) {
                float p = expf(attn_dot(qs[lane], ks[r], D) * scale - lse_s[lane]);
                float keep = thresh != 0 ? attn_keep(key, stream, ((uint64_t)bh * T + t) * T + j,
                                                     thresh, keep_scale)
                                         : 1.0f;
                float dp = attn_dot(dys[lane], vs[r], D) * keep;
                pk = p * keep;
                dS = p * (dp - ds_s[lane]);
            }
            /* queries t0 + tt for tt in [max(0, j - t0), min(32, T - t0)), in increasing order */
            const int tt_lo = j > t0 ? (int)(j - t0) : 0;
            const int tt_hi = T - t0 < ATT_TILE ? (int)(T - t0) : ATT_TILE;
            for (int tt = tt_lo; tt < tt_hi; tt++) {
                float gv = __shfl_sync(0xffffffffu, pk, tt);
                float gk = __shfl_sync(0xffffffffu, dS, tt);
#pragma unroll
                for (int i = 0; i < ATT_DPL; i++) {
                    int d = lane + 32 * i;
                    if (d < D) {
                        dv[rr][i] += gv * dys[tt][d];
                        dk[rr][i] += gk * qs[tt][d];
                    }
                }
            }
        }
    }

#pragma unroll
    for (int rr = 0; rr < DKV_ROWS_PER_WARP; rr++) {
        const int64_t j = j0 + warp * DKV_ROWS_PER_WARP + rr;
        if (j >= T) continue;
        E *dkr = dqkv + (b * T + j) * ld + H * D + h * D;       /* k slot of token (b, j) */
        E *dvr = dkr + H * D;                                   /* v slot */
#pragma unroll
        for (int i = 0; i < ATT_DPL; i++) {
            int d = lane + 32 * i;
            if (d < D) {
                dkr[d] = ct_st<E>(dk[rr][i] * scale);
                dvr[d] = ct_st<E>(dv[rr][i]);
            }
        }
    }
}

/* ---- host side ---- */

/* Which kernels run (CTRAIN_CUDA_ATTENTION, read once at backend creation): by default
 * cuda_attention_mma.cu where it applies (fp16/bf16, D of 32, 64, 128), else the kernels of this
 * file; "reference" always the kernels of this file: to compare them, or to rule the fast path
 * out. (The WMMA kernels that sat between the two are in bench/kernels/.) */
enum { ATTN_AUTO = 0, ATTN_REFERENCE = 2 };

/* The dropout rule's numbers, exactly as dropout_forward computes them (cuda_eltwise.cu). */
static uint64_t attn_thresh(float p) {
    double t = (double)p * 4294967296.0;
    return t <= 0.0 ? 0 : (uint64_t)t;
}
static float attn_keep_scale(float p) { return p < 1.0f ? 1.0f / (1.0f - p) : 0.0f; }

/* Checks the sizes; false when there is nothing to do. */
static bool attn_check(int64_t B, int64_t T, int64_t H, int64_t D, int rows_per_cta) {
    CT_CUDA_REQUIRE(B >= 0 && T >= 0 && H >= 0 && D >= 0, "causal attention: negative size");
    if (B == 0 || T == 0 || H == 0) return false;
    CT_CUDA_REQUIRE(D >= 1 && D <= ATT_DMAX, "causal attention: head dim must be 1 .. 128");
    CT_CUDA_REQUIRE(B * H <= 65535, "causal attention: B * H over the grid's y limit (65535)");
    CT_CUDA_REQUIRE((T + rows_per_cta - 1) / rows_per_cta <= INT32_MAX,
                    "causal attention: T over the grid's x limit");
    return true;
}

static void cu_attn_forward(ct_backend *be, void *y, float *lse, const void *qkv, int64_t B,
                            int64_t T, int64_t H, int64_t D, float p, uint64_t seed,
                            uint64_t stream, ct_dtype dt) {
    if (!attn_check(B, T, H, D, FWD_BQ)) return;
    float scale = (float)(1.0 / sqrt((double)D));
    uint64_t key = ct_cuda_rng_key(seed, CT_RNG_DROPOUT);
    int path = ct_cuda_of(be)->attn_path;
    if (path == ATTN_AUTO && ct_cuda_attn_mma_usable(dt, D, y, qkv, NULL, NULL)) {
        ct_cuda_attn_mma_forward(ct_cuda_stream(be), y, lse, qkv, B, T, H, D, scale, attn_thresh(p),
                                 attn_keep_scale(p), key, stream, dt);
        return;
    }
    dim3 grid((unsigned)((T + FWD_BQ - 1) / FWD_BQ), (unsigned)(B * H));
    CT_DT_DISPATCH(dt, E, {
        k_attn_forward<E><<<grid, ATT_THREADS, 0, ct_cuda_stream(be)>>>(
            (E *)y, lse, (const E *)qkv, T, H, (int)D, scale, attn_thresh(p), attn_keep_scale(p),
            key, stream);
        CT_CUDA_LAUNCH_CHECK();
    });
}

static void cu_attn_backward(ct_backend *be, void *dqkv, const void *dy, const void *qkv,
                             const void *y, const float *lse, int64_t B, int64_t T, int64_t H,
                             int64_t D, float p, uint64_t seed, uint64_t stream, ct_dtype dt) {
    if (!attn_check(B, T, H, D, DQ_BQ)) return;
    float scale = (float)(1.0 / sqrt((double)D));
    uint64_t key = ct_cuda_rng_key(seed, CT_RNG_DROPOUT), thresh = attn_thresh(p);
    float keep_scale = attn_keep_scale(p);
    cudaStream_t st = ct_cuda_stream(be);
    float *dsum = (float *)CT_CUDA_SCRATCH(be, (size_t)(B * H * T) * sizeof(float));
    dim3 grid_q((unsigned)((T + DQ_BQ - 1) / DQ_BQ), (unsigned)(B * H));
    dim3 grid_kv((unsigned)((T + DKV_BK - 1) / DKV_BK), (unsigned)(B * H));
    CT_DT_DISPATCH(dt, E, {
        k_attn_dsum<E><<<ct_cuda_grid(be, B * T * H * 32, 256), 256, 0, st>>>(
            dsum, (const E *)dy, (const E *)y, B, T, H, (int)D);
        CT_CUDA_LAUNCH_CHECK();
        int path = ct_cuda_of(be)->attn_path;
        if (path == ATTN_AUTO && ct_cuda_attn_mma_usable(dt, D, dqkv, dy, qkv, y)) {
            ct_cuda_attn_mma_backward(st, dqkv, dy, qkv, lse, dsum, B, T, H, D, scale, thresh,
                                      keep_scale, key, stream, dt);
            break;
        }
        k_attn_dq<E><<<grid_q, ATT_THREADS, 0, st>>>((E *)dqkv, (const E *)dy, (const E *)qkv, lse,
                                                     dsum, T, H, (int)D, scale, thresh, keep_scale,
                                                     key, stream);
        CT_CUDA_LAUNCH_CHECK();
        k_attn_dkdv<E><<<grid_kv, ATT_THREADS, 0, st>>>((E *)dqkv, (const E *)dy, (const E *)qkv,
                                                        lse, dsum, T, H, (int)D, scale, thresh,
                                                        keep_scale, key, stream);
        CT_CUDA_LAUNCH_CHECK();
    });
    ct_cuda_scratch_free(be, dsum);
}

/* ---- attention over a key/value cache (kv_attention_forward: generation) ----
 * k_kv_store: one thread per element of the new tokens' k and v, copied into the caches
 * K, V [B, KV, cap, D] at rows pos0 + t (from query head g H/KV of qkv, as stored).
 * k_kv_attend: one CTA of KV_THREADS per (token, query head), over its keys 0 .. pos0 + t in
 * chunks of KV_CHUNK: thread j of the chunk computes score j (a dot product over d in order), the
 * chunk's maximum rescales the running sum and output (online softmax), thread 0 adds the chunk's
 * exponentials in key order, and thread d < D accumulates its output dim over the chunk's keys in
 * key order. Every sum has a fixed order; no atomics. Decoding reads each cached row once per
 * query head: memory-bound on the cache, which is small next to the weights a token reads. */
#define KV_THREADS 128
#define KV_CHUNK 256

template <typename E>
__global__ void k_kv_store(E *K, E *V, const E *qkv, int64_t T, int64_t pos0, int64_t cap, int H, int KV, int D,
                           int64_t n) {
    GRID_STRIDE(e, n) {
        int64_t d = e % D, r = e / D, g = r % KV, bt = r / KV, b = bt / T, t = bt % T;
        const E *src = qkv + bt * 3 * H * D + g * (H / KV) * D + d;
        int64_t at = ((b * KV + g) * cap + pos0 + t) * D + d;
        K[at] = src[(int64_t)H * D];
        V[at] = src[2 * (int64_t)H * D];
    }
}

template <typename E>
__global__ void k_kv_attend(E *y, const E *qkv, const E *K, const E *V, int64_t T, int64_t pos0, int64_t cap, int H,
                            int KV, int D, float scale) {
    __shared__ float q[ATT_DMAX];
    __shared__ float s[KV_CHUNK];
    __shared__ float wmax[KV_THREADS / 32];
    __shared__ float total;
    int64_t row = blockIdx.x, bt = row / H, b = bt / T, t = bt % T;
    int h = (int)(row % H), g = h / (H / KV);
    int64_t L = pos0 + t + 1;
    const E *qr = qkv + bt * 3 * H * D + (int64_t)h * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) q[d] = ct_ld(qr[d]);
    if (threadIdx.x == 0) total = 0.0f;
    __syncthreads();
    const E *Kh = K + (b * KV + g) * cap * D, *Vh = V + (b * KV + g) * cap * D;
    float m = -INFINITY, acc = 0.0f;
    for (int64_t j0 = 0; j0 < L; j0 += KV_CHUNK) {
        int n = (int)(L - j0 < KV_CHUNK ? L - j0 : KV_CHUNK);
        float cm = -INFINITY;
        for (int j = threadIdx.x; j < n; j += blockDim.x) {
            const E *kr = Kh + (j0 + j) * D;
            float dot = 0.0f;
            for (int d = 0; d < D; d++) dot = fmaf(q[d], ct_ld(kr[d]), dot);
            s[j] = dot * scale;
            cm = fmaxf(cm, s[j]);
        }
        for (int o = 16; o > 0; o >>= 1) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, o));
        if ((threadIdx.x & 31) == 0) wmax[threadIdx.x >> 5] = cm;
        __syncthreads();
        for (int w = 0; w < KV_THREADS / 32; w++) cm = fmaxf(cm, wmax[w]);
        float mn = fmaxf(m, cm), corr = expf(m - mn);
        for (int j = threadIdx.x; j < n; j += blockDim.x) s[j] = expf(s[j] - mn);
        __syncthreads();
        if (threadIdx.x == 0) {
            float c = 0.0f;
            for (int j = 0; j < n; j++) c += s[j];
            total = total * corr + c;
        }
        if (threadIdx.x < D) {
            float a = acc * corr;
            for (int j = 0; j < n; j++) a = fmaf(s[j], ct_ld(Vh[(j0 + j) * D + threadIdx.x]), a);
            acc = a;
        }
        m = mn;
        __syncthreads();
    }
    if (threadIdx.x < D) y[row * D + threadIdx.x] = ct_st<E>(acc / total);
}

static void cu_kv_attention_forward(ct_backend *be, void *y, void *kv, const void *qkv, int64_t B, int64_t T,
                                    int64_t pos0, int64_t cap, int64_t H, int64_t KV, int64_t D, ct_dtype dt) {
    CT_CUDA_REQUIRE(B >= 0 && T >= 0 && H >= 0 && D >= 0, "kv attention: negative size");
    if (B == 0 || T == 0 || H == 0) return;
    CT_CUDA_REQUIRE(D >= 1 && D <= ATT_DMAX, "kv attention: head dim must be 1 .. 128");
    CT_CUDA_REQUIRE(KV >= 1 && H % KV == 0, "kv attention: kv heads must divide heads");
    CT_CUDA_REQUIRE(pos0 >= 0 && pos0 + T <= cap, "kv attention: the tokens must fit the cache");
    CT_CUDA_REQUIRE(B * T * H <= INT32_MAX, "kv attention: more than 2^31 query rows");
    cudaStream_t st = ct_cuda_stream(be);
    int64_t n = B * T * KV * D;
    float scale = (float)(1.0 / sqrt((double)D));
    CT_DT_DISPATCH(dt, E, {
        E *K = (E *)kv, *V = K + B * KV * cap * D;
        k_kv_store<E><<<ct_cuda_grid(be, n, CT_CUDA_THREADS), CT_CUDA_THREADS, 0, st>>>(
            K, V, (const E *)qkv, T, pos0, cap, (int)H, (int)KV, (int)D, n);
        CT_CUDA_LAUNCH_CHECK();
        if (y) {
            k_kv_attend<E><<<(unsigned)(B * T * H), KV_THREADS, 0, st>>>((E *)y, (const E *)qkv, K, V, T, pos0, cap,
                                                                          (int)H, (int)KV, (int)D, scale);
            CT_CUDA_LAUNCH_CHECK();
        }
    });
}

void ct_cuda_attn_install(ct_backend *be) {
    const char *env = getenv("CTRAIN_CUDA_ATTENTION");
    ct_cuda_of(be)->attn_path = env && strcmp(env, "reference") == 0 ? ATTN_REFERENCE : ATTN_AUTO;
    ct_cuda_attn_mma_init();
    be->attn.causal_attention_forward = cu_attn_forward;
    be->attn.causal_attention_backward = cu_attn_backward;
    be->attn.kv_attention_forward = cu_kv_attention_forward;
}
