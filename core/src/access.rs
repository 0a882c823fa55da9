//! Who can read and write a run directory (docs/cluster.md, "Who can read and write a run
//! directory").
//!
//! run.db keeps the run config of the first submit, with its `[scheduler.script] env` values
//! and its `[notify] command` (often a webhook token), and the job scripts carry the same
//! values: secrets, and commands the owner's next `submit` runs as the owner. So:
//!
//! - embedfleet creates a run directory `0700`. One the user made beforehand keeps its mode,
//!   and that mode is how a user asks to share the run with a group: a directory its group may
//!   enter and list and others may not (`mkdir -m 750`, or `2750`) makes a group run
//!   ([`Reach::Group`]); any other mode a private one ([`Reach::Owner`]).
//! - The files that hold secrets — run.db (SQLite gives its `-wal` and `-shm` the database's
//!   mode), the job scripts, the notify hook's log — get their mode from that reach, never from
//!   the umask: `0600` (`0640` for a group run), scripts `0700` (`0750`).
//! - Other files go through [`crate::atomic`], which never lets anyone but their owner write
//!   them.
//! - A run.db that someone else could have written (its mode, or its owner) is not trusted to
//!   hold the commands the owner runs: see [`db_writable_by_others`]. A run directory others
//!   can write is warned about: they can delete and replace its files.

use std::fs::{self, File, Permissions};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::layout::RunLayout;

/// The section of docs/cluster.md the messages point to.
pub const DOC: &str = "docs/cluster.md, \"Who can read and write a run directory\"";

/// Who besides its owner may read a run's private files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// Nobody: the default, and every run directory not made for a group.
    Owner,
    /// The run directory's group (read, never write): the user made the directory so.
    Group,
}

impl Reach {
    /// What the run directory's mode asks for: [`Reach::Group`] when its group may enter and
    /// list it (`r-x`) and others may do neither; otherwise (or when it does not exist yet)
    /// [`Reach::Owner`].
    pub fn of_run_dir(dir: &Path) -> Reach {
        match fs::metadata(dir) {
            Ok(m) if m.mode() & 0o050 == 0o050 && m.mode() & 0o007 == 0 => Reach::Group,
            _ => Reach::Owner,
        }
    }

    /// The mode of a directory embedfleet makes inside the run directory.
    pub fn dir_mode(self) -> u32 {
        match self {
            Reach::Owner => 0o700,
            Reach::Group => 0o750,
        }
    }

    /// The mode of a private file: run.db, a hook's log.
    pub fn file_mode(self) -> u32 {
        match self {
            Reach::Owner => 0o600,
            Reach::Group => 0o640,
        }
    }

    /// The mode of a job script (it holds the `env` values).
    pub fn script_mode(self) -> u32 {
        self.dir_mode()
    }
}

/// Creates the run directory `0700` when it does not exist (its parents as the umask makes
/// them: they are the user's). An existing one keeps its mode: see [`Reach::of_run_dir`].
pub fn create_run_dir(dir: &Path) -> io::Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent)?;
    }
    match fs::create_dir(dir) {
        // Set, not asked of `mkdir`: the umask does not decide it.
        Ok(()) => fs::set_permissions(dir, Permissions::from_mode(Reach::Owner.dir_mode())),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists && dir.is_dir() => Ok(()),
        Err(e) => Err(e),
    }
}

/// Creates the directory `path` inside the run directory (and its missing parents) with the
/// run's reach, when it does not exist; an existing one is left as it is.
pub fn create_dir_in_run(path: &Path, reach: Reach) -> io::Result<()> {
    if path.is_dir() {
        return Ok(());
    }
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(reach.dir_mode())
        .create(path)?;
    fs::set_permissions(path, Permissions::from_mode(reach.dir_mode()))
}

/// Creates `path`, which must not exist, with exactly `mode` (the umask does not apply), never
/// through a link.
pub fn create_file(path: &Path, mode: u32) -> io::Result<File> {
    let file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    file.set_permissions(Permissions::from_mode(mode))?;
    Ok(file)
}

