/* cuda_attention_mma.cu: causal attention with the scores kept in registers (FlashAttention-2's
 * structure), for 16-bit storage and head dims 32, 64 and 128. cuda_attention.cu chooses it first;
 * the layouts, the dropout rule and the results' meaning are the ones that file describes.
 *
 * Products are PTX mma.sync m16n8k16 (16-bit inputs, fp32 accumulation) with operands loaded from
 * shared memory by ldmatrix. Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"),
 * with g = lane / 4 and q = lane % 4:
 *   A 16x16 (4 x 32-bit): a0 (row g, cols 2q, 2q+1), a1 (row g+8, same cols), a2 (row g,
 *       cols 2q+8, 2q+9), a3 (row g+8, cols 2q+8, 2q+9); the lower column in the low half.
 *   B 16x8  (2 x 32-bit): b0 (rows 2q, 2q+1, col g), b1 (rows 2q+8, 2q+9, col g).
 *   C 16x8  (4 x fp32):   c0, c1 (row g, cols 2q, 2q+1), c2, c3 (row g+8, cols 2q, 2q+1).
 * So the C fragments of two neighbouring 8-column tiles of S are, element for element, the A
 * fragment of the 16-column block of P: the probabilities go from one product to the next without
 * leaving the registers. Each lane holds two rows (g and g+8) of its warp's 16; a row's max and
 * sum are reduced over the four lanes that share g.
 *
 * A CTA is 4 warps and a 64-row tile (queries in the forward and dq kernels, keys in dk/dv); it
 * walks the other side in tiles of 64, loaded by all warps into shared memory with cp.async, the
 * next tile in flight while this one is used (two buffers). Tiles are aligned to
 * 64, so a query tile meets keys k0 <= q0 only and every valid query row has a valid key in every
 * tile it visits (key k0 <= t). 16-column blocks that hold no pair inside the causal bound are
 * skipped (their products would add exact zeros). Every sum has a fixed order (per lane, then a
 * fixed butterfly), so results do not depend on scheduling; dq, dk and dv are each written by one
 * CTA (no atomics). The softmax runs in base 2 (exp2f is one instruction); lse is stored in
 * natural-log units as the other kernels store it. P and dS are rounded to the storage type before
 * their second product, as in FlashAttention-2. */
#include "cuda/cuda_attention.cuh"
#include "cuda/cuda_dtype.cuh"

#define MMA_ROWS 64
#define MMA_THREADS 128
#define MMA_LOG2E 1.4426950408889634f
#define MMA_LN2 0.6931471805599453f

__device__ __forceinline__ uint32_t mma_smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* Four 8x8 16-bit matrices; lane i gives the address of row i % 8 of matrix i / 8. */
__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(mma_smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(mma_smem_addr(p)));
}

/* c += a b for one 16x8 tile. */
__device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1,
                                          __nv_bfloat16 *) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_16816(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1,
                                          __half *) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <typename E>
__device__ __forceinline__ void mma_e(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    mma_16816(c, a, b0, b1, (E *)nullptr);
}

/* Two floats as one 32-bit pair of E, lo in the low half. */
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi, __nv_bfloat16 *) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi, __half *) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
template <typename E> __device__ __forceinline__ uint32_t pack_e(float lo, float hi) {
    return pack_pair(lo, hi, (E *)nullptr);
}

