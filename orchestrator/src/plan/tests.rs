use super::*;
use embedfleet_core::batchfile;
use embedfleet_core::quarantine::QuarantineReason;

fn line(id: &str, chars: usize) -> String {
    format!("{{\"id\":\"{id}\",\"text\":\"{}\"}}\n", "x".repeat(chars))
}

fn options(dir: &Path, corpus: Vec<PathBuf>, settings: PlanSettings) -> PlanOptions {
    PlanOptions {
        corpus,
        run_dir: dir.join("run"),
        settings,
        threads: 2,
        progress: false,
    }
}

/// Every (batch, ids in row order) of a run, from the batch files themselves.
fn batches(run_dir: &Path) -> Vec<Vec<String>> {
    let db = RunDb::open(run_dir).unwrap();
    let mut stmt = db
        .conn()
        .prepare("SELECT path FROM batches ORDER BY file_id, seq")
        .unwrap();
    let paths: Vec<String> = stmt
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    paths
        .iter()
        .map(|p| {
            let mut ids = Vec::new();
            batchfile::read(&run_dir.join(p), |row| ids.push(row.paper.id)).unwrap();
            ids
        })
        .collect()
}

#[test]
fn cuts_jobs_by_papers_and_chars_and_gives_an_oversized_paper_its_own_job() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("c.jsonl");
    let text: String = [
        ("a", 10),
        ("b", 10),
        ("c", 10),
        ("huge", 500),
        ("d", 10),
        ("e", 45),
        ("f", 10),
    ]
    .iter()
    .map(|(id, n)| line(id, *n))
    .collect();
    std::fs::write(&corpus, text).unwrap();
    let settings = PlanSettings {
        papers_per_job: 3,
        max_job_chars: Some(60),
        ..PlanSettings::default()
    };
    let opts = options(dir.path(), vec![corpus], settings);
    let report = plan(&opts).unwrap();
    assert_eq!(report.papers, 7);
    let got = batches(&opts.run_dir);
    assert_eq!(
        got,
        [vec!["a", "b", "c"], vec!["huge"], vec!["d", "e"], vec!["f"]]
    );
    assert_eq!(report.batches, 4);
}

#[test]
fn planning_again_is_a_no_op_and_a_changed_corpus_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.jsonl");
    let b = dir.path().join("b.jsonl");
    std::fs::write(&a, line("1", 5) + &line("2", 5)).unwrap();
    std::fs::write(&b, line("3", 5)).unwrap();
    let opts = options(
        dir.path(),
        vec![dir.path().to_path_buf()],
        PlanSettings::default(),
    );
    let first = plan(&opts).unwrap();
    assert!(!first.already_planned);
    let before = batches(&opts.run_dir);
    let again = plan(&opts).unwrap();
    assert!(again.already_planned);
    assert_eq!((again.papers, again.batches), (first.papers, first.batches));
    assert_eq!(batches(&opts.run_dir), before);

    std::fs::write(&b, line("3", 6)).unwrap();
    std::fs::write(dir.path().join("new.jsonl"), line("9", 5)).unwrap();
    let err = plan(&opts).unwrap_err();
    assert!(err.is_refusal());
    let message = err.to_string();
    assert!(
        message.contains("b.jsonl: size") && message.contains("new.jsonl: added"),
        "{message}"
    );
    assert!(
        !message.contains("a.jsonl"),
        "unchanged files are not named: {message}"
    );

    let other = PlanSettings {
        papers_per_job: 7,
        ..PlanSettings::default()
    };
    let err = plan(&options(dir.path(), vec![a], other)).unwrap_err();
    assert!(matches!(err, PlanError::SettingsChanged { .. }), "{err}");
}

#[test]
fn duplicates_keep_the_first_occurrence_in_corpus_order() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.jsonl");
    let b = dir.path().join("b.jsonl");
    std::fs::write(&a, line("x", 5) + &line("y", 5) + &line("x", 6)).unwrap();
    std::fs::write(&b, line("y", 5) + &line("z", 5)).unwrap();
    let opts = options(
        dir.path(),
        vec![a.clone(), b.clone()],
        PlanSettings::default(),
    );
    let report = plan(&opts).unwrap();
    assert_eq!((report.papers, report.duplicates), (3, 2));
    let q = read_quarantine(&opts.run_dir).unwrap();
    let dups: Vec<_> = q
        .iter()
        .filter(|e| e.reason == QuarantineReason::DuplicateId)
        .collect();
    assert_eq!(dups.len(), 2);
    let a_path = std::fs::canonicalize(&a).unwrap().display().to_string();
    assert_eq!(dups[0].id.as_deref(), Some("x"));
    assert_eq!(dups[0].line, 3);
    assert_eq!(
        dups[0].first_occurrence.as_deref(),
        Some(format!("{a_path}:1").as_str())
    );
    assert_eq!(dups[1].id.as_deref(), Some("y"));
    assert_eq!(
        dups[1].first_occurrence.as_deref(),
        Some(format!("{a_path}:2").as_str())
    );
    let db = RunDb::open(&opts.run_dir).unwrap();
    let batch_of_b: embedfleet_core::BatchId = db
        .conn()
        .query_row("SELECT id FROM batches WHERE file_id = 2", [], |r| r.get(0))
        .unwrap();
    assert_eq!(db.excluded_rows(batch_of_b).unwrap(), [0]);
    assert_eq!(
        db.status()
            .unwrap()
            .quarantined_by_reason
            .get("duplicate_id"),
        Some(&2)
    );
    // A plan killed after resolving the duplicates but before it was marked complete resolves
    // them again on the next run: nothing may be counted twice.
    drop(db);
    let mut db = RunDb::open(&opts.run_dir).unwrap();
    let excluded = |db: &RunDb| -> i64 {
        db.conn()
            .query_row("SELECT sum(n_excluded) FROM batches", [], |r| r.get(0))
            .unwrap()
    };
    assert_eq!(excluded(&db), 2);
    assert_eq!(
        db.resolve_duplicates().unwrap(),
        2,
        "the run has two duplicates"
    );
    assert_eq!(excluded(&db), 2, "no exclusion counted twice");
    assert_eq!(
        db.status()
            .unwrap()
            .quarantined_by_reason
            .get("duplicate_id"),
        Some(&2),
        "no quarantine row twice"
    );
    assert_eq!(db.excluded_rows(batch_of_b).unwrap(), [0]);
}

