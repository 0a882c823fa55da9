//! `embedfleet doctor`: what this binary and this node can do, checked the way a job would use
//! them — the build, the driver, the devices, the model directory, one forward per device, the
//! run directory's filesystem — ending with one line per problem saying what to do.

use crate::flags::DoctorFlags;
use anyhow::Result;
use embedfleet_core::exit;
use embedfleet_core::handoff::OutputSettings;
use embedfleet_core::{Precision, RunLayout};
use embedfleet_embed::{LoadedModels, ModelLoad};
use embedfleet_models::{DeviceSpec, PackedSequences, CUDA_BUILD, CUDA_COMPUTE_CAP};
use std::path::Path;
use std::time::Instant;

pub fn doctor(args: &DoctorFlags) -> Result<i32> {
    let mut problems: Vec<String> = Vec::new();
    build(&mut problems);
    host();
    let devices = args
        .devices
        .clone()
        .unwrap_or_else(|| if CUDA_BUILD { "cuda" } else { "cpu" }.to_string());
    let devices = match embedfleet_embed::parse_devices(&devices) {
        Ok(d) => d,
        Err(e) => {
            problems.push(format!("--devices: {e}"));
            Vec::new()
        }
    };
    let names: Vec<String> = devices.iter().map(ToString::to_string).collect();
    println!("devices: {}", names.join(", "));
    for device in &devices {
        if let Err(e) = device.open() {
            problems.push(format!("{device} cannot be opened: {e}"));
        }
    }
    if args.attention {
        attention(&devices, &mut problems);
    }
    match &args.model_dir {
        Some(dir) if problems.is_empty() => {
            let precision = precision(args);
            model(dir, &devices, (args.tokens, precision), &mut problems)
        }
        Some(_) => println!("model: not loaded (fix the problems above first)"),
        None => println!("model: no --model-dir given; not checked"),
    }
    if let Some(dir) = &args.run_dir {
        run_dir(dir, &mut problems);
        // The scheduler's own checks of the run's queues: the given run config's, else the
        // one the run keeps.
        let given = args
            .config
            .as_deref()
            .map(embedfleet_orchestrator::config::RunConfig::load)
            .transpose()?;
        problems.extend(embedfleet_orchestrator::stored_config::preflight(
            dir,
            given.as_ref(),
        ));
    }
    if problems.is_empty() {
        println!("no problems found");
        return Ok(exit::SUCCESS);
    }
    for p in &problems {
        println!("problem: {p}");
    }
    Ok(exit::FAILURE)
}

/// Each device's attention kernel, probed before any model: a cuDNN that refuses the fused
/// kernel is known in seconds.
fn attention(devices: &[DeviceSpec], problems: &mut Vec<String>) {
    let mut seen: Vec<DeviceSpec> = Vec::new();
    for device in devices {
        if seen.contains(device) {
            continue;
        }
        seen.push(*device);
        match embedfleet_models::probe_attention(device) {
            Ok(kernel) => println!("attention on {device}: {kernel}"),
            Err(reason) => problems.push(format!(
                "the fused attention kernel cannot run on {device}: {reason}; EMBEDFLEET_ATTENTION=blockwise runs the slower blockwise kernel instead"
            )),
        }
    }
}

fn build(problems: &mut Vec<String>) {
    let version = env!("CARGO_PKG_VERSION");
    let Some(cuda) = embedfleet_models::build_cuda() else {
        println!(
            "embedfleet {version}: CPU build (no CUDA kernels; runs on --devices cpu / cpu:N)"
        );
        println!("driver: not needed by a CPU build");
        println!("GPU builds by driver: {}", embedfleet_models::build_table());
        return;
    };
    let cap = CUDA_COMPUTE_CAP.unwrap_or("unknown");
    let form = embedfleet_models::KERNEL_FORM;
    let floor = embedfleet_models::min_driver_for(cuda)
        .map_or("a driver for it".into(), |d| format!("driver >= {d}"));
    println!(
        "embedfleet {version}: CUDA {cuda} build, kernels as {form} for compute capability {cap} (needs CUDA >= {cuda} in the driver: {floor}), the CUDA {} cuBLAS/cuRAND libraries and libcudnn 9 for CUDA {}",
        cuda.major, cuda.major
    );
    if let Some(gpus) = embedfleet_models::supported_gpus() {
        println!("runs on: {gpus}");
    }
    println!("GPU builds by driver: {}", embedfleet_models::build_table());
    for problem in driver(cuda, form) {
        problems.push(problem);
    }
}

/// The node's driver: its version line and the CUDA it supports, asked of the driver itself
/// (cuDriverGetVersion), so that a sandbox hiding `/proc/driver/nvidia/version` is no problem.
/// Returns the problems: a driver too old for this build, or none at all.
fn driver(
    cuda: embedfleet_models::CudaVersion,
    form: embedfleet_models::KernelForm,
) -> Vec<String> {
    let proc_text = std::fs::read_to_string("/proc/driver/nvidia/version").ok();
    let from_proc = proc_text
        .as_deref()
        .and_then(embedfleet_models::driver_major)
        .and_then(embedfleet_models::driver_cuda);
    let supported = embedfleet_models::driver_cuda_version().or(from_proc);
    let line = proc_text
        .as_deref()
        .and_then(|t| t.lines().next())
        .map_or("(no /proc/driver/nvidia/version)".into(), |l| {
            l.trim().to_string()
        });
    let Some(supported) = supported else {
        println!("driver: {line}");
        return vec![
            "no NVIDIA driver answers on this node (cuDriverGetVersion, /proc/driver/nvidia/version): run doctor on a GPU node (`submit --trial QUEUE` runs a job there)".into(),
        ];
    };
    println!(
        "driver: {line}; supports CUDA {supported}; runs {}",
        embedfleet_models::build_for(supported)
    );
    embedfleet_models::driver_advice(cuda, form, supported)
        .into_iter()
        .collect()
}