/* The A fragment of rows [r0, r0 + 16) x cols [c0, c0 + 16) of a row-major tile (stride ld). */
template <typename E>
__device__ __forceinline__ void load_a(uint32_t a[4], const E *tile, int ld, int r0, int c0) {
    const int lane = threadIdx.x & 31;
    ldsm_x4(a, tile + (r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + c0 + (lane >> 4) * 8);
}
/* B fragments of two 8-column tiles (n0 .. n0 + 15) x k in [k0, k0 + 16), from a tile stored
 * [n][k] row-major (K or V rows when the product is against their transpose): b[0], b[1] for
 * columns n0 .. n0 + 7, b[2], b[3] for n0 + 8 .. n0 + 15. */
template <typename E>
__device__ __forceinline__ void load_b_nk(uint32_t b[4], const E *tile, int ld, int n0, int k0) {
    const int lane = threadIdx.x & 31;
    ldsm_x4(b, tile + (n0 + (lane & 7) + (lane >> 4) * 8) * ld + k0 + ((lane >> 3) & 1) * 8);
}
/* The same from a tile stored [k][n] row-major (V, K, Q or dY rows as the right-hand factor). */
template <typename E>
__device__ __forceinline__ void load_b_kn(uint32_t b[4], const E *tile, int ld, int k0, int n0) {
    const int lane = threadIdx.x & 31;
    ldsm_x4_trans(b, tile + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * ld + n0 + (lane >> 4) * 8);
}

/* The A fragment of 16-column block kk of a 16 x 64 tile held as C fragments (c[2kk], c[2kk+1]),
 * rounded to E: how P and dS enter their second product without leaving the registers. */
template <typename E>
__device__ __forceinline__ void c_block_to_a(uint32_t a[4], const float (*c)[4], int kk) {
    a[0] = pack_e<E>(c[2 * kk][0], c[2 * kk][1]);
    a[1] = pack_e<E>(c[2 * kk][2], c[2 * kk][3]);
    a[2] = pack_e<E>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
    a[3] = pack_e<E>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

/* acc[16 x D] += A times rows [16 kk, 16 kk + 16) of B (a [k][n] tile, stride ldb, D columns). */
template <typename E, int D>
__device__ __forceinline__ void mma_a_rows(float (*acc)[4], const uint32_t a[4], const E *B, int ldb, int kk) {
#pragma unroll
    for (int n = 0; n < D / 16; n++) {
        uint32_t b[4];
        load_b_kn(b, B, ldb, kk * 16, n * 16);
        mma_e<E>(acc[2 * n], a, b[0], b[1]);
        mma_e<E>(acc[2 * n + 1], a, b[2], b[3]);
    }
}

/* Rows [r0, r0 + 64) of one head (src at the head's column of token 0, row stride ld) into sh
 * (row stride D + 8) as asynchronous 16-byte copies (cp.async, sm_80+), so that the next tile
 * loads while this one is used; rows at or past T are zero-filled (0 bytes read, from row 0's
 * address). The caller commits the group and waits for it. */
template <typename E, int D>
__device__ __forceinline__ void load_rows_async(E *sh, const E *src, int64_t ld, int64_t r0, int64_t T) {
    constexpr int VEC = D / 8, LDH = D + 8;
    for (int i = threadIdx.x; i < MMA_ROWS * VEC; i += blockDim.x) {
        int r = i / VEC, c = (i - r * VEC) * 8;
        int64_t t = r0 + r;
        const bool ok = t < T;
        const E *from = src + (ok ? t : 0) * ld + c;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(mma_smem_addr(sh + r * LDH + c)),
                     "l"(from), "r"(ok ? 16 : 0));
    }
}
__device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }
/* Waits until at most the newest group of this thread's copies is still in flight. */
__device__ __forceinline__ void cp_async_wait_all_but_newest(void) {
    asm volatile("cp.async.wait_group 1;\n" ::);
}

/* Row max and sum over the four lanes that hold a row (lanes 4g .. 4g + 3). */
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* ---- forward ---- */

