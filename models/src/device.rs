//! Device strings: `cpu`, `cpu:N` (N CPU workers), `cuda` (GPU 0), `cuda:N`, and lists
//! `cuda:0,1` for several workers (`cuda:0,0`: two workers on one GPU). The one parser of device lists in the workspace.

use std::fmt;
use std::str::FromStr;

use candle_core::Device;

use crate::error::{ModelError, ModelResult};

/// True when this binary was built with the `cuda` feature (it can run on GPUs).
pub const CUDA_BUILD: bool = cfg!(feature = "cuda");

/// The compute capability the CUDA kernels were built for (`CUDA_COMPUTE_CAP` at build time;
/// `.ci/cuda/build-cuda.sh` sets it), when known.
pub const CUDA_COMPUTE_CAP: Option<&str> = option_env!("CUDA_COMPUTE_CAP");

/// The CUDA toolkit the kernels were built with (`EMBEDFLEET_CUDA_VERSION` at build time, e.g.
/// `13.0` or `12.4`; `.ci/cuda/build-cuda.sh` sets it), when known.
pub const CUDA_VERSION: Option<&str> = option_env!("EMBEDFLEET_CUDA_VERSION");

/// The oldest driver (its major version) that loads the PTX of a CUDA `major.minor` toolkit:
/// the driver compiles candle's PTX at load time and refuses PTX newer than itself.
/// `None` for a version this table does not know.
pub fn min_driver_for(cuda: &str) -> Option<u32> {
    let (major, minor) = cuda.split_once('.')?;
    let minor: u32 = minor.split('.').next()?.parse().ok()?;
    match (major.parse::<u32>().ok()?, minor) {
        (13, _) => Some(580),
        (12, m) if m >= 8 => Some(570),
        (12, 6 | 7) => Some(560),
        (12, 5) => Some(555),
        (12, 4) => Some(550),
        (12, 3) => Some(545),
        (12, 2) => Some(535),
        (12, 1) => Some(530),
        (12, 0) => Some(525),
        _ => None,
    }
}

/// The driver's major version from `/proc/driver/nvidia/version`'s text
/// (`NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06 ...`).
pub fn driver_major(proc_version: &str) -> Option<u32> {
    let line = proc_version.lines().next()?;
    line.split_whitespace().find_map(|word| {
        let (major, rest) = word.split_once('.')?;
        (rest.chars().all(|c| c.is_ascii_digit() || c == '.') && !rest.is_empty())
            .then(|| major.parse().ok())
            .flatten()
    })
}

/// What a node whose driver is `driver` (major) should run, when a build of `cuda` cannot:
/// `None` when the driver is new enough.
pub fn driver_advice(cuda: &str, driver: u32) -> Option<String> {
    let needed = min_driver_for(cuda)?;
    if driver >= needed {
        return None;
    }
    let cu12 = min_driver_for("12.4").expect("12.4 is in the table");
    Some(if cuda.starts_with("13") && driver >= cu12 {
        format!(
            "driver {driver} is older than this CUDA {cuda} build needs (>= {needed}): use the CUDA 12.4 build on these nodes (README, \"GPU builds\")"
        )
    } else {
        format!(
            "driver {driver} is older than this CUDA {cuda} build needs (>= {needed}), and than any embedfleet build (>= {cu12}): ask for a node or module with a newer driver"
        )
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
                Device::new_cuda(*n).map_err(|e| ModelError::InvalidDevice {
                    spec: self.to_string(),
                    reason: e.to_string(),
                })
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
    #[test]
    fn a_driver_too_old_for_the_build_is_told_which_build_to_use() {
        let text = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\nGCC version: gcc 11";
        assert_eq!(super::driver_major(text), Some(535));
        assert_eq!(
            super::driver_major(
                "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build"
            ),
            Some(580)
        );
        assert_eq!(super::driver_major(""), None);
        assert_eq!(super::min_driver_for("13.0"), Some(580));
        assert_eq!(super::min_driver_for("12.4"), Some(550));
        assert_eq!(super::min_driver_for("11.8"), None);
        assert_eq!(super::driver_advice("13.0", 580), None);
        assert_eq!(super::driver_advice("12.4", 580), None);
        let to_cu12 = super::driver_advice("13.0", 560).unwrap();
        assert!(to_cu12.contains("CUDA 12.4 build"), "{to_cu12}");
        let too_old = super::driver_advice("13.0", 535).unwrap();
        assert!(too_old.contains("newer driver"), "{too_old}");
        assert!(super::driver_advice("12.4", 545)
            .unwrap()
            .contains(">= 550"));
    }

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
