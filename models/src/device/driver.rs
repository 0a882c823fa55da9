//! Which CUDA build of embedfleet starts on which NVIDIA driver: the decision `doctor` prints,
//! kept apart so that the CPU build tests it.
//!
//! A driver supports one CUDA version (R535 → 12.2, R580 → 13.0) and every older one. A
//! binary's kernels reach the GPU in one of two forms: PTX, which the driver compiles at load
//! and refuses when it comes from a newer CUDA than the driver's own; or cubins (machine code
//! for the GPU's architecture), which CUDA's minor-version compatibility lets any driver of the
//! same major run (12.x: from R525). candle's kernels are PTX ([`KERNEL_FORM`]): candle-kernels
//! builds PTX only and candle-core hands each module to the driver as text. So a build needs a
//! driver for at least its own CUDA version, and the CUDA 12 build for the oldest 12.x drivers
//! must be compiled with that 12.x (a cluster's CUDA module, `CUDA12_HOME`).

use std::fmt;

/// A CUDA version, major.minor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CudaVersion {
    pub major: u32,
    pub minor: u32,
}

impl CudaVersion {
    pub const fn new(major: u32, minor: u32) -> CudaVersion {
        CudaVersion { major, minor }
    }

    /// `"12.4"` (or `"12.4.131"`).
    pub fn parse(text: &str) -> Option<CudaVersion> {
        let mut parts = text.trim().split('.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        Some(CudaVersion { major, minor })
    }

    /// cuDriverGetVersion's integer (12020 → 12.2).
    pub fn from_driver_api(version: i32) -> Option<CudaVersion> {
        let v = u32::try_from(version).ok().filter(|&v| v >= 1000)?;
        Some(CudaVersion::new(v / 1000, v % 1000 / 10))
    }
}

impl fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// How a build's kernels reach the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelForm {
    /// Text the driver compiles at load: needs a driver of at least the build's CUDA version.
    Ptx,
    /// Machine code for the GPU's architecture: any driver of the build's major version.
    Cubin,
}

impl fmt::Display for KernelForm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KernelForm::Ptx => "PTX",
            KernelForm::Cubin => "cubin",
        })
    }
}

/// This binary's kernels: candle's, PTX whatever the toolkit (see the module's comment).
pub const KERNEL_FORM: KernelForm = KernelForm::Ptx;

/// The CUDA version of each driver branch, from NVIDIA's release notes (a driver supports its
/// branch's CUDA and every older one).
const DRIVER_CUDA: [(u32, CudaVersion); 11] = [
    (525, CudaVersion::new(12, 0)),
    (530, CudaVersion::new(12, 1)),
    (535, CudaVersion::new(12, 2)),
    (545, CudaVersion::new(12, 3)),
    (550, CudaVersion::new(12, 4)),
    (555, CudaVersion::new(12, 5)),
    (560, CudaVersion::new(12, 6)),
    (565, CudaVersion::new(12, 7)),
    (570, CudaVersion::new(12, 8)),
    (575, CudaVersion::new(12, 9)),
    (580, CudaVersion::new(13, 0)),
];

/// The CUDA version a driver (its major version, e.g. 535) supports; `None` before R525, older
/// than any CUDA 12. A driver newer than the table gets the newest entry: a lower bound.
pub fn driver_cuda(driver: u32) -> Option<CudaVersion> {
    DRIVER_CUDA
        .iter()
        .rev()
        .find(|(branch, _)| driver >= *branch)
        .map(|(_, cuda)| *cuda)
}

/// The oldest driver branch that supports `cuda`, when the table knows it.
pub fn min_driver_for(cuda: CudaVersion) -> Option<u32> {
    DRIVER_CUDA
        .iter()
        .find(|(_, supported)| *supported >= cuda && supported.major == cuda.major)
        .map(|(branch, _)| *branch)
}

/// Whether a build of `build`'s CUDA with kernels in `form` starts on a driver supporting
/// `driver`.
pub fn runs_on(build: CudaVersion, form: KernelForm, driver: CudaVersion) -> bool {
    match form {
        KernelForm::Ptx => driver >= build,
        // Minor-version compatibility: any driver of the same major (or a newer one).
        KernelForm::Cubin => driver >= CudaVersion::new(build.major, 0),
    }
}

