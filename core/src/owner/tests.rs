use super::*;
use crate::rundb::{RunDb, RunDbError};

fn record_for(dir: &Path, hostname: &str, boot_id: &str) {
    let record = OwnerRecord {
        format: OWNER_FORMAT,
        host: Host {
            hostname: hostname.into(),
            boot_id: boot_id.into(),
        },
        how: OwnedHow::Created,
        since_unix_s: unix_now() - 3600.0,
        previous: None,
    };
    write(dir, &record).unwrap();
}

fn heartbeat_for(dir: &Path, hostname: &str, age_s: f64) {
    let beat = Heartbeat {
        host: Host {
            hostname: hostname.into(),
            boot_id: "b".into(),
        },
        pid: 7,
        unix_s: unix_now() - age_s,
    };
    std::fs::write(
        RunLayout::new(dir).heartbeat_file(),
        serde_json::to_vec(&beat).unwrap(),
    )
    .unwrap();
}

#[test]
fn a_new_run_records_this_host_and_opens_again_as_its_owner() {
    let dir = tempfile::tempdir().unwrap();
    let db = RunDb::create(dir.path()).unwrap();
    assert_eq!(db.ownership(), &Ownership::Claimed);
    let record = read_owner(dir.path()).unwrap().unwrap();
    assert_eq!(record.host, Host::this());
    assert_eq!(record.how, OwnedHow::Created);
    drop(db);
    assert_eq!(
        RunDb::open(dir.path()).unwrap().ownership(),
        &Ownership::Owner
    );
    // Every owner process leaves a heartbeat.
    let beat = read_heartbeat(dir.path()).unwrap().unwrap();
    assert_eq!(beat.host, Host::this());
    assert!(beat.age_s() < 60.0);
}

#[test]
fn another_host_is_refused_before_sqlite_touches_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    record_for(dir.path(), "login-07.example", "boot-1");
    heartbeat_for(dir.path(), "login-07.example", 12.0);
    let err = match RunDb::create(dir.path()) {
        Err(RunDbError::Owner(e)) => e,
        Err(e) => panic!("not an owner error: {e}"),
        Ok(_) => panic!("another host's run was opened"),
    };
    let text = err.to_string();
    assert!(text.contains("belongs to host login-07.example"), "{text}");
    assert!(text.contains("take-over"), "{text}");
    assert!(text.contains("12 s ago"), "{text}");
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        ["owner-heartbeat.json", "owner.json"],
        "nothing written"
    );
    // The read-only check refuses too, and a run without a record may be read anywhere.
    assert!(check_read_only(dir.path()).is_err());
    assert!(check_read_only(tempfile::tempdir().unwrap().path()).is_ok());
}

#[test]
fn a_new_boot_of_the_owner_renews_the_record_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let this = Host::this();
    if this.boot_id.is_empty() {
        return; // no /proc here: boots cannot be told apart
    }
    record_for(dir.path(), &this.hostname, "an-earlier-boot");
    match check(dir.path()).unwrap() {
        Ownership::Rebooted { previous } => assert_eq!(previous.boot_id, "an-earlier-boot"),
        other => panic!("{other:?}"),
    }
    let record = read_owner(dir.path()).unwrap().unwrap();
    assert_eq!(record.how, OwnedHow::Rebooted);
    assert_eq!(record.host, this);
    assert_eq!(check(dir.path()).unwrap(), Ownership::Owner);
}

#[test]
fn take_over_waits_for_a_stale_heartbeat() {
    let dir = tempfile::tempdir().unwrap();
    record_for(dir.path(), "login-02", "boot-1");
    heartbeat_for(dir.path(), "login-02", 30.0);
    let err = take_over(dir.path(), Duration::from_secs(300)).unwrap_err();
    assert!(matches!(err, OwnerError::OwnerAlive { .. }), "{err}");
    assert_eq!(
        read_owner(dir.path()).unwrap().unwrap().host.hostname,
        "login-02"
    );
    // A heartbeat from the future (another clock) is fresh, too.
    heartbeat_for(dir.path(), "login-02", -600.0);
    assert!(take_over(dir.path(), Duration::from_secs(300)).is_err());

    heartbeat_for(dir.path(), "login-02", 900.0);
    match take_over(dir.path(), Duration::from_secs(300)).unwrap() {
        TakeOver::Moved {
            previous,
            heartbeat_age_s,
        } => {
            assert_eq!(previous.hostname, "login-02");
            assert!(heartbeat_age_s.unwrap() >= 900.0);
        }
        other => panic!("{other:?}"),
    }
    let record = read_owner(dir.path()).unwrap().unwrap();
    assert_eq!(record.how, OwnedHow::TakenOver);
    assert_eq!(record.host, Host::this());
    assert_eq!(record.previous.unwrap().hostname, "login-02");
    assert_eq!(
        take_over(dir.path(), Duration::from_secs(300)).unwrap(),
        TakeOver::AlreadyOwner
    );
    assert_eq!(check(dir.path()).unwrap(), Ownership::Owner);
}

#[test]
fn a_host_whose_run_was_taken_is_no_longer_owner() {
    let dir = tempfile::tempdir().unwrap();
    check(dir.path()).unwrap();
    assert!(still_owner(dir.path()).unwrap());
    record_for(dir.path(), "login-03", "boot-9");
    assert!(!still_owner(dir.path()).unwrap());
}

