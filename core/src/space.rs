//! Room on the run directory's filesystem: how much is free (`statvfs`), whether an error is a
//! full disk or an exceeded quota, and what the rest of a run will write.
//!
//! On a cluster the run directory sits on a shared filesystem under a project quota, and quotas
//! fill. A full disk is the environment's fault, not a batch's: the stages that meet one say so
//! with the numbers (what is free, what the rest needs, where), end with their own exit code
//! ([`crate::exit::DISK_FULL`]), and the same command goes on once there is room.

use std::io;
use std::path::{Path, PathBuf};

/// The room on one filesystem, as an unprivileged user sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Space {
    /// Bytes this user may still write (`f_bavail`: the root reserve left out).
    pub free: u64,
    /// The filesystem's size in bytes.
    pub total: u64,
}

/// The room on the filesystem that holds `path` (or, where `path` does not exist yet, its
/// nearest existing parent: a run directory about to be made).
pub fn space_of(path: &Path) -> io::Result<Space> {
    let existing = nearest_existing(path);
    let c = std::ffi::CString::new(existing.as_os_str().as_encoded_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: statvfs writes into a zeroed plain-data struct; the path is NUL-terminated.
    let st = unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut st) != 0 {
            return Err(io::Error::last_os_error());
        }
        st
    };
    let unit = st.f_frsize as u64;
    let free = st.f_bavail as u64 * unit;
    // On Lustre the user's quota is often what fills first: its room, where `lfs` says it.
    let free = match lustre_quota_free(&existing) {
        Some(quota) => free.min(quota),
        None => free,
    };
    Ok(Space {
        free,
        total: st.f_blocks as u64 * unit,
    })
}

/// Lustre's `f_type` (`LL_SUPER_MAGIC`).
const LUSTRE_MAGIC: i64 = 0x0BD0_0BD0;

/// The room this user's Lustre quota leaves at `dir` (`lfs quota -q -u UID DIR`, which needs no
/// privilege), where `dir` is on Lustre, `lfs` is there, and a limit is set; `None` otherwise.
fn lustre_quota_free(dir: &Path) -> Option<u64> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: statfs writes into a zeroed plain-data struct; the path is NUL-terminated.
    let kind = unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        if libc::statfs(c.as_ptr(), &mut st) != 0 {
            return None;
        }
        st.f_type as i64
    };
    if kind != LUSTRE_MAGIC {
        return None;
    }
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() }.to_string();
    let mut child = std::process::Command::new("lfs")
        .args(["quota", "-q", "-u", &uid])
        .arg(dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    // A Lustre whose quota server does not answer must not hold the caller: 10 s at most.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while child.try_wait().ok()?.is_none() {
        if std::time::Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take()?, &mut out).ok()?;
    lustre_room(&out)
}

/// The room left by `lfs quota -q` output: the hard limit (else the soft one) less what is
/// used, both in kB; `None` without a limit. A long filesystem name may be alone on its line,
/// its numbers on the next; a used figure over the quota ends with `*`.
fn lustre_room(out: &str) -> Option<u64> {
    let mut words = out.split_whitespace().skip(1);
    let mut number = || -> Option<u64> { words.next()?.trim_end_matches('*').parse().ok() };
    let (used, soft, hard) = (number()?, number()?, number()?);
    let limit = if hard > 0 { hard } else { soft };
    (limit > 0).then(|| limit.saturating_sub(used).saturating_mul(1024))
}

fn nearest_existing(path: &Path) -> PathBuf {
    let mut p = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    while !p.exists() {
        if !p.pop() {
            return PathBuf::from("/");
        }
    }
    p
}

