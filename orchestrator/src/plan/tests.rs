use super::*;
use embedfleet_core::batchfile;
use embedfleet_core::quarantine::QuarantineReason;
use embedfleet_core::rundb::ReleaseCounts;

fn line(id: &str, chars: usize) -> String {
    format!("{{\"id\":\"{id}\",\"text\":\"{}\"}}\n", "x".repeat(chars))
}

fn options(dir: &Path, corpus: Vec<PathBuf>, settings: PlanSettings) -> PlanOptions {
    PlanOptions {
        corpus,
        run_dir: dir.join("run"),
        settings,
        settings_given: true,
        threads: 2,
        progress: false,
        update: None,
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
        {
            db.resolve_release(1).unwrap();
            db.duplicates().unwrap()
        },
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

/// A corpus line with its text given.
fn paper(id: &str, text: &str) -> String {
    format!("{{\"id\":\"{id}\",\"text\":\"{text}\"}}\n")
}

fn update(opts: &PlanOptions, corpus: Vec<PathBuf>, only_adds: bool) -> PlanOptions {
    PlanOptions {
        corpus,
        settings_given: false,
        update: Some(UpdateOptions {
            only_adds,
            command: "test".into(),
        }),
        ..opts.clone()
    }
}

/// (id, superseded_in, withdrawn_in) of every paper row of the run, in corpus order.
fn paper_rows(run_dir: &Path) -> Vec<(String, Option<i64>, Option<i64>)> {
    let db = RunDb::open(run_dir).unwrap();
    let mut stmt = db
        .conn()
        .prepare(
            "SELECT p.id, p.superseded_in, p.withdrawn_in FROM papers p JOIN batches b ON b.id = p.batch_id
             ORDER BY b.file_id, b.seq, p.row",
        )
        .unwrap();
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    rows
}

/// Release 1: p0..p9 in one file. Release 2, two files: p1 withdrawn, p2's text changed, p10
/// and p11 new, p0 twice (the second a duplicate) and p10 twice (likewise).
fn two_releases(dir: &Path) -> (PathBuf, PathBuf) {
    let r1 = dir.join("r1");
    let r2 = dir.join("r2");
    std::fs::create_dir_all(&r1).unwrap();
    std::fs::create_dir_all(&r2).unwrap();
    let text = |i: usize| format!("text of paper {i}");
    std::fs::write(
        r1.join("part-0.jsonl"),
        (0..10)
            .map(|i| paper(&format!("p{i}"), &text(i)))
            .collect::<String>(),
    )
    .unwrap();
    let mut a: String = [0, 2, 3, 4, 5]
        .iter()
        .map(|&i| {
            let t = if i == 2 {
                "text of paper 2, revised".to_string()
            } else {
                text(i)
            };
            paper(&format!("p{i}"), &t)
        })
        .collect();
    a += &paper("p10", "a new paper");
    let b: String = [6, 7, 8, 9, 0]
        .iter()
        .map(|&i| paper(&format!("p{i}"), &text(i)))
        .collect::<String>()
        + &paper("p11", "another new paper")
        + &paper("p10", "a new paper, seen again");
    std::fs::write(r2.join("part-0.jsonl"), a).unwrap();
    std::fs::write(r2.join("part-1.jsonl"), b).unwrap();
    (r1, r2)
}

/// What release 2 of [`two_releases`] leaves in the run: each paper's rows, the duplicates
/// quarantined once, the excluded row of the last batch, the two releases.
fn release_two_is_recorded(run_dir: &Path) {
    let rows = paper_rows(run_dir);
    let state = |id: &str| -> Vec<(Option<i64>, Option<i64>)> {
        rows.iter()
            .filter(|r| r.0 == id)
            .map(|r| (r.1, r.2))
            .collect()
    };
    assert_eq!(
        state("p2"),
        [(Some(2), None), (None, None)],
        "old copy superseded"
    );
    assert_eq!(state("p1"), [(None, Some(2))], "withdrawn");
    assert_eq!(state("p3"), [(None, None)], "unchanged: one row, live");
    // Duplicates within the release: p0's second sighting (carried unchanged) and p10's
    // second row (planned, then excluded from its batch), each quarantined once.
    let q = read_quarantine(run_dir).unwrap();
    let dups: Vec<(&str, u64)> = q
        .iter()
        .filter(|e| e.reason == QuarantineReason::DuplicateId)
        .map(|e| (e.id.as_deref().unwrap(), e.line))
        .collect();
    assert_eq!(dups, [("p0", 5), ("p10", 7)]);
    let db = RunDb::open(run_dir).unwrap();
    // The release's one batch packs both files' papers; p10's second row is its last.
    let last: embedfleet_core::BatchId = db
        .conn()
        .query_row("SELECT max(id) FROM batches", [], |r| r.get(0))
        .unwrap();
    assert_eq!(db.excluded_rows(last).unwrap(), [3]);
    let files: Vec<(i64, i64)> = db
        .conn()
        .prepare("SELECT file_id, line FROM papers WHERE batch_id = ?1 ORDER BY row")
        .unwrap()
        .query_map([last], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        files,
        [(2, 2), (2, 6), (3, 6), (3, 7)],
        "each row keeps its file and line"
    );
    let releases = db.releases().unwrap();
    assert_eq!(releases.len(), 2);
    assert!(releases.iter().all(|r| r.planned_at.is_some()));
    assert_eq!(releases[1].command.as_deref(), Some("test"));
}

#[test]
fn an_update_plans_only_new_and_changed_papers_and_withdraws_those_the_release_lacks() {
    let dir = tempfile::tempdir().unwrap();
    let (r1, r2) = two_releases(dir.path());
    let settings = PlanSettings {
        papers_per_job: 4,
        ..PlanSettings::default()
    };
    let first = options(dir.path(), vec![r1.clone()], settings);
    let report = plan(&first).unwrap();
    assert_eq!((report.release, report.papers), (1, 10));
    let release_1_batches = batches(&first.run_dir);

    // The update is given none of the settings: it goes by the run's (4 papers a job).
    let second = update(&first, vec![r2.clone()], false);
    let report = plan(&second).unwrap();
    assert_eq!(report.release, 2);
    assert_eq!(
        report.counts,
        Some(ReleaseCounts {
            added: 2,
            changed: 1,
            withdrawn: 1,
            unchanged: 8,
            restamped: 0
        })
    );
    let got = batches(&first.run_dir);
    assert_eq!(
        got[..3],
        release_1_batches[..],
        "release 1's batches are untouched"
    );
    assert_eq!(
        got[3..],
        [vec!["p2", "p10", "p11", "p10"]],
        "only the changed and new papers are planned, packed across the files in corpus order"
    );
    let batch_files: Vec<String> = std::fs::read_dir(first.run_dir.join("batches"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| !name.starts_with("f000001-"))
        .collect();
    assert_eq!(
        batch_files,
        ["r0002-00000.parquet"],
        "the per-file batches it packed are gone"
    );
    release_two_is_recorded(&first.run_dir);

    // Again: nothing to do. The release-1 corpus is no longer the run's; release 2's is.
    assert!(plan(&second).unwrap().already_planned);
    let err = plan(&first).unwrap_err();
    assert!(matches!(err, PlanError::CorpusChanged { .. }), "{err}");
    assert!(err.to_string().contains("plan --update"), "{err}");
    let plain = PlanOptions {
        corpus: vec![r2.clone()],
        ..first.clone()
    };
    assert!(plan(&plain).unwrap().already_planned);

    // Release 3 only adds: it lacks everything but one new paper, and withdraws nothing.
    let r3 = dir.path().join("r3.jsonl");
    std::fs::write(&r3, paper("p12", "the newest")).unwrap();
    let report = plan(&update(&first, vec![r3], true)).unwrap();
    assert_eq!(
        report.counts,
        Some(ReleaseCounts {
            added: 1,
            ..ReleaseCounts::default()
        })
    );
    let live: u64 = RunDb::open(&first.run_dir)
        .unwrap()
        .conn()
        .query_row(
            "SELECT count(*) FROM papers WHERE duplicate_of IS NULL AND superseded_in IS NULL AND withdrawn_in IS NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(live, 12, "release 2's 11 and p12");
}

#[test]
fn an_update_killed_anywhere_resumes_to_the_same_plan() {
    let dir = tempfile::tempdir().unwrap();
    let (r1, r2) = two_releases(dir.path());
    let settings = PlanSettings {
        papers_per_job: 4,
        ..PlanSettings::default()
    };
    let clean = options(dir.path(), vec![r1.clone()], settings);
    plan(&clean).unwrap();
    plan(&update(&clean, vec![r2.clone()], false)).unwrap();
    let expected = (batches(&clean.run_dir), paper_rows(&clean.run_dir));

    // Killed while the release's files were being planned (before any packing), and again
    // before the release was settled (`tests/e2e/update_pack.rs` kills one mid-pack). Release
    // 1 was planned by an embedfleet that recorded no text or metadata hashes.
    let killed = PlanOptions {
        run_dir: dir.path().join("killed"),
        ..clean.clone()
    };
    plan(&killed).unwrap();
    plan(&update(&killed, vec![r2.clone()], false)).unwrap();
    let db = RunDb::open(&killed.run_dir).unwrap();
    db.conn()
        .execute_batch(
            "UPDATE papers SET superseded_in = NULL, withdrawn_in = NULL, duplicate_of = NULL;
             UPDATE batches SET n_excluded = 0;
             UPDATE release_seen SET duplicate_of = NULL;
             DELETE FROM quarantine;
             UPDATE releases SET planned_at = NULL, added = NULL WHERE id = 2;
             UPDATE settings SET value = '\"in_progress\"' WHERE key = 'plan_state';
             UPDATE papers SET text_hash = NULL, meta_hash = NULL WHERE batch_id IN (SELECT id FROM batches WHERE file_id = 1);",
        )
        .unwrap();
    drop(db);
    let mut db = RunDb::open(&killed.run_dir).unwrap();
    // The packed batch records its first paper's file (2): forgetting file 2 forgets it.
    for file in [2, 3] {
        db.reset_file(file).unwrap();
    }
    drop(db);
    // A plain `plan` of release 2's files finishes it too (a restart without --update).
    let resumed = PlanOptions {
        corpus: vec![r2.clone()],
        settings_given: false,
        ..killed.clone()
    };
    let report = plan(&resumed).unwrap();
    assert!(!report.already_planned);
    assert_eq!(report.counts.unwrap().to_embed(), 3);
    assert_eq!(
        (batches(&killed.run_dir), paper_rows(&killed.run_dir)),
        expected
    );
    let hashes: i64 = RunDb::open(&killed.run_dir)
        .unwrap()
        .conn()
        .query_row(
            "SELECT count(*) FROM papers WHERE text_hash IS NULL OR meta_hash IS NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(
        hashes, 0,
        "the missing text and metadata hashes were filled from the batch files"
    );

    // An update of other files while a release is unfinished is refused.
    let db = RunDb::open(&killed.run_dir).unwrap();
    db.conn()
        .execute("UPDATE releases SET planned_at = NULL WHERE id = 2", [])
        .unwrap();
    drop(db);
    let err = plan(&update(&killed, vec![r1], false)).unwrap_err();
    assert!(
        matches!(err, PlanError::ReleaseInProgress { release: 2, .. }),
        "{err}"
    );
}

#[test]
fn an_update_needs_a_planned_run() {
    let dir = tempfile::tempdir().unwrap();
    let (_, r2) = two_releases(dir.path());
    let opts = options(dir.path(), vec![], PlanSettings::default());
    let err = plan(&update(&opts, vec![r2], false)).unwrap_err();
    assert!(matches!(err, PlanError::NothingToUpdate { .. }), "{err}");
    assert!(err.is_refusal());
}

#[test]
fn a_deleted_paper_stays_deleted_when_a_release_carries_it_again_with_new_text() {
    let dir = tempfile::tempdir().unwrap();
    let r1 = dir.path().join("r1.jsonl");
    let r2 = dir.path().join("r2.jsonl");
    std::fs::write(&r1, paper("a", "alpha") + &paper("b", "beta")).unwrap();
    std::fs::write(
        &r2,
        paper("a", "alpha") + &paper("b", "beta, revised") + &paper("c", "gamma"),
    )
    .unwrap();
    let first = options(dir.path(), vec![r1], PlanSettings::default());
    plan(&first).unwrap();
    let db = RunDb::open(&first.run_dir).unwrap();
    db.record_tombstones(&[embedfleet_core::rundb::Tombstone {
        batch_id: 1,
        paper_id: "b".into(),
    }])
    .unwrap();
    drop(db);
    let report = plan(&update(&first, vec![r2], false)).unwrap();
    assert_eq!(
        report.counts,
        Some(ReleaseCounts {
            added: 1,
            unchanged: 2,
            ..ReleaseCounts::default()
        })
    );
    assert_eq!(batches(&first.run_dir)[1], ["c"]);
}

#[test]
fn a_release_that_changes_metadata_alone_restamps_its_papers_without_planning_them() {
    let dir = tempfile::tempdir().unwrap();
    let with = |id: &str, text: &str, created: &str, version: &str| {
        format!(
            "{{\"id\":\"{id}\",\"text\":\"{text}\",\"source\":\"s2orc\",\"created\":\"{created}\",\"version\":\"{version}\"}}\n"
        )
    };
    let write = |name: &str, body: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, body).unwrap();
        path
    };
    let r1 = write(
        "r1.jsonl",
        with("a", "alpha", "2019-01-01", "v2")
            + &with("b", "beta", "2019-01-01", "v2")
            + &with("c", "gamma", "2019-01-01", "v2"),
    );
    let first = options(dir.path(), vec![r1], PlanSettings::default());
    plan(&first).unwrap();
    // a: stamped v3 only; b: another year (the payload changes); c: as it was.
    let r2 = write(
        "r2.jsonl",
        with("a", "alpha", "2019-01-01", "v3")
            + &with("b", "beta", "2020-06-01", "v2")
            + &with("c", "gamma", "2019-01-01", "v2"),
    );
    let report = plan(&update(&first, vec![r2.clone()], false)).unwrap();
    assert_eq!(
        report.counts,
        Some(ReleaseCounts {
            unchanged: 3,
            restamped: 2,
            ..ReleaseCounts::default()
        })
    );
    assert_eq!(batches(&first.run_dir).len(), 1, "nothing planned");
    let db = RunDb::open(&first.run_dir).unwrap();
    let restamps = db.restamps().unwrap();
    let got: Vec<(&str, bool, Option<&str>, Option<&str>)> = restamps
        .iter()
        .map(|r| {
            (
                r.paper_id.as_str(),
                r.payload_changed,
                r.metadata.created.as_deref(),
                r.metadata.version.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("a", false, Some("2019-01-01"), Some("v3")),
            ("b", true, Some("2020-06-01"), Some("v2"))
        ]
    );
    assert!(restamps.iter().all(|r| r.batch_id == 1 && r.release == 2));
    // What a collection needs: `b` only (a's stamp is not in its payload).
    assert!(db.has_payload_restamps().unwrap());
    let payload: Vec<String> = db
        .payload_restamps()
        .unwrap()
        .into_iter()
        .map(|r| r.paper_id)
        .collect();
    assert_eq!(payload, ["b"]);
    drop(db);
    // Planned again: the same. A release 3 equal to release 2 restamps nothing (the live
    // rows serve release 2's metadata now); one that stamps `b` v4 restamps it again, and its
    // payload still differs from its shard's.
    assert!(
        plan(&update(&first, vec![r2.clone()], false))
            .unwrap()
            .already_planned
    );
    let r3 = write("r3.jsonl", std::fs::read_to_string(&r2).unwrap());
    let report = plan(&update(&first, vec![r3], false)).unwrap();
    assert_eq!(report.counts.unwrap().restamped, 0);
    let r4 = write(
        "r4.jsonl",
        with("a", "alpha", "2019-01-01", "v3")
            + &with("b", "beta", "2020-06-01", "v4")
            + &with("c", "gamma", "2019-01-01", "v2"),
    );
    let report = plan(&update(&first, vec![r4], false)).unwrap();
    assert_eq!(report.counts.unwrap().restamped, 1);
    let restamps = RunDb::open(&first.run_dir).unwrap().restamps().unwrap();
    let b = restamps.iter().find(|r| r.paper_id == "b").unwrap();
    assert_eq!((b.release, b.payload_changed), (4, true));
    assert_eq!(b.metadata.version.as_deref(), Some("v4"));
    let a = restamps.iter().find(|r| r.paper_id == "a").unwrap();
    assert_eq!((a.release, a.payload_changed), (2, false));
    let payload = RunDb::open(&first.run_dir)
        .unwrap()
        .payload_restamps()
        .unwrap();
    assert_eq!(
        payload
            .iter()
            .map(|r| (r.paper_id.as_str(), r.release))
            .collect::<Vec<_>>(),
        [("b", 4)],
        "b's newest values (release 4's), its payload changed in release 2"
    );
}
