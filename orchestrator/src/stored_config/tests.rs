//! The stored run config: chosen, compared, refused, shown.

use super::*;
use crate::scheduler::SchedulerConfig;

fn slurm() -> RunConfig {
    let mut c = RunConfig::default();
    c.scheduler.backend = Backend::Slurm;
    c.scheduler.script.walltime = Some("01:00:00".into());
    c
}

fn db() -> (tempfile::TempDir, RunDb) {
    let dir = tempfile::tempdir().unwrap();
    let db = RunDb::create(dir.path()).unwrap();
    (dir, db)
}

#[test]
fn a_stored_config_in_a_run_db_others_can_write_is_not_used() {
    use std::os::unix::fs::PermissionsExt;
    let (d, db) = db();
    let mut config = slurm();
    config.notify.command = Some("curl -d @- https://hooks.example/T0KEN".into());
    store(&db, &config).unwrap();
    let run_db = RunLayout::new(d.path()).db();
    std::fs::set_permissions(&run_db, std::fs::Permissions::from_mode(0o660)).unwrap();
    let err = choose(&db, &GivenConfig::default()).unwrap_err();
    assert!(err.is_refusal());
    let text = err.to_string();
    assert!(
        text.contains("run.db can be written by its group (mode 660)")
            && text.contains("chmod go-w")
            && text.contains("--replace-config"),
        "{text}"
    );
    // The user's own config, given again, is theirs: used (and stored over the other).
    let given = GivenConfig {
        file: Some(slurm()),
        replace: true,
        ..Default::default()
    };
    assert!(choose(&db, &given).is_ok());
    // Made the owner's alone again, the stored one is used.
    std::fs::set_permissions(&run_db, std::fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(choose(&db, &GivenConfig::default()).unwrap().config, config);
}

#[test]
fn a_printed_config_shows_neither_env_values_nor_the_notify_command() {
    let mut config = slurm();
    config.notify.command = Some("curl https://hooks.example/T0KEN".into());
    config
        .scheduler
        .script
        .env
        .insert("HF_TOKEN".into(), "hf_s3cret".into());
    let shown = to_toml(&config);
    assert!(
        !shown.contains("T0KEN") && !shown.contains("s3cret"),
        "{shown}"
    );
    assert!(shown.contains("HF_TOKEN"), "the name stays: {shown}");
}

#[test]
fn the_first_config_is_to_be_stored_and_later_ones_use_it() {
    let (_d, db) = db();
    let given = GivenConfig {
        file: Some(slurm()),
        ..Default::default()
    };
    let first = choose(&db, &given).unwrap();
    assert_eq!(first.origin, Origin::First);
    store(&db, &first.config).unwrap();
    let again = choose(&db, &GivenConfig::default()).unwrap();
    assert_eq!(again.origin, Origin::Stored);
    assert_eq!(again.config, slurm());
    // The same config given again is no change.
    assert_eq!(choose(&db, &given).unwrap().origin, Origin::Stored);
}

/// Records a job of batch 1 on `backend`, taken by the scheduler (pending: an open job).
fn submitted_job(db: &mut RunDb, backend: &str) {
    db.conn()
        .execute_batch(
            "INSERT INTO corpus_files (id, path, size, mtime_ns, edges) VALUES (1, 'c', 0, 0, '');
             INSERT INTO batches (id, file_id, seq, path, n_rows, n_chars) VALUES (1, 1, 1, 'b', 1, 1);",
        )
        .unwrap();
    db.insert_job(&embedfleet_core::rundb::NewJob {
        batches: &[1],
        attempt: 1,
        backend,
        queue: "debug",
        name: "j1",
        script: "s",
        log: "l",
        marker: "m",
    })
    .unwrap();
    db.set_job_submitted("j1", "17").unwrap();
}

#[test]
fn before_any_job_went_through_it_a_stored_config_is_replaced_freely() {
    let (_d, db) = db();
    store(&db, &slurm()).unwrap();
    let given = GivenConfig {
        backend: Some(Backend::Local),
        ..Default::default()
    };
    let chosen = choose(&db, &given).unwrap();
    assert!(chosen.to_store(), "{chosen:?}");
    assert!(matches!(chosen.origin, Origin::Replacing(_)));
}

#[test]
fn a_different_one_is_refused_key_by_key_unless_replaced() {
    let (_d, mut db) = db();
    store(&db, &slurm()).unwrap();
    submitted_job(&mut db, "slurm");
    db.set_job_state("j1", embedfleet_core::state::JobStatus::Completed, None)
        .unwrap();
    let given = GivenConfig {
        backend: Some(Backend::Local),
        ..Default::default()
    };
    let err = choose(&db, &given).unwrap_err();
    assert!(err.is_refusal());
    let text = err.to_string();
    assert!(
        text.contains(r#"scheduler.backend: the run's "slurm", here "local""#),
        "{text}"
    );
    let mut other = slurm();
    other.scheduler.script.walltime = None;
    other
        .scheduler
        .script
        .env
        .insert("TOKEN".into(), "s3cret".into());
    let d: Vec<String> = differences(&slurm(), &other)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        d,
        vec![
            "scheduler.script.env.TOKEN: the run's (unset), here ***".to_string(),
            r#"scheduler.script.walltime: the run's "01:00:00", here (unset)"#.to_string(),
        ]
    );
    let replaced = choose(
        &db,
        &GivenConfig {
            replace: true,
            ..given
        },
    )
    .unwrap();
    assert!(replaced.to_store());
    assert_eq!(replaced.config.scheduler.backend, Backend::Local);
    assert!(matches!(
        choose(
            &db,
            &GivenConfig {
                replace: true,
                ..Default::default()
            }
        ),
        Err(StoredConfigError::ReplaceWithoutConfig)
    ));
}

#[test]
fn a_backend_other_than_the_open_jobs_one_is_refused_even_when_replacing() {
    let (_d, mut db) = db();
    submitted_job(&mut db, "slurm");
    // A run submitted before configs were stored: no stored one, but its jobs say slurm.
    let err = choose(&db, &GivenConfig::default()).unwrap_err();
    assert!(
        matches!(err, StoredConfigError::OpenJobsElsewhere { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("open on slurm"), "{err}");
    let ok = choose(
        &db,
        &GivenConfig {
            file: Some(slurm()),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(ok.origin, Origin::First);
}

#[test]
fn run_refuses_a_run_kept_on_a_cluster() {
    let (_d, db) = db();
    check_local(&db).unwrap();
    store(&db, &slurm()).unwrap();
    let err = check_local(&db).unwrap_err();
    assert!(err.is_refusal() && err.to_string().contains("keeps a slurm run config"));
}

#[test]
fn shows_as_toml_that_reads_back() {
    let mut c = slurm();
    c.scheduler
        .script
        .env
        .insert("TOKEN".into(), "s3cret".into());
    let text = to_toml(&c);
    assert!(!text.contains("s3cret"), "{text}");
    let back: RunConfig = toml::from_str(&text).unwrap();
    assert_eq!(back.scheduler.backend, Backend::Slurm);
    // Only the chosen backend's table is shown: the others are their defaults.
    assert!(text.contains("[scheduler.slurm]"), "{text}");
    for other in ["[scheduler.pbs]", "[scheduler.ssh]", "[scheduler.local]"] {
        assert!(!text.contains(other), "{text}");
    }
    let mut c = back.clone();
    c.scheduler.script.env.clear();
    c.scheduler.pbs.flavor = crate::scheduler::PbsFlavor::Torque;
    assert!(
        to_toml(&c).contains("[scheduler.pbs]"),
        "a changed table is shown"
    );
}

/// A run config as run.db of a run submitted before the backends' registry keeps it: it
/// reads back, and is written again, key for key.
#[test]
fn a_config_stored_before_the_backend_registry_reads_back_as_it_was() {
    let program = serde_json::json!({"path": null, "extra_args": []});
    let stored = serde_json::json!({
        "scheduler": {
            "backend": "slurm",
            "command": {
                "timeout_secs": 60.0,
                "retries": 3,
                "backoff_initial_secs": 1.0,
                "backoff_max_secs": 30.0
            },
            "local": {"shell": "/bin/bash", "grace_secs": 10.0},
            "slurm": {
                "sbatch": {"path": "/opt/slurm/bin/sbatch", "extra_args": ["--qos=normal"]},
                "squeue": program,
                "scancel": program,
                "sacct": program,
                "scontrol": program,
                "use_sacct": "never"
            },
            "pbs": {
                "qsub": program,
                "qstat": program,
                "qdel": program,
                "flavor": "pro"
            },
            "script": {
                "template": null,
                "account": "P",
                "walltime": "01:00:00",
                "nodes": 1,
                "gpus_per_node": 4,
                "select_extra": null,
                "extra_directives": [],
                "modules": ["cuda"],
                "env": {},
                "setup": [],
                "embedfleet": null,
                "launcher": null
            }
        },
        "notify": {"command": null, "timeout_secs": 60.0}
    });
    let config: RunConfig = serde_json::from_value(stored.clone()).unwrap();
    assert_eq!(config.scheduler.backend, Backend::Slurm);
    assert_eq!(config.scheduler.slurm.sbatch.extra_args, ["--qos=normal"]);
    // A backend added since (ssh) writes its table too, with its defaults, and only that.
    let mut written = serde_json::to_value(&config).unwrap();
    let defaults = serde_json::to_value(SchedulerConfig::default()).unwrap();
    let tables = written["scheduler"].as_object_mut().unwrap();
    for name in Backend::NAMES {
        if stored["scheduler"].get(*name).is_none() {
            assert_eq!(tables.remove(*name).as_ref(), defaults.get(*name), "{name}");
        }
    }
    assert_eq!(written, stored);
}