/// Whether `e` is a full disk (ENOSPC) or an exceeded quota (EDQUOT).
pub fn is_disk_full(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// What embedfleet's own refusals for want of room end with (a check made before the write
/// that would fail), so that [`says_disk_full`] knows them too.
pub const NO_ROOM: &str = "(no room on that filesystem)";

/// Whether an error's words say a full disk or an exceeded quota: the operating system's
/// (`No space left on device (os error 28)`, `Disk quota exceeded (os error 122)`), SQLite's
/// (`database or disk is full`) or embedfleet's own ([`NO_ROOM`]). The stages' errors say
/// their cause in their message, whatever type carries it, so the words are what every one of
/// them has.
pub fn says_disk_full(text: &str) -> bool {
    [libc::ENOSPC, libc::EDQUOT]
        .iter()
        .any(|code| text.contains(&format!("(os error {code})")))
        || text.contains("database or disk is full")
        || text.contains(NO_ROOM)
}

/// Bytes one parquet shard row takes beside its vector: the id, the counts, the metadata the
/// corpus carries, the file's own overhead per row (docs/sizing.md, "Sizing a run").
pub const ROW_OVERHEAD_BYTES: u64 = 200;

/// Bytes the shards of `papers` papers take with `dim`-wide vectors of `bytes_per_value`.
pub fn shard_bytes(papers: u64, dim: u64, bytes_per_value: u64) -> u64 {
    papers.saturating_mul(dim * bytes_per_value + ROW_OVERHEAD_BYTES)
}

/// Bytes in the unit that reads best (`3.1 MB`, `12.4 GB`), decimal as `df -H` says them.
pub fn size(bytes: u64) -> String {
    const UNITS: [(&str, f64); 4] = [("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)];
    for (unit, scale) in UNITS {
        if bytes as f64 >= scale {
            return format!("{:.1} {unit}", bytes as f64 / scale);
        }
    }
    format!("{bytes} bytes")
}

/// The run directory's room as `status` shows it (its JSON's `disk`): what is free there and
/// what the rest of the run writes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DiskStatus {
    /// The run directory.
    pub dir: String,
    /// Bytes this user may still write on its filesystem.
    pub free_bytes: u64,
    /// The filesystem's size.
    pub total_bytes: u64,
    /// Bytes the shards of the papers not embedded yet will take, at the bytes per row of the
    /// newest shard (or the run's pinned width before the first); `None` before either is known.
    pub needed_bytes: Option<u64>,
}

impl DiskStatus {
    /// `status`'s line: `3.1 MB free at /r (of 8.0 MB); the rest of the run writes about 12.0 MB
    /// there: 8.9 MB short`.
    pub fn line(&self) -> String {
        let mut line = format!(
            "{} free at {} (of {})",
            size(self.free_bytes),
            self.dir,
            size(self.total_bytes)
        );
        if let Some(needed) = self.needed_bytes {
            line.push_str(&format!(
                "; the rest of the run writes about {} there",
                size(needed)
            ));
            if needed > self.free_bytes {
                line.push_str(&format!(": {} short", size(needed - self.free_bytes)));
            }
        }
        line
    }

    /// Whether the rest of the run is known not to fit.
    pub fn short(&self) -> bool {
        self.needed_bytes.is_some_and(|n| n > self.free_bytes)
    }
}

/// What the rest of a run will write, against the room where it writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Room {
    /// The run directory.
    pub dir: PathBuf,
    pub space: Space,
    /// Bytes the rest of the run will write there (its shards, and what goes with them).
    pub needed: u64,
    /// Bytes one job writes at least before it can finish (its batch's shards): with less free
    /// than that, no job can.
    pub per_job: u64,
}

/// How [`Room`] stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fit {
    /// The rest of the run fits.
    Fits,
    /// The next jobs fit, the whole rest does not: space must be made as the run goes.
    Short,
    /// Not even one job's batch fits in what is free: nothing can finish.
    Full,
    /// More than the whole filesystem: it never fits there.
    Never,
}

impl Room {
    pub fn fit(&self) -> Fit {
        if self.needed > self.space.total {
            Fit::Never
        } else if self.space.free < self.per_job {
            Fit::Full
        } else if self.space.free < self.needed {
            Fit::Short
        } else {
            Fit::Fits
        }
    }

    /// The room in words: `3.1 MB free at /scratch/r1 (of 8.0 MB); the rest of the run writes
    /// about 12.4 MB there`.
    pub fn describe(&self) -> String {
        format!(
            "{} free at {} (of {}); the rest of the run writes about {} there, a job at least {}",
            size(self.space.free),
            self.dir.display(),
            size(self.space.total),
            size(self.needed),
            size(self.per_job)
        )
    }