/// Opens `path` to append to it (a log), created with `mode` when new, never through a link: a
/// name someone else put there is refused (`ELOOP`), not followed.
pub fn open_append(path: &Path, mode: u32) -> io::Result<File> {
    fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(mode)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// run.db and the files SQLite keeps beside it.
pub fn db_files(dir: &Path) -> [PathBuf; 3] {
    let db = RunLayout::new(dir).db();
    let beside = |suffix: &str| {
        let mut name = db.clone().into_os_string();
        name.push(suffix);
        PathBuf::from(name)
    };
    [beside(""), beside("-wal"), beside("-shm")]
}

/// Readies run.db before SQLite opens it (the owner's open, never a read-only look): a new one
/// is created empty with its reach's mode, so that SQLite, which gives `-wal` and `-shm` the
/// database's mode, makes those private too. An existing one that others may read beyond its
/// reach (a run.db from before modes were set: `0644`) is tightened, with a warning; one that
/// others may write is left as it is and warned about: its stored run config is refused (see
/// [`db_writable_by_others`]) until the user has looked at it and fixed the mode. Warns too when
/// others can write the run directory.
pub fn prepare_db(dir: &Path) -> io::Result<()> {
    warn_if_dir_writable(dir);
    let reach = Reach::of_run_dir(dir);
    let [db, ..] = db_files(dir);
    match create_file(&db, reach.file_mode()) {
        Ok(_) => return Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    if let Some(why) = db_writable_by_others(dir) {
        tracing::warn!(
            "{why}: this run's stored run config (its notify command, its job scripts' setup \
             and env) is not used until only you can write run.db; see {DOC}"
        );
        return Ok(());
    }
    for path in db_files(dir) {
        tighten(&path, reach.file_mode())?;
    }
    Ok(())
}

/// Takes away the read bits `path` (if it exists, and is its owner's: this user's) has beyond
/// `allowed`.
fn tighten(path: &Path, allowed: u32) -> io::Result<()> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let mode = meta.mode() & 0o777;
    if !meta.is_file() || meta.uid() != euid() || mode & !allowed == 0 {
        return Ok(());
    }
    fs::set_permissions(path, Permissions::from_mode(mode & allowed))?;
    tracing::warn!(
        "{} was readable by others (mode {mode:o}), and it holds the run config's secrets: made \
         it {:o}; see {DOC}",
        path.display(),
        mode & allowed
    );
    Ok(())
}

/// Why someone other than this user could have written run.db (or the `-wal`/`-shm` SQLite
/// reads it through), if they could: a file another user owns, a link, or one whose group or
/// others may write. A command stored there is then not run as this user.
pub fn db_writable_by_others(dir: &Path) -> Option<String> {
    db_files(dir).iter().find_map(|path| {
        let meta = fs::symlink_metadata(path).ok()?;
        let mode = meta.mode() & 0o777;
        if meta.file_type().is_symlink() {
            Some(format!("{} is a symbolic link", path.display()))
        } else if meta.uid() != euid() {
            Some(format!(
                "{} belongs to another user (uid {})",
                path.display(),
                meta.uid()
            ))
        } else if mode & 0o022 != 0 {
            Some(format!(
                "{} can be written by {} (mode {mode:o})",
                path.display(),
                writers(mode)
            ))
        } else {
            None
        }
    })
}

/// Warns when others can write the run directory: they can then delete or replace its files.
fn warn_if_dir_writable(dir: &Path) {
    let Ok(meta) = fs::metadata(dir) else {
        return;
    };
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        tracing::warn!(
            "the run directory {} can be written by {} (mode {mode:o}): they can delete or \
             replace the run's files; `chmod g-w,o-w {}` fixes it (see {DOC})",
            dir.display(),
            writers(mode),
            dir.display()
        );
    }
}

