//! Files that are either absent or complete: written to a temporary name in the same
//! directory, fsynced, renamed, and the directory fsynced. A reader that sees the final name
//! sees the whole file, whatever moment a writer was killed at.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

/// The suffix of files being written. Anything with it is garbage from a killed writer.
pub const TMP_SUFFIX: &str = ".tmp";

/// The temporary name `path` is written under: `NAME.HOST.PID.tmp`, so two processes writing
/// the same file at once (two jobs rewriting `output-settings.json`, say) never write into one
/// temporary file — not even two with the same pid on two nodes over a shared filesystem; the
/// last rename wins, whole.
pub fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(
        ".{}.{}{TMP_SUFFIX}",
        host_tag(),
        std::process::id()
    ));
    path.with_file_name(name)
}

/// This host's name as it may stand in a file name (no `/`, no dots to confuse the suffix).
fn host_tag() -> &'static str {
    static TAG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TAG.get_or_init(|| {
        crate::host::name()
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    })
}

/// Makes a file written at `tmp_path(path)` durable under `path`.
pub fn commit(path: &Path) -> io::Result<()> {
    let tmp = tmp_path(path);
    File::open(&tmp)?.sync_all()?;
    fs::rename(&tmp, path)?;
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => sync_dir(dir),
        _ => sync_dir(Path::new(".")),
    }
}

/// Creates the temporary file of `path` ([`tmp_path`]) for writing, never through a link: the
/// name is predictable (host and pid), so another user who can write the directory could plant
/// a symlink there, and a plain create would truncate its target. Whatever is at the name (a
/// killed writer's leftover, or a planted link) is unlinked — the link itself, not its target
/// — and the file is made with `O_CREAT|O_EXCL|O_NOFOLLOW`: anything planted again in between
/// is an error, never followed.
pub fn create_tmp(path: &Path) -> io::Result<File> {
    create_fresh(&tmp_path(path))
}

/// Creates `path` anew for writing, never through a link (see [`create_tmp`]), for a caller
/// that names its own temporary file.
pub fn create_fresh(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    match fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Writes `bytes` to `path` atomically. A write that fails (a full disk) leaves nothing
/// behind: its temporary file goes too.
pub fn write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    or_discard(path, || {
        io::Write::write_all(&mut create_tmp(path)?, bytes)?;
        commit(path)
    })
}

/// [`write`] for a file that holds secrets: its mode is exactly `mode`, whatever the umask, from
/// before its first byte is written.
pub fn write_with_mode(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    or_discard(path, || {
        let mut file = create_tmp(path)?;
        file.set_permissions(fs::Permissions::from_mode(mode))?;
        io::Write::write_all(&mut file, bytes)?;
        commit(path)
    })
}

/// Copies the file `from` to `to` atomically (nothing left behind when it fails).
pub fn copy(from: &Path, to: &Path) -> io::Result<u64> {
    or_discard(to, || {
        let copied = io::copy(&mut File::open(from)?, &mut create_tmp(to)?)?;
        commit(to)?;
        Ok(copied)
    })
}

/// Runs `write`, which writes `path` by its temporary file; when it fails, the temporary file
/// is removed (a full disk must not be kept full by the halves of failed writes).
pub fn or_discard<T>(path: &Path, write: impl FnOnce() -> io::Result<T>) -> io::Result<T> {
    let result = write();
    if result.is_err() {
        discard(path);
    }
    result
}

/// Removes `path`'s temporary file when dropped, unless [`TmpGuard::committed`] said the file
/// made it: a writer object (a parquet shard's, a batch file's) that fails or is dropped
/// half-way leaves nothing behind. Keep it as a field of the writer.
#[derive(Debug)]
pub struct TmpGuard {
    path: PathBuf,
    armed: bool,
}

impl TmpGuard {
    /// Guards the temporary file of `path`.
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            armed: true,
        }
    }

    /// The file was committed: nothing to remove.
    pub fn committed(mut self) {
        self.armed = false;
    }
}

impl Drop for TmpGuard {
    fn drop(&mut self) {
        if self.armed {
            discard(&self.path);
        }
    }
}

/// Removes the temporary file of `path` ([`tmp_path`]), if there is one: a write given up.
pub fn discard(path: &Path) {
    let _ = fs::remove_file(tmp_path(path));
}

/// Removes, under `dir` and its folders (but `skip`'s, by name), the temporary files writers
/// left that nobody is writing any more: this host's whose process is gone (their name carries
/// the host and the pid: [`tmp_path`]), and another host's untouched for `stale_after` (a
/// writer writes a shard in minutes; a node that crashed mid-write never comes back for it).
/// Returns how many went. What cannot be read is passed over: this is housekeeping.
pub fn remove_dead_writers_leftovers(
    dir: &Path,
    skip: &[&str],
    stale_after: std::time::Duration,
) -> usize {
    let mut removed = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                if !skip.contains(&name.as_ref()) {
                    stack.push(entry.path());
                }
                continue;
            }
            if !kind.is_file() || !is_dead_writers(&name, &entry, stale_after) {
                continue;
            }
            if fs::remove_file(entry.path()).is_ok() {
                removed += 1;
            }
        }
    }
    removed
}