#[test]
fn a_killed_plan_is_finished_by_the_next_one() {
    let dir = tempfile::tempdir().unwrap();
    let text: String = (0..50).map(|i| line(&i.to_string(), 20 + i)).collect();
    for name in ["a.jsonl", "b.jsonl"] {
        std::fs::write(
            dir.path().join(name),
            text.replace("\"id\":\"", &format!("\"id\":\"{name}-")),
        )
        .unwrap();
    }
    let settings = PlanSettings {
        papers_per_job: 8,
        ..PlanSettings::default()
    };
    let clean = options(dir.path(), vec![dir.path().to_path_buf()], settings.clone());
    plan(&clean).unwrap();
    let expected = batches(&clean.run_dir);

    // A plan killed mid-way: file 1 done, file 2 with one batch recorded, a half-written batch
    // file and a stray finished batch file that run.db never heard of.
    let killed = PlanOptions {
        run_dir: dir.path().join("killed"),
        ..clean.clone()
    };
    plan(&killed).unwrap();
    let db = RunDb::open(&killed.run_dir).unwrap();
    db.conn()
        .execute("UPDATE corpus_files SET state = 'pending' WHERE id = 2", [])
        .unwrap();
    db.conn()
        .execute("DELETE FROM papers WHERE batch_id IN (SELECT id FROM batches WHERE file_id = 2 AND seq > 0)", [])
        .unwrap();
    db.conn()
        .execute("DELETE FROM batches WHERE file_id = 2 AND seq > 0", [])
        .unwrap();
    db.conn()
        .execute("DELETE FROM settings WHERE key = 'plan_state'", [])
        .unwrap();
    drop(db);
    std::fs::write(
        killed.run_dir.join("batches/f000002-00009.parquet.tmp"),
        b"half",
    )
    .unwrap();
    let report = plan(&killed).unwrap();
    assert!(!report.already_planned);
    assert_eq!(report.files_planned_now, 1);
    assert_eq!(batches(&killed.run_dir), expected);
    let leftovers: Vec<_> = std::fs::read_dir(killed.run_dir.join("batches"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let status = RunDb::open(&killed.run_dir).unwrap().status().unwrap();
    assert_eq!(status.papers_planned, 100);
}

#[test]
fn source_filter_and_quarantine_are_counted() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("c.jsonl");
    std::fs::write(
        &corpus,
        concat!(
            r#"{"id":"1","text":"a","source":"s2orc/train"}"#,
            "\n",
            r#"{"id":"2","text":"b","source":"s2ag/train"}"#,
            "\nnot json\n",
            r#"{"id":"3","text":""}"#,
            "\n"
        ),
    )
    .unwrap();
    let settings = PlanSettings {
        sources: vec!["s2orc".into()],
        ..PlanSettings::default()
    };
    let opts = options(dir.path(), vec![corpus], settings);
    let report = plan(&opts).unwrap();
    assert_eq!((report.papers, report.quarantined), (1, 2));
    let status = RunDb::open(&opts.run_dir).unwrap().status().unwrap();
    assert_eq!(status.papers_filtered, 1);
    assert_eq!(status.quarantined_by_reason.get("invalid_json"), Some(&1));
    assert_eq!(status.quarantined_by_reason.get("empty_text"), Some(&1));
    let q = read_quarantine(&opts.run_dir).unwrap();
    assert_eq!(q.iter().map(|e| e.line).collect::<Vec<_>>(), [3, 4]);
}

#[test]
fn a_run_db_error_while_recording_ends_the_plan_instead_of_hanging_it() {
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("c.jsonl");
    let text: String = (0..400).map(|i| line(&format!("p{i}"), 10)).collect();
    std::fs::write(&corpus, text).unwrap();
    let settings = PlanSettings {
        papers_per_job: 1,
        ..PlanSettings::default()
    };
    let mut opts = options(dir.path(), vec![corpus], settings);
    opts.threads = 1;
    // run.db refuses the third batch: the recorder stops while the worker has 400 to send
    // through a channel of 64.
    let db = RunDb::create(&opts.run_dir).unwrap();
    db.conn()
        .execute_batch(
            "CREATE TRIGGER refuse BEFORE INSERT ON batches WHEN (SELECT count(*) FROM batches) >= 2
             BEGIN SELECT RAISE(ABORT, 'injected failure'); END;",
        )
        .unwrap();
    drop(db);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(plan(&opts).map(|_| ()).map_err(|e| e.to_string()));
    });
    let result = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("plan ended instead of hanging");
    let err = result.unwrap_err();
    assert!(err.contains("injected failure"), "{err}");
}