/// "its group", "others" or "its group and others", for the write bits of `mode`.
fn writers(mode: u32) -> &'static str {
    match (mode & 0o020 != 0, mode & 0o002 != 0) {
        (true, true) => "its group and others",
        (true, false) => "its group",
        _ => "others",
    }
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        fs::symlink_metadata(path).unwrap().mode() & 0o777
    }

    #[test]
    fn a_new_run_directory_is_its_owners_and_an_existing_one_keeps_its_mode() {
        let base = tempfile::tempdir().unwrap();
        let run = base.path().join("a/run");
        create_run_dir(&run).unwrap();
        assert_eq!(mode(&run), 0o700);
        assert_eq!(Reach::of_run_dir(&run), Reach::Owner);
        let shared = base.path().join("shared");
        fs::create_dir(&shared).unwrap();
        fs::set_permissions(&shared, Permissions::from_mode(0o750)).unwrap();
        create_run_dir(&shared).unwrap();
        assert_eq!(mode(&shared), 0o750);
        assert_eq!(Reach::of_run_dir(&shared), Reach::Group);
        // Open to others (a umask's 0755 or 0775): not a group run, a private one.
        fs::set_permissions(&shared, Permissions::from_mode(0o775)).unwrap();
        assert_eq!(Reach::of_run_dir(&shared), Reach::Owner);
    }

    #[test]
    fn a_private_file_gets_its_mode_whatever_the_umask() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        create_file(&path, 0o640).unwrap();
        assert_eq!(mode(&path), 0o640);
        assert_eq!(
            create_file(&path, 0o600).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        let sub = dir.path().join("jobs/x");
        create_dir_in_run(&sub, Reach::Group).unwrap();
        assert_eq!(mode(&sub), 0o750);
    }

    #[test]
    fn a_log_is_appended_to_but_a_link_at_its_name_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("notify.log");
        io::Write::write_all(&mut open_append(&log, 0o600).unwrap(), b"a\n").unwrap();
        io::Write::write_all(&mut open_append(&log, 0o600).unwrap(), b"b\n").unwrap();
        assert_eq!(fs::read(&log).unwrap(), b"a\nb\n");
        assert_eq!(mode(&log), 0o600);
        let victim = dir.path().join("victim");
        fs::write(&victim, b"keep").unwrap();
        let planted = dir.path().join("job.log");
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        assert!(open_append(&planted, 0o600).is_err());
        assert_eq!(fs::read(&victim).unwrap(), b"keep");
    }

    #[test]
    fn an_old_readable_run_db_is_tightened_and_a_writable_one_is_not_trusted() {
        let dir = tempfile::tempdir().unwrap();
        fs::set_permissions(dir.path(), Permissions::from_mode(0o755)).unwrap();
        let [db, wal, _] = db_files(dir.path());
        fs::write(&db, b"").unwrap();
        fs::set_permissions(&db, Permissions::from_mode(0o644)).unwrap();
        fs::write(&wal, b"").unwrap();
        fs::set_permissions(&wal, Permissions::from_mode(0o644)).unwrap();
        assert_eq!(db_writable_by_others(dir.path()), None);
        prepare_db(dir.path()).unwrap();
        assert_eq!((mode(&db), mode(&wal)), (0o600, 0o600));

        fs::set_permissions(&wal, Permissions::from_mode(0o664)).unwrap();
        let why = db_writable_by_others(dir.path()).unwrap();
        assert!(
            why.contains("run.db-wal can be written by its group (mode 664)"),
            "{why}"
        );
        prepare_db(dir.path()).unwrap();
        assert_eq!(mode(&wal), 0o664, "left for the user to look at");

        fs::remove_file(&wal).unwrap();
        std::os::unix::fs::symlink("/elsewhere", &wal).unwrap();
        assert!(db_writable_by_others(dir.path())
            .unwrap()
            .contains("symbolic link"));
    }
}