#[test]
fn an_unreadable_record_is_an_error_not_a_claim() {
    let dir = tempfile::tempdir().unwrap();
    // A directory where the record should be: reading it fails (EISDIR), as a stale handle would.
    std::fs::create_dir(RunLayout::new(dir.path()).owner_file()).unwrap();
    let err = check(dir.path()).unwrap_err();
    assert!(matches!(err, OwnerError::Io { .. }), "{err}");
    std::fs::remove_dir(RunLayout::new(dir.path()).owner_file()).unwrap();
    std::fs::write(RunLayout::new(dir.path()).owner_file(), b"{not json").unwrap();
    let err = check(dir.path()).unwrap_err();
    assert!(
        err.to_string().contains("not a valid owner record"),
        "{err}"
    );
}

/// Makes the heartbeat's name a non-empty directory: every beat fails (as a full quota or a
/// stale NFS handle would make it, even for root) until [`unblock_heartbeat`].
fn block_heartbeat(dir: &Path) {
    let path = RunLayout::new(dir).heartbeat_file();
    let _ = std::fs::remove_file(&path);
    std::fs::create_dir(&path).unwrap();
    std::fs::write(path.join("x"), b"").unwrap();
}

fn unblock_heartbeat(dir: &Path) {
    std::fs::remove_dir_all(RunLayout::new(dir).heartbeat_file()).unwrap();
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let end = std::time::Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(std::time::Instant::now() < end, "waited 20 s for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_heartbeat_that_fails_is_retried_and_the_process_stops_writing_until_it_beats_again() {
    // Each test is its own process (nextest): the interval is this one's.
    std::env::set_var(heartbeat::HEARTBEAT_INTERVAL_ENV, "0.1");
    let dir = tempfile::tempdir().unwrap();
    let db = RunDb::create(dir.path()).unwrap();
    db.set_setting("k", &1).unwrap();
    block_heartbeat(dir.path());
    // Past the grace (0.23 s here) without a heartbeat, a commit is refused and says why.
    std::thread::sleep(Duration::from_millis(500));
    let err = db.set_setting("k", &2).unwrap_err();
    assert!(matches!(err, RunDbError::NotWriting { .. }), "{err}");
    assert!(
        err.to_string().contains("has not written its heartbeat"),
        "{err}"
    );
    assert_eq!(db.setting::<i32>("k").unwrap(), Some(1), "rolled back");
    // The thread did not die: once the heartbeat can be written, it is, and writes go on.
    unblock_heartbeat(dir.path());
    wait_for("a heartbeat", || {
        read_heartbeat(dir.path())
            .ok()
            .flatten()
            .is_some_and(|b| b.age_s() < 1.0)
    });
    wait_for("writes allowed again", || db.set_setting("k", &3).is_ok());
    assert_eq!(db.setting::<i32>("k").unwrap(), Some(3));
}

#[test]
fn a_long_command_writes_nothing_more_once_its_run_was_taken_over() {
    std::env::set_var(heartbeat::HEARTBEAT_INTERVAL_ENV, "0.1");
    let dir = tempfile::tempdir().unwrap();
    let db = RunDb::create(dir.path()).unwrap();
    db.set_setting("k", &1).unwrap();
    record_for(dir.path(), "login-05", "boot-2");
    wait_for("the take-over noticed", || db.set_setting("k", &2).is_err());
    let err = db.set_setting("k", &2).unwrap_err();
    assert!(err.to_string().contains("taken over"), "{err}");
    // And its heartbeat stopped: the new owner's are not overwritten.
    heartbeat_for(dir.path(), "login-05", 0.0);
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(
        read_heartbeat(dir.path()).unwrap().unwrap().host.hostname,
        "login-05"
    );
}

#[test]
fn take_over_refuses_a_garbled_heartbeat_and_waits_out_a_missing_one() {
    let dir = tempfile::tempdir().unwrap();
    record_for(dir.path(), "login-06", "boot-1");
    let path = RunLayout::new(dir.path()).heartbeat_file();
    std::fs::write(&path, b"{\"host\": ").unwrap();
    let err = take_over(dir.path(), Duration::from_millis(200)).unwrap_err();
    assert!(matches!(err, OwnerError::GarbledHeartbeat { .. }), "{err}");
    assert!(err.to_string().contains("delete the file"), "{err}");
    assert_eq!(
        read_owner(dir.path()).unwrap().unwrap().host.hostname,
        "login-06"
    );

    // None at all: it waits --stale-after; one appearing meanwhile is a live owner.
    std::fs::remove_file(&path).unwrap();
    let writer = {
        let dir = dir.path().to_path_buf();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            heartbeat_for(&dir, "login-06", 0.0);
        })
    };
    let started = std::time::Instant::now();
    let err = take_over(dir.path(), Duration::from_secs(5)).unwrap_err();
    writer.join().unwrap();
    assert!(matches!(err, OwnerError::OwnerAlive { .. }), "{err}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    // None through the whole wait: moved, after waiting it out.
    std::fs::remove_file(&path).unwrap();
    let started = std::time::Instant::now();
    match take_over(dir.path(), Duration::from_millis(600)).unwrap() {
        TakeOver::Moved {
            heartbeat_age_s, ..
        } => assert_eq!(heartbeat_age_s, None),
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_millis(600));
}