template <typename E, int D>
__global__ void __launch_bounds__(MMA_THREADS)
k_attn_fwd_mma(E *__restrict__ y, float *__restrict__ lse, const E *__restrict__ qkv, int64_t T,
               int64_t H, float scale2, uint64_t thresh, float keep_scale, uint64_t key, uint64_t stream) {
    constexpr int LDH = D + 8, KD = D / 16, ND = D / 8;
    extern __shared__ __align__(128) unsigned char smem[];
    E *Qs = reinterpret_cast<E *>(smem);
    E *KVs = Qs + MMA_ROWS * LDH;   /* two buffers of (K tile, V tile): this one and the next */

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int64_t bh = blockIdx.y, b = bh / H, h = bh - b * H;
    const int64_t q0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * MMA_ROWS; /* heavy tiles first */
    const int64_t ld = 3 * H * D;
    const E *qh = qkv + b * T * ld + h * D;
    const E *kh = qh + H * D, *vh = qh + 2 * H * D;
    const int64_t t_last = (q0 + MMA_ROWS < T ? q0 + MMA_ROWS : T) - 1;
    const int64_t w0 = q0 + warp * 16;
    const int64_t w_last = w0 + 15 < t_last ? w0 + 15 : t_last;
    const bool active = w0 <= t_last;
    const int64_t row_t[2] = {w0 + g, w0 + g + 8};   /* the two query rows of this lane */

    load_rows_async<E, D>(Qs, qh, ld, q0, T);
    load_rows_async<E, D>(KVs, kh, ld, 0, T);
    load_rows_async<E, D>(KVs + MMA_ROWS * LDH, vh, ld, 0, T);
    cp_async_commit();
    uint32_t qa[KD][4];

    float o[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  /* l: this lane's share of the sum */

    for (int64_t k0 = 0, it = 0; k0 <= t_last; k0 += MMA_ROWS, it++) {
        const E *Ks = KVs + (it & 1) * 2 * MMA_ROWS * LDH, *Vs = Ks + MMA_ROWS * LDH;
        __syncthreads(); /* every warp is done with the buffer the next tile goes to */
        if (k0 + MMA_ROWS <= t_last) {
            E *next = KVs + ((it + 1) & 1) * 2 * MMA_ROWS * LDH;
            load_rows_async<E, D>(next, kh, ld, k0 + MMA_ROWS, T);
            load_rows_async<E, D>(next + MMA_ROWS * LDH, vh, ld, k0 + MMA_ROWS, T);
        }
        cp_async_commit();
        cp_async_wait_all_but_newest(); /* this tile (and Q) */
        __syncthreads();
        if (!active) continue;
        if (it == 0) {
#pragma unroll
            for (int kd = 0; kd < KD; kd++) load_a(qa[kd], Qs, LDH, warp * 16, kd * 16);
        }
        /* below the diagonal, with every row inside the sequence, no score is masked */
        const bool unmasked = k0 + MMA_ROWS - 1 <= w0 && w0 + 15 < T;

        float s[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
        for (int kd = 0; kd < KD; kd++)
#pragma unroll
            for (int np = 0; np < 4; np++) {
                if (k0 + np * 16 > w_last) continue; /* keys past every row of this warp */
                uint32_t bk[4];
                load_b_nk(bk, Ks, LDH, np * 16, kd * 16);
                mma_e<E>(s[2 * np], qa[kd], bk[0], bk[1]);
                mma_e<E>(s[2 * np + 1], qa[kd], bk[2], bk[3]);
            }

        float mx[2] = {-INFINITY, -INFINITY};
        if (unmasked) {
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    s[nt][e] *= scale2;
                    mx[e >> 1] = fmaxf(mx[e >> 1], s[nt][e]);
                }
        } else {
#pragma unroll
            for (int nt = 0; nt < 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int hh = e >> 1;
                    const int64_t j = k0 + nt * 8 + 2 * q + (e & 1);
                    float v = (row_t[hh] < T && j <= row_t[hh]) ? s[nt][e] * scale2 : -INFINITY;
                    s[nt][e] = v;
                    mx[hh] = fmaxf(mx[hh], v);
                }
        }
        float corr[2];
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            float m_new = fmaxf(m[hh], quad_max(mx[hh]));
            corr[hh] = 1.0f;
            if (row_t[hh] >= T) m_new = 0.0f;             /* a row past the sequence stays 0 */
            else if (m[hh] != -INFINITY) corr[hh] = exp2f(m[hh] - m_new);
            m[hh] = m_new;
        }
        float part[2] = {0.0f, 0.0f};
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int hh = e >> 1;
                float p = exp2f(s[nt][e] - m[hh]); /* masked: exp2(-inf) = 0 */
                part[hh] += p;
                if (thresh != 0 && p != 0.0f) {
                    const uint64_t j = (uint64_t)(k0 + nt * 8 + 2 * q + (e & 1));
                    p *= attn_keep(key, stream, ((uint64_t)bh * T + (uint64_t)row_t[hh]) * T + j, thresh,
                                   keep_scale);
                }
                s[nt][e] = p;
            }
        l[0] = l[0] * corr[0] + part[0];     /* the softmax sum: no dropout */
        l[1] = l[1] * corr[1] + part[1];
#pragma unroll
        for (int n = 0; n < ND; n++) {
            o[n][0] *= corr[0];
            o[n][1] *= corr[0];
            o[n][2] *= corr[1];
            o[n][3] *= corr[1];
        }
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            if (k0 + kk * 16 > w_last) continue;
            uint32_t pa[4];
            c_block_to_a<E>(pa, s, kk);
            mma_a_rows<E, D>(o, pa, Vs, LDH, kk);
        }
    }
    if (!active) return;
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        const int64_t t = row_t[hh];
        float lsum = quad_sum(l[hh]);
        if (t >= T) continue;
        const float inv = 1.0f / lsum;
        E *yr = y + ((b * T + t) * H + h) * D + 2 * q;
