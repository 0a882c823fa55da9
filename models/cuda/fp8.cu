// The two kernels around an FP8 projection's GEMM (models/src/fp8/gpu.rs launches them;
// models/src/fp8/quantize.rs is the same arithmetic on the CPU, bit for bit):
//   - each bf16 row of the input quantized to E4M3 with its own scale (amax / 448), the codes of
//     x · (448 / amax), a row of zeros scale 1;
//   - the GEMM's bf16 output multiplied by its row's and its column's scales (a token's and an
//     output channel's): the two rank-1 factors cuBLASLt's per-tensor scales cannot carry.
// Compiled by models/build.rs with elementwise.cu's targets. The E4M3 conversion is the
// hardware's on sm_89 and newer (the only GPUs that run FP8 projections; older ones are
// refused before a model loads), nvcc's emulation in the sm_80 cubin.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

namespace {

constexpr float kE4m3Max = 448.0f;

// The largest of `v` over the block; every thread gets it. blockDim.x is a multiple of 32.
__device__ float block_max(float v) {
    __shared__ float per_warp[32];
    for (int offset = 16; offset > 0; offset /= 2) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    }
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (lane == 0) per_warp[warp] = v;
    __syncthreads();
    const int warps = blockDim.x / 32;
    v = lane < warps ? per_warp[lane] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    }
    return v;
}

}  // namespace

// One block per row of `x` ([rows, cols] bf16): codes [rows, cols] E4M3, scales [rows] f32.
extern "C" __global__ void ef_fp8_quantize_rows_bf16(const __nv_bfloat16* __restrict__ x,
                                                    uint8_t* __restrict__ codes,
                                                    float* __restrict__ scales,
                                                    uint64_t cols) {
    const uint64_t row = blockIdx.x;
    const __nv_bfloat16* in = x + row * cols;
    uint8_t* out = codes + row * cols;
    float amax = 0.0f;
    for (uint64_t i = threadIdx.x; i < cols; i += blockDim.x) {
        amax = fmaxf(amax, fabsf(__bfloat162float(in[i])));
    }
    amax = block_max(amax);
    const bool usable = amax > 0.0f && isfinite(amax);
    const float inv = usable ? kE4m3Max / amax : 1.0f;
    if (threadIdx.x == 0) scales[row] = usable ? amax / kE4m3Max : 1.0f;
    for (uint64_t i = threadIdx.x; i < cols; i += blockDim.x) {
        out[i] = __nv_cvt_float_to_fp8(__bfloat162float(in[i]) * inv, __NV_SATFINITE, __NV_E4M3);
    }
}

// y[r, c] *= row_scales[r] · col_scales[c], in place, for the rows · cols values of `y` (bf16).
extern "C" __global__ void ef_fp8_scale_bf16(__nv_bfloat16* __restrict__ y,
                                            const float* __restrict__ row_scales,
                                            const float* __restrict__ col_scales,
                                            uint64_t rows, uint64_t cols) {
    const uint64_t n = rows * cols;
    for (uint64_t i = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x; i < n;
         i += (uint64_t)gridDim.x * blockDim.x) {
        const uint64_t r = i / cols;
        const uint64_t c = i - r * cols;
        y[i] = __float2bfloat16(__bfloat162float(y[i]) * (row_scales[r] * col_scales[c]));
    }
}
