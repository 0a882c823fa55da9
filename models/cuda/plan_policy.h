/*
 * plan_policy.h - which plan builds ef_sdpa_prepare tries for a new key, in order: the one
 * decision of the cuDNN shim that needs no GPU and no cuDNN, so it is compiled into every build
 * (plan_policy.cpp) and tested on the CPU (models/src/attention_plan.rs).
 *
 * Every new (sequences, longest length) key is a new cuDNN graph. Built with dynamic shapes and
 * the handle's one kernel cache (cuDNN >= 9.4), the keys of a model share the kernel cuDNN
 * compiles at run time (NVRTC) for the first: later keys only build a plan around it. The
 * frontend allows dynamic shapes on the COMPOSITE SDPA node only ("Unified SDPA node doesn't
 * support dynamic shape"), so the unified node is always built static.
 */
#ifndef EF_PLAN_POLICY_H
#define EF_PLAN_POLICY_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* EF_SDPA_IMPL: auto (unified, then composite), composite or unified. */
enum { EF_SDPA_PREFER_AUTO = 0, EF_SDPA_PREFER_COMPOSITE = 1, EF_SDPA_PREFER_UNIFIED = 2 };
/* The SDPA node a plan build uses. */
enum { EF_SDPA_NODE_COMPOSITE = 1, EF_SDPA_NODE_UNIFIED = 2 };
/* The first cuDNN with the kernel cache and dynamic shapes (9.4.0). */
#define EF_SDPA_DYNAMIC_MIN_CUDNN 90400

/* One plan build: a node, with or without dynamic shapes (and the shared kernel cache). */
typedef struct ef_sdpa_attempt {
    int32_t node;
    int32_t dynamic_shapes;
} ef_sdpa_attempt;

/* The builds to try for a new key, at most `cap` into `out`; returns how many. `dynamic_wanted`
   is EF_SDPA_DYNAMIC (default off); `dynamic_failed` is set once a dynamic-shape build failed
   on this handle, so that a cuDNN without dynamic shapes for this graph costs one failed build,
   not one per key. */
int32_t ef_sdpa_plan_attempts(int32_t preference, int64_t cudnn_version, int32_t dynamic_wanted,
                              int32_t dynamic_failed, ef_sdpa_attempt* out, int32_t cap);

#ifdef __cplusplus
}
#endif

#endif /* EF_PLAN_POLICY_H */
