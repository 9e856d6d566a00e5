/* attention_wmma.cu (workbench: bench/kernels/README.md says why it left cuda/): causal attention
 * on tensor cores through WMMA, for 16-bit storage (fp16, bf16) and head dims that are a multiple
 * of 16 up to 128. It was cuda/cuda_attention_tc.cu, chosen by cuda/cuda_attention.cu between the
 * mma.sync kernels (cuda_attention_mma.cu) and the CUDA-core ones; the layouts, the dropout rule
 * and the results' meaning are the ones cuda/cuda_attention.cu describes.
 *
 * The products run through WMMA fragments (16x16x16, fp32 accumulation); everything between them
 * (scale, causal mask, online softmax in base 2, dropout, dS) is fp32 on CUDA cores, on tiles kept
 * in shared memory. As in FlashAttention-2 the probabilities P and dS are rounded to the storage type before
 * they enter the second product of each pair (P V, dS K, P^T dY, dS^T Q); sums stay fp32.
 *
 * Tiles: a CTA is 4 warps; each warp owns 16 rows of a 64-row tile (query rows in the forward and
 * dq kernels, key rows in the dk/dv kernel) and walks the other side in tiles of 64, which all
 * warps load together into shared memory. Tiles are aligned to 64, so a query tile meets keys
 * k0 <= q0 only, and every valid query row has at least one valid key in every tile it visits
 * (key k0 <= t): the running max is finite after the first tile.
 * Fragments never leave the warp that owns their rows; a row's softmax is done by two lanes (32
 * columns each), so every sum has a fixed order: the results do not depend on scheduling.
 *
 *   forward  grid (ceil(T/64), B H): S = Q K^T -> online softmax -> O = O corr + P V (O in shared
 *            memory, rescaled per row), y = O / l, lse = m + log l.
 *   dq       grid (ceil(T/64), B H): S = Q K^T, dP = dY V^T, dS = P (dP keep - dsum), dq += dS K
 *            (dq in registers: up to 8 fragments per warp).
 *   dk, dv   grid (ceil(T/64), B H), one key tile per CTA: S^T = K Q^T, dP^T = V dY^T,
 *            dv += (P keep)^T dY, dk += dS^T Q, over the query tiles t0 >= j0.
 * Heavier tiles (more keys or queries to visit) are launched first. */
#include <mma.h>

#include "cuda/cuda_attention.cuh"
#include "cuda/cuda_dtype.cuh"

using namespace nvcuda;

/* True when the tensor-core kernels take this call: fp16/bf16, D a multiple of 16 up to 128, and
 * every buffer given (NULL: not used) 16-byte aligned (the tile loads are 16-byte copies). */
bool ct_cuda_attn_tc_usable(ct_dtype dt, int64_t D, const void *a, const void *b, const void *c,
                            const void *d);
/* Allows the kernels their shared memory (over 48 KiB); once, at backend creation. */
void ct_cuda_attn_tc_init(void);
void ct_cuda_attn_tc_forward(cudaStream_t st, void *y, float *lse, const void *qkv, int64_t B,
                             int64_t T, int64_t H, int64_t D, float scale, uint64_t thresh,
                             float keep_scale, uint64_t key, uint64_t stream, ct_dtype dt);
/* dq, dk, dv into dqkv; dsum[bh T + t] = dy_t . y_t computed by the caller. */
void ct_cuda_attn_tc_backward(cudaStream_t st, void *dqkv, const void *dy, const void *qkv,
                              const float *lse, const float *dsum, int64_t B, int64_t T, int64_t H,
                              int64_t D, float scale, uint64_t thresh, float keep_scale, uint64_t key,
                              uint64_t stream, ct_dtype dt);

#define TC_ROWS 64                    /* rows of a CTA's tile and of the tiles it walks */
#define TC_WARPS 4
#define TC_THREADS (TC_WARPS * 32)
#define TC_DMAX 128
#define TC_FRAGS (TC_DMAX / 16)       /* 16-column blocks of a head */
#define TC_HPAD 8                     /* padding of 16-bit rows, in elements (bank spread) */
#define TC_FPAD 4                     /* padding of fp32 rows */
#define TC_LDP (TC_ROWS + TC_HPAD)    /* 16-bit row of 64 probabilities */
#define TC_LDS (TC_ROWS + TC_FPAD)    /* fp32 row of 64 scores */
/* Softmax in base 2: exp(x) = exp2(x log2 e), and exp2f is a single instruction */
#define CT_LOG2E 1.4426950408889634f
#define CT_LN2 0.6931471805599453f

typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> tc_acc;
template <typename E> using tc_a_row = wmma::fragment<wmma::matrix_a, 16, 16, 16, E, wmma::row_major>;
template <typename E> using tc_b_row = wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::row_major>;
template <typename E> using tc_b_col = wmma::fragment<wmma::matrix_b, 16, 16, 16, E, wmma::col_major>;

/* Shared-memory layout, the same on host (launch size) and device. Every region starts at a
 * multiple of 128 bytes and every fragment pointer lands on a multiple of 32 (WMMA's rule). */
struct tc_layout {
    int ldh;       /* 16-bit head rows: D + pad */
    int ldw;       /* fp32 work rows: scores (64) or a head row (D), whichever is wider */
    size_t head;   /* bytes of a 64-row 16-bit head tile */
    size_t work;   /* bytes of a 64-row fp32 work tile */
    size_t scores; /* bytes of a 64-row fp32 score tile */
    size_t probs;  /* bytes of a 64-row 16-bit probability tile */
    size_t rows;   /* bytes of per-row fp32 values */
};

__host__ __device__ static inline size_t tc_round(size_t b) { return (b + 127) / 128 * 128; }

__host__ __device__ static inline tc_layout tc_layout_of(int D) {
    tc_layout L;
    L.ldh = D + TC_HPAD;
    L.ldw = (D + TC_FPAD > TC_LDS ? D + TC_FPAD : TC_LDS);
    L.head = tc_round((size_t)TC_ROWS * L.ldh * 2);
    L.work = tc_round((size_t)TC_ROWS * L.ldw * 4);
    L.scores = tc_round((size_t)TC_ROWS * TC_LDS * 4);
    L.probs = tc_round((size_t)TC_ROWS * TC_LDP * 2);
    L.rows = tc_round((size_t)TC_ROWS * 4);
    return L;
}

/* forward: Q, K, V heads; work (scores, then nothing); O; P; corr and l per row */
__host__ __device__ static inline size_t tc_fwd_smem(int D) {
    tc_layout L = tc_layout_of(D);
    return 3 * L.head + 2 * L.work + L.probs + 2 * L.rows;
}
/* dq: Q, dY, K, V heads; work (S, then dq); dP scores; dS probabilities */
__host__ __device__ static inline size_t tc_dq_smem(int D) {
    tc_layout L = tc_layout_of(D);
    return 4 * L.head + L.work + L.scores + L.probs;
}
/* dk, dv: K, V, Q, dY heads; work (S^T, then dk/dv); dP^T scores; P^T and dS^T; lse, dsum */
__host__ __device__ static inline size_t tc_dkdv_smem(int D) {
    tc_layout L = tc_layout_of(D);
    return 4 * L.head + L.work + L.scores + 2 * L.probs + 2 * L.rows;
}

/* Rows [r0, r0 + 64) of one head (src: the head's column in token 0, row stride ld elements) into
 * sh (row stride ldh) with 16-byte copies; rows at or past T read as 0. D % 16 == 0 and 16-byte
 * aligned sources are the caller's promise (tc_usable). */
template <typename E>
__device__ __forceinline__ void tc_load_head(E *sh, int ldh, const E *src, int64_t ld, int64_t r0,
                                             int64_t T, int D) {
    const int vec = D / 8; /* 8 16-bit values per 16 bytes */
    for (int i = threadIdx.x; i < TC_ROWS * vec; i += blockDim.x) {
        int r = i / vec, c = (i - r * vec) * 8;
        int64_t t = r0 + r;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (t < T) v = *reinterpret_cast<const uint4 *>(src + t * ld + c);
        *reinterpret_cast<uint4 *>(sh + r * ldh + c) = v;
    }
}

/* out[16 x 64] (fp32, row stride ldo; 16-column blocks n with need(n) only) = A[16 x D] B^T where
 * A's rows and B's 64 rows are 16-bit head tiles of stride ldh. */
