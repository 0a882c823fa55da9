//! The submit loop owner's CPU per poll at the study's shape (issue 39): a run.db of 2,075
//! batches written as the rehearsal leaves it mid-run (~2,200 job attempts with their embed runs
//! and ingested attempts, 4 one-paper shards per done batch, 64 jobs running, the rest
//! planned), then POLLS polls of what `SubmitLoop::run` does each round apart from the
//! scheduler's command: the ingest with nothing new, the open jobs, the batches without a job,
//! `RunDb::status`, the console line, the owner check, `status-snapshot.json` and the owner's
//! report (`metrics.prom`). Polls alternate between `status` from run.db's running counters
//! ("after") and from a recount of the tables (`RunDb::status_recounted`, "before"), so the
//! ratio is measured in one run on one machine state. Prints ms of this process's CPU per poll,
//! per part and in all; BENCHMARKS.md records the figures.
//!
//! Run: `cargo bench -p embedfleet-orchestrator --bench owner_poll [-- BATCHES POLLS]`
//! (debug build: add `--profile dev`).

use std::time::Duration;

use embedfleet_core::process::own_cpu;
use embedfleet_core::rundb::{RunDb, RunStatus};
use embedfleet_core::state::PlanState;
use embedfleet_core::status_snapshot::{write_snapshot, LoopState};
use embedfleet_orchestrator::report::owner::OwnerReport;
use embedfleet_orchestrator::submit::Console;

/// Jobs running at the poll (the rehearsal's two queues of 32).
const OPEN: i64 = 64;
/// Shards per batch (the rehearsal: one paper each, 4 papers per batch).
const SHARDS: i64 = 4;
/// Parts of a poll, in the order timed.
const PARTS: [&str; 5] = [
    "ingest",
    "open jobs + batches without job",
    "status",
    "console",
    "snapshot + report",
];

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let batches: i64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(2075);
    let polls: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(100);
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let done = batches * 3 / 4;
    let attempts = build_run(&run, batches, done);
    let mut db = RunDb::open(&run).unwrap();
    let mut report = OwnerReport::new(&run, Duration::from_secs(300));
    let mut console = Console::new(false);
    let mut state = LoopState {
        pid: std::process::id(),
        started_unix_s: 0.0,
        poll_interval_s: 30.0,
        last_poll_unix_s: 0.0,
        ended_unix_s: None,
        polls: 0,
        cpu_s: 0.0,
        result_file_ops: 0,
        ingest_cpu_s: 0.0,
        taken_in: 0,
        cpu_by_part_s: Default::default(),
        quiet_polls: 0,
        quiet_cpu_s: 0.0,
        routing: None,
        set_aside: Default::default(),
    };
    assert_eq!(db.status().unwrap(), db.status_recounted().unwrap());
    // [mode][part]: CPU seconds; mode 0 recounts ("before"), mode 1 reads the counters.
    let mut cpu = [[0.0f64; PARTS.len()]; 2];
    for poll in 0..2 * polls {
        let mode = poll % 2;
        let mut t = own_cpu();
        let mut lap = |part: usize, cpu: &mut [[f64; PARTS.len()]; 2]| {
            let now = own_cpu();
            cpu[mode][part] += (now - t).as_secs_f64();
            t = now;
        };
        db.ingest_results().unwrap();
        lap(0, &mut cpu);
        let open = db.open_jobs().unwrap();
        let pending = db.batches_without_job().unwrap();
        assert_eq!(
            (open.len(), pending.len()),
            (OPEN as usize, (batches - done - OPEN) as usize)
        );
        lap(1, &mut cpu);
        let status: RunStatus = if mode == 0 {
            db.status_recounted().unwrap()
        } else {
            db.status().unwrap()
        };
        lap(2, &mut cpu);
        console.update(&status, &open, false);
        lap(3, &mut cpu);
        assert!(embedfleet_core::owner::still_owner(&run).unwrap());
        state.polls += 1;
        state.last_poll_unix_s = embedfleet_core::owner::unix_now();
        write_snapshot(&run, &status, Some(state.clone())).unwrap();
        report.polled(&db, &status, &state).unwrap();
        lap(4, &mut cpu);
    }
    println!("{batches} batches ({done} done, {OPEN} running), {attempts} job attempts, {} shards; {polls} polls each way", done * SHARDS);
    println!(
        "{:<34} {:>10} {:>10} {:>8}",
        "ms of CPU per poll", "recount", "counters", "ratio"
    );
    let ms = |s: f64| s * 1e3 / polls as f64;
    for (i, part) in PARTS.iter().enumerate() {
        println!(
            "{part:<34} {:>10.3} {:>10.3} {:>8.3}",
            ms(cpu[0][i]),
            ms(cpu[1][i]),
            cpu[1][i] / cpu[0][i]
        );
    }
    let (before, after) = (cpu[0].iter().sum::<f64>(), cpu[1].iter().sum::<f64>());
    println!(
        "{:<34} {:>10.3} {:>10.3} {:>8.3}",
        "poll in all",
        ms(before),
        ms(after),
        after / before
    );
}

