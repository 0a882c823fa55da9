// cudnn_sdpa.cpp - fused SDPA forward over packed ragged bf16 sequences (causal, whole
// sequence or a band around the diagonal),
// built on the header-only cuDNN frontend graph API, exposed through the C ABI
// in cudnn_sdpa.h.
//
// Build (no libcudnn / libcudart at link time; link only libdl and libstdc++):
//   g++ -std=c++17 -O2 -fPIC -c cudnn_sdpa.cpp -DNV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
//       -isystem $CUDNN_FRONTEND_INCLUDE -isystem $CUDNN_INCLUDE -isystem $CUDA_INCLUDE
//   (one command line; optionally -fvisibility=hidden: the ef_sdpa_* entry points stay exported)
// (fetch-headers.sh next to this file downloads and prints those three directories.)
//
// Design notes (what was read in cudnn-frontend 1.32.0 and why the code is as it is):
//
// * Ragged offsets + seq_len rather than cu_seq_len. The frontend offers two ways
//   to describe variable-length packed sequences:
//     (a) per-tensor ragged offsets (Tensor_attributes::set_ragged_offset) plus
//         per-batch lengths (set_seq_len_q/kv) and padding_mask = true, and
//     (b) cumulative lengths (set_cu_seq_len_q/kv).
//   (b) is accepted only by the UNIFIED SDPA node and only with cuDNN >= 9.24
//   (sdpa_support_surface.h: the COMPOSITE node rejects CU_SEQ_LEN_*), whereas
//   (a) works on both the COMPOSITE node (all cuDNN 9.x on Hopper+, and on sm_8x
//   from cuDNN 9.18.1) and the UNIFIED node (cuDNN >= 9.15 for seq_len, >= 9.21
//   for the causal band). (a) is therefore the robust choice for "cuDNN >= 9.1".
//   Ragged offsets are element offsets (cu_seqlens[i] * heads * head_dim), int32,
//   shape [b+1,1,1,1]; this matches the frontend's own THD tests.
// * set_max_total_seq_len_q/kv exists on SDPA_attributes in this frontend but is
//   documented as a frontend-side hint that is never lowered to the backend; in
//   the forward node it is only validated (it sizes backward workspaces). It is
//   not set here, so total_tokens does not enter the graph and plans are shared
//   across different token totals with the same batch / max_seq_len.
// * Layout: dims are always {b, h, s, d}; the packed token-major storage is
//   described by BSHD strides {s*h*d, d, h*d, 1}. With ragged offsets the batch
//   stride is ignored: sequence i starts at element offset[i].
// * Masks: diagonal alignment TOP_LEFT with a right bound (0: causal; set_causal_mask
//   is marked "to deprecate") and a left bound (a sliding window), each optional: an
//   encoder's whole sequence sets neither. q and kv share seq_len, so top-left ==
//   bottom-right. The frontend keeps key j for query i when j + left > i (its
//   "column + window_size > row", utils/attn_score_modifiers.h) and when
//   i + right >= j (the right-bound band's CMP_GE): a window of w keys either side is
//   (left w + 1, right w). Non-causal bounds need cuDNN >= 9.10.2 (earlier, the
//   frontend takes a left bound only with causal masking); the UNIFIED node takes
//   bounds from 9.21, so earlier ones build COMPOSITE (plan_policy's retry).
// * Implementation choice: the frontend's AUTO mode picks UNIFIED when the
//   version checks pass, else COMPOSITE, but does not fall back if the chosen
//   one later fails to find an engine. Here "auto" builds UNIFIED and, on any
//   failure, COMPOSITE (EF_SDPA_IMPL forces one of them for A/B testing).
// * Dynamic shapes and one kernel cache per handle (cuDNN >= 9.4): every new
//   (batch, max_seq_len) key is a new graph, and a COMPOSITE graph's engine is
//   compiled at run time (NVRTC), 0.1-2 s a key. Built with
//   set_dynamic_shape_enabled(true) and the handle's KernelCache, the keys share
//   the kernel compiled for the first and only build a plan around it. The
//   frontend refuses dynamic shapes on the UNIFIED node, so it stays static.
//   A dynamic build that fails where the static one then succeeds is not tried
//   again on the handle. The order of attempts is plan_policy.cpp's (tested on
//   the CPU). Off by default, EF_SDPA_DYNAMIC=1 turns them on: the first GPU runs (H200,
//   cuDNN 9.19) faulted with a misaligned address in a dynamic-shape plan, on the key it
//   was compiled for, at 16 tokens after 1; static plans built in ~0.05 s a key there.
// * Dynamic loading: with NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING every cudnn*
//   call is resolved with dlsym on the global `cudnn_frontend::cudnn_dlhandle`,
//   which the application must define and set (done in load_cudnn below) before
//   the first frontend call; the frontend caches each symbol in a function-local
//   static, so the library is never dlclose'd. CUDA runtime entry points used by
//   the frontend are dlopen'ed by it from "libcudart.so.12"/"libcudart.so.13"
//   (override: CUDNN_FRONTEND_CUDART_LIB_NAME) on first use. cuDNN itself links
//   cudart statically and does not need libcudart.so, so this shim avoids every
//   frontend path that would load it: the SM version is queried through the
//   driver API (libcuda.so.1) and handed to the graph (Graph::set_sm_version, so
//   Context::populate_sm_version_from_device never calls cudaGetDevice), and CUDA
//   graph retention is set to NONE (otherwise every execute of a runtime-compiled
//   engine queries the stream's capture state through cudart).
// * Launch errors: cudnnBackendExecute reports failed launches in its status
//   (CUDNN_STATUS_EXECUTION_FAILED*), which the frontend turns into an error_t.
//   cudaGetLastError of a separately loaded libcudart would not see cuDNN's
//   statically linked runtime, so after execute the stream is additionally
//   queried through the driver (cuStreamQuery, skipped while the stream is being
//   captured) to surface sticky asynchronous faults; EF_SDPA_SYNC=1 synchronizes.