/// Whether the file `name` is a temporary file ([`tmp_path`]) whose writer is gone.
fn is_dead_writers(name: &str, entry: &fs::DirEntry, stale_after: std::time::Duration) -> bool {
    let Some(stem) = name.strip_suffix(TMP_SUFFIX) else {
        return false;
    };
    let mut parts = stem.rsplitn(3, '.');
    let (Some(pid), Some(host)) = (parts.next(), parts.next()) else {
        return false;
    };
    if parts.next().is_none() {
        return false;
    }
    let Ok(pid) = pid.parse::<i32>() else {
        return false;
    };
    if host == host_tag() {
        // SAFETY: kill with signal 0 only asks whether the process exists.
        let gone = unsafe { libc::kill(pid, 0) } != 0
            && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        return gone;
    }
    entry
        .metadata()
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age > stale_after)
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    // Directory fsync makes the rename itself durable; some filesystems refuse it, which is fine.
    match File::open(dir).and_then(|d| d.sync_all()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => Ok(()),
        Err(e) if e.raw_os_error() == Some(22) => Ok(()), // EINVAL: no fsync on this fs
        Err(e) => Err(e),
    }
}

/// Removes leftovers of killed writers in `dir` (not recursive). Returns how many went.
pub fn remove_leftovers(dir: &Path) -> io::Result<usize> {
    let mut removed = 0;
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        if entry.file_name().to_string_lossy().ends_with(TMP_SUFFIX) {
            fs::remove_file(entry.path())?;
            removed += 1;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_planted_at_the_temporary_name_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("authorized_keys");
        fs::write(&victim, b"the victim's key").unwrap();
        let path = dir.path().join("owner-heartbeat.json");
        std::os::unix::fs::symlink(&victim, tmp_path(&path)).unwrap();
        write(&path, b"{}").unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"the victim's key");
        assert_eq!(fs::read(&path).unwrap(), b"{}");
        assert!(!fs::symlink_metadata(&path).unwrap().is_symlink());
        assert!(
            fs::symlink_metadata(tmp_path(&path)).is_err(),
            "nothing left"
        );
    }

    #[test]
    fn leftovers_of_dead_writers_go_and_a_live_ones_stays() {
        let dir = tempfile::tempdir().unwrap();
        let shards = dir.path().join("shards");
        fs::create_dir(&shards).unwrap();
        let mine = tmp_path(&shards.join("b1.parquet"));
        fs::write(&mine, b"being written").unwrap();
        // A pid no process has (above the kernel's pid_max).
        let dead = shards.join(format!("b2.parquet.{}.99999999.tmp", host_tag()));
        fs::write(&dead, b"half").unwrap();
        let elsewhere = shards.join("b3.parquet.node-7.1234.tmp");
        fs::write(&elsewhere, b"half").unwrap();
        let skipped = dir.path().join("qdrant");
        fs::create_dir(&skipped).unwrap();
        let engines = skipped.join(format!("wal.{}.99999999.tmp", host_tag()));
        fs::write(&engines, b"not ours").unwrap();
        let day = std::time::Duration::from_secs(86_400);
        assert_eq!(
            remove_dead_writers_leftovers(dir.path(), &["qdrant"], day),
            1
        );
        assert!(mine.exists() && !dead.exists() && elsewhere.exists() && engines.exists());
        // Another host's, once older than the stale age.
        assert_eq!(
            remove_dead_writers_leftovers(dir.path(), &["qdrant"], std::time::Duration::ZERO),
            1
        );
        assert!(!elsewhere.exists() && mine.exists());
    }

    #[test]
    fn a_failed_write_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("status-snapshot.json");
        let err = or_discard(&path, || {
            io::Write::write_all(&mut create_tmp(&path)?, b"half")?;
            Err::<(), _>(io::Error::from_raw_os_error(libc::ENOSPC))
        })
        .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
        assert!(!tmp_path(&path).exists() && !path.exists());
    }

    #[test]
    fn write_replaces_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.json");
        write(&path, b"one").unwrap();
        write(&path, b"two").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert!(!tmp_path(&path).exists());
    }

    #[test]
    fn leftovers_are_removed_and_finished_files_kept() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("x.parquet.tmp"), b"half").unwrap();
        fs::write(dir.path().join("y.parquet"), b"whole").unwrap();
        assert_eq!(remove_leftovers(dir.path()).unwrap(), 1);
        assert!(dir.path().join("y.parquet").exists());
        assert!(!dir.path().join("x.parquet.tmp").exists());
    }

    #[test]
    fn each_process_writes_under_its_own_temporary_name() {
        let tmp = tmp_path(Path::new("/run/quarantine.jsonl"));
        let name = tmp.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(
            name,
            format!("quarantine.jsonl.{}.{}.tmp", host_tag(), std::process::id())
        );
        assert!(
            !host_tag().is_empty() && !host_tag().contains(['/', '.']),
            "{}",
            host_tag()
        );
        assert!(
            name.ends_with(TMP_SUFFIX),
            "leftovers are still found by their suffix"
        );
    }
}
