//! The report's figures, trace, metrics and page over a small run written straight into run.db:
//! three batches, one done on its first attempt, one failed then done, one cancelled.

use super::*;
use crate::report::{html, metrics, trace};
use embedfleet_core::rundb::{BatchTimings, NewJob, RunDb};
use embedfleet_core::state::JobStatus;
use embedfleet_core::BatchId;

const PLANTED: &str = "<script>document.body.dataset.pwned = 1</script>";

fn run_db() -> (tempfile::TempDir, RunDb) {
    let dir = tempfile::tempdir().unwrap();
    let mut db = RunDb::create(dir.path()).unwrap();
    db.conn()
        .execute(
            "INSERT INTO corpus_files (id, path, size, mtime_ns, edges) VALUES (1, 'c', 0, 0, '')",
            [],
        )
        .unwrap();
    for id in 1..=3 {
        db.conn()
            .execute(
                "INSERT INTO batches (id, file_id, seq, path, n_rows, n_chars) VALUES (?1, 1, ?1, 'b', 4, 1)",
                [id],
            )
            .unwrap();
    }
    let jobs = [
        (1, 1, "j1", JobStatus::Completed, None),
        (2, 1, "j2a", JobStatus::Failed, Some("failed (exit code 3)")),
        (2, 2, "j2b", JobStatus::Completed, None),
        (3, 1, "j3", JobStatus::Cancelled, Some("cancelled")),
    ];
    for (batch, attempt, name, state, reason) in jobs {
        let log = format!("logs/{name}.log");
        db.insert_job(&NewJob {
            batches: &[batch],
            attempt,
            backend: "slurm",
            queue: "gpu\"<b>",
            name,
            script: "s",
            log: &log,
            marker: "m",
        })
        .unwrap();
        db.set_job_submitted(name, &format!("{}", 100 + batch))
            .unwrap();
        db.set_job_state(name, JobStatus::Running, None).unwrap();
        if state == JobStatus::Completed {
            let now = embedfleet_core::owner::unix_now();
            let t = BatchTimings {
                papers: 4,
                tokens: 400,
                total_s: 2.0,
                inference_s: 1.5,
                model_load_s: 0.5,
                ..BatchTimings::default()
            };
            db.record_batch_run(BatchId(batch), Some(name), now, now + 2.0, "cpu", &t, None)
                .unwrap();
            db.conn()
                .execute(
                    "INSERT INTO attempts (batch_id, token, state, job, host, reason, ingested_at)
                     VALUES (?1, ?2, 'accepted', ?2, 'node<1>', '', strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
                    rusqlite::params![batch, name],
                )
                .unwrap();
        }
        db.set_job_state(name, state, reason).unwrap();
    }
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    std::fs::write(
        dir.path().join("logs/j2a.log"),
        format!("loading\nError: CUDA out of memory {PLANTED}\n"),
    )
    .unwrap();
    (dir, db)
}

fn figures_of(dir: &std::path::Path, db: &RunDb) -> (AttemptHistory, Figures) {
    let history = AttemptHistory::load(db).unwrap();
    let status = db.status().unwrap();
    let quarantined = vec![(PLANTED.to_string(), "embed_failed".into(), "x".into())];
    let mut cache = std::collections::HashMap::new();
    let figures = compute(&status, &history, quarantined, |a| {
        crate::report::owner::first_error(dir, &mut cache, a)
    });
    (history, figures)
}

#[test]
fn every_attempt_is_a_bar_and_the_failed_one_is_listed_with_its_first_error_line() {
    let (dir, db) = run_db();
    let (_, f) = figures_of(dir.path(), &db);
    assert_eq!(f.bars.len(), 4);
    let outcomes: Vec<Outcome> = f.bars.iter().map(|b| b.outcome).collect();
    use Outcome::*;
    assert_eq!(outcomes, [Done, Failed, Done, Preempted]);
    assert_eq!(f.failures.len(), 1);
    let failure = &f.failures[0];
    assert_eq!((failure.batch, failure.attempt), (2, 1));
    assert_eq!(
        failure.first_error.as_deref(),
        Some(format!("Error: CUDA out of memory {PLANTED}").as_str())
    );
    assert_eq!(f.queues.len(), 1);
    let q = &f.queues[0];
    assert_eq!((q.attempts, q.done, q.failed, q.preempted), (4, 2, 1, 1));
    assert_eq!(q.start_delays_s.len(), 4);
    assert_eq!(f.hosts.len(), 1);
    assert_eq!(f.hosts[0].papers, 8);
    assert!(
        (f.hosts[0].papers_per_s - 2.0).abs() < 1e-9,
        "{:?}",
        f.hosts
    );
    let b = f.breakdown.as_ref().unwrap();
    assert_eq!(b.runs, 2);
    assert!((b.inference_s - 1.5).abs() < 1e-9);
    assert_eq!(f.progress.last().unwrap().1, 8, "{:?}", f.progress);
}

#[test]
fn the_page_holds_everything_from_outside_as_text() {
    let (dir, db) = run_db();
    let (_, f) = figures_of(dir.path(), &db);
    let page = html::render(&f);
    // The two script elements the page brings, and no other.
    assert_eq!(page.matches("<script").count(), 2, "{page}");
    assert!(!page.contains("node<1>") && !page.contains("gpu\"<b>"));
    assert!(page.contains("&lt;script&gt;document.body.dataset.pwned"));
    assert!(page.contains("gpu&quot;&lt;b&gt;"));
    // Nothing fetched: no element that loads (the SVG namespace is a name, not a fetch).
    for loads in [
        "src=",
        "<link",
        "url(",
        "@import",
        "fetch(",
        "XMLHttpRequest",
    ] {
        assert!(!page.contains(loads), "{loads}");
    }
}

#[test]
fn the_trace_has_a_line_per_attempt_in_nextflows_names() {
    let (dir, db) = run_db();
    let (history, _) = figures_of(dir.path(), &db);
    let text = trace::render(&history);
    let lines: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(lines.len(), 5);
    assert_eq!(lines[0], trace::FIELDS);
    assert!(lines.iter().all(|l| l.len() == trace::FIELDS.len()));
    assert_eq!(lines[2][3], "FAILED");
    assert_eq!(lines[2][4], "3");
    assert_eq!(lines[1][4], "0");
    assert_eq!(lines[1][13], "node<1>");
    assert_eq!(lines[4][13], "-");
}

#[test]
fn metrics_count_by_queue_and_outcome_with_escaped_labels() {
    let (dir, db) = run_db();
    let (history, _) = figures_of(dir.path(), &db);
    let status = db.status().unwrap();
    let text = metrics::render(&metrics::MetricsInput {
        status: &status,
        history: &history,
        submit_loop: None,
    });
    assert!(text.contains("embedfleet_papers_planned 12\n"), "{text}");
    assert!(
        text.contains("embedfleet_job_failures_total{queue=\"gpu\\\"<b>\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("embedfleet_job_preemptions_total{queue=\"gpu\\\"<b>\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("embedfleet_batches{state=\"planned\"} 3\n"),
        "{text}"
    );
    // The history's counts follow each change, not a recount.
    let mut history = history;
    db.set_job_state("j1", JobStatus::Failed, Some("later"))
        .unwrap();
    history.refresh(&db).unwrap();
    let failed: u64 = history
        .counts()
        .iter()
        .filter(|((_, o), _)| *o == Outcome::Failed)
        .map(|(_, n)| n)
        .sum();
    assert_eq!(failed, 2);
    assert_eq!(history.counts().values().sum::<u64>(), 4);
}

#[test]
fn the_owner_rewrites_its_files_when_due_not_every_poll() {
    use crate::report::owner::OwnerReport;
    use embedfleet_core::RunLayout;
    let (dir, db) = run_db();
    let mut owner = OwnerReport::new(dir.path(), std::time::Duration::from_secs(3600));
    let status = db.status().unwrap();
    let now = embedfleet_core::owner::unix_now();
    let mut state = embedfleet_core::status_snapshot::LoopState {
        pid: 1,
        started_unix_s: now,
        poll_interval_s: 30.0,
        last_poll_unix_s: now,
        ended_unix_s: None,
        polls: 1,
        cpu_s: 0.02,
        result_file_ops: 0,
        ingest_cpu_s: 0.0,
        taken_in: 0,
        cpu_by_part_s: Default::default(),
        quiet_polls: 0,
        quiet_cpu_s: 0.0,
        routing: None,
        set_aside: Default::default(),
    };
    owner.polled(&db, &status, &state).unwrap();
    let page = RunLayout::new(dir.path()).report_page();
    assert!(std::fs::read_to_string(&page)
        .unwrap()
        .contains("id=\"timeline\""));
    std::fs::remove_file(&page).unwrap();
    let metrics_file = RunLayout::new(dir.path()).metrics_file();
    let polls = |n: u32| {
        let metrics = std::fs::read_to_string(&metrics_file).unwrap();
        metrics.contains(&format!("embedfleet_owner_polls_total {n}\n"))
    };
    assert!(polls(1));
    state.polls = 2;
    owner.polled(&db, &status, &state).unwrap();
    assert!(!page.exists(), "the page is due every hour here");
    assert!(polls(1), "the metrics are due every 10 s, not every poll");
    owner.finish(&status, &state);
    assert!(page.exists(), "written once more at the loop's end");
    assert!(polls(2));
    let metrics = std::fs::read_to_string(&metrics_file).unwrap();
    assert!(
        metrics.contains("embedfleet_owner_poll_cpu_seconds 0.01\n"),
        "{metrics}"
    );
}

#[test]
fn the_page_shows_the_latest_eval_when_the_run_has_one() {
    let (dir, _db) = run_db();
    let page = crate::report::html_page(&RunDb::open(dir.path()).unwrap(), dir.path()).unwrap();
    assert!(!page.contains("id=\"eval\""));
    std::fs::create_dir_all(dir.path().join("eval")).unwrap();
    let latest = serde_json::json!({"format_version": 1, "collection": "papers", "k": 10,
        "queries": 200, "rows": [{"filter": "<i>year</i>", "search": "ef=64", "ef": 64,
        "recall": 0.98, "short_share": 0.0, "queries_per_s": 900.0,
        "latency": {"p50_ms": 1.0, "p95_ms": 2.5, "p99_ms": 3.0}}]});
    std::fs::write(dir.path().join("eval/latest.json"), latest.to_string()).unwrap();
    let page = crate::report::html_page(&RunDb::open(dir.path()).unwrap(), dir.path()).unwrap();
    assert!(page.contains("id=\"eval\""));
    assert!(
        page.contains("<td>&lt;i&gt;year&lt;/i&gt;</td><td>ef=64</td><td class=\"n\">0.9800</td>")
    );
}

#[test]
fn the_page_shows_the_databases_side_by_side_when_the_run_compared_them() {
    let (dir, _db) = run_db();
    let page = crate::report::html_page(&RunDb::open(dir.path()).unwrap(), dir.path()).unwrap();
    assert!(!page.contains("id=\"compare\""));
    std::fs::create_dir_all(dir.path().join("eval")).unwrap();
    let row = |database: &str, tuning: &str, reached: bool, recall: f64, short: f64| {
        serde_json::json!({"database": database, "index": "hnsw (m=16, ef_construction=100)",
            "filter": "year=1999", "selectivity": 0.0102, "tuning": tuning,
            "reached_floor": reached, "recall": recall, "short_share": short,
            "queries_per_s": 800.0, "latency": {"p50_ms": 1.2, "p95_ms": 2.0, "p99_ms": 3.5}})
    };
    let compare = serde_json::json!({"format_version": 1, "k": 10, "floor": 0.95,
        "queries": 200, "rows": [
            row("qdrant (embedded)", "ef=32", true, 0.97, 0.0),
            row("pgvector", "ef=1000", false, 0.90, 0.0),
            row("pgvector, defaults (no iterative scan)", "defaults", false, 0.05, 0.99)]});
    std::fs::write(dir.path().join("eval/compare.json"), compare.to_string()).unwrap();
    let page = crate::report::html_page(&RunDb::open(dir.path()).unwrap(), dir.path()).unwrap();
    assert!(page.contains("id=\"compare\""), "the section is there");
    assert!(page.contains("<td>qdrant (embedded)</td>"));
    assert!(page.contains("<td>ef=1000 (floor not reached)</td>"));
    assert!(
        page.contains("<td class=\"n\">99.0 %</td>"),
        "the short answers"
    );
    assert!(
        page.contains("<td>defaults</td>"),
        "defaults are not a miss"
    );
}

#[test]
fn the_page_shows_the_upload_rate_tunes_curve_and_the_query_workload_when_the_run_has_them() {
    use crate::report::activity::*;
    let (dir, db) = run_db();
    let page = crate::report::html_page(&RunDb::open(dir.path()).unwrap(), dir.path()).unwrap();
    for id in ["upload-runs", "tune-plot", "query-run"] {
        assert!(
            !page.contains(&format!("id=\"{id}\"")),
            "{id} without a record"
        );
    }
    let collection = format!("papers@{PLANTED}");
    record_upload(
        &db,
        UploadRun {
            collection: collection.clone(),
            points: 8300,
            seconds: 4.15,
            batch_size: 256,
            in_flight: 4,
            workers: 3,
            ended_unix_s: 1.8e9,
        },
    )
    .unwrap();
    let trial = |sweep: &str, batch_size, in_flight, points_per_s| TuneTrial {
        sweep: sweep.into(),
        batch_size,
        in_flight,
        points_per_s,
    };
    db.set_setting(
        TUNE_RUN_SETTING,
        &TuneRun {
            sink: "server".into(),
            trials: vec![
                trial("batch", 64, 2, 900.0),
                trial("batch", 256, 2, 1800.0),
                trial("in_flight", 256, 4, 2400.0),
            ],
            batch_size: 256,
            in_flight: 4,
            points_per_s: 2400.0,
            ended_unix_s: 1.8e9,
        },
    )
    .unwrap();
    db.set_setting(
        QUERY_RUN_SETTING,
        &QueryRun {
            collection: collection.clone(),
            queries: 22723,
            already_done: 723,
            rows: 220000,
            embed_s: 30.0,
            search_s: 11.0,
            queries_per_s: 2000.0,
            p50_ms: 1.5,
            p95_ms: 4.0,
            p99_ms: 7.25,
            ended_unix_s: 1.8e9,
        },
    )
    .unwrap();
    let page = crate::report::html_page(&RunDb::open(dir.path()).unwrap(), dir.path()).unwrap();
    // The rate (8,300 points in 4.15 s), escaped where it came from outside.
    assert!(
        page.contains("<td class=\"n\">8300</td><td class=\"n\">4.2</td><td class=\"n\">2000</td>"),
        "{page}"
    );
    assert!(!page.contains(&format!("<td>{collection}")));
    assert_eq!(page.matches("class=\"tune-bar\"").count(), 3);
    assert!(page.contains("fill=\"#1f5f8b\"><title>in_flight sweep: batch 256, 4 in flight"));
    assert!(page.contains("<td class=\"n\">22723</td><td class=\"n\">22000</td>"));
    assert!(page.contains("<td class=\"n\">7.25</td>"));
    // Still one script of its own, nothing run from the records.
    assert_eq!(page.matches("<script").count(), 2);
}
