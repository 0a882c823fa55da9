//! Which host owns a run directory, and the files that let every other host see the run.
//!
//! run.db is SQLite in WAL mode, whose index is shared memory: it works between processes of
//! one host and silently corrupts between hosts, even on a shared filesystem. So one host owns
//! a run, the login node that made it. `owner.json` beside run.db names it (hostname and boot
//! id), and every open of run.db checks it first ([`check`]): on another host — a second login
//! node behind the same name, a compute node — the command refuses and says where the owner is.
//!
//! Every other host reads what the owner publishes as plain files, written atomically:
//! - `status-snapshot.json` ([`crate::status_snapshot`]): the run's status, rewritten each poll by the submit
//!   loop and by each `status` on the owner, read by `status` anywhere else;
//! - `owner-heartbeat.json` ([`heartbeat`]): rewritten every 30 s by every owner process that
//!   holds run.db open. `take-over` moves ownership to another host only once it is stale.
//!
//! A boot id that changed under the same hostname is the owner rebooted: nothing of the old
//! boot can still hold run.db, so the record is renewed and the restart reported.

pub mod heartbeat;

use crate::atomic;
use crate::RunLayout;
use serde::{Deserialize, Serialize};
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use heartbeat::{keep_heartbeat, read_heartbeat, Heartbeat, HEARTBEAT_INTERVAL};

/// The format of `owner.json` this embedfleet writes and reads.
pub const OWNER_FORMAT: u32 = 1;

/// A host as the owner record names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Host {
    /// What `hostname` prints (`/proc/sys/kernel/hostname`: per UTS namespace).
    pub hostname: String,
    /// `/proc/sys/kernel/random/boot_id`: new at every boot; empty where there is none.
    pub boot_id: String,
}

impl Host {
    /// This process's host.
    pub fn this() -> Host {
        Host {
            hostname: crate::host::name(),
            boot_id: crate::host::boot_id(),
        }
    }

    /// The same boot of the same host. An empty boot id (no /proc) matches any.
    pub fn same_boot(&self, other: &Host) -> bool {
        self.hostname == other.hostname
            && (self.boot_id.is_empty()
                || other.boot_id.is_empty()
                || self.boot_id == other.boot_id)
    }
}

/// How the current owner came to own the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OwnedHow {
    /// It made the run.
    Created,
    /// It opened a run of an older embedfleet, which had no owner record.
    Claimed,
    /// Its host rebooted (same hostname, new boot id).
    Rebooted,
    /// `embedfleet take-over` moved the run here from a host that was gone.
    TakenOver,
}

/// `owner.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OwnerRecord {
    pub format: u32,
    pub host: Host,
    pub how: OwnedHow,
    pub since_unix_s: f64,
    /// The owner before this one, when ownership moved or the host rebooted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<Host>,
}

impl OwnerRecord {
    fn new(how: OwnedHow, previous: Option<Host>) -> Self {
        Self {
            format: OWNER_FORMAT,
            host: Host::this(),
            how,
            since_unix_s: unix_now(),
            previous,
        }
    }
}

/// What [`check`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum Ownership {
    /// This host owns the run (and did already).
    Owner,
    /// This host just became the owner: a new run, or one made before owner records.
    Claimed,
    /// This host owns the run and has rebooted since it last opened it.
    Rebooted { previous: Host },
}

#[derive(Debug, thiserror::Error)]
pub enum OwnerError {
    #[error(
        "{dir} belongs to host {owner} (since {since}; {beat}): only processes on that host may open its run.db \
         (SQLite's WAL index does not work across hosts). Run this command there (`ssh {owner}`); \
         `embedfleet status --run-dir {dir}` works here from the owner's snapshot. If {owner} is gone for good, \
         `embedfleet take-over --run-dir {dir}` on this host moves the run here",
        dir = dir.display(),
        owner = owner.host.hostname,
        since = describe_time(owner.since_unix_s),
        beat = describe_heartbeat(*heartbeat_age_s)
    )]
    OtherHost {
        dir: PathBuf,
        owner: Box<OwnerRecord>,
        heartbeat_age_s: Option<f64>,
    },
    #[error(
        "{dir} is still owned by host {owner}: a process there held run.db {age:.0} s ago (less than --stale-after {stale:.0} s). \
         Stop the run there (or wait until it has been silent for {stale:.0} s) and try again",
        dir = dir.display(),
        owner = owner.host.hostname,
        age = age_s,
        stale = stale_after_s
    )]
    OwnerAlive {
        dir: PathBuf,
        owner: Box<OwnerRecord>,
        age_s: f64,
        stale_after_s: f64,
    },
    #[error(
        "{} is not a heartbeat embedfleet wrote ({cause}): a process on {owner} may be \
         rewriting it, so the run is not taken over. If {owner} is gone for good, delete the \
         file and run `take-over` again: it then waits --stale-after for a heartbeat to appear",
        path.display()
    )]
    GarbledHeartbeat {
        path: PathBuf,
        owner: String,
        cause: serde_json::Error,
    },
    #[error("failed to {action} {}: {cause}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        cause: io::Error,
    },
    #[error(
        "{} is not a valid owner record ({cause}): restore it from a backup, or, on the host that runs the \
         run, delete it (the next command there records that host again)",
        path.display()
    )]
    Invalid {
        path: PathBuf,
        cause: serde_json::Error,
    },
}

