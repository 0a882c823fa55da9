//! Device strings: `cpu`, `cpu:N` (N CPU workers), `cuda` (GPU 0), `cuda:N`, and lists
//! `cuda:0,1` for several workers (`cuda:0,0`: two workers on one GPU). The one parser of device lists in the workspace.

use std::fmt;
use std::str::FromStr;

use candle_core::Device;

use crate::error::{ModelError, ModelResult};

mod driver;
#[cfg(feature = "cuda")]
pub(crate) mod per_device;
pub mod pool;
pub use driver::{
    build_for, build_table, driver_advice, driver_cuda, driver_cuda_version, driver_major,
    min_driver_for, runs_on, BuildChoice, CudaVersion, KernelForm, CUDA12_BUILD, CUDA13_BUILD,
    KERNEL_FORM,
};

/// True when this binary was built with the `cuda` feature (it can run on GPUs).
pub const CUDA_BUILD: bool = cfg!(feature = "cuda");

/// The compute capability the CUDA kernels were built for (`CUDA_COMPUTE_CAP` at build time;
/// `.ci/cuda/build-cuda.sh` sets it), when known.
pub const CUDA_COMPUTE_CAP: Option<&str> = option_env!("CUDA_COMPUTE_CAP");

/// The CUDA toolkit the kernels were built with (`EMBEDFLEET_CUDA_VERSION` at build time, e.g.
/// `13.0` or `12.4`; `.ci/cuda/build-cuda.sh` sets it), when known.
pub const CUDA_VERSION: Option<&str> = option_env!("EMBEDFLEET_CUDA_VERSION");

/// This build's CUDA version (`CUDA_VERSION`; 13.0 when it was not recorded), `None` in a CPU
/// build.
pub fn build_cuda() -> Option<CudaVersion> {
    CUDA_BUILD.then(|| {
        CUDA_VERSION
            .and_then(CudaVersion::parse)
            .unwrap_or(CUDA13_BUILD)
    })
}

/// The GPUs this build runs on, in words: candle's kernels are PTX for `CUDA_COMPUTE_CAP`
/// (80: sm_80 and newer — A100, and H100/H200 through the driver's compiler; 90: sm_90a, Hopper
/// only), attention is cuDNN's (sm_80 and newer, loaded at run time). `None` in a CPU build.
pub fn supported_gpus() -> Option<String> {
    if !CUDA_BUILD {
        return None;
    }
    let gpus = match CUDA_COMPUTE_CAP {
        Some("80") | None => "compute capability 8.0 and newer: A100, and H100/H200 (their driver compiles the sm_80 PTX)".to_string(),
        Some("90") => "compute capability 9.0 only (sm_90a PTX): H100/H200, not A100".to_string(),
        Some(cap) => format!("compute capability {cap} (PTX) and newer"),
    };
    Some(format!(
        "{gpus}; attention in cuDNN 9's fused kernel, loaded at run time"
    ))
}

/// One compute device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceSpec {
    #[default]
    Cpu,
    Cuda(usize),
}

