// plan_policy.cpp - see plan_policy.h. Plain C++: no CUDA or cuDNN header.

#include "plan_policy.h"

extern "C" int32_t
ef_sdpa_plan_attempts(int32_t preference, int64_t cudnn_version, int32_t dynamic_wanted, int32_t dynamic_failed,
                      ef_sdpa_attempt *out, int32_t cap) {
    bool const dynamic = dynamic_wanted != 0 && dynamic_failed == 0 && cudnn_version >= EF_SDPA_DYNAMIC_MIN_CUDNN;
    ef_sdpa_attempt plan[3];
    int32_t n = 0;
    if (preference != EF_SDPA_PREFER_COMPOSITE) {
        plan[n++] = {EF_SDPA_NODE_UNIFIED, 0};
    }
    if (preference != EF_SDPA_PREFER_UNIFIED) {
        if (dynamic) {
            plan[n++] = {EF_SDPA_NODE_COMPOSITE, 1};
        }
        plan[n++] = {EF_SDPA_NODE_COMPOSITE, 0};
    }
    int32_t written = 0;
    for (; written < n && written < cap && out != nullptr; ++written) {
        out[written] = plan[written];
    }
    return written;
}
