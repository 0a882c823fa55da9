//! Pinning: a setting a run fixes once and holds every later step to.
//!
//! A run pins what decides its results — the plan's batching rule (run.db), the output
//! settings of its shards (`output-settings.json`), its built shards' collection settings and
//! shard keys (`snapshots/`), its run config (run.db) — so that a restart typed with other
//! options, or with none, cannot mix two kinds of rows. Every such setting is compared here,
//! field by field, and every difference is worded the same way ([`Difference`]): the setting
//! as a user names it, the run's value, then the one given now.
//!
//! A pin kept in a file is written once, by whoever comes first ([`write_once`]): processes on
//! several hosts may pin at the same moment over a shared filesystem, and the loser reads the
//! winner's.

use std::fmt;
use std::io;
use std::path::Path;

/// One setting that differs from what the run pinned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    /// The setting as a user names it: a flag (`--shard-papers`), a run config key
    /// (`scheduler.backend`), a collection setting (`hnsw m`).
    pub name: String,
    /// The run's value, as shown.
    pub pinned: String,
    /// The value given now, as shown.
    pub given: String,
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: the run's {}, here {}",
            self.name, self.pinned, self.given
        )
    }
}

/// One setting of a pinned set: its name, what is compared, and what is shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    /// What decides whether two values are the same.
    pub compared: String,
    /// What a user is shown of it (the model's fingerprint and its directory, say, where only
    /// the fingerprint is compared: one model reached by two mount paths is the same model).
    pub shown: String,
}

impl Field {
    /// A setting compared and shown as `value`.
    pub fn new(name: impl Into<String>, value: impl fmt::Display) -> Self {
        let value = value.to_string();
        Self {
            name: name.into(),
            compared: value.clone(),
            shown: value,
        }
    }

    /// A setting compared by `compared` and shown as `shown`.
    pub fn shown_as(
        name: impl Into<String>,
        compared: impl fmt::Display,
        shown: impl fmt::Display,
    ) -> Self {
        Self {
            name: name.into(),
            compared: compared.to_string(),
            shown: shown.to_string(),
        }
    }
}

/// What a pinned field that the other side lacks is shown as.
pub const UNSET: &str = "(unset)";

/// A set of settings a run pins, compared field by field.
pub trait Pinned {
    /// Each setting, in the order differences are told.
    fn fields(&self) -> Vec<Field>;

    /// What differs between the run's settings (`self`) and `given`, one entry per setting
    /// (empty when none does).
    fn differences(&self, given: &Self) -> Vec<Difference> {
        compare(&self.fields(), &given.fields())
    }
}

/// The differences between the run's fields and the given ones, matched by name, in the run's
/// order and then the given side's new names. A field one side lacks is [`UNSET`] there.
pub fn compare(pinned: &[Field], given: &[Field]) -> Vec<Difference> {
    let find = |fields: &[Field], name: &str| fields.iter().position(|f| f.name == name);
    let mut out = Vec::new();
    for p in pinned {
        let g = find(given, &p.name).map(|i| &given[i]);
        if g.map(|g| &g.compared) != Some(&p.compared) {
            out.push(Difference {
                name: p.name.clone(),
                pinned: p.shown.clone(),
                given: g.map_or(UNSET.to_string(), |g| g.shown.clone()),
            });
        }
    }
    for g in given.iter().filter(|g| find(pinned, &g.name).is_none()) {
        out.push(Difference {
            name: g.name.clone(),
            pinned: UNSET.to_string(),
            given: g.shown.clone(),
        });
    }
    out
}

/// The differences as one line, `; ` between them.
pub fn join(differences: &[Difference]) -> String {
    differences
        .iter()
        .map(Difference::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// Where a resolved setting came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Given on this command line.
    Given,
    /// What the run pinned (or its earlier command was given): a restart typed without it.
    Run,
    /// Neither: the default.
    Default,
}

/// A setting resolved once: as given, else as the run has it, else the default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolved<T> {
    pub value: T,
    pub source: Source,
}

