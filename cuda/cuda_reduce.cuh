/* cuda_reduce.cuh: deterministic per-channel reductions over a [rows, cols, inner] layout.
 *
 * ct_cuda_reduce_rci<NV>(be, rows, cols, inner, f, g) computes, for every channel c < cols,
 *   s[v] = sum over r < rows, i < inner of f(r, c, i)[v]      (v < NV)
 * and then calls g(c, s) once per channel on the device. Sums are in double; the order of every
 * addition depends only on (rows, cols, inner), never on the device, so results are bit-stable.
 *
 * Two passes, no atomics: pass 1 reduces fixed chunks of a channel into a scratch buffer, pass 2
 * adds a channel's chunk results in chunk order. inner == 1 (bias of a linear layer, LayerNorm's
 * dgamma) uses tiles of 32 channels so that reads stay coalesced; inner > 1 (NCHW) uses one block
 * per (channel, chunk) reading contiguous runs of `inner`. f and g are functor objects (the build
 * does not enable device lambdas). */
#ifndef CT_CUDA_REDUCE_CUH
#define CT_CUDA_REDUCE_CUH

#include "cuda/cuda_internal.h"

#define CT_RED_TILE_C 32     /* channels per block (inner == 1) */
#define CT_RED_TILE_R 8      /* row lanes per block (inner == 1) */
#define CT_RED_MAX_CHUNKS 256

/* Pass 1, inner == 1: block (32, 8) covers channels [bx*32, bx*32+32) and rows of chunk by. */
template <int NV, class F>
__global__ void ct_red_cols_kernel(F f, int64_t rows, int64_t cols, int64_t rows_per_chunk,
                                   int64_t n_chunks, double *partial) {
    __shared__ double sh[NV][CT_RED_TILE_R][CT_RED_TILE_C + 1];
    int tx = threadIdx.x, ty = threadIdx.y;
    int64_t c = (int64_t)blockIdx.x * CT_RED_TILE_C + tx;
    int64_t chunk = blockIdx.y;
    int64_t r0 = chunk * rows_per_chunk;
    int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
    double acc[NV];
    for (int v = 0; v < NV; v++) acc[v] = 0.0;
    if (c < cols) {
        for (int64_t r = r0 + ty; r < r1; r += CT_RED_TILE_R) {
            double val[NV];
            f(r, c, (int64_t)0, val);
            for (int v = 0; v < NV; v++) acc[v] += val[v];
        }
    }
    for (int v = 0; v < NV; v++) sh[v][ty][tx] = acc[v];
    __syncthreads();
    for (int s = CT_RED_TILE_R / 2; s > 0; s >>= 1) {
        if (ty < s)
            for (int v = 0; v < NV; v++) sh[v][ty][tx] += sh[v][ty + s][tx];
        __syncthreads();
    }
    if (ty == 0 && c < cols)
        for (int v = 0; v < NV; v++) partial[(c * n_chunks + chunk) * NV + v] = sh[v][0][tx];
}

/* Pass 1, inner > 1: block (256) reduces elements [chunk*per, ...) of channel bx, where element j
 * of a channel is (r = j / inner, i = j % inner). */
template <int NV, class F>
__global__ void ct_red_chan_kernel(F f, int64_t rows, int64_t inner, int64_t per_chunk,
                                   int64_t n_chunks, double *partial) {
    __shared__ double sh[32];
    int64_t c = blockIdx.x, chunk = blockIdx.y;
    int64_t m = rows * inner;
    int64_t j0 = chunk * per_chunk;
    int64_t j1 = j0 + per_chunk < m ? j0 + per_chunk : m;
    double acc[NV];
    for (int v = 0; v < NV; v++) acc[v] = 0.0;
    for (int64_t j = j0 + threadIdx.x; j < j1; j += blockDim.x) {
        int64_t r = j / inner, i = j - r * inner;
        double val[NV];
        f(r, c, i, val);
        for (int v = 0; v < NV; v++) acc[v] += val[v];
    }
    for (int v = 0; v < NV; v++) {
        double s = ct_block_sum(acc[v], sh);
        if (threadIdx.x == 0) partial[(c * n_chunks + chunk) * NV + v] = s;
        __syncthreads(); /* sh is reused by the next value */
    }
}

/* Pass 2: one thread per channel adds its chunks in order and hands the sums to g. */
template <int NV, class G>
__global__ void ct_red_finish_kernel(G g, int64_t cols, int64_t n_chunks, const double *partial) {
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    double s[NV];
    for (int v = 0; v < NV; v++) s[v] = 0.0;
    for (int64_t k = 0; k < n_chunks; k++)
        for (int v = 0; v < NV; v++) s[v] += partial[(c * n_chunks + k) * NV + v];
    g(c, s);
}