#pragma unroll
        for (int n = 0; n < ND; n++)
            *reinterpret_cast<uint32_t *>(yr + n * 8) = pack_e<E>(o[n][2 * hh] * inv, o[n][2 * hh + 1] * inv);
        if (q == 0) lse[bh * T + t] = (m[hh] + log2f(lsum)) * MMA_LN2;
    }
}

/* ---- backward ---- */

template <typename E, int D>
__global__ void __launch_bounds__(MMA_THREADS)
k_attn_dq_mma(E *__restrict__ dqkv, const E *__restrict__ dy, const E *__restrict__ qkv,
              const float *__restrict__ lse, const float *__restrict__ dsum, int64_t T, int64_t H,
              float scale, uint64_t thresh, float keep_scale, uint64_t key, uint64_t stream) {
    constexpr int LDH = D + 8, KD = D / 16, ND = D / 8;
    extern __shared__ __align__(128) unsigned char smem[];
    E *Qs = reinterpret_cast<E *>(smem);
    E *dYs = Qs + MMA_ROWS * LDH;
    E *KVs = dYs + MMA_ROWS * LDH;  /* two buffers of (K tile, V tile) */

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int64_t bh = blockIdx.y, b = bh / H, h = bh - b * H;
    const int64_t q0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * MMA_ROWS;
    const int64_t ld = 3 * H * D;
    const E *qh = qkv + b * T * ld + h * D;
    const E *kh = qh + H * D, *vh = qh + 2 * H * D;
    const E *dyh = dy + b * T * H * D + h * D;
    const int64_t t_last = (q0 + MMA_ROWS < T ? q0 + MMA_ROWS : T) - 1;
    const int64_t w0 = q0 + warp * 16;
    const int64_t w_last = w0 + 15 < t_last ? w0 + 15 : t_last;
    const bool active = w0 <= t_last;
    const int64_t row_t[2] = {w0 + g, w0 + g + 8};
    const float scale2 = scale * MMA_LOG2E;
    float lse2[2], ds_row[2];
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        bool ok = active && row_t[hh] < T;
        lse2[hh] = ok ? lse[bh * T + row_t[hh]] * MMA_LOG2E : 0.0f;
        ds_row[hh] = ok ? dsum[bh * T + row_t[hh]] : 0.0f;
    }

    load_rows_async<E, D>(Qs, qh, ld, q0, T);
    load_rows_async<E, D>(dYs, dyh, H * D, q0, T);
    load_rows_async<E, D>(KVs, kh, ld, 0, T);
    load_rows_async<E, D>(KVs + MMA_ROWS * LDH, vh, ld, 0, T);
    cp_async_commit();

    float dq[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;

    for (int64_t k0 = 0, it = 0; k0 <= t_last; k0 += MMA_ROWS, it++) {
        const E *Ks = KVs + (it & 1) * 2 * MMA_ROWS * LDH, *Vs = Ks + MMA_ROWS * LDH;
        __syncthreads();
        if (k0 + MMA_ROWS <= t_last) {
            E *next = KVs + ((it + 1) & 1) * 2 * MMA_ROWS * LDH;
            load_rows_async<E, D>(next, kh, ld, k0 + MMA_ROWS, T);
            load_rows_async<E, D>(next + MMA_ROWS * LDH, vh, ld, k0 + MMA_ROWS, T);
        }
        cp_async_commit();
        cp_async_wait_all_but_newest();
        __syncthreads();
        if (!active) continue;

        float s[8][4], dp[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[nt][e] = dp[nt][e] = 0.0f;
#pragma unroll
        for (int kd = 0; kd < KD; kd++) {
            uint32_t qa[4], da[4];
            load_a(qa, Qs, LDH, warp * 16, kd * 16);
            load_a(da, dYs, LDH, warp * 16, kd * 16);
#pragma unroll
            for (int np = 0; np < 4; np++) {
                if (k0 + np * 16 > w_last) continue;
                uint32_t bk[4], bv[4];
                load_b_nk(bk, Ks, LDH, np * 16, kd * 16);
                load_b_nk(bv, Vs, LDH, np * 16, kd * 16);
                mma_e<E>(s[2 * np], qa, bk[0], bk[1]);
                mma_e<E>(s[2 * np + 1], qa, bk[2], bk[3]);
                mma_e<E>(dp[2 * np], da, bv[0], bv[1]);
                mma_e<E>(dp[2 * np + 1], da, bv[2], bv[3]);
            }
        }
        /* dS = P (dP keep - dsum), into s */
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int hh = e >> 1;
                const int64_t j = k0 + nt * 8 + 2 * q + (e & 1), t = row_t[hh];
                float ds = 0.0f;
                if (t < T && j <= t) {
                    float p = exp2f(s[nt][e] * scale2 - lse2[hh]);
                    float d = dp[nt][e];
                    if (thresh != 0)
                        d *= attn_keep(key, stream, ((uint64_t)bh * T + (uint64_t)t) * T + (uint64_t)j, thresh,
                                       keep_scale);
                    ds = p * (d - ds_row[hh]);
                }
                s[nt][e] = ds;
            }
        /* dq += dS K */
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            if (k0 + kk * 16 > w_last) continue;
            uint32_t da[4];
            c_block_to_a<E>(da, s, kk);
            mma_a_rows<E, D>(dq, da, Ks, LDH, kk);
        }
    }
    if (!active) return;
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        const int64_t t = row_t[hh];
        if (t >= T) continue;
        E *dqr = dqkv + (b * T + t) * ld + h * D + 2 * q;          /* q slot of token (b, t) */
