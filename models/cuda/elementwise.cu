// The forward's two elementwise steps as one kernel each, bf16 in and out, f32 inside
// (models/src/elementwise.rs: the same arithmetic on the CPU, and the host side that picks the
// vector width and launches). Compiled by models/build.rs into a fatbin of sm_80 and sm_90
// cubins plus compute_80 PTX, loaded from bytes: no NVRTC, and a CUDA 12 build runs on any
// 12.x driver that takes its cubins.
//
// Why: candle's SwiGLU over the halves of one product is a strided silu then a strided
// multiply (two passes, per-element index arithmetic, a host-to-device copy of the strides
// each), and a residual add then an RMSNorm read and write the hidden state twice.
#include <cuda_bf16.h>
#include <stdint.h>

namespace {

// Eight bf16 values: one 16-byte load or store.
struct alignas(16) Bf16x8 {
    __nv_bfloat16 v[8];
};

template <int VEC>
struct Pack {
    __nv_bfloat16 v[VEC];
};

template <int VEC>
__device__ __forceinline__ Pack<VEC> load(const __nv_bfloat16* p) {
    Pack<VEC> out;
    if constexpr (VEC == 8) {
        Bf16x8 raw = *reinterpret_cast<const Bf16x8*>(p);
#pragma unroll
        for (int i = 0; i < 8; ++i) out.v[i] = raw.v[i];
    } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) out.v[i] = p[i];
    }
    return out;
}

template <int VEC>
__device__ __forceinline__ void store(__nv_bfloat16* p, const Pack<VEC>& x) {
    if constexpr (VEC == 8) {
        Bf16x8 raw;
#pragma unroll
        for (int i = 0; i < 8; ++i) raw.v[i] = x.v[i];
        *reinterpret_cast<Bf16x8*>(p) = raw;
    } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) p[i] = x.v[i];
    }
}

// silu(gate) rounded to bf16, then times up, rounded: transformers' `act_fn(gate) * up` with
// its two bf16 results.
template <int VEC>
__device__ __forceinline__ void swiglu_at(const __nv_bfloat16* __restrict__ gate_up,
                                          __nv_bfloat16* __restrict__ out, uint64_t v,
                                          uint64_t vecs_per_row, uint64_t inter) {
    const uint64_t row = v / vecs_per_row;
    const uint64_t col = (v % vecs_per_row) * VEC;
    const Pack<VEC> g = load<VEC>(gate_up + row * 2 * inter + col);
    const Pack<VEC> u = load<VEC>(gate_up + row * 2 * inter + inter + col);
    Pack<VEC> y;
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
        const float gf = __bfloat162float(g.v[i]);
        const float act = __bfloat162float(__float2bfloat16(gf / (1.0f + expf(-gf))));
        y.v[i] = __float2bfloat16(act * __bfloat162float(u.v[i]));
    }
    store<VEC>(out + row * inter + col, y);
}

template <int VEC>
__device__ void swiglu(const __nv_bfloat16* __restrict__ gate_up, __nv_bfloat16* __restrict__ out,
                       uint64_t rows, uint64_t inter) {
    const uint64_t vecs_per_row = inter / VEC;
    const uint64_t total = rows * vecs_per_row;
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t v = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; v < total; v += stride) {
        swiglu_at<VEC>(gate_up, out, v, vecs_per_row, inter);
    }
}

// The block's sum of `x`; every thread gets it. blockDim.x is a multiple of 32, at most 1024.
__device__ __forceinline__ float block_sum(float x) {
    __shared__ float partial[32];
    const unsigned lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
    if (lane == 0) partial[warp] = x;
    __syncthreads();
    const unsigned warps = blockDim.x / 32;
    x = lane < warps ? partial[lane] : 0.0f;
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

// One block per row: sum = bf16(x + h) into out[0], then out[1] = bf16(sum * rsqrt(mean(sum²) +
// eps) * w) with the mean over the rounded sum in f32, as candle's add and its rms_norm kernel
// give them.
template <int VEC>
__device__ void add_rms_norm(const __nv_bfloat16* __restrict__ x,
                             const __nv_bfloat16* __restrict__ h,
                             const __nv_bfloat16* __restrict__ w, __nv_bfloat16* __restrict__ out,
                             uint64_t rows, uint64_t hidden, float eps) {
    const uint64_t row = blockIdx.x;
    if (row >= rows) return;
    const __nv_bfloat16* xr = x + row * hidden;
    const __nv_bfloat16* hr = h + row * hidden;
    __nv_bfloat16* sum = out + row * hidden;
    __nv_bfloat16* normed = out + rows * hidden + row * hidden;
    float squares = 0.0f;
    for (uint64_t c = (uint64_t)threadIdx.x * VEC; c < hidden; c += (uint64_t)blockDim.x * VEC) {
        const Pack<VEC> a = load<VEC>(xr + c);
        const Pack<VEC> b = load<VEC>(hr + c);
        Pack<VEC> s;
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
            s.v[i] = __float2bfloat16(__bfloat162float(a.v[i]) + __bfloat162float(b.v[i]));
            const float sf = __bfloat162float(s.v[i]);
            squares += sf * sf;
        }
        store<VEC>(sum + c, s);
    }
    const float inv = rsqrtf(block_sum(squares) / (float)hidden + eps);
    // Each thread reads back only what it wrote itself: no barrier needed.
    for (uint64_t c = (uint64_t)threadIdx.x * VEC; c < hidden; c += (uint64_t)blockDim.x * VEC) {
        const Pack<VEC> s = load<VEC>(sum + c);
        const Pack<VEC> wv = load<VEC>(w + c);
        Pack<VEC> y;
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
            y.v[i] = __float2bfloat16(__bfloat162float(s.v[i]) * inv * __bfloat162float(wv.v[i]));
        }
        store<VEC>(normed + c, y);
    }
}

