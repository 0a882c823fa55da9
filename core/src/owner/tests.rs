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