/// Writes the run: planned, `done` batches embedded (about 5 % after a cancelled attempt, 1 %
/// after a failed one), the next [`OPEN`] running, the rest planned. Returns the job attempts.
fn build_run(run: &std::path::Path, batches: i64, done: i64) -> i64 {
    let mut db = RunDb::create(run).unwrap();
    let tx = db.conn_mut().transaction().unwrap();
    tx.execute_batch(
        "INSERT INTO releases (id, command, started_at, planned_at, added, changed, withdrawn, unchanged)
         VALUES (1, 'plan', '2027-01-01T00:00:00.000Z', '2027-01-01T00:00:01.000Z', 0, 0, 0, 0);",
    )
    .unwrap();
    for file in 1..=5 {
        tx.execute(
            "INSERT INTO corpus_files (id, path, size, mtime_ns, edges, state, papers, quarantined, filtered)
             VALUES (?1, 'corpus-' || ?1 || '.jsonl.gz', 1, 1, '', 'planned', ?2, 2, 0)",
            rusqlite::params![file, batches * 4 / 5],
        )
        .unwrap();
        for line in 0..2 {
            tx.execute(
                "INSERT INTO quarantine (file_id, line, reason, detail) VALUES (?1, ?2, 'empty_text', '')",
                [file, line],
            )
            .unwrap();
        }
    }
    let mut rng = 2075u64;
    let mut draw = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % 1000) as f64 / 1000.0
    };
    let mut row = 0i64;
    let iso = |s: i64| {
        format!(
            "2027-01-01T{:02}:{:02}:{:02}.000Z",
            s / 3600 % 24,
            s / 60 % 60,
            s % 60
        )
    };
    for b in 1..=batches {
        let state = if b <= done {
            "done"
        } else if b <= done + OPEN {
            "running"
        } else {
            "planned"
        };
        tx.execute(
            "INSERT INTO batches (id, file_id, seq, path, n_rows, n_chars, state, results_settled)
             VALUES (?1, ?2, ?1, 'batches/b' || ?1 || '.parquet', 4, 1200, ?3, ?4)",
            rusqlite::params![b, 1 + b % 5, state, b <= done],
        )
        .unwrap();
        for r in 0..4 {
            tx.execute(
                "INSERT INTO papers (id, batch_id, row, line, n_chars) VALUES (?1, ?2, ?3, ?3, 300)",
                rusqlite::params![format!("p{}", b * 4 + r), b, r],
            )
            .unwrap();
        }
        if state == "planned" {
            continue;
        }
        let mut tries = Vec::new();
        if draw() < 0.05 {
            tries.push("cancelled");
        }
        if draw() < 0.01 {
            tries.push("failed");
        }
        tries.push(if state == "done" {
            "completed"
        } else {
            "running"
        });
        for (attempt, job_state) in tries.iter().enumerate() {
            row += 1;
            let name = format!("ef-run-b{b}-a{}", attempt + 1);
            let start = row * 2;
            tx.execute(
                "INSERT INTO jobs (batch_id, attempt, backend, queue, scheduler_id, state, submitted_at,
                                   started_at, finished_at, name, log, updated_at)
                 VALUES (?1, ?2, 'slurm', ?3, ?4, ?5, ?6, ?6, ?7, ?8, 'logs/' || ?8 || '.log', ?7)",
                rusqlite::params![
                    b,
                    attempt + 1,
                    if row % 2 == 0 { "debug" } else { "gpu" },
                    (100_000 + row).to_string(),
                    job_state,
                    iso(start),
                    (*job_state != "running").then(|| iso(start + 30)),
                    name
                ],
            )
            .unwrap();
            if *job_state == "running" {
                continue;
            }
            let ok = *job_state == "completed";
            tx.execute(
                "INSERT INTO batch_runs (batch_id, started_at, finished_at, devices, state, total_s, papers, tokens, job)
                 VALUES (?1, ?2, ?3, 'cuda:0', ?4, 29.0, 4, 2400, ?5)",
                rusqlite::params![b, iso(start), iso(start + 30), if ok { "done" } else { "failed" }, name],
            )
            .unwrap();
            tx.execute(
                "INSERT INTO attempts (batch_id, token, state, job, host, reason, cleaned, ingested_at)
                 VALUES (?1, ?2, ?3, ?4, 'node01', '', 1, ?5)",
                rusqlite::params![b, format!("t{row}"), if ok { "accepted" } else { "failed" }, name, iso(start + 30)],
            )
            .unwrap();
        }
        if state == "done" {
            for part in 0..SHARDS {
                tx.execute(
                    "INSERT INTO shards (batch_id, part, path, rows, sha256, created_at)
                     VALUES (?1, ?2, 'shards/b' || ?1 || '-' || ?2 || '.parquet', 1, '', '2027-01-01T00:00:00.000Z')",
                    [b, part],
                )
                .unwrap();
            }
        }
    }
    tx.commit().unwrap();
    db.set_plan_state(PlanState::Complete).unwrap();
    // A results folder per batch that had a job, as the rehearsal leaves them.
    for b in 1..=done + OPEN {
        std::fs::create_dir_all(db.layout().results_dir().join(format!("b{b}"))).unwrap();
    }
    row
}
