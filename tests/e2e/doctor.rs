//! `doctor` on this machine (a CPU build): the build, the devices, one forward, the run
//! directory's filesystem; a broken model directory is one clear problem line and exit 1.

use crate::util::TestDir;

#[test]
fn doctor_reports_the_build_devices_and_one_forward() {
    let t = TestDir::new();
    t.run(&["make-tiny-model", "--out", "model"], 0);
    std::fs::create_dir_all(t.join("run")).unwrap();
    let args = [
        "doctor",
        "--model-dir",
        "model",
        "--devices",
        "cpu:2",
        "--run-dir",
        "run",
        "--attention",
    ];
    let out = t.run(&args, 0);
    let stdout = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "CPU build",
        "devices: cpu, cpu",
        "fingerprint",
        "forward: cpu: 512 tokens",
        // The kernel the model's forward ran (the CPU's own, in f32).
        "-d vector, tiled-cpu attention",
        "run dir:",
        "writable, filesystem",
        "no problems found",
        // The probe, once per distinct device.
        "attention on cpu: blockwise",
    ] {
        assert!(stdout.contains(needle), "doctor says {needle}:\n{stdout}");
    }
    assert_eq!(
        stdout.matches("forward: cpu").count(),
        2,
        "one forward per device"
    );
    assert_eq!(stdout.matches("attention on cpu").count(), 1, "{stdout}");
}

#[test]
fn doctor_checks_the_precision_asked_or_the_one_the_run_pinned() {
    let t = TestDir::new();
    t.run(&["make-tiny-model", "--out", "model"], 0);
    let fp8_refused = |stdout: &str| {
        stdout.contains("precision: fp8")
            && stdout
                .lines()
                .any(|l| l.starts_with("problem: the model does not load: --precision fp8"))
    };
    let args = ["doctor", "--model-dir", "model", "--devices", "cpu"];
    let out = t.run(&[&args[..], &["--precision", "fp8"]].concat(), 1);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(fp8_refused(&stdout), "{stdout}");
    // A run whose first submit pinned FP8: doctor --run-dir checks it without being told.
    std::fs::create_dir_all(t.join("run")).unwrap();
    let settings = serde_json::json!({
        "model": "x", "model_dir": "model", "dim": null, "vector_dtype": "f32",
        "precision": "fp8", "max_tokens": null, "shard_papers": 500, "pooling": "last_token",
        "normalized": true, "instruction": null
    });
    std::fs::write(t.join("run/output-settings.json"), settings.to_string()).unwrap();
    let out = t.run(&[&args[..], &["--run-dir", "run"]].concat(), 1);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(fp8_refused(&stdout), "{stdout}");
    // Asked for native, it is native: one forward, no problem from the model.
    let out = t.run(
        &[&args[..], &["--run-dir", "run", "--precision", "native"]].concat(),
        0,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("forward: cpu") && !stdout.contains("precision: fp8"),
        "{stdout}"
    );
}

#[test]
fn doctor_names_a_broken_model_directory_and_a_device_this_build_lacks() {
    let t = TestDir::new();
    t.run(&["make-tiny-model", "--out", "model"], 0);
    std::fs::remove_file(t.join("model/tokenizer.json")).unwrap();
    let out = t.run(&["doctor", "--model-dir", "model"], 1);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let problems: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("problem:"))
        .collect();
    assert_eq!(problems.len(), 1, "{stdout}");
    assert!(problems[0].contains("tokenizer.json"), "{stdout}");
    let out = t.run(&["doctor", "--devices", "cuda:0", "--attention"], 1);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("problem: cuda:0") && stdout.contains("--features cuda"),
        "{stdout}"
    );
    // The probe of a GPU this build cannot drive is a problem line too, saying what to use.
    assert!(
        stdout.contains("fused attention kernel cannot run on cuda:0")
            && stdout.contains("EMBEDFLEET_ATTENTION=blockwise"),
        "{stdout}"
    );
}