template <typename E>
__device__ __forceinline__ void tc_rows_times_tile_t(float *out, int ldo, const E *A, const E *Bt,
                                                     int ldh, int D, int n_blocks) {
    for (int n = 0; n < n_blocks; n++) {
        tc_acc acc;
        wmma::fill_fragment(acc, 0.0f);
        for (int kd = 0; kd < D / 16; kd++) {
            tc_a_row<E> a;
            tc_b_col<E> b;
            wmma::load_matrix_sync(a, A + kd * 16, ldh);
            wmma::load_matrix_sync(b, Bt + n * 16 * ldh + kd * 16, ldh);
            wmma::mma_sync(acc, a, b, acc);
        }
        wmma::store_matrix_sync(out + n * 16, acc, ldo, wmma::mem_row_major);
    }
}

/* ---- forward ---- */

template <typename E>
__global__ void __launch_bounds__(TC_THREADS)
k_attn_fwd_tc(E *__restrict__ y, float *__restrict__ lse, const E *__restrict__ qkv, int64_t T,
              int64_t H, int D, float scale, uint64_t thresh, float keep_scale, uint64_t key,
              uint64_t stream) {
    extern __shared__ __align__(128) unsigned char smem[];
    const tc_layout L = tc_layout_of(D);
    E *Qs = reinterpret_cast<E *>(smem);
    E *Ks = reinterpret_cast<E *>(smem + L.head);
    E *Vs = reinterpret_cast<E *>(smem + 2 * L.head);
    float *Ws = reinterpret_cast<float *>(smem + 3 * L.head);                 /* scores */
    float *Os = reinterpret_cast<float *>(smem + 3 * L.head + L.work);        /* output rows */
    E *Ps = reinterpret_cast<E *>(smem + 3 * L.head + 2 * L.work);
    float *corr_s = reinterpret_cast<float *>(smem + 3 * L.head + 2 * L.work + L.probs);
    float *l_s = corr_s + TC_ROWS;

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t bh = blockIdx.y, b = bh / H, h = bh - b * H;
    const int64_t q0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * TC_ROWS; /* heavy tiles first */
    const int64_t ld = 3 * H * D;
    const E *qh = qkv + b * T * ld + h * D;
    const E *kh = qh + H * D, *vh = qh + 2 * H * D;
    const int64_t t_last = (q0 + TC_ROWS < T ? q0 + TC_ROWS : T) - 1;
    const int64_t w0 = q0 + warp * 16;                 /* this warp's first query row */
    const int64_t w_last = w0 + 15 < t_last ? w0 + 15 : t_last;
    const bool active = w0 <= t_last;

    float *Ww = Ws + warp * 16 * L.ldw, *Ow = Os + warp * 16 * L.ldw;
    E *Pw = Ps + warp * 16 * TC_LDP;
    for (int i = lane; i < 16 * D; i += 32) Ow[(i / D) * L.ldw + i % D] = 0.0f;
    /* the softmax of row r is done by lanes 2r (columns 0..31) and 2r + 1 (32..63) */
    const int r = lane >> 1, half = lane & 1;
    const int64_t t = w0 + r;
    const float scale2 = scale * CT_LOG2E;
    float m_run = -INFINITY, l_run = 0.0f;        /* running max (log2 units) and sum of row t */

    tc_load_head(Qs, L.ldh, qh, ld, q0, T, D);
    for (int64_t k0 = 0; k0 <= t_last; k0 += TC_ROWS) {
        __syncthreads(); /* every warp is done with the previous K, V (and Q is loaded) */
        tc_load_head(Ks, L.ldh, kh, ld, k0, T, D);
        tc_load_head(Vs, L.ldh, vh, ld, k0, T, D);
        __syncthreads();
        if (!active) continue;
        /* 16-key blocks holding a key <= the warp's last row; the rest of the tile is masked */
        const int nb = (int)((w_last - k0) / 16 + 1 < 4 ? (w_last - k0) / 16 + 1 : 4);
        tc_rows_times_tile_t(Ww, L.ldw, Qs + warp * 16 * L.ldh, Ks, L.ldh, D, nb);
        __syncwarp();

        /* this lane's 32 scores, in log2 units (exp2 is one instruction; lse is converted back) */
        const float *srow = Ww + r * L.ldw + half * 32;
        const int64_t j_first = k0 + half * 32;
        float sv[32];
        float mx = -INFINITY;
#pragma unroll
        for (int c = 0; c < 32; c += 4) {
            float4 v4 = *reinterpret_cast<const float4 *>(srow + c);
            sv[c] = v4.x;
            sv[c + 1] = v4.y;
            sv[c + 2] = v4.z;
            sv[c + 3] = v4.w;
        }
#pragma unroll
        for (int c = 0; c < 32; c++) {
            sv[c] = (t < T && j_first + c <= t) ? sv[c] * scale2 : -INFINITY;
            mx = fmaxf(mx, sv[c]);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        /* corr rescales what was summed under the old max; 1 when nothing changes (then the
         * warp skips the rescale), and for rows past the sequence, which stay 0 */
        float m_new = fmaxf(m_run, mx), corr = 1.0f;
        if (t >= T) m_new = 0.0f;
        else if (m_run != -INFINITY) corr = exp2f(m_run - m_new);
        float sum = 0.0f;
        E *prow = Pw + r * TC_LDP + half * 32;
#pragma unroll
        for (int c = 0; c < 32; c++) {
            float p = exp2f(sv[c] - m_new); /* masked: exp2(-inf) = 0 */
            sum += p;
            if (thresh != 0 && p != 0.0f)
                p *= attn_keep(key, stream, ((uint64_t)bh * T + t) * T + (uint64_t)(j_first + c),
                               thresh, keep_scale);
            prow[c] = ct_st<E>(p);
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        l_run = l_run * corr + sum;            /* the softmax sum: no dropout */
        m_run = m_new;
        if (half == 0) corr_s[warp * 16 + r] = corr;
        __syncwarp();
        if (__any_sync(0xffffffffu, corr != 1.0f)) {
            for (int i = lane; i < 16 * D; i += 32) Ow[(i / D) * L.ldw + i % D] *= corr_s[warp * 16 + i / D];
            __syncwarp();
        }
        /* O += P V over the key blocks that hold a valid key */
        for (int n = 0; n < D / 16; n++) {
            tc_acc acc;
            wmma::load_matrix_sync(acc, Ow + n * 16, L.ldw, wmma::mem_row_major);
            for (int kk = 0; kk < nb; kk++) {
                tc_a_row<E> a;
                tc_b_row<E> bf;
                wmma::load_matrix_sync(a, Pw + kk * 16, TC_LDP);
                wmma::load_matrix_sync(bf, Vs + kk * 16 * L.ldh + n * 16, L.ldh);
                wmma::mma_sync(acc, a, bf, acc);
            }
            wmma::store_matrix_sync(Ow + n * 16, acc, L.ldw, wmma::mem_row_major);
        }
        __syncwarp();
    }
    if (!active) return;
    if (half == 0) l_s[warp * 16 + r] = l_run;
    if (half == 0 && t < T) lse[bh * T + t] = (m_run + log2f(l_run)) * CT_LN2;
    __syncwarp();
    for (int i = lane; i < 16 * D; i += 32) {
        int rr = i / D, d = i - rr * D;
        int64_t tt = w0 + rr;
        if (tt < T) y[((b * T + tt) * H + h) * D + d] = ct_st<E>(Ow[rr * L.ldw + d] / l_s[warp * 16 + rr]);
    }
}

/* ---- backward ---- */

template <typename E>
__global__ void __launch_bounds__(TC_THREADS)
k_attn_dq_tc(E *__restrict__ dqkv, const E *__restrict__ dy, const E *__restrict__ qkv,
             const float *__restrict__ lse, const float *__restrict__ dsum, int64_t T, int64_t H,
             int D, float scale, uint64_t thresh, float keep_scale, uint64_t key, uint64_t stream) {
    extern __shared__ __align__(128) unsigned char smem[];
    const tc_layout L = tc_layout_of(D);
    E *Qs = reinterpret_cast<E *>(smem);
    E *dYs = reinterpret_cast<E *>(smem + L.head);
    E *Ks = reinterpret_cast<E *>(smem + 2 * L.head);
    E *Vs = reinterpret_cast<E *>(smem + 3 * L.head);
    float *Ws = reinterpret_cast<float *>(smem + 4 * L.head);                    /* S, then dq */
    float *dPs = reinterpret_cast<float *>(smem + 4 * L.head + L.work);
    E *dSs = reinterpret_cast<E *>(smem + 4 * L.head + L.work + L.scores);

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t bh = blockIdx.y, b = bh / H, h = bh - b * H;
    const int64_t q0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * TC_ROWS;
    const int64_t ld = 3 * H * D;
    const E *qh = qkv + b * T * ld + h * D;
    const E *kh = qh + H * D, *vh = qh + 2 * H * D;
    const E *dyh = dy + b * T * H * D + h * D;
    const int64_t t_last = (q0 + TC_ROWS < T ? q0 + TC_ROWS : T) - 1;
    const int64_t w0 = q0 + warp * 16;
    const int64_t w_last = w0 + 15 < t_last ? w0 + 15 : t_last;
    const bool active = w0 <= t_last;

    float *Ww = Ws + warp * 16 * L.ldw, *dPw = dPs + warp * 16 * TC_LDS;
    E *dSw = dSs + warp * 16 * TC_LDP;
    const int r = lane >> 1, half = lane & 1;
    const int64_t t = w0 + r;
    const float scale2 = scale * CT_LOG2E;
    const float lse2_t = (active && t < T) ? lse[bh * T + t] * CT_LOG2E : 0.0f;
    const float dsum_t = (active && t < T) ? dsum[bh * T + t] : 0.0f;

    tc_acc dq[TC_FRAGS];
#pragma unroll
    for (int n = 0; n < TC_FRAGS; n++) wmma::fill_fragment(dq[n], 0.0f);

    tc_load_head(Qs, L.ldh, qh, ld, q0, T, D);
    tc_load_head(dYs, L.ldh, dyh, H * D, q0, T, D);
    for (int64_t k0 = 0; k0 <= t_last; k0 += TC_ROWS) {
        __syncthreads();
        tc_load_head(Ks, L.ldh, kh, ld, k0, T, D);
        tc_load_head(Vs, L.ldh, vh, ld, k0, T, D);
        __syncthreads();
        if (!active) continue;
        const int nb = (int)((w_last - k0) / 16 + 1 < 4 ? (w_last - k0) / 16 + 1 : 4);
        tc_rows_times_tile_t(Ww, L.ldw, Qs + warp * 16 * L.ldh, Ks, L.ldh, D, nb);
        tc_rows_times_tile_t(dPw, TC_LDS, dYs + warp * 16 * L.ldh, Vs, L.ldh, D, nb);
        __syncwarp();
        const int64_t j_first = k0 + half * 32;
        const float *srow = Ww + r * L.ldw + half * 32, *dprow = dPw + r * TC_LDS + half * 32;
        E *dsrow = dSw + r * TC_LDP + half * 32;
#pragma unroll
        for (int c = 0; c < 32; c += 4) {
            float4 s4 = *reinterpret_cast<const float4 *>(srow + c);
            float4 d4 = *reinterpret_cast<const float4 *>(dprow + c);
            float sc[4] = {s4.x, s4.y, s4.z, s4.w}, dc[4] = {d4.x, d4.y, d4.z, d4.w};
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int64_t j = j_first + c + u;
                float ds = 0.0f;
                if (t < T && j <= t) {
                    float p = exp2f(sc[u] * scale2 - lse2_t);
                    float dp = dc[u];
                    if (thresh != 0)
                        dp *= attn_keep(key, stream, ((uint64_t)bh * T + t) * T + (uint64_t)j, thresh,
                                        keep_scale);
                    ds = p * (dp - dsum_t);
                }
                dsrow[c + u] = ct_st<E>(ds);
            }
        }
        __syncwarp();
#pragma unroll
        for (int n = 0; n < TC_FRAGS; n++) {
            if (n >= D / 16) break;
            for (int kk = 0; kk < nb; kk++) {
                tc_a_row<E> a;
                tc_b_row<E> bf;
                wmma::load_matrix_sync(a, dSw + kk * 16, TC_LDP);
                wmma::load_matrix_sync(bf, Ks + kk * 16 * L.ldh + n * 16, L.ldh);
                wmma::mma_sync(dq[n], a, bf, dq[n]);
            }
        }
    }
    if (!active) return;
    __syncwarp();
#pragma unroll
    for (int n = 0; n < TC_FRAGS; n++)
        if (n < D / 16) wmma::store_matrix_sync(Ww + n * 16, dq[n], L.ldw, wmma::mem_row_major);
    __syncwarp();
    for (int i = lane; i < 16 * D; i += 32) {
        int rr = i / D, d = i - rr * D;
        int64_t tt = w0 + rr;
        if (tt < T) dqkv[(b * T + tt) * ld + h * D + d] = ct_st<E>(Ww[rr * L.ldw + d] * scale);
    }
}

template <typename E>
__global__ void __launch_bounds__(TC_THREADS)
k_attn_dkdv_tc(E *__restrict__ dqkv, const E *__restrict__ dy, const E *__restrict__ qkv,
               const float *__restrict__ lse, const float *__restrict__ dsum, int64_t T, int64_t H,
               int D, float scale, uint64_t thresh, float keep_scale, uint64_t key, uint64_t stream) {
    extern __shared__ __align__(128) unsigned char smem[];
    const tc_layout L = tc_layout_of(D);
    E *Ks = reinterpret_cast<E *>(smem);
    E *Vs = reinterpret_cast<E *>(smem + L.head);
    E *Qs = reinterpret_cast<E *>(smem + 2 * L.head);
    E *dYs = reinterpret_cast<E *>(smem + 3 * L.head);
    float *Ws = reinterpret_cast<float *>(smem + 4 * L.head);                    /* S^T, then out */
    float *dPs = reinterpret_cast<float *>(smem + 4 * L.head + L.work);          /* dP^T */
    E *Pts = reinterpret_cast<E *>(smem + 4 * L.head + L.work + L.scores);       /* (P keep)^T */
    E *dSts = reinterpret_cast<E *>(smem + 4 * L.head + L.work + L.scores + L.probs);
    float *lse_s = reinterpret_cast<float *>(smem + 4 * L.head + L.work + L.scores + 2 * L.probs);
    float *ds_s = lse_s + TC_ROWS;

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int64_t bh = blockIdx.y, b = bh / H, h = bh - b * H;
    const int64_t j0 = (int64_t)blockIdx.x * TC_ROWS; /* early key tiles see the most queries */
    const int64_t ld = 3 * H * D;
    const E *qh = qkv + b * T * ld + h * D;
    const E *kh = qh + H * D, *vh = qh + 2 * H * D;
    const E *dyh = dy + b * T * H * D + h * D;
    const int64_t w0 = j0 + warp * 16;                 /* this warp's first key */
    const bool active = w0 < T;

    float *Ww = Ws + warp * 16 * L.ldw, *dPw = dPs + warp * 16 * TC_LDS;
    E *Ptw = Pts + warp * 16 * TC_LDP, *dStw = dSts + warp * 16 * TC_LDP;
    const int r = lane >> 1, half = lane & 1;          /* key row r, queries half*32 .. +31 */
    const int64_t j = w0 + r;
    const float scale2 = scale * CT_LOG2E;

    tc_acc dk[TC_FRAGS], dv[TC_FRAGS];
#pragma unroll
    for (int n = 0; n < TC_FRAGS; n++) {
        wmma::fill_fragment(dk[n], 0.0f);
        wmma::fill_fragment(dv[n], 0.0f);
    }

    tc_load_head(Ks, L.ldh, kh, ld, j0, T, D);
    tc_load_head(Vs, L.ldh, vh, ld, j0, T, D);
    for (int64_t t0 = j0; t0 < T; t0 += TC_ROWS) {
        __syncthreads();
        tc_load_head(Qs, L.ldh, qh, ld, t0, T, D);
        tc_load_head(dYs, L.ldh, dyh, H * D, t0, T, D);
        for (int i = threadIdx.x; i < TC_ROWS; i += blockDim.x) {
            int64_t tt = t0 + i;
            lse_s[i] = tt < T ? lse[bh * T + tt] * CT_LOG2E : 0.0f;   /* log2 units */
            ds_s[i] = tt < T ? dsum[bh * T + tt] : 0.0f;
        }
        __syncthreads();
        if (!active) continue;
        /* 16-query blocks from the first holding a query >= the warp's first key, to T */
        const int kb0 = (int)(w0 > t0 ? (w0 - t0) / 16 : 0);
        const int kb1 = (int)(T - t0 < TC_ROWS ? (T - t0 + 15) / 16 : 4);
        for (int n = kb0; n < kb1; n++) {
            tc_acc s, dp;
            wmma::fill_fragment(s, 0.0f);
            wmma::fill_fragment(dp, 0.0f);
            for (int kd = 0; kd < D / 16; kd++) {
                tc_a_row<E> a;
                tc_b_col<E> bq;
                wmma::load_matrix_sync(a, Ks + warp * 16 * L.ldh + kd * 16, L.ldh);
                wmma::load_matrix_sync(bq, Qs + n * 16 * L.ldh + kd * 16, L.ldh);
                wmma::mma_sync(s, a, bq, s);
                wmma::load_matrix_sync(a, Vs + warp * 16 * L.ldh + kd * 16, L.ldh);
                wmma::load_matrix_sync(bq, dYs + n * 16 * L.ldh + kd * 16, L.ldh);
                wmma::mma_sync(dp, a, bq, dp);
            }
            wmma::store_matrix_sync(Ww + n * 16, s, L.ldw, wmma::mem_row_major);
            wmma::store_matrix_sync(dPw + n * 16, dp, TC_LDS, wmma::mem_row_major);
        }
        __syncwarp();
        const float *srow = Ww + r * L.ldw + half * 32, *dprow = dPw + r * TC_LDS + half * 32;
#pragma unroll
        for (int c = 0; c < 32; c += 4) {
            float4 s4 = *reinterpret_cast<const float4 *>(srow + c);
            float4 d4 = *reinterpret_cast<const float4 *>(dprow + c);
            float sc[4] = {s4.x, s4.y, s4.z, s4.w}, dc[4] = {d4.x, d4.y, d4.z, d4.w};
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int q = half * 32 + c + u;       /* query t0 + q */
                const int64_t tq = t0 + q;
                float pk = 0.0f, ds = 0.0f;
                if (j < T && tq < T && tq >= j) {
                    float p = exp2f(sc[u] * scale2 - lse_s[q]);
                    float keep = thresh != 0 ? attn_keep(key, stream, ((uint64_t)bh * T + tq) * T + (uint64_t)j,
                                                         thresh, keep_scale)
                                             : 1.0f;
                    pk = p * keep;
                    ds = p * (dc[u] * keep - ds_s[q]);
                }
                Ptw[r * TC_LDP + q] = ct_st<E>(pk);
                dStw[r * TC_LDP + q] = ct_st<E>(ds);
            }
        }
        __syncwarp();
#pragma unroll
        for (int n = 0; n < TC_FRAGS; n++) {
            if (n >= D / 16) break;
            for (int kk = kb0; kk < kb1; kk++) {
                tc_a_row<E> a;
                tc_b_row<E> bf;
                wmma::load_matrix_sync(a, Ptw + kk * 16, TC_LDP);
                wmma::load_matrix_sync(bf, dYs + kk * 16 * L.ldh + n * 16, L.ldh);
                wmma::mma_sync(dv[n], a, bf, dv[n]);
                wmma::load_matrix_sync(a, dStw + kk * 16, TC_LDP);
                wmma::load_matrix_sync(bf, Qs + kk * 16 * L.ldh + n * 16, L.ldh);
                wmma::mma_sync(dk[n], a, bf, dk[n]);
            }
        }
    }
    if (!active) return;
    __syncwarp();
    /* dk through the work tile, then dv (16 x D fp32 each) */
#pragma unroll
    for (int n = 0; n < TC_FRAGS; n++)
        if (n < D / 16) wmma::store_matrix_sync(Ww + n * 16, dk[n], L.ldw, wmma::mem_row_major);
    __syncwarp();
    for (int i = lane; i < 16 * D; i += 32) {
        int rr = i / D, d = i - rr * D;
        int64_t jj = w0 + rr;
        if (jj < T) dqkv[(b * T + jj) * ld + H * D + h * D + d] = ct_st<E>(Ww[rr * L.ldw + d] * scale);
    }
    __syncwarp();
#pragma unroll
    for (int n = 0; n < TC_FRAGS; n++)
        if (n < D / 16) wmma::store_matrix_sync(Ww + n * 16, dv[n], L.ldw, wmma::mem_row_major);
    __syncwarp();
    for (int i = lane; i < 16 * D; i += 32) {
        int rr = i / D, d = i - rr * D;
        int64_t jj = w0 + rr;
        if (jj < T) dqkv[(b * T + jj) * ld + 2 * H * D + h * D + d] = ct_st<E>(Ww[rr * L.ldw + d]);
    }
}

