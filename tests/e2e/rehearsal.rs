//! The reduced dress rehearsal: `benches/rehearsal.sh` at 100 batches through the real
//! one-node Slurm, every fault kind once (jobs cancelled while running, the submit loop
//! SIGKILLed three times and restarted with no options, a partition drained, a result manifest
//! unreadable for a poll, a job hung until its walltime), into the embedded Qdrant, then query,
//! eval and publish. Its end counts are read by pyarrow, qdrant-edge-py and `datasets`.
//!
//! Through Slurm, the vectors go into a three-peer Qdrant cluster of the script's own (from
//! `QDRANT_BIN`, which `.ci/run` sets) as grouped shards, one peer SIGKILLed mid-load and started
//! again; the query workload and eval then run through the cluster. Through PBS, and through
//! Slurm where no server binary is given, into the embedded Qdrant.
//!
//! The drained partition is `rehearsal`, one no other test submits to (the CI cluster has it:
//! .ci/slurm/start-local-slurm.sh), so the drain cannot fail a test running beside this one.
//!
//! The same rehearsal runs through the real one-node OpenPBS (`SCHEDULER=pbs`,
//! .ci/pbs/start-local-pbs.sh): jobs deleted with `qdel`, the queue `rehearsal` disabled for a
//! while, the hung job killed by PBS at its walltime (Exit_status -29).

use crate::browser;
use crate::pbs_util::pbs_up;
use crate::util::{python, slurm_up};
use std::process::Command;

#[test]
fn a_reduced_rehearsal_through_slurm_with_every_fault_kind_ends_with_exact_counts() {
    let test = "a_reduced_rehearsal_through_slurm_with_every_fault_kind_ends_with_exact_counts";
    if !slurm_up(test) {
        return;
    }
    let partitions = Command::new("sinfo")
        .args(["-h", "-o", "%R"])
        .output()
        .unwrap();
    if !String::from_utf8_lossy(&partitions.stdout)
        .lines()
        .any(|p| p.trim() == "rehearsal")
    {
        assert!(
            std::env::var("EMBEDFLEET_REQUIRE_SLURM").as_deref() != Ok("1"),
            "{test}: the Slurm cluster has no partition `rehearsal`: restart it with .ci/slurm/start-local-slurm.sh"
        );
        eprintln!(
            "skipping {test}: no partition `rehearsal` (restart .ci/slurm/start-local-slurm.sh)"
        );
        return;
    }
    // The cluster's peers: a server binary of CI's (or the developer's own) is needed.
    let peers = match std::env::var("QDRANT_BIN") {
        Ok(bin) if std::path::Path::new(&bin).is_file() => 3,
        _ => {
            assert!(
                std::env::var("EMBEDFLEET_REQUIRE_QDRANT_SERVER").as_deref() != Ok("1"),
                "{test}: EMBEDFLEET_REQUIRE_QDRANT_SERVER=1 but QDRANT_BIN names no qdrant binary \
                 (.ci/qdrant/unpack-qdrant.sh)"
            );
            eprintln!("{test}: no QDRANT_BIN: into the embedded Qdrant, not a three-peer cluster");
            0
        }
    };
    rehearse("slurm", "scancel", peers);
}

#[test]
fn a_reduced_rehearsal_through_pbs_with_every_fault_kind_ends_with_exact_counts() {
    let test = "a_reduced_rehearsal_through_pbs_with_every_fault_kind_ends_with_exact_counts";
    if !pbs_up(test) {
        return;
    }
    let queue = crate::pbs_util::pbs("qstat")
        .args(["-Q", "rehearsal"])
        .output();
    if !queue.is_ok_and(|o| o.status.success()) {
        assert!(
            std::env::var("EMBEDFLEET_REQUIRE_PBS").as_deref() != Ok("1"),
            "{test}: the PBS server has no queue `rehearsal`: start it again with .ci/pbs/start-local-pbs.sh"
        );
        eprintln!("skipping {test}: no queue `rehearsal` (start .ci/pbs/start-local-pbs.sh again)");
        return;
    }
    rehearse("pbs", "qdel", 0);
}

