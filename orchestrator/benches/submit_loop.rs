//! The submit loop's own overhead at full-corpus scale: 10,000 planned batches through the
//! local backend, each job a shell script that only marks its batch done in run.db (needs the
//! `sqlite3` command). Prints time per round (poll + submit, sleeps excluded), submissions per
//! second and the size of run.db; BENCHMARKS.md records the figures.
//!
//! Run: `cargo bench -p embedfleet-orchestrator --bench submit_loop [-- BATCHES CAP]`

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use embedfleet_core::rundb::RunDb;
use embedfleet_orchestrator::submit::{submit, LoopPolicy, SubmitOptions, Submitted};

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let batches: i64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let cap: u32 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(32);
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut db = RunDb::create(&run).unwrap();
    {
        let tx = db.conn_mut().transaction().unwrap();
        tx.execute(
            "INSERT INTO corpus_files (id, path, size, mtime_ns, edges, state) VALUES (1, 'c', 0, 0, '', 'planned')",
            [],
        )
        .unwrap();
        for id in 1..=batches {
            tx.execute(
                "INSERT INTO batches (id, file_id, seq, path, n_rows, n_chars) VALUES (?1, 1, ?1, 'b', 4000, 1)",
                [id],
            )
            .unwrap();
        }
        tx.commit().unwrap();
    }
    db.set_plan_state(embedfleet_core::state::PlanState::Complete)
        .unwrap();
    drop(db);
    let fake = dir.path().join("fake-embedfleet");
    // BENCH_JOB_SLEEP spreads the jobs' run.db writes out as real jobs' are (minutes apart).
    let sleep = std::env::var("BENCH_JOB_SLEEP").unwrap_or_else(|_| "0".into());
    std::fs::write(
        &fake,
        format!("#!/bin/bash\n# embed-job --run-dir DIR --batch N\nsleep {sleep}\nsqlite3 \"$3/run.db\" \"PRAGMA busy_timeout=60000; UPDATE batches SET state='done' WHERE id=$5\" >/dev/null\n"),
    )
    .unwrap();
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&fake)
        .status()
        .unwrap();
    let options = SubmitOptions {
        run_dir: run.clone(),
        config: Default::default(),
        queues: Some(BTreeMap::from([("local".to_string(), cap)])),
        policy: LoopPolicy {
            max_attempts: 1,
            poll_interval: Duration::from_millis(50),
            lost_after: Duration::from_secs(30),
            breaker_after: 0,
            route: Default::default(),
            speculate: true,
            max_jobs: None,
        },
        embed_args: Vec::new(),
        exe: fake,
        progress: false,
        session: Default::default(),
        bytes_per_paper: 0,
        keep_on_first_job: Vec::new(),
    };
    let t = Instant::now();
    let db = RunDb::open(&options.run_dir).unwrap();
    let Submitted::Ran(report) = submit(db, &options, None, false).unwrap().0 else {
        unreachable!("not a dry run")
    };
    let secs = t.elapsed().as_secs_f64();
    let db_bytes: u64 = ["run.db", "run.db-wal"]
        .iter()
        .filter_map(|f| std::fs::metadata(run.join(f)).ok())
        .map(|m| m.len())
        .sum();
    assert_eq!(report.batches_done, batches as u64, "{:?}", report.failed);
    // This process only: the jobs are other processes.
    let cpu = embedfleet_core::process::own_cpu().as_secs_f64();
    println!(
        "the loop's own CPU (job processes excluded): {cpu:.2} s = {:.2} ms per batch",
        cpu * 1e3 / batches as f64
    );
    let ms = |d: Duration| d.as_secs_f64() * 1e3 / report.rounds as f64;
    println!(
        "per round: poll {:.2} ms, submit {:.2} ms, progress {:.2} ms",
        ms(report.busy_poll),
        ms(report.busy_submit),
        ms(report.busy_progress)
    );
    println!(
        "{batches} batches, cap {cap}: {secs:.1} s; {} rounds, {:.2} ms per round (poll + submit, \
         sleeps excluded; {:.0} % of the wall time); {:.0} submissions/s; run.db {:.1} MiB",
        report.rounds,
        report.busy.as_secs_f64() * 1e3 / report.rounds as f64,
        100.0 * report.busy.as_secs_f64() / secs,
        report.submitted as f64 / secs,
        db_bytes as f64 / (1 << 20) as f64
    );
}
