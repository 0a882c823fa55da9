//! Compiles the cuDNN shim's plan policy (`cuda/plan_policy.cpp`, plain C++: which plan builds
//! a new attention key tries) into every build, so that the CPU build tests the code the GPU
//! runs. With the `cuda` feature, also compiles the cuDNN fused-attention shim
//! (`cuda/cudnn_sdpa.cpp`) over the header-only cuDNN frontend. Nothing is linked from CUDA or
//! cuDNN at build time: the shim loads libcudnn when a model starts on a GPU.
//!
//! Headers come from NVIDIA's PyPI wheels (`cuda/fetch-headers.sh`, run by
//! `.ci/cuda/build-cuda.sh`): `CUDNN_FRONTEND_INCLUDE`, `CUDNN_INCLUDE` and `CUDA_INCLUDE`
//! (default `$CUDA_HOME/include`) name their directories.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=cuda/cudnn_sdpa.cpp");
    println!("cargo:rerun-if-changed=cuda/cudnn_sdpa.h");
    println!("cargo:rerun-if-changed=cuda/plan_policy.cpp");
    println!("cargo:rerun-if-changed=cuda/plan_policy.h");
    for var in [
        "CUDNN_FRONTEND_INCLUDE",
        "CUDNN_INCLUDE",
        "CUDA_INCLUDE",
        "CUDA_HOME",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .opt_level(2)
        .warnings(true)
        .file("cuda/plan_policy.cpp")
        .compile("embedfleet_sdpa_plan_policy");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    let dir = |var: &str, fallback: Option<PathBuf>| -> PathBuf {
        let path = std::env::var_os(var).map(PathBuf::from).or(fallback);
        match path {
            Some(p) if p.is_dir() => p,
            _ => panic!(
                "the cuda feature compiles cuDNN's fused attention and needs its headers: \
                 {var} must name a directory. `.ci/cuda/build-cuda.sh` fetches them from PyPI \
                 (models/cuda/fetch-headers.sh) and sets it."
            ),
        }
    };
    let frontend = dir("CUDNN_FRONTEND_INCLUDE", None);
    let cudnn = dir("CUDNN_INCLUDE", None);
    let cuda = dir(
        "CUDA_INCLUDE",
        std::env::var_os("CUDA_HOME").map(|h| PathBuf::from(h).join("include")),
    );
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .opt_level(2)
        .define("NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING", None)
        .include("cuda")
        // The frontend's and NVIDIA's own headers: their warnings are not ours.
        .flag("-isystem")
        .flag(frontend.to_str().expect("a UTF-8 include path"))
        .flag("-isystem")
        .flag(cudnn.to_str().expect("a UTF-8 include path"))
        .flag("-isystem")
        .flag(cuda.to_str().expect("a UTF-8 include path"))
        .warnings(true)
        .file("cuda/cudnn_sdpa.cpp")
        .compile("embedfleet_cudnn_sdpa");
    println!("cargo:rustc-link-lib=dylib=dl");
}
