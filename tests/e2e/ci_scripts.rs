//! `.ci`'s server scripts as a machine that never ran them meets them (issue 60, item 13): run
//! from a working directory that no longer exists, stdin from /dev/null, they start what they
//! start; a step that fails names its script, line and command instead of ending without a
//! word. A PostgreSQL cluster of the test's own (its own directory and port) stands in for
//! every server script: the same `cd` and error handling, seconds instead of minutes.

use std::path::Path;
use std::process::{Command, Output, Stdio};

/// Runs `script` (a path under the repository) with `env`, in a working directory removed
/// under it before it starts (a shell enters the directory, removes it, then runs the script).
fn from_a_deleted_directory(script: &str, env: &[(&str, &str)]) -> Output {
    let gone = tempfile::tempdir().unwrap().keep();
    let script = crate::util::root().join(script);
    Command::new("sh")
        .args(["-c", "cd \"$1\" && rmdir \"$1\" && exec bash \"$2\"", "sh"])
        .arg(&gone)
        .arg(&script)
        .stdin(Stdio::null())
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// Whether this machine can start a PostgreSQL cluster of the test's own (root, Debian's
/// PostgreSQL 15 and pgvector installed, as `.ci/pgvector/start-local-pg.sh` leaves them).
fn can_start_pg(test: &str) -> bool {
    let ok =
        unsafe { libc::geteuid() } == 0 && Path::new("/usr/lib/postgresql/15/bin/initdb").is_file();
    if !ok {
        assert!(
            std::env::var_os("EMBEDFLEET_REQUIRE_PG").is_none(),
            "{test}: EMBEDFLEET_REQUIRE_PG is set but this machine cannot start a cluster"
        );
        eprintln!("skipping {test}: needs root and Debian's PostgreSQL 15");
    }
    ok
}

#[test]
fn a_server_script_started_from_a_deleted_directory_starts_and_a_failed_step_is_named() {
    let test = "a_server_script_started_from_a_deleted_directory_starts_and_a_failed_step_is_named";
    if !can_start_pg(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let data = dir.path().join("pg");
    let port = 56000 + (std::process::id() % 900) as u16;
    let port = port.to_string();
    let env = [
        ("EMBEDFLEET_PG_DIR", data.to_str().unwrap()),
        ("EMBEDFLEET_PG_PORT", port.as_str()),
    ];
    let out = from_a_deleted_directory(".ci/pgvector/start-local-pg.sh", &env);
    let stop = || from_a_deleted_directory(".ci/pgvector/stop-local-pg.sh", &env);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        stop();
    }
    assert!(out.status.success(), "{err}");
    let answered = Command::new("/usr/lib/postgresql/15/bin/pg_isready")
        .args(["-h", "127.0.0.1", "-p", &port])
        .status()
        .unwrap();
    let stopped = stop();
    assert!(answered.success(), "the cluster answers on {port}");
    assert!(
        stopped.status.success(),
        "{}",
        String::from_utf8_lossy(&stopped.stderr)
    );

    // A step that fails says which script, line and command: a port that is no number.
    let bad = [
        ("EMBEDFLEET_PG_DIR", data.to_str().unwrap()),
        ("EMBEDFLEET_PG_PORT", "not-a-port"),
    ];
    let out = from_a_deleted_directory(".ci/pgvector/start-local-pg.sh", &bad);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(".ci/pgvector/start-local-pg.sh: line ") && err.contains("failed (exit"),
        "{err}"
    );
}

/// Every bash script under `.ci` names its failing line (sources `.ci/lib/err.sh`), but the one
/// sourced into a user's shell.
#[test]
fn every_ci_script_names_the_line_that_failed() {
    let ci = crate::util::root().join(".ci");
    let mut scripts = Vec::new();
    let mut stack = vec![ci.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if std::fs::read_to_string(&path)
                .is_ok_and(|t| t.starts_with("#!/usr/bin/env bash") || t.starts_with("#!/bin/bash"))
            {
                scripts.push(path);
            }
        }
    }
    assert!(scripts.len() > 8, "{scripts:?}");
    for script in scripts {
        let text = std::fs::read_to_string(&script).unwrap();
        if script.ends_with("cuda/gpu-env.sh") {
            continue;
        }
        assert!(
            text.contains("lib/err.sh"),
            "{} does not source .ci/lib/err.sh",
            script.display()
        );
    }
}

/// `.ci/qdrant/unpack-qdrant.sh`: an archive whose sha256 is not the one kept for the 1.18.3
/// server is refused with both sums named, and nothing is unpacked; a QDRANT_BIN that is no
/// executable is said to be so. The archive CI keeps beside the clone, where there is one,
/// unpacks into a server that says it is 1.18.3.
#[test]
fn the_qdrant_unpack_checks_the_archives_sha256_and_names_both_sums() {
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("qdrant.xz");
    std::fs::write(&fake, b"not the server").unwrap();
    let unpack_dir = dir.path().join("unpacked");
    std::fs::create_dir(&unpack_dir).unwrap();
    let run = |env: &[(&str, &str)]| {
        let mut cmd = Command::new("bash");
        cmd.arg(crate::util::root().join(".ci/qdrant/unpack-qdrant.sh"))
            .env_remove("QDRANT_BIN")
            .env("QDRANT_UNPACK_DIR", &unpack_dir)
            .stdin(Stdio::null());
        cmd.envs(env.iter().copied()).output().unwrap()
    };
    let out = run(&[("QDRANT_XZ", fake.to_str().unwrap())]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let kept_sum = "2d86bdfbc96e9e69ef94b17e6bdeb0661ffe3d5d21e63ced603e97f57c0a3e16";
    let fake_sum = Command::new("sha256sum").arg(&fake).output().unwrap();
    let fake_sum = String::from_utf8_lossy(&fake_sum.stdout);
    let fake_sum = fake_sum.split(' ').next().unwrap();
    assert_eq!(fake_sum.len(), 64, "{fake_sum}");
    assert!(err.contains(fake_sum) && err.contains(kept_sum), "{err}");
    assert_eq!(std::fs::read_dir(&unpack_dir).unwrap().count(), 0);

    let out = run(&[("QDRANT_BIN", fake.to_str().unwrap())]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("is not an executable file"),
        "{err}"
    );

    let kept = crate::util::root().join("../shared/qdrant/qdrant-1.18.3-x86_64-linux-gnu.xz");
    if !kept.is_file() {
        assert!(
            std::env::var_os("EMBEDFLEET_REQUIRE_QDRANT_SERVER").is_none(),
            "EMBEDFLEET_REQUIRE_QDRANT_SERVER is set but {} is missing",
            kept.display()
        );
        eprintln!("the kept archive's unpack skipped: no {}", kept.display());
        return;
    }
    let out = run(&[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let bin = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(bin.starts_with(unpack_dir.to_str().unwrap()), "{bin}");
    let version = Command::new(&bin).arg("--version").output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        "qdrant 1.18.3"
    );
}