/// The embedfleet build for a node whose driver supports `driver`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildChoice {
    /// The default build (CUDA 13.0).
    Cuda13,
    /// `CUDA_MAJOR=12`, assembled here (CUDA 12.4).
    Cuda12,
    /// `CUDA_MAJOR=12` with `CUDA12_HOME` a toolkit of this 12.x or older (the driver's own,
    /// e.g. a cluster's CUDA module): PTX from 12.4 does not load on it.
    Cuda12Own(CudaVersion),
    /// Older than CUDA 12.0: no build of embedfleet starts.
    None,
}

/// The two builds `build-cuda.sh` makes with no toolkit of the user's.
pub const CUDA13_BUILD: CudaVersion = CudaVersion::new(13, 0);
pub const CUDA12_BUILD: CudaVersion = CudaVersion::new(12, 4);

/// Which build to run on a driver supporting `driver`, for this build's kernel form.
pub fn build_for(driver: CudaVersion) -> BuildChoice {
    if runs_on(CUDA13_BUILD, KERNEL_FORM, driver) {
        BuildChoice::Cuda13
    } else if runs_on(CUDA12_BUILD, KERNEL_FORM, driver) {
        BuildChoice::Cuda12
    } else if driver.major == 12 {
        BuildChoice::Cuda12Own(driver)
    } else {
        BuildChoice::None
    }
}

impl fmt::Display for BuildChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildChoice::Cuda13 => write!(f, "the CUDA {CUDA13_BUILD} build (the default)"),
            BuildChoice::Cuda12 => write!(f, "the CUDA {CUDA12_BUILD} build (CUDA_MAJOR=12)"),
            BuildChoice::Cuda12Own(cuda) => write!(
                f,
                "a CUDA 12 build compiled with CUDA {cuda} or older (CUDA_MAJOR=12 CUDA12_HOME=a CUDA {cuda} toolkit, e.g. the cluster's module; docs/cuda.md)"
            ),
            BuildChoice::None => f.write_str(
                "no build of embedfleet: the driver is older than CUDA 12.0 (R525); ask for nodes with a newer driver",
            ),
        }
    }
}

/// Which build each driver takes, in one line (doctor prints it on every node and build).
pub fn build_table() -> String {
    let floor = |cuda| min_driver_for(cuda).expect("the table knows every build's CUDA");
    format!(
        "driver >= {}: CUDA {CUDA13_BUILD} build; {}-{}: CUDA {CUDA12_BUILD} build; {}-{}: a CUDA 12 build compiled with the driver's own 12.x (CUDA12_HOME); older: none",
        floor(CUDA13_BUILD),
        floor(CUDA12_BUILD),
        floor(CUDA13_BUILD) - 1,
        floor(CudaVersion::new(12, 0)),
        floor(CUDA12_BUILD) - 1,
    )
}