/* ---- host side ---- */

static bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

bool ct_cuda_attn_tc_usable(ct_dtype dt, int64_t D, const void *a, const void *b, const void *c,
                            const void *d) {
    if (dt != CT_F16 && dt != CT_BF16) return false;
    if (D < 16 || D > TC_DMAX || D % 16 != 0) return false;
    return aligned16(a) && aligned16(b) && (!c || aligned16(c)) && (!d || aligned16(d));
}

/* Dynamic shared memory above 48 KiB must be allowed per kernel, once, outside any capture. */
void ct_cuda_attn_tc_init(void) {
    int fwd = (int)tc_fwd_smem(TC_DMAX), dq = (int)tc_dq_smem(TC_DMAX), dkdv = (int)tc_dkdv_smem(TC_DMAX);
    CT_CUDA_CHECK(cudaFuncSetAttribute(k_attn_fwd_tc<__half>, cudaFuncAttributeMaxDynamicSharedMemorySize, fwd));
    CT_CUDA_CHECK(cudaFuncSetAttribute(k_attn_fwd_tc<__nv_bfloat16>, cudaFuncAttributeMaxDynamicSharedMemorySize, fwd));
    CT_CUDA_CHECK(cudaFuncSetAttribute(k_attn_dq_tc<__half>, cudaFuncAttributeMaxDynamicSharedMemorySize, dq));
    CT_CUDA_CHECK(cudaFuncSetAttribute(k_attn_dq_tc<__nv_bfloat16>, cudaFuncAttributeMaxDynamicSharedMemorySize, dq));
    CT_CUDA_CHECK(cudaFuncSetAttribute(k_attn_dkdv_tc<__half>, cudaFuncAttributeMaxDynamicSharedMemorySize, dkdv));
    CT_CUDA_CHECK(cudaFuncSetAttribute(k_attn_dkdv_tc<__nv_bfloat16>, cudaFuncAttributeMaxDynamicSharedMemorySize, dkdv));
}

