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

/// Writes `bytes` to `path` atomically.
pub fn write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    io::Write::write_all(&mut create_tmp(path)?, bytes)?;
    commit(path)
}

/// [`write`] for a file that holds secrets: its mode is exactly `mode`, whatever the umask, from
/// before its first byte is written.
pub fn write_with_mode(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut file = create_tmp(path)?;
    file.set_permissions(fs::Permissions::from_mode(mode))?;
    io::Write::write_all(&mut file, bytes)?;
    commit(path)
}

/// Copies the file `from` to `to` atomically.
pub fn copy(from: &Path, to: &Path) -> io::Result<u64> {
    let copied = io::copy(&mut File::open(from)?, &mut create_tmp(to)?)?;
    commit(to)?;
    Ok(copied)
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