/// benches/rehearsal.sh at 100 batches through `scheduler`, whose job cancels the report
/// names `cancel_kind`, into a cluster of `peers` Qdrant peers (0: the embedded Qdrant, read
/// back by qdrant-edge-py; else one killed mid-load); its report checked.
fn rehearse(scheduler: &str, cancel_kind: &str, peers: usize) {
    // The readers that are not ours must be there (or the test is skipped, outside CI).
    for (module, env) in [
        ("pyarrow", "EMBEDFLEET_REQUIRE_PYARROW"),
        ("datasets", "EMBEDFLEET_REQUIRE_DATASETS"),
        ("qdrant_edge", "EMBEDFLEET_REQUIRE_QDRANT_EDGE"),
    ] {
        if (module != "qdrant_edge" || peers == 0) && python("pass", module, env).is_none() {
            return;
        }
    }
    let peers_env = peers.to_string();
    let work = tempfile::tempdir().unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/rehearsal.sh");
    let out = Command::new("bash")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_embedfleet"))
        .env("WORK", work.path().join("w"))
        .envs([
            ("SCHEDULER", scheduler),
            ("BATCHES", "100"),
            ("QUEUES", "debug=8 rehearsal=8"),
            ("DRAIN_PARTITION", "rehearsal"),
            ("DRAIN_S", "15"),
            ("WALLTIME", "00:01:00"),
            ("CANCEL_PCT", "3"),
            ("TERMS", "500"),
            ("PEERS", peers_env.as_str()),
            ("PEER_KILL", if peers > 0 { "1" } else { "0" }),
            // Its own ports: the cluster .ci/run starts is on 6433-6455.
            ("PORT_BASE", "7400"),
            ("MEASURE", "0"),
            ("HF_DATASETS_OFFLINE", "1"),
            ("HF_HUB_OFFLINE", "1"),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report = std::fs::read_to_string(work.path().join("w/report.json")).unwrap_or_else(|e| {
        panic!(
            "no report ({e}):\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    assert!(out.status.success(), "{stdout}");
    assert_eq!(report["checks_failed"], 0, "{stdout}");
    // `field` of each entry of the report's list `list`.
    let fields = |list: &str, field: &str| -> Vec<String> {
        report[list]
            .as_array()
            .unwrap()
            .iter()
            .map(|entry| entry[field].as_str().unwrap().to_string())
            .collect()
    };
    // Every fault struck, as often as asked.
    let kinds = fields("faults", "kind");
    let count = |k: &str| kinds.iter().filter(|x| *x == k).count();
    assert_eq!(count("loop_killed"), 3, "{kinds:?}");
    assert_eq!(count(cancel_kind), 3, "{kinds:?}");
    for kind in ["drain", "drain_end", "unreadable_manifest", "hang"] {
        assert_eq!(count(kind), 1, "{kind}: {kinds:?}");
    }
    let crashes = usize::from(peers > 0);
    assert_eq!(count("peer_killed"), crashes, "{kinds:?}");
    assert_eq!(count("peer_started"), crashes, "{kinds:?}");
    // The exact counts, each checked by the script against a reader that is not ours.
    let checks = fields("checks", "check");
    for check in [
        "batches_done",
        "hung_job_timed_out",
        "shard_rows_are_good_papers",
        "shard_ids_unique",
        "points_are_good_papers",
        if peers > 0 {
            "qdrant_peers"
        } else {
            "points_are_good_papers"
        },
        "query_rows",
        "published_rows",
        "trace_rows_are_job_attempts",
    ] {
        assert!(
            checks.iter().any(|c| c == check),
            "{check} not checked: {checks:?}"
        );
    }
    // The last loop's own account of its rounds, the quiet ones (nothing arrived) apart.
    let last = report["windows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["stage"] == "last_loop")
        .unwrap_or_else(|| panic!("no last_loop line: {}", report["windows"]));
    let (polls, quiet) = (
        last["polls"].as_f64().unwrap(),
        last["quiet_polls"].as_f64().unwrap(),
    );
    assert!(polls >= 1.0 && quiet <= polls, "{last}");
    assert!(
        quiet == 0.0 || last["cpu_ms_per_quiet_poll"].as_f64().unwrap() > 0.0,
        "{last}"
    );
    report_in_a_browser(&work.path().join("w"));
}

/// The rehearsal's `report --html` in headless Chromium: a bar per job attempt in run.db, the
/// failed attempts listed, no script error.
fn report_in_a_browser(work: &std::path::Path) {
    let db = embedfleet_core::rundb::RunDb::open(&work.join("run")).unwrap();
    let count = |sql: &str| -> usize {
        db.conn()
            .query_row(sql, [], |r| r.get::<_, i64>(0))
            .unwrap() as usize
    };
    let attempts = count("SELECT count(*) FROM jobs");
    let failed = count(
        "SELECT count(*) FROM jobs WHERE state IN ('failed', 'node_fail', 'out_of_memory', 'timeout', 'lost')",
    );
    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("rehearsal-report.png");
    let Some(r) = browser::render(&work.join("report.html"), Some(&shot)) else {
        return;
    };
    assert!(
        r.dom.contains("data-rendered=\"1\""),
        "the page's script did not finish"
    );
    assert!(
        !r.dom.contains("data-js-errors=\""),
        "script errors in the page"
    );
    assert_eq!(r.dom.matches("<g class=\"bar\"").count(), attempts);
    assert_eq!(r.dom.matches("<tr class=\"failure\">").count(), failed);
    assert!(failed >= 1, "the hung job's walltime is a failure");
}