/// What a node whose driver supports `driver` should do when this build (`build`, kernels in
/// `form`) cannot start there: `None` when it can.
pub fn driver_advice(build: CudaVersion, form: KernelForm, driver: CudaVersion) -> Option<String> {
    if runs_on(build, form, driver) {
        return None;
    }
    let needed = match form {
        KernelForm::Ptx => build,
        KernelForm::Cubin => CudaVersion::new(build.major, 0),
    };
    let branch = min_driver_for(needed).map_or(String::new(), |d| format!(", driver >= {d}"));
    Some(format!(
        "this driver supports CUDA {driver}, older than this CUDA {build} build's {form} kernels need (CUDA >= {needed}{branch}): run {} on these nodes",
        build_for(driver)
    ))
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

/// The CUDA version the node's driver supports, asked of the driver (cuDriverGetVersion):
/// `None` in a CPU build, or where no driver answers (the link-time stub). Needs no
/// `/proc/driver/nvidia/version`, which sandboxed runtimes hide.
pub fn driver_cuda_version() -> Option<CudaVersion> {
    #[cfg(feature = "cuda")]
    {
        use candle_core::cuda_backend::cudarc::driver::sys;
        let mut version = 0;
        // SAFETY: writes one int; needs no initialised driver or context.
        let rc = unsafe { sys::cuDriverGetVersion(&mut version) };
        if rc == sys::CUresult::CUDA_SUCCESS {
            return CudaVersion::from_driver_api(version);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(text: &str) -> CudaVersion {
        CudaVersion::parse(text).unwrap()
    }

    #[test]
    fn versions_parse_from_text_the_driver_api_and_the_driver_branch() {
        assert_eq!(v("12.4.131"), CudaVersion::new(12, 4));
        assert_eq!(CudaVersion::from_driver_api(12020), Some(v("12.2")));
        assert_eq!(CudaVersion::from_driver_api(13000), Some(v("13.0")));
        assert_eq!(CudaVersion::from_driver_api(0), None);
        let text = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.183.01  Sun May 12 19:39:15 UTC 2024\nGCC version: gcc 11";
        assert_eq!(driver_major(text), Some(535));
        assert_eq!(
            driver_major(
                "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build"
            ),
            Some(580)
        );
        assert_eq!(driver_major(""), None);
        assert_eq!(driver_cuda(535), Some(v("12.2")));
        assert_eq!(driver_cuda(538), Some(v("12.2")), "a point release of R535");
        assert_eq!(driver_cuda(590), Some(v("13.0")), "newer than the table");
        assert_eq!(driver_cuda(520), None);
        assert_eq!(min_driver_for(v("12.4")), Some(550));
        assert_eq!(min_driver_for(v("13.0")), Some(580));
        assert_eq!(min_driver_for(v("12.0")), Some(525));
        assert_eq!(min_driver_for(v("11.8")), None);
    }

    #[test]
    fn ptx_needs_the_builds_own_cuda_and_cubins_only_its_major() {
        let (ptx, cubin) = (KernelForm::Ptx, KernelForm::Cubin);
        assert!(runs_on(v("12.4"), ptx, v("12.4")));
        assert!(runs_on(v("12.4"), ptx, v("13.0")), "drivers run older CUDA");
        assert!(
            !runs_on(v("12.4"), ptx, v("12.2")),
            "R535 refuses 12.4's PTX"
        );
        assert!(
            runs_on(v("12.4"), cubin, v("12.0")),
            "minor-version compatibility"
        );
        assert!(!runs_on(v("13.0"), cubin, v("12.9")));
        assert!(!runs_on(v("13.0"), ptx, v("12.9")));
    }

    #[test]
    fn every_driver_is_told_which_build_runs_there() {
        // driver branch -> the build doctor names (kernels are PTX: candle's).
        let table = [
            (515, BuildChoice::None),
            (525, BuildChoice::Cuda12Own(v("12.0"))),
            (535, BuildChoice::Cuda12Own(v("12.2"))),
            (545, BuildChoice::Cuda12Own(v("12.3"))),
            (550, BuildChoice::Cuda12),
            (560, BuildChoice::Cuda12),
            (570, BuildChoice::Cuda12),
            (575, BuildChoice::Cuda12),
            (580, BuildChoice::Cuda13),
            (590, BuildChoice::Cuda13),
        ];
        for (driver, want) in table {
            let cuda = driver_cuda(driver).unwrap_or(CudaVersion::new(11, 8));
            assert_eq!(build_for(cuda), want, "driver {driver} (CUDA {cuda})");
        }
        assert!(BuildChoice::Cuda12Own(v("12.2"))
            .to_string()
            .contains("CUDA12_HOME"));
        let line = build_table();
        assert!(
            line.contains("driver >= 580: CUDA 13.0")
                && line.contains("550-579: CUDA 12.4")
                && line.contains("525-549"),
            "{line}"
        );
    }

    #[test]
    fn a_build_the_driver_cannot_start_says_what_to_run_instead() {
        let ptx = KernelForm::Ptx;
        assert_eq!(driver_advice(v("13.0"), ptx, v("13.0")), None);
        assert_eq!(driver_advice(v("12.4"), ptx, v("13.0")), None);
        let to_cu12 = driver_advice(v("13.0"), ptx, v("12.6")).unwrap();
        assert!(
            to_cu12.contains("CUDA 12.4 build") && to_cu12.contains("driver >= 580"),
            "{to_cu12}"
        );
        let own = driver_advice(v("12.4"), ptx, v("12.2")).unwrap();
        assert!(
            own.contains("driver >= 550") && own.contains("compiled with CUDA 12.2"),
            "{own}"
        );
        let none = driver_advice(v("12.4"), ptx, v("11.8")).unwrap();
        assert!(none.contains("no build of embedfleet"), "{none}");
        // A cubin build of 12.4 would start on R525.
        assert_eq!(driver_advice(v("12.4"), KernelForm::Cubin, v("12.0")), None);
    }
}