#pragma unroll
        for (int n = 0; n < ND; n++)
            *reinterpret_cast<uint32_t *>(dqr + n * 8) =
                pack_e<E>(dq[n][2 * hh] * scale, dq[n][2 * hh + 1] * scale);
    }
}

template <typename E, int D>
__global__ void __launch_bounds__(MMA_THREADS)
k_attn_dkdv_mma(E *__restrict__ dqkv, const E *__restrict__ dy, const E *__restrict__ qkv,
                const float *__restrict__ lse, const float *__restrict__ dsum, int64_t T, int64_t H,
                float scale, uint64_t thresh, float keep_scale, uint64_t key, uint64_t stream) {
    constexpr int LDH = D + 8, KD = D / 16, ND = D / 8;
    extern __shared__ __align__(128) unsigned char smem[];
    E *Ks = reinterpret_cast<E *>(smem);
    E *Vs = Ks + MMA_ROWS * LDH;
    E *QdYs = Vs + MMA_ROWS * LDH;   /* two buffers of (Q tile, dY tile) */
    float *rows_s = reinterpret_cast<float *>(QdYs + 4 * MMA_ROWS * LDH); /* two of (lse2, dsum) */

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    const int64_t bh = blockIdx.y, b = bh / H, h = bh - b * H;
    const int64_t j0 = (int64_t)blockIdx.x * MMA_ROWS;    /* early key tiles see the most queries */
    const int64_t ld = 3 * H * D;
    const E *qh = qkv + b * T * ld + h * D;
    const E *kh = qh + H * D, *vh = qh + 2 * H * D;
    const E *dyh = dy + b * T * H * D + h * D;
    const int64_t w0 = j0 + warp * 16;                     /* this warp's first key */
    const bool active = w0 < T;
    const int64_t row_j[2] = {w0 + g, w0 + g + 8};         /* the two key rows of this lane */
    const float scale2 = scale * MMA_LOG2E;

    /* lse (in log2 units) and dsum of the query tile t0 into buffer buf */
    auto load_row_values = [&](int64_t t0, int buf) {
        float *l2 = rows_s + buf * 2 * MMA_ROWS, *dsv = l2 + MMA_ROWS;
        for (int i = threadIdx.x; i < MMA_ROWS; i += blockDim.x) {
            int64_t tt = t0 + i;
            l2[i] = tt < T ? lse[bh * T + tt] * MMA_LOG2E : 0.0f;
            dsv[i] = tt < T ? dsum[bh * T + tt] : 0.0f;
        }
    };
    load_rows_async<E, D>(Ks, kh, ld, j0, T);
    load_rows_async<E, D>(Vs, vh, ld, j0, T);
    load_rows_async<E, D>(QdYs, qh, ld, j0, T);
    load_rows_async<E, D>(QdYs + MMA_ROWS * LDH, dyh, H * D, j0, T);
    cp_async_commit();
    load_row_values(j0, 0);

    float dk[ND][4], dv[ND][4];
#pragma unroll
    for (int n = 0; n < ND; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.0f;

    for (int64_t t0 = j0, it = 0; t0 < T; t0 += MMA_ROWS, it++) {
        const E *Qs = QdYs + (it & 1) * 2 * MMA_ROWS * LDH, *dYs = Qs + MMA_ROWS * LDH;
        const float *lse2_s = rows_s + (it & 1) * 2 * MMA_ROWS, *ds_s = lse2_s + MMA_ROWS;
        __syncthreads();
        if (t0 + MMA_ROWS < T) {
            E *next = QdYs + ((it + 1) & 1) * 2 * MMA_ROWS * LDH;
            load_rows_async<E, D>(next, qh, ld, t0 + MMA_ROWS, T);
            load_rows_async<E, D>(next + MMA_ROWS * LDH, dyh, H * D, t0 + MMA_ROWS, T);
            load_row_values(t0 + MMA_ROWS, (int)((it + 1) & 1));
        }
        cp_async_commit();
        cp_async_wait_all_but_newest();
        __syncthreads();
        if (!active) continue;

        /* 16-query block np holds a query >= this warp's first key and < T */
#define NEEDED(np) (t0 + (np) * 16 + 15 >= w0 && t0 + (np) * 16 < T)
        float st[8][4], dpt[8][4];   /* S^T and dP^T: rows keys, columns queries */
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) st[nt][e] = dpt[nt][e] = 0.0f;
#pragma unroll
        for (int kd = 0; kd < KD; kd++) {
            uint32_t ka[4], va[4];
            load_a(ka, Ks, LDH, warp * 16, kd * 16);
            load_a(va, Vs, LDH, warp * 16, kd * 16);
#pragma unroll
            for (int np = 0; np < 4; np++) {
                if (!NEEDED(np)) continue;
                uint32_t bq[4], bd[4];
                load_b_nk(bq, Qs, LDH, np * 16, kd * 16);
                load_b_nk(bd, dYs, LDH, np * 16, kd * 16);
                mma_e<E>(st[2 * np], ka, bq[0], bq[1]);
                mma_e<E>(st[2 * np + 1], ka, bq[2], bq[3]);
                mma_e<E>(dpt[2 * np], va, bd[0], bd[1]);
                mma_e<E>(dpt[2 * np + 1], va, bd[2], bd[3]);
            }
        }
        /* P keep into st, dS into dpt */
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int hh = e >> 1, c = nt * 8 + 2 * q + (e & 1);
                const int64_t j = row_j[hh], tq = t0 + c;
                float pk = 0.0f, ds = 0.0f;
                if (j < T && tq < T && tq >= j) {
                    float p = exp2f(st[nt][e] * scale2 - lse2_s[c]);
                    float keep = thresh != 0 ? attn_keep(key, stream, ((uint64_t)bh * T + (uint64_t)tq) * T +
                                                                          (uint64_t)j, thresh, keep_scale)
                                             : 1.0f;
                    pk = p * keep;
                    ds = p * (dpt[nt][e] * keep - ds_s[c]);
                }
                st[nt][e] = pk;
                dpt[nt][e] = ds;
            }
        /* dv += (P keep)^T dY, dk += dS^T Q */
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            if (!NEEDED(kk)) continue;
            uint32_t pa[4], sa[4];
            c_block_to_a<E>(pa, st, kk);
            c_block_to_a<E>(sa, dpt, kk);
            mma_a_rows<E, D>(dv, pa, dYs, LDH, kk);
            mma_a_rows<E, D>(dk, sa, Qs, LDH, kk);
        }