impl<T> Resolved<T> {
    /// `given`, else `run`, else `default()`.
    pub fn of(given: Option<T>, run: Option<T>, default: impl FnOnce() -> T) -> Self {
        match (given, run) {
            (Some(value), _) => Self {
                value,
                source: Source::Given,
            },
            (None, Some(value)) => Self {
                value,
                source: Source::Run,
            },
            (None, None) => Self {
                value: default(),
                source: Source::Default,
            },
        }
    }

    /// A setting whose default is "none" (a dimension left as the model's, no token cap):
    /// `given`, else `run`, else `None`.
    pub fn optional(given: Option<T>, run: Option<T>) -> Resolved<Option<T>> {
        Resolved::of(given.map(Some), run.map(Some), || None)
    }

    /// Whether the run's value was taken (the command line gave none).
    pub fn from_run(&self) -> bool {
        self.source == Source::Run
    }

    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Resolved<U> {
        Resolved {
            value: f(self.value),
            source: self.source,
        }
    }
}

/// Writes `bytes` at `path` unless a file is there: the first writer wins, on one host or
/// several (the file appears by a hard link, which never replaces; it is written and synced
/// under a name of its own first, so a reader never sees half of it). True when this call
/// wrote it.
pub fn write_once(path: &Path, bytes: &[u8]) -> io::Result<bool> {
    if path.exists() {
        return Ok(false);
    }
    // A name of its own: threads of one process share a pid, processes of several hosts may.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut tmp = crate::atomic::tmp_path(path).into_os_string();
    tmp.push(format!(".{n}{}", crate::atomic::TMP_SUFFIX));
    let tmp = std::path::PathBuf::from(tmp);
    if let Err(e) = std::fs::write(&tmp, bytes) {
        // A full disk: nothing half-written left behind.
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    let linked = std::fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .and_then(|()| std::fs::hard_link(&tmp, path));
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Settings(Vec<(&'static str, &'static str)>);

    impl Pinned for Settings {
        fn fields(&self) -> Vec<Field> {
            self.0.iter().map(|(n, v)| Field::new(*n, v)).collect()
        }
    }

    #[test]
    fn every_difference_is_worded_alike_and_a_missing_side_is_unset() {
        let run = Settings(vec![("--dim", "256"), ("walltime", "01:00:00")]);
        let here = Settings(vec![("--dim", "512"), ("env.TOKEN", "***")]);
        let told: Vec<String> = run
            .differences(&here)
            .iter()
            .map(|d| d.to_string())
            .collect();
        assert_eq!(
            told,
            [
                "--dim: the run's 256, here 512",
                "walltime: the run's 01:00:00, here (unset)",
                "env.TOKEN: the run's (unset), here ***",
            ]
        );
        assert!(run.differences(&Settings(run.0.clone())).is_empty());
    }

    #[test]
    fn a_field_shown_otherwise_is_compared_by_its_key_alone() {
        let a = [Field::shown_as("model", "f00d", "f00d (/eagle/q)")];
        let b = [Field::shown_as("model", "f00d", "f00d (/lus/eagle/q)")];
        assert!(compare(&a, &b).is_empty());
        let c = [Field::shown_as("model", "beef", "beef (/eagle/q)")];
        assert_eq!(
            compare(&a, &c)[0].to_string(),
            "model: the run's f00d (/eagle/q), here beef (/eagle/q)"
        );
    }

    #[test]
    fn a_setting_is_as_given_else_the_runs_else_the_default() {
        let r = Resolved::of(Some(2), Some(5), || 9);
        assert_eq!((r.value, r.source), (2, Source::Given));
        let r = Resolved::of(None, Some(5), || 9);
        assert_eq!((r.value, r.source), (5, Source::Run));
        assert!(r.from_run());
        let r = Resolved::<i32>::of(None, None, || 9);
        assert_eq!((r.value, r.source), (9, Source::Default));
    }

    #[test]
    fn the_first_writer_wins_and_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pin.json");
        let wins: Vec<bool> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|i| {
                    let path = &path;
                    s.spawn(move || write_once(path, format!("{i}").as_bytes()).unwrap())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(wins.iter().filter(|w| **w).count(), 1, "{wins:?}");
        let winner = wins.iter().position(|w| *w).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), winner.to_string());
        assert!(!write_once(&path, b"later").unwrap());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
