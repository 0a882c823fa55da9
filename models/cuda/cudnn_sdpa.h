/*
 * cudnn_sdpa.h - C ABI over the cuDNN frontend (graph API) for fused
 * scaled-dot-product attention forward (inference) on packed, ragged bf16
 * sequences ("THD" layout): causal (a decoder's), over the whole sequence (an
 * encoder's) or within a band around the diagonal (sliding windows). Implemented
 * in cudnn_sdpa.cpp.
 *
 * The mask, within each sequence, is two bounds: query i sees key j when
 *   i - left_bound < j   (left_bound >= 1; -1: no left bound), and
 *   j <= i + right_bound (right_bound >= 0; -1: no right bound).
 * Causal: (-1, 0). Whole sequence: (-1, -1). A window of w keys either side of
 * the query: (w + 1, w). A band that is not causal needs cuDNN >= 9.10.2.
 *
 * Nothing here links against libcudnn or libcudart: ef_sdpa_create() dlopens
 * libcudnn (and libcuda.so.1, the driver, for device queries) at run time.
 *
 * Run-time requirements (checked, with a message naming what is missing):
 *   - cuDNN >= 9.1 (cuDNN 9.10.0 / 9.10.1 are refused by the frontend for
 *     bf16 SDPA because of known bugs).
 *   - GPU compute capability >= 8.0 (sm_80, Ampere) for bf16 flash attention.
 *     On sm_8x the packed/ragged (THD) layout additionally needs cuDNN >= 9.18.1;
 *     Hopper (sm_90) and newer accept it with any supported cuDNN 9.
 *   - head_dim a multiple of 8 (16-byte rows), at most 256; arch/version
 *     specific limits (e.g. <= 128 on sm_8x with cuDNN <= 9.9) are reported by
 *     ef_sdpa_prepare.
 *   - The CUDA context of the target device must be current on the calling
 *     thread when ef_sdpa_create is called (e.g. cudarc's bind_to_thread, or any
 *     prior CUDA runtime call on that device); every later call must use the
 *     same device.
 *
 * Environment variables (all optional):
 *   EF_SDPA_CUDNN_LIB  path or soname of libcudnn to dlopen before trying
 *                      "libcudnn.so.9" and "libcudnn.so".
 *   EF_SDPA_IMPL       "auto" (default), "composite" or "unified": which cuDNN
 *                      frontend SDPA implementation to build. With "auto" a
 *                      failed build is retried once with "composite".
 *   EF_SDPA_SYNC       "1": synchronize the stream after every ef_sdpa_run and
 *                      report asynchronous kernel faults (debugging/self-test).
 *   EF_SDPA_DYNAMIC    "1": build composite plans with dynamic shapes (cuDNN
 *                      >= 9.4), sharing one kernel cache, so a new key reuses
 *                      the kernel compiled for an earlier one (plan_policy.h).
 *                      Off by default: on an H200 with cuDNN 9.19 such a plan
 *                      faulted with a misaligned address (err 716).
 *   EF_SDPA_DENSE_SINGLE "1": a batch of one sequence runs as a plain BSHD tensor
 *                      of exactly its length (no ragged offsets, no padding mask;
 *                      a plan per length). An A/B switch for the GPU check: it
 *                      tells the ragged graph's error from the kernel's.
 *
 * Thread safety: every function may be called from any thread; calls on one
 * ef_sdpa are serialized by an internal mutex (it owns one cudnnHandle_t).
 * Plans are kept until ef_sdpa_destroy, so CUDA graphs captured from
 * ef_sdpa_run must be destroyed before the ef_sdpa that recorded them.
 */
#ifndef EF_CUDNN_SDPA_H
#define EF_CUDNN_SDPA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ef_sdpa ef_sdpa;

/* dlopens libcudnn (try "libcudnn.so.9" then "libcudnn.so"), creates a cudnnHandle_t for the
   current CUDA device. Returns NULL and writes a message into err on failure (missing library,
   version too old: require cuDNN >= 9.1 at run time, say so). */
ef_sdpa* ef_sdpa_create(char* err, size_t err_len);

void ef_sdpa_destroy(ef_sdpa* s);

/* The cuDNN version loaded at run time (e.g. 91300), or 0. */
int64_t ef_sdpa_cudnn_version(const ef_sdpa* s);

/* Builds (or takes from a cache keyed by every argument) the execution plan for one shape and
   writes the workspace bytes it needs. 0 on success; nonzero with a message on failure
   (unsupported shape or GPU: the message must say which).
   Note: total_tokens is validated but is not part of the cuDNN graph (the graph is described by
   batch x max_seq_len plus device-side ragged offsets), so plans are shared between calls that
   differ only in total_tokens. Callers should bucket batch and max_seq_len (e.g. round up) to
   bound the number of plans: each plan build takes tens to hundreds of milliseconds. */
int ef_sdpa_prepare(ef_sdpa* s, int32_t batch, int32_t max_seq_len, int32_t total_tokens,
                    int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, float scale,
                    int32_t left_bound, int32_t right_bound, int64_t* workspace_bytes,
                    char* err, size_t err_len);

/* The plan prepared for this key, in words, or NULL when none is prepared: its implementation
   first ("unified" or "composite"), then ", dynamic shapes" when it shares the kernel cache, and
   the seconds its build took (e.g. "composite, dynamic shapes, built in 0.084 s"). cuDNN may
   pick different kernels per shape, so callers log it. Valid until ef_sdpa_destroy. */
const char* ef_sdpa_plan_impl(ef_sdpa* s, int32_t batch, int32_t max_seq_len, int32_t n_heads,
                              int32_t n_kv_heads, int32_t head_dim, float scale,
                              int32_t left_bound, int32_t right_bound);

/* Runs on `stream` (a cudaStream_t). Layouts, all contiguous, bf16:
     q, o: [total_tokens, n_heads, head_dim]   (token-major, "THD" packed)
     k, v: [total_tokens, n_kv_heads, head_dim]
   Sequence i occupies tokens [cu_seqlens[i], cu_seqlens[i+1]); it attends to itself only,
   within the mask of left_bound and right_bound (top-left aligned, see above). Grouped-query attention:
   n_heads is a multiple of n_kv_heads; query head h uses kv head h / (n_heads/n_kv_heads).
   Softmax scale `scale` is applied to q.k inside the kernel (q is NOT pre-scaled).
   Device int32 arrays prepared by the caller:
     seq_len:     [batch]    lengths (may contain 0 for padded batch slots at the end)
     q_offsets:   [batch+1]  element offsets of each sequence in q/o = cu_seqlens[i]*n_heads*head_dim
     kv_offsets:  [batch+1]  element offsets in k/v = cu_seqlens[i]*n_kv_heads*head_dim
   Every seq_len[i] must be <= max_seq_len. q, k, v, o must be 16-byte aligned.
   `workspace` has at least the bytes ef_sdpa_prepare reported (may be NULL if 0).
   Same shape arguments as the prepare call. 0 on success; nonzero with a message. Errors of
   the kernel launch must be reported, not swallowed. */
int ef_sdpa_run(ef_sdpa* s, void* stream, int32_t batch, int32_t max_seq_len,
                int32_t total_tokens, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
                float scale, int32_t left_bound, int32_t right_bound, const void* q,
                const void* k, const void* v, void* o,
                const int32_t* seq_len, const int32_t* q_offsets, const int32_t* kv_offsets,
                void* workspace, char* err, size_t err_len);

#ifdef __cplusplus
}
#endif

#endif /* EF_CUDNN_SDPA_H */