#undef NEEDED
    }
    if (!active) return;
#pragma unroll
    for (int hh = 0; hh < 2; hh++) {
        const int64_t j = row_j[hh];
        if (j >= T) continue;
        E *dkr = dqkv + (b * T + j) * ld + H * D + h * D + 2 * q;   /* k slot of token (b, j) */
        E *dvr = dkr + H * D;                                       /* v slot */
#pragma unroll
        for (int n = 0; n < ND; n++) {
            *reinterpret_cast<uint32_t *>(dkr + n * 8) = pack_e<E>(dk[n][2 * hh] * scale, dk[n][2 * hh + 1] * scale);
            *reinterpret_cast<uint32_t *>(dvr + n * 8) = pack_e<E>(dv[n][2 * hh], dv[n][2 * hh + 1]);
        }
    }
}

/* ---- host side ---- */

/* 64-row tiles of D + 8 16-bit values: Q and two (K, V); Q, dY and two (K, V); K, V and two
 * (Q, dY) plus two (lse, dsum) rows */
static size_t fwd_smem(int D) { return (size_t)5 * MMA_ROWS * (D + 8) * 2; }
static size_t dq_smem(int D) { return (size_t)6 * MMA_ROWS * (D + 8) * 2; }
static size_t dkdv_smem(int D) { return (size_t)6 * MMA_ROWS * (D + 8) * 2 + 4 * MMA_ROWS * sizeof(float); }

static bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

bool ct_cuda_attn_mma_usable(ct_dtype dt, int64_t D, const void *a, const void *b, const void *c,
                             const void *d) {
    if (dt != CT_F16 && dt != CT_BF16) return false;
    if (D != 32 && D != 64 && D != 128) return false;
    return aligned16(a) && aligned16(b) && (!c || aligned16(c)) && (!d || aligned16(d));
}

template <typename E, int D> static void allow_smem(void) {
    CT_CUDA_CHECK(cudaFuncSetAttribute(k_attn_fwd_mma<E, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)fwd_smem(D)));
    CT_CUDA_CHECK(cudaFuncSetAttribute(k_attn_dq_mma<E, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)dq_smem(D)));
    CT_CUDA_CHECK(cudaFuncSetAttribute(k_attn_dkdv_mma<E, D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       (int)dkdv_smem(D)));
}

void ct_cuda_attn_mma_init(void) {
    allow_smem<__half, 32>();
    allow_smem<__half, 64>();
    allow_smem<__half, 128>();
    allow_smem<__nv_bfloat16, 32>();
    allow_smem<__nv_bfloat16, 64>();
    allow_smem<__nv_bfloat16, 128>();
}

/* Runs the code given with E the storage type and HD the head dim as compile-time constants. */
#define MMA_DISPATCH(dt, D, ...)                                                               \
    do {                                                                                        \
        if ((dt) == CT_F16) {                                                                   \
            typedef __half E;                                                                   \
            if ((D) == 32) { constexpr int HD = 32; __VA_ARGS__; }                                     \
            else if ((D) == 64) { constexpr int HD = 64; __VA_ARGS__; }                                \
            else { constexpr int HD = 128; __VA_ARGS__; }                                              \
        } else {                                                                                \
            typedef __nv_bfloat16 E;                                                            \
            if ((D) == 32) { constexpr int HD = 32; __VA_ARGS__; }                                     \
            else if ((D) == 64) { constexpr int HD = 64; __VA_ARGS__; }                                \
            else { constexpr int HD = 128; __VA_ARGS__; }                                              \
        }                                                                                       \
    } while (0)