impl DeviceSpec {
    /// Opens the device; CUDA without the `cuda` feature is an error that says so.
    pub fn open(&self) -> ModelResult<Device> {
        match self {
            DeviceSpec::Cpu => Ok(Device::Cpu),
            DeviceSpec::Cuda(n) => {
                if !cfg!(feature = "cuda") {
                    return Err(ModelError::InvalidDevice {
                        spec: self.to_string(),
                        reason: "this build has no CUDA support; rebuild with `--features cuda`"
                            .into(),
                    });
                }
                let device = Device::new_cuda(*n).map_err(|e| ModelError::InvalidDevice {
                    spec: self.to_string(),
                    reason: e.to_string(),
                })?;
                #[cfg(feature = "cuda")]
                if let Device::Cuda(d) = &device {
                    let kept = pool::keep_freed_memory(d.cuda_stream().context());
                    tracing::debug!(device = %self, kept, "memory pool keeps freed memory");
                    // EF_NO_EVENT_TRACKING=1 (an A/B switch for the GPU check): no CUDA event
                    // recorded per tensor use. Each worker computes on its own stream with
                    // tensors of its own, so the events order nothing here.
                    if crate::ab_switch::AbSwitch::NoEventTracking.on() {
                        // SAFETY: no tensor of this device is shared with another stream.
                        unsafe { d.disable_event_tracking() };
                    }
                    match crate::projection::give_cublas_a_workspace(d) {
                        Ok(given) => tracing::debug!(device = %self, given, "cuBLAS workspace"),
                        Err(e) => tracing::warn!(device = %self, "no cuBLAS workspace: {e}"),
                    }
                }
                Ok(device)
            }
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Cpu => write!(f, "cpu"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl FromStr for DeviceSpec {
    type Err = ModelError;

    /// Parses `cpu`, `cuda` or `cuda:N`.
    fn from_str(s: &str) -> ModelResult<DeviceSpec> {
        match parse_devices(s)?.as_slice() {
            [one] => Ok(*one),
            _ => Err(invalid(s, "expected one device; use `cuda:N`")),
        }
    }
}

fn invalid(spec: &str, reason: &str) -> ModelError {
    ModelError::InvalidDevice {
        spec: spec.to_string(),
        reason: reason.to_string(),
    }
}

/// Parses `cpu`, `cuda`, `cuda:N` or `cuda:N,M,...` into one spec per device.
pub fn parse_devices(spec: &str) -> ModelResult<Vec<DeviceSpec>> {
    let s = spec.trim().to_ascii_lowercase();
    match s.as_str() {
        "cpu" => return Ok(vec![DeviceSpec::Cpu]),
        "cuda" | "gpu" => return Ok(vec![DeviceSpec::Cuda(0)]),
        _ => {}
    }
    if let Some(n) = s.strip_prefix("cpu:") {
        // N CPU workers: the multi-device path without a GPU.
        let n: usize = n
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| invalid(spec, "`cpu:N` takes a positive number of workers"))?;
        return Ok(vec![DeviceSpec::Cpu; n]);
    }
    let Some(list) = s.strip_prefix("cuda:") else {
        return Err(invalid(
            spec,
            "expected `cpu`, `cpu:N`, `cuda`, `cuda:N` or `cuda:N,M`",
        ));
    };
    let mut out = Vec::new();
    for part in list.split(',') {
        let n: usize = part.trim().parse().map_err(|_| {
            invalid(
                spec,
                "GPU ordinals are non-negative integers, as in `cuda:0,1`",
            )
        })?;
        // A GPU listed twice gets two workers (a smoke test of several workers on one GPU).
        out.push(DeviceSpec::Cuda(n));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_device_strings() {
        assert_eq!("cpu".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cpu);
        assert_eq!("CUDA".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(0));
        assert_eq!("cuda:3".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(3));
        assert_eq!(
            parse_devices("cuda:0, 1").unwrap(),
            vec![DeviceSpec::Cuda(0), DeviceSpec::Cuda(1)]
        );
        assert_eq!(parse_devices("cpu:3").unwrap(), vec![DeviceSpec::Cpu; 3]);
        assert_eq!(
            parse_devices("cuda:0,0").unwrap(),
            vec![DeviceSpec::Cuda(0); 2],
            "two workers on one GPU"
        );
        for bad in ["tpu", "cuda:", "cuda:x", "cuda:-1", "cpu:0", "cpu:x"] {
            assert!(parse_devices(bad).is_err(), "{bad}");
        }
        assert!("cuda:0,1".parse::<DeviceSpec>().is_err());
        assert_eq!(DeviceSpec::Cuda(2).to_string(), "cuda:2");
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_feature_is_a_clear_error() {
        let err = DeviceSpec::Cuda(0).open().unwrap_err().to_string();
        assert!(err.contains("--features cuda"), "{err}");
    }
}