pub type Result<T> = std::result::Result<T, OwnerError>;

/// The run's owner record, `None` for a run without one.
pub fn read_owner(dir: &Path) -> Result<Option<OwnerRecord>> {
    read_json(RunLayout::new(dir).owner_file())
}

/// The bytes of `path`, `None` when there is no such file. Any other read error (a stale NFS
/// handle) is an error, never taken for an absent file: claiming a run on it could take the
/// run from its owner.
fn read_if_present(path: &Path) -> Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(OwnerError::Io {
            action: "read",
            path: path.into(),
            cause: source,
        }),
    }
}

/// `path` read as JSON, `None` when there is no such file.
pub(crate) fn read_json<T: serde::de::DeserializeOwned>(path: PathBuf) -> Result<Option<T>> {
    match read_if_present(&path)? {
        Some(bytes) => {
            serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| OwnerError::Invalid {
                    path,
                    cause: source,
                })
        }
        None => Ok(None),
    }
}

/// Writes `value` to `path` as JSON, atomically.
pub(crate) fn write_json<T: Serialize>(path: PathBuf, value: &T) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(value).expect("the owner's files serialise");
    atomic::write(&path, &bytes).map_err(|source| OwnerError::Io {
        action: "write",
        path,
        cause: source,
    })
}

/// Checks that this host may open the run's run.db, recording it as the owner when the run
/// has none yet. Called before every open of run.db.
pub fn check(dir: &Path) -> Result<Ownership> {
    let this = Host::this();
    for _ in 0..3 {
        match read_owner(dir)? {
            None => {
                let how = if RunLayout::new(dir).db().exists() {
                    OwnedHow::Claimed
                } else {
                    OwnedHow::Created
                };
                if write_first(dir, &OwnerRecord::new(how, None))? {
                    return Ok(Ownership::Claimed);
                }
                // Another process recorded an owner first: judge by its record.
            }
            Some(record) if record.host.hostname != this.hostname => {
                return Err(OwnerError::OtherHost {
                    dir: dir.into(),
                    heartbeat_age_s: read_heartbeat(dir).ok().flatten().map(|h| h.age_s()),
                    owner: Box::new(record),
                });
            }
            Some(record) if record.host.same_boot(&this) => return Ok(Ownership::Owner),
            Some(record) => {
                write(
                    dir,
                    &OwnerRecord::new(OwnedHow::Rebooted, Some(record.host.clone())),
                )?;
                return Ok(Ownership::Rebooted {
                    previous: record.host,
                });
            }
        }
    }
    Err(OwnerError::Io {
        action: "record the owner in",
        path: RunLayout::new(dir).owner_file(),
        cause: io::Error::other("the record kept changing under this process"),
    })
}

/// Like [`check`], but writes nothing: for commands that must leave the run directory as it
/// is (`submit --dry-run`). A run without a record may be read by any host.
pub fn check_read_only(dir: &Path) -> Result<()> {
    let this = Host::this();
    match read_owner(dir)? {
        Some(record) if record.host.hostname != this.hostname => Err(OwnerError::OtherHost {
            dir: dir.into(),
            heartbeat_age_s: read_heartbeat(dir).ok().flatten().map(|h| h.age_s()),
            owner: Box::new(record),
        }),
        _ => Ok(()),
    }
}