// One warp per (row, head): the head's RMSNorm (`w`, f32 sum of squares, rounded to bf16 as
// candle's norm rounds), then the rotary of that row's position (rotate-half, f32, rounded once),
// written into `out` [rows, heads, hd]; rows at or past `tokens` (the fused attention's padding)
// are zeros. `qkv` rows hold `row_heads` heads; this one's start at head `first`. hd is even.
__device__ void qk_norm_rope(const __nv_bfloat16* __restrict__ qkv, const __nv_bfloat16* __restrict__ w,
                             const __nv_bfloat16* __restrict__ cos, const __nv_bfloat16* __restrict__ sin,
                             __nv_bfloat16* __restrict__ out, uint64_t tokens, uint64_t rows,
                             uint32_t row_heads, uint32_t first, uint32_t heads, uint32_t hd, float eps) {
    const uint64_t warp = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const unsigned lane = threadIdx.x % 32;
    if (warp >= rows * heads) return;  // whole warps leave together: blockDim is a multiple of 32
    const uint64_t row = warp / heads;
    const uint32_t head = warp % heads;
    __nv_bfloat16* dst = out + warp * hd;
    if (row >= tokens) {
        for (uint32_t i = lane; i < hd; i += 32) dst[i] = __float2bfloat16(0.0f);
        return;
    }
    const __nv_bfloat16* src = qkv + (row * row_heads + first + head) * hd;
    float squares = 0.0f;
    for (uint32_t i = lane; i < hd; i += 32) {
        const float v = __bfloat162float(src[i]);
        squares += v * v;
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) squares += __shfl_xor_sync(0xffffffffu, squares, offset);
    const float inv = rsqrtf(squares / (float)hd + eps);
    const uint32_t half = hd / 2;
    for (uint32_t i = lane; i < half; i += 32) {
        const float a = __bfloat162float(__float2bfloat16(__bfloat162float(src[i]) * inv * __bfloat162float(w[i])));
        const float b = __bfloat162float(
            __float2bfloat16(__bfloat162float(src[i + half]) * inv * __bfloat162float(w[i + half])));
        const float c = __bfloat162float(cos[row * half + i]);
        const float s = __bfloat162float(sin[row * half + i]);
        dst[i] = __float2bfloat16(a * c - b * s);
        dst[i + half] = __float2bfloat16(a * s + b * c);
    }
}

}  // namespace

extern "C" __global__ void ef_qk_norm_rope_bf16(const __nv_bfloat16* qkv, const __nv_bfloat16* w,
                                                const __nv_bfloat16* cos, const __nv_bfloat16* sin,
                                                __nv_bfloat16* out, uint64_t tokens, uint64_t rows,
                                                uint32_t row_heads, uint32_t first, uint32_t heads,
                                                uint32_t hd, float eps) {
    qk_norm_rope(qkv, w, cos, sin, out, tokens, rows, row_heads, first, heads, hd, eps);
}

// `gate_up` is [rows, 2 * inter] (gate then up), `out` [rows, inter]. The _v8 kernels take
// 16-byte aligned rows (inter a multiple of 8, aligned pointers); the host checks.
extern "C" __global__ void ef_swiglu_bf16_v8(const __nv_bfloat16* gate_up, __nv_bfloat16* out,
                                             uint64_t rows, uint64_t inter) {
    swiglu<8>(gate_up, out, rows, inter);
}
extern "C" __global__ void ef_swiglu_bf16_v1(const __nv_bfloat16* gate_up, __nv_bfloat16* out,
                                             uint64_t rows, uint64_t inter) {
    swiglu<1>(gate_up, out, rows, inter);
}

// `x`, `h` [rows, hidden], `w` [hidden], `out` [2, rows, hidden]: the sum, then its norm.
extern "C" __global__ void ef_add_rms_norm_bf16_v8(const __nv_bfloat16* x, const __nv_bfloat16* h,
                                                   const __nv_bfloat16* w, __nv_bfloat16* out,
                                                   uint64_t rows, uint64_t hidden, float eps) {
    add_rms_norm<8>(x, h, w, out, rows, hidden, eps);
}
extern "C" __global__ void ef_add_rms_norm_bf16_v1(const __nv_bfloat16* x, const __nv_bfloat16* h,
                                                   const __nv_bfloat16* w, __nv_bfloat16* out,
                                                   uint64_t rows, uint64_t hidden, float eps) {
    add_rms_norm<1>(x, h, w, out, rows, hidden, eps);
}