#define TC_DISPATCH(dt, E, ...)                                                                  \
    do {                                                                                         \
        if ((dt) == CT_F16) {                                                                    \
            typedef __half E;                                                                    \
            __VA_ARGS__;                                                                         \
        } else {                                                                                 \
            typedef __nv_bfloat16 E;                                                             \
            __VA_ARGS__;                                                                         \
        }                                                                                        \
    } while (0)

void ct_cuda_attn_tc_forward(cudaStream_t st, void *y, float *lse, const void *qkv, int64_t B,
                             int64_t T, int64_t H, int64_t D, float scale, uint64_t thresh,
                             float keep_scale, uint64_t key, uint64_t stream, ct_dtype dt) {
    dim3 grid((unsigned)((T + TC_ROWS - 1) / TC_ROWS), (unsigned)(B * H));
    size_t sm = tc_fwd_smem((int)D);
    TC_DISPATCH(dt, E, {
        k_attn_fwd_tc<E><<<grid, TC_THREADS, sm, st>>>((E *)y, lse, (const E *)qkv, T, H, (int)D, scale,
                                                        thresh, keep_scale, key, stream);
        CT_CUDA_LAUNCH_CHECK();
    });
}

void ct_cuda_attn_tc_backward(cudaStream_t st, void *dqkv, const void *dy, const void *qkv,
                              const float *lse, const float *dsum, int64_t B, int64_t T, int64_t H,
                              int64_t D, float scale, uint64_t thresh, float keep_scale, uint64_t key,
                              uint64_t stream, ct_dtype dt) {
    dim3 grid((unsigned)((T + TC_ROWS - 1) / TC_ROWS), (unsigned)(B * H));
    TC_DISPATCH(dt, E, {
        k_attn_dq_tc<E><<<grid, TC_THREADS, tc_dq_smem((int)D), st>>>(
            (E *)dqkv, (const E *)dy, (const E *)qkv, lse, dsum, T, H, (int)D, scale, thresh, keep_scale,
            key, stream);
        CT_CUDA_LAUNCH_CHECK();
        k_attn_dkdv_tc<E><<<grid, TC_THREADS, tc_dkdv_smem((int)D), st>>>(
            (E *)dqkv, (const E *)dy, (const E *)qkv, lse, dsum, T, H, (int)D, scale, thresh, keep_scale,
            key, stream);
        CT_CUDA_LAUNCH_CHECK();
    });
}