fn host() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib = |key: &str| {
        meminfo
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let gib = |k: f64| k / (1024.0 * 1024.0);
    println!(
        "host: {} cores, {:.1} GiB memory ({:.1} GiB available)",
        cores,
        gib(kib("MemTotal:")),
        gib(kib("MemAvailable:"))
    );
}

/// Checks the model directory, loads it on every device and runs one forward on each.
/// The precision of the test forward: `--precision`, else the one the run (`--run-dir`) pinned,
/// else native.
fn precision(args: &DoctorFlags) -> Precision {
    let pinned = || {
        let dir = args.run_dir.as_ref()?;
        let settings = OutputSettings::read(&RunLayout::new(dir)).ok()??;
        Some(settings.precision)
    };
    args.precision.or_else(pinned).unwrap_or_default()
}

fn model(
    dir: &Path,
    devices: &[DeviceSpec],
    (tokens, precision): (usize, Precision),
    problems: &mut Vec<String>,
) {
    let summary = match embedfleet_models::verify_model_dir(dir) {
        Ok(s) => s,
        Err(e) => {
            problems.push(format!(
                "the model directory {} is not usable: {e} (docs/cluster.md, \"The model, offline\")",
                dir.display()
            ));
            return;
        }
    };
    let c = &summary.shape;
    println!(
        "model: {}: {} layers, hidden {}, context {} tokens, {} weight file(s) ({:.1} MB), fingerprint {}",
        dir.display(),
        c.num_hidden_layers,
        c.hidden_size,
        c.max_position_embeddings,
        summary.weight_files.len(),
        summary.weight_bytes as f64 / 1e6,
        embedfleet_embed::model_revision(dir)
    );
    if let Ok(vectors) = embedfleet_models::describe_vectors(dir) {
        println!("vectors: {vectors}");
    }
    if precision != Precision::Native {
        println!("precision: {precision}");
    }
    let how = ModelLoad {
        precision,
        ..ModelLoad::default()
    };
    let loaded = match LoadedModels::load_with(dir, devices, &how) {
        Ok(l) => l,
        Err(e) => {
            problems.push(format!("the model does not load: {e}"));
            return;
        }
    };
    let len = tokens.clamp(2, c.max_position_embeddings);
    let vocab = (c.vocab_size as u32).saturating_sub(1).max(1);
    let framing = loaded.tokenizer.framing();
    let body = len.saturating_sub(framing.overhead()).max(1) as u32;
    let ids = framing.wrap(&(0..body).map(|i| i % vocab).collect::<Vec<_>>());
    let len = ids.len();
    let batch = PackedSequences::from_sequences(&[ids]);
    for (device, model) in devices.iter().zip(&loaded.models) {
        let started = Instant::now();
        match model.embed(&batch) {
            Ok(v) => {
                let secs = started.elapsed().as_secs_f64().max(1e-9);
                let peak = embedfleet_embed::job::process_peak_rss_bytes()
                    .map_or("unknown".into(), |b| {
                        format!("{:.0} MiB", b as f64 / 1048576.0)
                    });
                // The kernel names a fallback: an encoder whose fused attention this node's
                // cuDNN refused runs the blockwise one (its log says why).
                println!(
                    "forward: {device}: {len} tokens in {secs:.2} s ({:.0} tokens/s), a {}-d vector, {} attention; peak memory of this process {peak}",
                    len as f64 / secs,
                    v[0].len(),
                    model.attention_kernel()
                );
            }
            Err(e) => problems.push(format!("one forward on {device} failed: {e}")),
        }
    }
}

/// Whether the run directory is writable, and on which filesystem.
fn run_dir(dir: &Path, problems: &mut Vec<String>) {
    let probe = dir.join(format!(".embedfleet-doctor-{}", std::process::id()));
    let writable = std::fs::write(&probe, b"ok").is_ok();
    let _ = std::fs::remove_file(&probe);
    let fs = filesystem(dir);
    println!(
        "run dir: {}: {}, filesystem {fs}",
        dir.display(),
        if writable { "writable" } else { "NOT writable" }
    );
    if !writable {
        problems.push(format!(
            "{} is not writable from this node: jobs write their parquet shards there; use a directory on a shared filesystem every node can write",
            dir.display()
        ));
    }
}

/// The filesystem type of `dir`, by its statfs magic number.
fn filesystem(dir: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let Ok(path) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return "unknown".into();
    };
    // SAFETY: statfs writes into a zeroed plain-data struct; the path is NUL-terminated.
    let magic = unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        if libc::statfs(path.as_ptr(), &mut st) != 0 {
            return "unknown (statfs failed)".into();
        }
        st.f_type as u64
    };
    let name = match magic {
        0x0BD0_0BD0 => "lustre (shared)",
        0x4750_4653 => "gpfs (shared)",
        0x6969 => "nfs (shared)",
        0xFE53_4D42 | 0xFF53_4D42 => "smb/cifs (shared)",
        0xEF53 => "ext4 (local)",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs (local)",
        0x0102_1994 => "tmpfs (memory: lost at reboot, not shared)",
        0x794C_7630 => "overlayfs (local)",
        _ => return format!("unknown (magic 0x{magic:x})"),
    };
    name.to_string()
}
