//! Compiles the cuDNN shim's plan policy (`cuda/plan_policy.cpp`, plain C++: which plan builds
//! a new attention key tries) into every build, so that the CPU build tests the code the GPU
//! runs. With the `cuda` feature, also compiles the cuDNN fused-attention shim
//! (`cuda/cudnn_sdpa.cpp`) over the header-only cuDNN frontend, and our own kernels
//! (`cuda/elementwise.cu`, `cuda/fp8.cu`) with nvcc, each into a fatbin of sm_80 and sm_90
//! cubins plus compute_80 PTX, embedded in the binary. Nothing is linked from CUDA or cuDNN at build time: the shim
//! loads libcudnn when a model starts on a GPU.
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
    println!("cargo:rerun-if-changed=cuda/elementwise.cu");
    println!("cargo:rerun-if-changed=cuda/fp8.cu");
    for var in [
        "CUDNN_FRONTEND_INCLUDE",
        "CUDNN_INCLUDE",
        "CUDA_INCLUDE",
        "CUDA_HOME",
        "NVCC",
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
    compile_fatbin("elementwise");
    compile_fatbin("fp8");
}

/// `cuda/<name>.cu` into `$OUT_DIR/<name>.fatbin`: cubins for the A100 (sm_80) and
/// Hopper (sm_90), which any driver of the toolkit's major version runs, and compute_80 PTX for
/// anything newer. nvcc is `$NVCC`, else `$CUDA_HOME/bin/nvcc`, else the one on PATH (the
/// CUDA build script puts its toolkit's there).
fn compile_fatbin(name: &str) {
    let nvcc = std::env::var_os("NVCC")
        .map(PathBuf::from)
        .or_else(|| {
            let home = PathBuf::from(std::env::var_os("CUDA_HOME")?).join("bin/nvcc");
            home.is_file().then_some(home)
        })
        .unwrap_or_else(|| PathBuf::from("nvcc"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"))
        .join(format!("{name}.fatbin"));
    let status = std::process::Command::new(&nvcc)
        .args(["-std=c++17", "-O3", "--fatbin"])
        .args(["-gencode", "arch=compute_80,code=sm_80"])
        .args(["-gencode", "arch=compute_90,code=sm_90"])
        .args(["-gencode", "arch=compute_80,code=compute_80"])
        .arg("-o")
        .arg(&out)
        .arg(format!("cuda/{name}.cu"))
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("{} failed ({s}) on cuda/{name}.cu", nvcc.display()),
        Err(e) => panic!(
            "the cuda feature compiles cuda/{name}.cu with nvcc, and {} does not run \
             ({e}): set NVCC or CUDA_HOME, or build with .ci/cuda/build-cuda.sh",
            nvcc.display()
        ),
    }
}