/// What `take-over` did.
#[derive(Debug, Clone, PartialEq)]
pub enum TakeOver {
    /// This host owned the run already.
    AlreadyOwner,
    /// The run was moved here from `previous`, whose last heartbeat was `heartbeat_age_s` old.
    Moved {
        previous: Host,
        heartbeat_age_s: Option<f64>,
    },
}

/// Moves the run to this host, refusing while the owner's heartbeat is younger than
/// `stale_after`.
pub fn take_over(dir: &Path, stale_after: Duration) -> Result<TakeOver> {
    let this = Host::this();
    let Some(record) = read_owner(dir)? else {
        check(dir)?;
        return Ok(TakeOver::AlreadyOwner);
    };
    if record.host.hostname == this.hostname {
        check(dir)?;
        return Ok(TakeOver::AlreadyOwner);
    }
    let beat = match heartbeat::read_strict(dir, &record.host.hostname)? {
        Some(beat) => Some(beat),
        // No heartbeat at all: an owner process that could not write one yet (or someone
        // deleted it) is not proof of silence. Wait the silence out: one that appears meanwhile
        // is a live owner.
        None => heartbeat::wait_for_one(dir, &record.host.hostname, stale_after)?,
    };
    let age = beat.as_ref().map(Heartbeat::age_s);
    // A heartbeat from the future (clocks apart) counts as fresh: better refuse than split.
    if let Some(age) = age.filter(|&a| a < stale_after.as_secs_f64()) {
        return Err(OwnerError::OwnerAlive {
            dir: dir.into(),
            owner: Box::new(record),
            age_s: age.max(0.0),
            stale_after_s: stale_after.as_secs_f64(),
        });
    }
    write(
        dir,
        &OwnerRecord::new(OwnedHow::TakenOver, Some(record.host.clone())),
    )?;
    Ok(TakeOver::Moved {
        previous: record.host,
        heartbeat_age_s: age,
    })
}

/// Whether this host (this boot) is still the owner: a long-running process checks it now and
/// then, so that a loop left running on a host the run was taken from stops.
pub fn still_owner(dir: &Path) -> Result<bool> {
    Ok(read_owner(dir)?.is_some_and(|r| r.host.same_boot(&Host::this())))
}

fn write(dir: &Path, record: &OwnerRecord) -> Result<()> {
    write_json(RunLayout::new(dir).owner_file(), record)
}

/// Writes the first record, unless one appeared meanwhile (false): a hard link fails when the
/// name exists, on NFS too, so two hosts opening a new run at once cannot both become owner.
fn write_first(dir: &Path, record: &OwnerRecord) -> Result<bool> {
    let path = RunLayout::new(dir).owner_file();
    let io_err = |action, source| OwnerError::Io {
        action,
        path: path.clone(),
        cause: source,
    };
    crate::access::create_run_dir(dir).map_err(|e| io_err("create the directory of", e))?;
    let tmp = atomic::tmp_path(&path);
    let bytes = serde_json::to_vec_pretty(record).expect("an owner record serialises");
    // Never through a link planted at the (predictable) temporary name.
    if let Err(e) =
        atomic::create_fresh(&tmp).and_then(|mut f| std::io::Write::write_all(&mut f, &bytes))
    {
        // A full disk: nothing half-written left behind.
        let _ = std::fs::remove_file(&tmp);
        return Err(io_err("write", e));
    }
    let linked = std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .and_then(|_| std::fs::hard_link(&tmp, &path));
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(io_err("write", e)),
    }
}

/// Seconds since the epoch, by this host's clock.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

fn describe_time(unix_s: f64) -> String {
    let age = unix_now() - unix_s;
    format!("{} ago", describe_age(age))
}

fn describe_heartbeat(age: Option<f64>) -> String {
    match age {
        Some(a) => format!("a process there held run.db {} ago", describe_age(a)),
        None => "no heartbeat recorded".into(),
    }
}

/// `42 s`, `7 min`, `3.5 h`, `2.0 days`.
pub fn describe_age(secs: f64) -> String {
    let s = secs.max(0.0);
    if s < 120.0 {
        format!("{s:.0} s")
    } else if s < 7200.0 {
        format!("{:.0} min", s / 60.0)
    } else if s < 172_800.0 {
        format!("{:.1} h", s / 3600.0)
    } else {
        format!("{:.1} days", s / 86_400.0)
    }
}

#[cfg(test)]
mod tests;