void ct_cuda_attn_mma_forward(cudaStream_t st, void *y, float *lse, const void *qkv, int64_t B,
                              int64_t T, int64_t H, int64_t D, float scale, uint64_t thresh,
                              float keep_scale, uint64_t key, uint64_t stream, ct_dtype dt) {
    dim3 grid((unsigned)((T + MMA_ROWS - 1) / MMA_ROWS), (unsigned)(B * H));
    MMA_DISPATCH(dt, D, {
        k_attn_fwd_mma<E, HD><<<grid, MMA_THREADS, fwd_smem(HD), st>>>(
            (E *)y, lse, (const E *)qkv, T, H, scale * MMA_LOG2E, thresh, keep_scale, key, stream);
        CT_CUDA_LAUNCH_CHECK();
    });
}

void ct_cuda_attn_mma_backward(cudaStream_t st, void *dqkv, const void *dy, const void *qkv,
                               const float *lse, const float *dsum, int64_t B, int64_t T, int64_t H,
                               int64_t D, float scale, uint64_t thresh, float keep_scale, uint64_t key,
                               uint64_t stream, ct_dtype dt) {
    dim3 grid((unsigned)((T + MMA_ROWS - 1) / MMA_ROWS), (unsigned)(B * H));
    MMA_DISPATCH(dt, D, {
        k_attn_dq_mma<E, HD><<<grid, MMA_THREADS, dq_smem(HD), st>>>(
            (E *)dqkv, (const E *)dy, (const E *)qkv, lse, dsum, T, H, scale, thresh, keep_scale, key, stream);
        CT_CUDA_LAUNCH_CHECK();
        k_attn_dkdv_mma<E, HD><<<grid, MMA_THREADS, dkdv_smem(HD), st>>>(
            (E *)dqkv, (const E *)dy, (const E *)qkv, lse, dsum, T, H, scale, thresh, keep_scale, key, stream);
        CT_CUDA_LAUNCH_CHECK();
    });
}