#include "cudnn_sdpa.h"
#include "plan_policy.h"

#if !defined(NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING)
#error "cudnn_sdpa.cpp must be compiled with -DNV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING (no libcudnn/libcudart at link time)"
#endif

#include <dlfcn.h>

#include <cuda.h>
#include <cudnn_frontend.h>

#if CUDNN_FRONTEND_VERSION < 13200
#error "cudnn_sdpa.cpp needs cuDNN frontend >= 1.32.0 headers (see fetch-headers.sh)"
#endif

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <vector>

// Required by the frontend in dynamic-loading mode (declared extern in cudnn_frontend_shim.h).
namespace cudnn_frontend {
void *cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

#define EF_SDPA_API extern "C" __attribute__((visibility("default")))

// Types held by struct ef_sdpa (a global type), so they live in a named namespace.
namespace ef_sdpa_detail {

namespace fe = cudnn_frontend;

struct DeviceInfo {
    int ordinal = -1;
    int major   = 0;
    int minor   = 0;
    std::string name;
};

enum class Impl { Auto, Composite, Unified };

// Everything that shapes the cuDNN graph. total_tokens is deliberately absent (see the notes at the top).
// (batch, max_seq_len, heads, kv heads, head dim, scale bits, dense, left bound, right bound)
using PlanKey = std::tuple<int32_t, int32_t, int32_t, int32_t, int32_t, uint32_t, bool, int32_t, int32_t>;

struct Plan {
    std::shared_ptr<fe::graph::Graph> graph;
    int64_t workspace = 0;
    fe::AttentionImplementation_t impl = fe::AttentionImplementation_t::AUTO;
    bool dynamic_shapes = false;
    // What ef_sdpa_plan_impl returns: the node, dynamic shapes or not, the build's seconds.
    std::string label;
};

}  // namespace ef_sdpa_detail

namespace {

namespace fe = cudnn_frontend;
using namespace ef_sdpa_detail;

constexpr int64_t kMinCudnnVersion  = 90100;   // required by the ABI contract
constexpr int64_t kMaxCudnnVersion  = 100000;  // compiled against cuDNN 9 headers
constexpr int64_t kRaggedSm8xCudnn  = 91801;   // frontend: THD on sm < 90 needs 9.18.1
constexpr int32_t kMaxHeadDim       = 256;
constexpr uintptr_t kPtrAlignment   = 16;

// Tensor UIDs of the graph (stable, used to build the variant pack).
enum : int64_t {
    kUidQ = 1,
    kUidK,
    kUidV,
    kUidO,
    kUidSeqLenQ,
    kUidSeqLenKV,
    kUidOffsetQ,
    kUidOffsetK,
    kUidOffsetV,
    kUidOffsetO,
};

void
write_err(char *err, size_t err_len, const std::string &msg) {
    if (err == nullptr || err_len == 0) {
        return;
    }
    size_t const n = std::min(err_len - 1, msg.size());
    std::memcpy(err, msg.data(), n);
    err[n] = '\0';
}

std::string
version_string(int64_t v) {
    // cuDNN 9 encodes versions as major*10000 + minor*100 + patch.
    return std::to_string(v / 10000) + "." + std::to_string((v / 100) % 100) + "." + std::to_string(v % 100);
}

const char *
code_name(fe::error_code_t c) {
    switch (c) {
        case fe::error_code_t::OK:
            return "OK";
        case fe::error_code_t::ATTRIBUTE_NOT_SET:
            return "ATTRIBUTE_NOT_SET";
        case fe::error_code_t::SHAPE_DEDUCTION_FAILED:
            return "SHAPE_DEDUCTION_FAILED";
        case fe::error_code_t::INVALID_TENSOR_NAME:
            return "INVALID_TENSOR_NAME";
        case fe::error_code_t::INVALID_VARIANT_PACK:
            return "INVALID_VARIANT_PACK";
        case fe::error_code_t::GRAPH_NOT_SUPPORTED:
            return "GRAPH_NOT_SUPPORTED";
        case fe::error_code_t::GRAPH_EXECUTION_PLAN_CREATION_FAILED:
            return "GRAPH_EXECUTION_PLAN_CREATION_FAILED";
        case fe::error_code_t::GRAPH_EXECUTION_FAILED:
            return "GRAPH_EXECUTION_FAILED";
        case fe::error_code_t::HEURISTIC_QUERY_FAILED:
            return "HEURISTIC_QUERY_FAILED";
        case fe::error_code_t::UNSUPPORTED_GRAPH_FORMAT:
            return "UNSUPPORTED_GRAPH_FORMAT";
        case fe::error_code_t::CUDA_API_FAILED:
            return "CUDA_API_FAILED";
        case fe::error_code_t::CUDNN_BACKEND_API_FAILED:
            return "CUDNN_BACKEND_API_FAILED";
        case fe::error_code_t::INVALID_CUDA_DEVICE:
            return "INVALID_CUDA_DEVICE";
        case fe::error_code_t::HANDLE_ERROR:
            return "HANDLE_ERROR";
        case fe::error_code_t::INVALID_VALUE:
            return "INVALID_VALUE";
        case fe::error_code_t::NVRTC_COMPILATION_FAILED:
            return "NVRTC_COMPILATION_FAILED";
    }
    return "UNKNOWN_ERROR";
}

std::string
describe(fe::error_t e) {
    return std::string(code_name(e.get_code())) + ": " + e.get_message();
}

std::string
cudnn_status_message(cudnnStatus_t status) {
    std::string msg = fe::detail::get_error_string(status);
    std::string last = fe::detail::get_last_error_string_();
    if (!last.empty()) {
        msg += " (" + last + ")";
    }
    return msg;
}

std::string
last_dlerror() {
    const char *e = dlerror();
    return e ? e : "unknown dlopen error";
}

// ---------------------------------------------------------------------------
// Process-wide libraries: libcudnn (for the frontend) and libcuda (driver API,
// for device queries and stream checks). Loaded once, never unloaded.
// ---------------------------------------------------------------------------

struct DriverApi {
    using CtxGetDevice       = CUresult (*)(CUdevice *);
    using DeviceGetAttribute = CUresult (*)(int *, CUdevice_attribute, CUdevice);
    using DeviceGetName      = CUresult (*)(char *, int, CUdevice);
    using StreamQuery        = CUresult (*)(CUstream);
    using StreamSynchronize  = CUresult (*)(CUstream);
    using StreamIsCapturing  = CUresult (*)(CUstream, CUstreamCaptureStatus *);
    using GetErrorString     = CUresult (*)(CUresult, const char **);