template <int NV, class F, class G>
void ct_cuda_reduce_rci(ct_backend *be, int64_t rows, int64_t cols, int64_t inner, F f, G g) {
    CT_CUDA_REQUIRE(rows >= 0 && cols >= 0 && inner >= 1, "bad reduction shape");
    if (cols == 0) return;
    cudaStream_t st = ct_cuda_stream(be);
    int64_t n_chunks, per;
    double *partial;
    if (inner == 1) {
        /* at least 256 rows per chunk, at most CT_RED_MAX_CHUNKS chunks */
        per = rows / CT_RED_MAX_CHUNKS + 1;
        if (per < 256) per = 256;
        n_chunks = rows > 0 ? (rows + per - 1) / per : 1;
        CT_CUDA_REQUIRE(n_chunks <= 65535, "too many reduction chunks");
        partial = (double *)CT_CUDA_SCRATCH(be, (size_t)(cols * n_chunks * NV) * sizeof(double));
        dim3 grid((unsigned)((cols + CT_RED_TILE_C - 1) / CT_RED_TILE_C), (unsigned)n_chunks);
        dim3 block(CT_RED_TILE_C, CT_RED_TILE_R);
        CT_CUDA_REQUIRE((cols + CT_RED_TILE_C - 1) / CT_RED_TILE_C <= INT32_MAX, "too many columns");
        ct_red_cols_kernel<NV, F><<<grid, block, 0, st>>>(f, rows, cols, per, n_chunks, partial);
        CT_CUDA_LAUNCH_CHECK();
    } else {
        int64_t m = rows * inner;
        per = m / CT_RED_MAX_CHUNKS + 1;
        if (per < 4096) per = 4096;
        n_chunks = m > 0 ? (m + per - 1) / per : 1;
        CT_CUDA_REQUIRE(cols <= INT32_MAX && n_chunks <= 65535, "reduction grid too large");
        partial = (double *)CT_CUDA_SCRATCH(be, (size_t)(cols * n_chunks * NV) * sizeof(double));
        dim3 grid((unsigned)cols, (unsigned)n_chunks);
        ct_red_chan_kernel<NV, F><<<grid, 256, 0, st>>>(f, rows, inner, per, n_chunks, partial);
        CT_CUDA_LAUNCH_CHECK();
    }
    unsigned fb = (unsigned)((cols + 127) / 128);
    ct_red_finish_kernel<NV, G><<<fb, 128, 0, st>>>(g, cols, n_chunks, partial);
    CT_CUDA_LAUNCH_CHECK();
    ct_cuda_scratch_free(be, partial);
}

/* ---- whole-array sums ----
 * ct_cuda_sum_1d<NV>(be, n, f, out_dev): out_dev[v] = sum over i < n of f(i)[v], in double, on the
 * device (nothing is copied to the host; see ct_cuda_read_result). f is called exactly once per i,
 * so it may also write outputs (loss gradients, optimizer state). Chunks of CT_CUDA_RED_CHUNK
 * elements (more when n needs over CT_CUDA_RED_MAX_CHUNKS chunks), one block each; a single block
 * then adds the chunk results in a fixed tree. */
template <int NV, class F>
__global__ void ct_sum1d_pass1(F f, int64_t n, int64_t per_chunk, double *partial) {
    __shared__ double sh[32];
    int64_t chunk = blockIdx.x;
    int64_t i0 = chunk * per_chunk;
    int64_t i1 = i0 + per_chunk < n ? i0 + per_chunk : n;
    double acc[NV];
    for (int v = 0; v < NV; v++) acc[v] = 0.0;
    for (int64_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
        double val[NV];
        f(i, val);
        for (int v = 0; v < NV; v++) acc[v] += val[v];
    }
    for (int v = 0; v < NV; v++) {
        double s = ct_block_sum(acc[v], sh);
        if (threadIdx.x == 0) partial[chunk * NV + v] = s;
        __syncthreads();
    }
}

template <int NV>
__global__ void ct_sum1d_pass2(const double *partial, int64_t n_chunks, double *out) {
    __shared__ double sh[32];
    for (int v = 0; v < NV; v++) {
        double acc = 0.0;
        for (int64_t k = threadIdx.x; k < n_chunks; k += blockDim.x) acc += partial[k * NV + v];
        double s = ct_block_sum(acc, sh);
        if (threadIdx.x == 0) out[v] = s;
        __syncthreads();
    }
}

template <int NV, class F>
void ct_cuda_sum_1d(ct_backend *be, int64_t n, F f, double *out_dev) {
    CT_CUDA_REQUIRE(n >= 0, "negative reduction length");
    cudaStream_t st = ct_cuda_stream(be);
    int64_t n_chunks = ct_cuda_red_chunks(n);
    int64_t per = (n + n_chunks - 1) / n_chunks;
    if (per < 1) per = 1;
    double *partial = (double *)CT_CUDA_SCRATCH(be, (size_t)(n_chunks * NV) * sizeof(double));
    ct_sum1d_pass1<NV, F><<<(unsigned)n_chunks, CT_CUDA_RED_THREADS, 0, st>>>(f, n, per, partial);
    CT_CUDA_LAUNCH_CHECK();
    ct_sum1d_pass2<NV><<<1, CT_CUDA_RED_THREADS, 0, st>>>(partial, n_chunks, out_dev);
    CT_CUDA_LAUNCH_CHECK();
    ct_cuda_scratch_free(be, partial);
}

#endif