    /// What to do about it, in words; `None` when it fits.
    pub fn advice(&self) -> Option<String> {
        let short = size(self.needed.saturating_sub(self.space.free));
        match self.fit() {
            Fit::Fits => None,
            Fit::Short => Some(format!(
                "about {short} more is needed before the run ends: free space on that \
                 filesystem or raise the quota as it goes (jobs wait while there is no room for \
                 one), or use --vector-dtype f16 or a smaller --dim for a new run"
            )),
            Fit::Full => Some(format!(
                "not one job's shards fit: free at least {} there (about {short} for the whole \
                 run), then run the same command again",
                size(self.per_job.saturating_sub(self.space.free))
            )),
            Fit::Never => Some(
                "the rest of the run is larger than that whole filesystem: move the run \
                 directory to a larger one (plan into a new run directory there), or use \
                 --vector-dtype f16 or a smaller --dim"
                    .to_string(),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_systems_and_sqlites_words_for_a_full_disk_are_recognised() {
        let enospc = io::Error::from_raw_os_error(libc::ENOSPC);
        let edquot = io::Error::from_raw_os_error(libc::EDQUOT);
        assert!(is_disk_full(&enospc) && is_disk_full(&edquot));
        assert!(!is_disk_full(&io::Error::from_raw_os_error(libc::EIO)));
        for e in [&enospc, &edquot] {
            let wrapped = format!("failed to write shard /r/shards/b1.parquet: {e}");
            assert!(says_disk_full(&wrapped), "{wrapped}");
        }
        assert!(says_disk_full("run.db in /r: database or disk is full"));
        assert!(!says_disk_full(
            &io::Error::from_raw_os_error(libc::EIO).to_string()
        ));
        assert!(!says_disk_full("batch 28 failed (os error 2)"));
    }

    #[test]
    fn the_room_of_a_directory_yet_to_be_made_is_its_parents() {
        let dir = tempfile::tempdir().unwrap();
        let here = space_of(dir.path()).unwrap();
        let later = space_of(&dir.path().join("run/shards")).unwrap();
        assert_eq!(here.total, later.total);
        assert!(here.total > 0 && here.free <= here.total);
    }

    #[test]
    fn a_room_fits_falls_short_is_full_or_never_fits() {
        let room = |free, total, needed, per_job| Room {
            dir: "/scratch/r1".into(),
            space: Space { free, total },
            needed,
            per_job,
        };
        assert_eq!(room(100, 200, 50, 10).fit(), Fit::Fits);
        assert_eq!(room(100, 200, 150, 10).fit(), Fit::Short);
        assert_eq!(room(5, 200, 150, 10).fit(), Fit::Full);
        assert_eq!(room(100, 200, 250, 10).fit(), Fit::Never);
        assert!(room(100, 200, 50, 10).advice().is_none());
        let short = room(3_000_000, 20_000_000, 12_000_000, 1_000_000);
        assert_eq!(
            short.describe(),
            "3.0 MB free at /scratch/r1 (of 20.0 MB); the rest of the run writes about 12.0 MB \
             there, a job at least 1.0 MB"
        );
        assert!(short.advice().unwrap().contains("about 9.0 MB more"));
        let full = room(500_000, 8_000_000, 6_000_000, 1_000_000);
        assert!(full
            .advice()
            .unwrap()
            .contains("free at least 500.0 kB there"));
    }

    #[test]
    fn a_lustre_quota_leaves_its_limit_less_what_is_used() {
        // `lfs quota -q -u bob /mnt/lustre`, as Lustre's manual shows it.
        let line =
            "    /mnt/lustre       0   30720   30920       -       0   10000   11000       -";
        assert_eq!(lustre_room(line), Some(30920 * 1024));
        let over = "/lus/eagle  31000*  30720   30920   6d23h       12   10000   11000       -";
        assert_eq!(lustre_room(over), Some(0));
        let wrapped = "/lus/eagle/projects/a-very-long-project-name\n     1024   2048       0       -       1       0       0       -";
        assert_eq!(lustre_room(wrapped), Some(1024 * 1024));
        let unlimited = "/mnt/lustre  1024  0  0  -  1  0  0  -";
        assert_eq!(lustre_room(unlimited), None);
        assert_eq!(lustre_room("lfs: no such filesystem"), None);
    }

    #[test]
    fn sizes_read_in_the_unit_that_fits() {
        assert_eq!(size(999), "999 bytes");
        assert_eq!(size(3_100_000), "3.1 MB");
        assert_eq!(size(89_000_000_000), "89.0 GB");
        assert_eq!(shard_bytes(1000, 128, 4), 1000 * (512 + 200));
    }
}