    CtxGetDevice ctx_get_device              = nullptr;
    DeviceGetAttribute device_get_attribute  = nullptr;
    DeviceGetName device_get_name            = nullptr;
    StreamQuery stream_query                 = nullptr;
    StreamSynchronize stream_synchronize     = nullptr;
    StreamIsCapturing stream_is_capturing    = nullptr;
    GetErrorString get_error_string          = nullptr;

    std::string
    error(CUresult r) const {
        const char *s = nullptr;
        if (get_error_string != nullptr && get_error_string(r, &s) == CUDA_SUCCESS && s != nullptr) {
            return std::string(s) + " (CUresult " + std::to_string(static_cast<int>(r)) + ")";
        }
        return "CUresult " + std::to_string(static_cast<int>(r));
    }
};

struct Libraries {
    std::mutex mu;
    void *cudnn            = nullptr;
    int64_t cudnn_version  = 0;
    std::string cudnn_name;
    void *cuda             = nullptr;
    DriverApi drv;
};

Libraries &
libs() {
    // Intentionally leaked: frontend statics may call into the libraries during teardown.
    static Libraries *l = new Libraries;
    return *l;
}

bool
load_cudnn(std::string &msg) {
    Libraries &l = libs();
    std::lock_guard<std::mutex> lock(l.mu);
    if (l.cudnn != nullptr) {
        return true;
    }
    std::vector<std::string> candidates;
    if (const char *env = std::getenv("EF_SDPA_CUDNN_LIB"); env != nullptr && env[0] != '\0') {
        candidates.emplace_back(env);
    }
    candidates.emplace_back("libcudnn.so.9");
    candidates.emplace_back("libcudnn.so");

    std::string tried;
    for (auto const &name : candidates) {
        dlerror();
        void *h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (h == nullptr) {
            tried += "\n  " + name + ": " + last_dlerror();
            continue;
        }
        dlerror();
        void *sym = dlsym(h, "cudnnGetVersion");
        if (sym == nullptr) {
            tried += "\n  " + name + ": no cudnnGetVersion symbol (" + last_dlerror() + ")";
            dlclose(h);
            continue;
        }
        auto const version = static_cast<int64_t>(reinterpret_cast<size_t (*)()>(sym)());
        if (version < kMinCudnnVersion) {
            tried += "\n  " + name + ": cuDNN " + version_string(version) +
                     " is too old; cuDNN >= 9.1.0 is required at run time";
            dlclose(h);
            continue;
        }
        if (version >= kMaxCudnnVersion) {
            tried += "\n  " + name + ": cuDNN version " + std::to_string(version) +
                     " is not supported by this build (compiled against cuDNN 9 headers)";
            dlclose(h);
            continue;
        }
        l.cudnn                     = h;
        l.cudnn_version             = version;
        l.cudnn_name                = name;
        fe::cudnn_dlhandle          = h;
        return true;
    }
    msg = "could not load a usable cuDNN (need cuDNN >= 9.1.0; set EF_SDPA_CUDNN_LIB or LD_LIBRARY_PATH):" + tried;
    return false;
}

bool
load_driver(std::string &msg) {
    Libraries &l = libs();
    std::lock_guard<std::mutex> lock(l.mu);
    if (l.cuda != nullptr) {
        return true;
    }
    std::string tried;
    void *h = nullptr;
    for (const char *name : {"libcuda.so.1", "libcuda.so"}) {
        dlerror();
        h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
        if (h != nullptr) {
            break;
        }
        tried += std::string("\n  ") + name + ": " + last_dlerror();
    }
    if (h == nullptr) {
        msg = "could not load the CUDA driver library (no NVIDIA driver?):" + tried;
        return false;
    }
    DriverApi d;
    bool ok      = true;
    auto resolve = [&](auto &fn, const char *sym) {
        dlerror();
        void *p = dlsym(h, sym);
        if (p == nullptr) {
            ok = false;
            msg += std::string(msg.empty() ? "" : "; ") + "libcuda lacks " + sym;
        }
        fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    };
    resolve(d.ctx_get_device, "cuCtxGetDevice");
    resolve(d.device_get_attribute, "cuDeviceGetAttribute");
    resolve(d.device_get_name, "cuDeviceGetName");
    resolve(d.stream_query, "cuStreamQuery");
    resolve(d.stream_synchronize, "cuStreamSynchronize");
    resolve(d.stream_is_capturing, "cuStreamIsCapturing");
    resolve(d.get_error_string, "cuGetErrorString");
    if (!ok) {
        msg = "CUDA driver too old: " + msg;
        dlclose(h);
        return false;
    }
    l.cuda = h;
    l.drv  = d;
    return true;
}

const DriverApi &
drv() {
    return libs().drv;  // only used after load_driver succeeded; never changes afterwards
}

bool
query_current_device(DeviceInfo &info, std::string &msg) {
    const DriverApi &d = drv();
    CUdevice dev       = 0;
    CUresult r         = d.ctx_get_device(&dev);
    if (r != CUDA_SUCCESS) {
        msg = "no CUDA context is current on the calling thread (cuCtxGetDevice: " + d.error(r) +
              "); make the target device's context current first";
        return false;
    }
    info.ordinal = static_cast<int>(dev);
    r            = d.device_get_attribute(&info.major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    if (r == CUDA_SUCCESS) {
        r = d.device_get_attribute(&info.minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
    }
    if (r != CUDA_SUCCESS) {
        msg = "cuDeviceGetAttribute(compute capability) failed: " + d.error(r);
        return false;
    }
    char name[256] = {0};
    if (d.device_get_name(name, static_cast<int>(sizeof(name) - 1), dev) == CUDA_SUCCESS) {
        info.name = name;
    } else {
        info.name = "CUDA device " + std::to_string(info.ordinal);
    }
    return true;
}

const char *
impl_name(fe::AttentionImplementation_t i) {
    switch (i) {
        case fe::AttentionImplementation_t::COMPOSITE:
            return "composite";
        case fe::AttentionImplementation_t::UNIFIED:
            return "unified";
        case fe::AttentionImplementation_t::AUTO:
            return "auto";
    }
    return "?";
}

struct Shape {
    int32_t batch       = 0;
    int32_t max_seq_len = 0;
    int32_t total       = 0;
    int32_t n_heads     = 0;
    int32_t n_kv_heads  = 0;
    int32_t head_dim    = 0;
    float scale         = 0.0f;
    // EF_SDPA_DENSE_SINGLE: one sequence as a plain BSHD tensor of exactly its length (no
    // ragged offsets, no padding mask), max_seq_len == total. An A/B switch for the GPU check.
    bool dense = false;
    // The mask within a sequence (cudnn_sdpa.h): key j seen by query i when i - left_bound < j
    // and j <= i + right_bound; -1 leaves a side unbounded. Causal: (-1, 0).
    int32_t left_bound  = -1;
    int32_t right_bound = 0;

    std::string
    mask() const {
        if (left_bound < 0 && right_bound < 0) {
            return "whole sequence";
        }
        if (left_bound < 0 && right_bound == 0) {
            return "causal";
        }
        return "band left_bound=" + std::to_string(left_bound) + " right_bound=" + std::to_string(right_bound);
    }

    std::string
    str() const {
        return "batch=" + std::to_string(batch) + " max_seq_len=" + std::to_string(max_seq_len) +
               " total_tokens=" + std::to_string(total) + " n_heads=" + std::to_string(n_heads) +
               " n_kv_heads=" + std::to_string(n_kv_heads) + " head_dim=" + std::to_string(head_dim) +
               " mask=" + mask() + (dense ? " dense" : "");
    }
};

// A shape of the C ABI's arguments.
Shape
shape_of(int32_t batch, int32_t max_seq_len, int32_t total, int32_t n_heads, int32_t n_kv_heads, int32_t head_dim,
         float scale, int32_t left_bound, int32_t right_bound) {
    Shape sh{batch, max_seq_len, total, n_heads, n_kv_heads, head_dim, scale};
    sh.left_bound  = left_bound;
    sh.right_bound = right_bound;
    return sh;
}

PlanKey
plan_key(Shape const &sh) {
    uint32_t scale_bits = 0;
    static_assert(sizeof(scale_bits) == sizeof(sh.scale), "float is not 32-bit");
    std::memcpy(&scale_bits, &sh.scale, sizeof(scale_bits));
    return PlanKey{sh.batch,    sh.max_seq_len, sh.n_heads,     sh.n_kv_heads,  sh.head_dim,
                   scale_bits, sh.dense,       sh.left_bound, sh.right_bound};
}

// Argument checks shared by prepare and run. Returns an empty string when valid.
std::string
check_shape(Shape const &sh) {
    if (sh.batch < 1) {
        return "batch must be >= 1";
    }
    if (sh.max_seq_len < 1) {
        return "max_seq_len must be >= 1";
    }
    if (sh.total < 0) {
        return "total_tokens must be >= 0";
    }
    if (static_cast<int64_t>(sh.total) > static_cast<int64_t>(sh.batch) * sh.max_seq_len) {
        return "total_tokens exceeds batch * max_seq_len (some sequence would be longer than max_seq_len)";
    }
    if (sh.n_heads < 1 || sh.n_kv_heads < 1) {
        return "n_heads and n_kv_heads must be >= 1";
    }
    if (sh.n_heads % sh.n_kv_heads != 0) {
        return "n_heads must be a multiple of n_kv_heads (grouped-query attention)";
    }
    if (sh.head_dim < 8 || sh.head_dim % 8 != 0) {
        return "head_dim must be a positive multiple of 8 (cuDNN needs 16-byte aligned bf16 rows)";
    }
    if (sh.head_dim > kMaxHeadDim) {
        return "head_dim > " + std::to_string(kMaxHeadDim) + " is not supported";
    }
    if (!std::isfinite(sh.scale)) {
        return "scale must be finite";
    }
    if (sh.left_bound == 0 || sh.left_bound < -1) {
        return "left_bound must be >= 1 (the query itself counts), or -1 for none";
    }
    if (sh.right_bound < -1) {
        return "right_bound must be >= 0, or -1 for none";
    }
    // The ragged offset arrays are int32 element offsets: the largest is total*heads*head_dim.
    int64_t const max_q_elems = static_cast<int64_t>(sh.total) * sh.n_heads * sh.head_dim;
    if (max_q_elems > INT32_MAX) {
        return "total_tokens * n_heads * head_dim exceeds INT32_MAX: int32 ragged offsets would overflow";
    }
    return {};
}

}  // namespace

// ---------------------------------------------------------------------------
// The handle type of the C ABI.
// ---------------------------------------------------------------------------

struct ef_sdpa {
    std::mutex mu;  // serializes all use of `handle` and `cache`
    cudnnHandle_t handle = nullptr;
    int64_t cudnn_version = 0;
    ef_sdpa_detail::DeviceInfo device;
    int32_t sm = 0;  // major*10 + minor
    ef_sdpa_detail::Impl impl_pref = ef_sdpa_detail::Impl::Auto;
    bool sync_check = false;
    bool dynamic_wanted = false;  // EF_SDPA_DYNAMIC
    bool dense_single = false;    // EF_SDPA_DENSE_SINGLE
    bool dynamic_failed = false;  // a dynamic build failed where the static one succeeded
    // Shared by every dynamic-shape plan of this handle (one device, one model's heads).
    std::shared_ptr<cudnn_frontend::KernelCache> kernel_cache = std::make_shared<cudnn_frontend::KernelCache>();
    std::map<ef_sdpa_detail::PlanKey, std::shared_ptr<ef_sdpa_detail::Plan>> cache;

    std::string
    where() const {
        return "on " + device.name + " (sm_" + std::to_string(sm) + ") with cuDNN " + version_string(cudnn_version) +
               " (frontend " + std::to_string(CUDNN_FRONTEND_MAJOR_VERSION) + "." +
               std::to_string(CUDNN_FRONTEND_MINOR_VERSION) + "." + std::to_string(CUDNN_FRONTEND_PATCH_VERSION) + ")";
    }
};

namespace {

// `sh` as the handle builds it: with EF_SDPA_DENSE_SINGLE=1 a single sequence is a dense BSHD
// tensor of exactly its tokens (its own plan per length), not a ragged batch.
Shape
with_dense(ef_sdpa const *s, Shape sh) {
    if (s->dense_single && sh.batch == 1 && sh.total > 0) {
        sh.dense       = true;
        sh.max_seq_len = sh.total;
    }
    return sh;
}

// Checks that the context current on this thread (if any) belongs to the device the handle was made for.
std::string
check_same_device(ef_sdpa const *s) {
    CUdevice dev = 0;
    if (drv().ctx_get_device(&dev) != CUDA_SUCCESS) {
        return {};  // no current context: cuDNN / the frontend bind the handle's device themselves
    }
    if (static_cast<int>(dev) != s->device.ordinal) {
        return "the current CUDA context is on device " + std::to_string(static_cast<int>(dev)) +
               " but this ef_sdpa was created for device " + std::to_string(s->device.ordinal);
    }
    return {};
}

// Builds the graph for one shape with one implementation. On failure returns false and sets `why`.
bool
try_build(ef_sdpa *s, Shape const &sh, fe::AttentionImplementation_t impl, bool dynamic, Plan &plan,
          std::string &why) {
    try {
        auto g = std::make_shared<fe::graph::Graph>();
        g->set_io_data_type(fe::DataType_t::BFLOAT16)
            .set_intermediate_data_type(fe::DataType_t::FLOAT)
            .set_compute_data_type(fe::DataType_t::FLOAT);
        // Must precede sdpa(): nodes copy the graph's context when they are created.
        g->set_sm_version(s->sm);
        if (dynamic) {
            g->set_dynamic_shape_enabled(true).set_kernel_cache(s->kernel_cache);
        }
        // No CUDA-graph user objects (and no cudart capture queries per execute); the plans live in the
        // ef_sdpa's cache until ef_sdpa_destroy, which is what NONE requires of captured graphs.
        g->set_cuda_graph_retention(fe::CudaGraphRetention_t::NONE);

        int64_t const b   = sh.batch;
        int64_t const sq  = sh.max_seq_len;
        int64_t const h   = sh.n_heads;
        int64_t const hkv = sh.n_kv_heads;
        int64_t const d   = sh.head_dim;

        auto index_tensor = [&](const char *name, int64_t uid, int64_t n) {
            return g->tensor(fe::graph::Tensor_attributes()
                                 .set_name(name)
                                 .set_uid(uid)
                                 .set_data_type(fe::DataType_t::INT32)
                                 .set_dim({n, 1, 1, 1})
                                 .set_stride({1, 1, 1, 1}));
        };
        // Logical dims {b, heads, s, d}; physical packed token-major [t, heads, d] => BSHD strides.
        auto thd_attrs = [&](const char *name, int64_t uid, int64_t heads) {
            return fe::graph::Tensor_attributes()
                .set_name(name)
                .set_uid(uid)
                .set_data_type(fe::DataType_t::BFLOAT16)
                .set_dim({b, heads, sq, d})
                .set_stride({sq * heads * d, d, heads * d, 1});
        };

        auto Q = g->tensor(thd_attrs("Q", kUidQ, h));
        auto K = g->tensor(thd_attrs("K", kUidK, hkv));
        auto V = g->tensor(thd_attrs("V", kUidV, hkv));

        auto opts = fe::graph::SDPA_attributes()
                        .set_name("ef_thd_sdpa")
                        .set_generate_stats(false)  // inference: no softmax stats output
                        .set_attn_scale(sh.scale)
                        .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
                        .set_implementation(impl);
        if (sh.right_bound >= 0) {
            opts.set_diagonal_band_right_bound(sh.right_bound);
        }
        if (sh.left_bound >= 1) {
            opts.set_diagonal_band_left_bound(sh.left_bound);
        }
        std::shared_ptr<fe::graph::Tensor_attributes> off_o;
        if (!sh.dense) {
            auto seq_q  = index_tensor("seq_len_q", kUidSeqLenQ, b);
            auto seq_kv = index_tensor("seq_len_kv", kUidSeqLenKV, b);
            Q->set_ragged_offset(index_tensor("ragged_offset_q", kUidOffsetQ, b + 1));
            K->set_ragged_offset(index_tensor("ragged_offset_k", kUidOffsetK, b + 1));
            V->set_ragged_offset(index_tensor("ragged_offset_v", kUidOffsetV, b + 1));
            off_o = index_tensor("ragged_offset_o", kUidOffsetO, b + 1);
            opts.set_padding_mask(true).set_seq_len_q(seq_q).set_seq_len_kv(seq_kv);
        }

        auto outs = g->sdpa(Q, K, V, opts);
        auto O    = outs[0];
        O->set_output(true)
            .set_uid(kUidO)
            .set_data_type(fe::DataType_t::BFLOAT16)
            .set_dim({b, h, sq, d})
            .set_stride({sq * h * d, d, h * d, 1});
        if (off_o) {
            O->set_ragged_offset(off_o);
        }

        if (auto e = g->validate(); e.is_bad()) {
            why = "validate: " + describe(e);
            return false;
        }
        if (auto e = g->build_operation_graph(s->handle); e.is_bad()) {
            why = "build_operation_graph: " + describe(e);
            return false;
        }
        if (auto e = g->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}); e.is_bad()) {
            why = "create_execution_plans: " + describe(e);
            return false;
        }
        if (auto e = g->check_support(s->handle); e.is_bad()) {
            why = "check_support: " + describe(e);
            return false;
        }
        if (auto e = g->build_plans(s->handle, fe::BuildPlanPolicy_t::HEURISTICS_CHOICE); e.is_bad()) {
            why = "build_plans: " + describe(e);
            return false;
        }
        int64_t ws = 0;
        if (auto e = g->get_workspace_size(ws); e.is_bad()) {
            why = "get_workspace_size: " + describe(e);
            return false;
        }
        plan.graph          = std::move(g);
        plan.workspace      = ws;
        plan.impl           = impl;
        plan.dynamic_shapes = dynamic;
        return true;
    } catch (std::exception const &ex) {
        why = std::string("exception: ") + ex.what();
    } catch (...) {
        why = "unknown exception";
    }
    return false;
}

int
prepare_locked(ef_sdpa *s, Shape const &sh, int64_t *workspace_bytes, std::string &msg) {
    auto const key = plan_key(sh);
    if (auto it = s->cache.find(key); it != s->cache.end()) {
        if (workspace_bytes != nullptr) {
            *workspace_bytes = it->second->workspace;
        }
        return 0;
    }
    if (std::string e = check_same_device(s); !e.empty()) {
        msg = "ef_sdpa_prepare: " + e;
        return 1;
    }

    int32_t const preference = s->impl_pref == Impl::Composite ? EF_SDPA_PREFER_COMPOSITE
                               : s->impl_pref == Impl::Unified ? EF_SDPA_PREFER_UNIFIED
                                                                : EF_SDPA_PREFER_AUTO;
    ef_sdpa_attempt attempts[4];
    int32_t const n = ef_sdpa_plan_attempts(
        preference, s->cudnn_version, s->dynamic_wanted ? 1 : 0, s->dynamic_failed ? 1 : 0, attempts, 4);

    std::string failures;
    bool dynamic_failed_here = false;
    for (int32_t i = 0; i < n; ++i) {
        auto const impl = attempts[i].node == EF_SDPA_NODE_UNIFIED ? fe::AttentionImplementation_t::UNIFIED
                                                                   : fe::AttentionImplementation_t::COMPOSITE;
        bool const dynamic = attempts[i].dynamic_shapes != 0;
        auto plan          = std::make_shared<Plan>();
        std::string why;
        auto const started = std::chrono::steady_clock::now();
        if (try_build(s, sh, impl, dynamic, *plan, why)) {
            double const secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
            if (dynamic_failed_here && !dynamic) {
                s->dynamic_failed = true;  // this cuDNN builds the graph, but not with dynamic shapes
            }
            char built[48];
            std::snprintf(built, sizeof(built), ", built in %.3f s", secs);
            plan->label = std::string(impl_name(impl)) + (dynamic ? ", dynamic shapes" : "") + built +
                          (dynamic_failed_here && !dynamic ? " (dynamic shapes refused: off for this handle)" : "");
            if (workspace_bytes != nullptr) {
                *workspace_bytes = plan->workspace;
            }
            s->cache.emplace(key, std::move(plan));
            return 0;
        }
        dynamic_failed_here = dynamic_failed_here || dynamic;
        failures += std::string("\n  [") + impl_name(impl) + (dynamic ? ", dynamic shapes" : "") + "] " + why;
    }
    msg = "ef_sdpa_prepare: unsupported shape or GPU: " + sh.str() + " " + s->where() + ":" + failures;
    return 1;
}

}  // namespace

// ---------------------------------------------------------------------------
// C ABI
// ---------------------------------------------------------------------------

EF_SDPA_API ef_sdpa *
ef_sdpa_create(char *err, size_t err_len) {
    try {
        std::string msg;
        if (!load_cudnn(msg)) {
            write_err(err, err_len, "ef_sdpa_create: " + msg);
            return nullptr;
        }
        if (!load_driver(msg)) {
            write_err(err, err_len, "ef_sdpa_create: " + msg);
            return nullptr;
        }
        DeviceInfo dev;
        if (!query_current_device(dev, msg)) {
            write_err(err, err_len, "ef_sdpa_create: " + msg);
            return nullptr;
        }
        int64_t const version = libs().cudnn_version;
        int32_t const sm      = dev.major * 10 + dev.minor;
        std::string const gpu = dev.name + " (sm_" + std::to_string(sm) + ")";
        std::string const cudnn = "cuDNN " + version_string(version) + " (" + libs().cudnn_name + ")";

        if (dev.major < 8) {
            write_err(err,
                      err_len,
                      "ef_sdpa_create: unsupported GPU " + gpu +
                          ": cuDNN bf16 fused flash attention needs compute capability >= 8.0 (Ampere or newer)");
            return nullptr;
        }
        if (sm < 90 && version < kRaggedSm8xCudnn) {
            write_err(err,
                      err_len,
                      "ef_sdpa_create: " + gpu + " with " + cudnn +
                          ": packed/ragged (THD) attention on pre-Hopper GPUs needs cuDNN >= 9.18.1");
            return nullptr;
        }
        if (version == 91000 || version == 91001) {
            write_err(err,
                      err_len,
                      "ef_sdpa_create: " + cudnn +
                          " is refused for bf16 SDPA by the cuDNN frontend (known bugs); use 9.10.2 or newer");
            return nullptr;
        }

        Impl impl = Impl::Auto;
        if (const char *e = std::getenv("EF_SDPA_IMPL"); e != nullptr && e[0] != '\0') {
            std::string v(e);
            std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
            if (v == "auto") {
                impl = Impl::Auto;
            } else if (v == "composite") {
                impl = Impl::Composite;
            } else if (v == "unified") {
                impl = Impl::Unified;
            } else {
                write_err(err, err_len, "ef_sdpa_create: EF_SDPA_IMPL must be auto, composite or unified, not '" + v + "'");
                return nullptr;
            }
        }
        bool sync_check = false;
        if (const char *e = std::getenv("EF_SDPA_SYNC"); e != nullptr) {
            sync_check = std::strcmp(e, "1") == 0 || std::strcmp(e, "true") == 0;
        }
        // Off unless asked for: on an H200 with cuDNN 9.19 a dynamic-shape composite plan
        // faulted (misaligned address, err 716) on its own key at 16 tokens after running at
        // 1, and static plans build in ~0.05 s a key there anyway (BENCHMARKS.md).
        bool dynamic_wanted = false;
        if (const char *e = std::getenv("EF_SDPA_DYNAMIC"); e != nullptr) {
            dynamic_wanted = std::strcmp(e, "1") == 0 || std::strcmp(e, "true") == 0;
        }
        bool dense_single = false;
        if (const char *e = std::getenv("EF_SDPA_DENSE_SINGLE"); e != nullptr) {
            dense_single = std::strcmp(e, "1") == 0;
        }

        cudnnHandle_t handle = nullptr;
        cudnnStatus_t const st = fe::detail::create_handle(&handle);
        if (st != CUDNN_STATUS_SUCCESS) {
            write_err(err, err_len, "ef_sdpa_create: cudnnCreate failed on " + gpu + " with " + cudnn + ": " +
                                        cudnn_status_message(st));
            return nullptr;
        }

        auto s           = std::make_unique<ef_sdpa>();
        s->handle        = handle;
        s->cudnn_version = version;
        s->device        = dev;
        s->sm            = sm;
        s->impl_pref     = impl;
        s->sync_check    = sync_check;
        s->dynamic_wanted = dynamic_wanted;
        s->dense_single   = dense_single;
        return s.release();
    } catch (std::exception const &ex) {
        write_err(err, err_len, std::string("ef_sdpa_create: exception: ") + ex.what());
    } catch (...) {
        write_err(err, err_len, "ef_sdpa_create: unknown exception");
    }
    return nullptr;
}

EF_SDPA_API void
ef_sdpa_destroy(ef_sdpa *s) {
    if (s == nullptr) {
        return;
    }
    try {
        {
            std::lock_guard<std::mutex> lock(s->mu);
            s->cache.clear();  // plans and graphs first: they hold backend descriptors
            s->kernel_cache.reset();
            if (s->handle != nullptr) {
                (void)fe::detail::destroy_handle(s->handle);
                s->handle = nullptr;
            }
        }
        delete s;
    } catch (...) {
        // Nothing sensible to report from a destructor-like call; never let it cross the ABI.
    }
}

EF_SDPA_API int64_t
ef_sdpa_cudnn_version(const ef_sdpa *s) {
    return s != nullptr ? s->cudnn_version : 0;
}

EF_SDPA_API int
ef_sdpa_prepare(ef_sdpa *s,
                int32_t batch,
                int32_t max_seq_len,
                int32_t total_tokens,
                int32_t n_heads,
                int32_t n_kv_heads,
                int32_t head_dim,
                float scale,
                int32_t left_bound,
                int32_t right_bound,
                int64_t *workspace_bytes,
                char *err,
                size_t err_len) {
    try {
        if (s == nullptr) {
            write_err(err, err_len, "ef_sdpa_prepare: null ef_sdpa");
            return 1;
        }
        Shape const sh = with_dense(
            s, shape_of(batch, max_seq_len, total_tokens, n_heads, n_kv_heads, head_dim, scale, left_bound, right_bound));
        if (std::string e = check_shape(sh); !e.empty()) {
            write_err(err, err_len, "ef_sdpa_prepare: unsupported shape (" + sh.str() + "): " + e);
            return 1;
        }
        std::lock_guard<std::mutex> lock(s->mu);
        std::string msg;
        int const rc = prepare_locked(s, sh, workspace_bytes, msg);
        if (rc != 0) {
            write_err(err, err_len, msg);
        }
        return rc;
    } catch (std::exception const &ex) {
        write_err(err, err_len, std::string("ef_sdpa_prepare: exception: ") + ex.what());
    } catch (...) {
        write_err(err, err_len, "ef_sdpa_prepare: unknown exception");
    }
    return 1;
}

EF_SDPA_API const char *
ef_sdpa_plan_impl(ef_sdpa *s,
                  int32_t batch,
                  int32_t max_seq_len,
                  int32_t n_heads,
                  int32_t n_kv_heads,
                  int32_t head_dim,
                  float scale,
                  int32_t left_bound,
                  int32_t right_bound) {
    try {
        if (s == nullptr) {
            return nullptr;
        }
        Shape const sh = shape_of(batch, max_seq_len, 0, n_heads, n_kv_heads, head_dim, scale, left_bound, right_bound);
        std::lock_guard<std::mutex> lock(s->mu);
        auto const it = s->cache.find(plan_key(sh));
        return it == s->cache.end() ? nullptr : it->second->label.c_str();
    } catch (...) {
        return nullptr;
    }
}

EF_SDPA_API int
ef_sdpa_run(ef_sdpa *s,
            void *stream,
            int32_t batch,
            int32_t max_seq_len,
            int32_t total_tokens,
            int32_t n_heads,
            int32_t n_kv_heads,
            int32_t head_dim,
            float scale,
            int32_t left_bound,
            int32_t right_bound,
            const void *q,
            const void *k,
            const void *v,
            void *o,
            const int32_t *seq_len,
            const int32_t *q_offsets,
            const int32_t *kv_offsets,
            void *workspace,
            char *err,
            size_t err_len) {
    try {
        if (s == nullptr) {
            write_err(err, err_len, "ef_sdpa_run: null ef_sdpa");
            return 1;
        }
        Shape const sh = with_dense(
            s, shape_of(batch, max_seq_len, total_tokens, n_heads, n_kv_heads, head_dim, scale, left_bound, right_bound));
        if (std::string e = check_shape(sh); !e.empty()) {
            write_err(err, err_len, "ef_sdpa_run: invalid shape (" + sh.str() + "): " + e);
            return 1;
        }
        if (total_tokens == 0) {
            return 0;  // nothing to compute, o is empty
        }
        if (q == nullptr || k == nullptr || v == nullptr || o == nullptr || seq_len == nullptr ||
            q_offsets == nullptr || kv_offsets == nullptr) {
            write_err(err, err_len, "ef_sdpa_run: null device pointer argument");
            return 1;
        }
        for (auto [p, name] : {std::pair<const void *, const char *>{q, "q"},
                               std::pair<const void *, const char *>{k, "k"},
                               std::pair<const void *, const char *>{v, "v"},
                               std::pair<const void *, const char *>{o, "o"}}) {
            if (reinterpret_cast<uintptr_t>(p) % kPtrAlignment != 0) {
                write_err(err, err_len, std::string("ef_sdpa_run: ") + name + " is not 16-byte aligned");
                return 1;
            }
        }

        std::lock_guard<std::mutex> lock(s->mu);
        auto it = s->cache.find(plan_key(sh));
        if (it == s->cache.end()) {
            write_err(err,
                      err_len,
                      "ef_sdpa_run: no plan for " + sh.str() + "; call ef_sdpa_prepare with the same arguments first");
            return 1;
        }
        Plan const &plan = *it->second;
        if (plan.workspace > 0 && workspace == nullptr) {
            write_err(err,
                      err_len,
                      "ef_sdpa_run: the plan needs " + std::to_string(plan.workspace) +
                          " workspace bytes but workspace is NULL");
            return 1;
        }
        if (std::string e = check_same_device(s); !e.empty()) {
            write_err(err, err_len, "ef_sdpa_run: " + e);
            return 1;
        }

        auto const cu_stream = static_cast<cudaStream_t>(stream);
        if (cudnnStatus_t st = fe::detail::set_stream(s->handle, cu_stream); st != CUDNN_STATUS_SUCCESS) {
            write_err(err, err_len, "ef_sdpa_run: cudnnSetStream failed: " + cudnn_status_message(st));
            return 1;
        }

        std::unordered_map<int64_t, void *> pack = {
            {kUidQ, const_cast<void *>(q)},
            {kUidK, const_cast<void *>(k)},
            {kUidV, const_cast<void *>(v)},
            {kUidO, o},
        };
        if (!sh.dense) {
            pack.insert({{kUidSeqLenQ, const_cast<int32_t *>(seq_len)},
                         {kUidSeqLenKV, const_cast<int32_t *>(seq_len)},
                         {kUidOffsetQ, const_cast<int32_t *>(q_offsets)},
                         {kUidOffsetO, const_cast<int32_t *>(q_offsets)},
                         {kUidOffsetK, const_cast<int32_t *>(kv_offsets)},
                         {kUidOffsetV, const_cast<int32_t *>(kv_offsets)}});
        }
        if (auto e = plan.graph->execute(s->handle, pack, workspace); e.is_bad()) {
            write_err(err,
                      err_len,
                      "ef_sdpa_run: cuDNN execute (" + std::string(impl_name(plan.impl)) + ") failed for " + sh.str() +
                          " " + s->where() + ": " + describe(e));
            return 1;
        }

        // Surface sticky asynchronous faults (without blocking unless EF_SDPA_SYNC=1). A stream that is being
        // captured into a CUDA graph must be neither queried nor synchronized (that would invalidate the capture).
        auto const drv_stream         = static_cast<CUstream>(stream);
        CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
        if (drv().stream_is_capturing(drv_stream, &capture) == CUDA_SUCCESS &&
            capture == CU_STREAM_CAPTURE_STATUS_NONE) {
            if (s->sync_check) {
                if (CUresult const r = drv().stream_synchronize(drv_stream); r != CUDA_SUCCESS) {
                    write_err(err, err_len, "ef_sdpa_run: CUDA error after the SDPA kernel: " + drv().error(r));
                    return 1;
                }
            } else if (CUresult const r = drv().stream_query(drv_stream); r != CUDA_SUCCESS && r != CUDA_ERROR_NOT_READY) {
                write_err(err,
                          err_len,
                          "ef_sdpa_run: CUDA error on the stream after launching the SDPA kernel (from this or an "
                          "earlier launch): " +
                              drv().error(r));
                return 1;
            }
        }
        return 0;
    } catch (std::exception const &ex) {
        write_err(err, err_len, std::string("ef_sdpa_run: exception: ") + ex.what());
    } catch (...) {
        write_err(err, err_len, "ef_sdpa_run: unknown exception");
    }
    return 1;
}
