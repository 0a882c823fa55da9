//! A full disk or an exceeded quota (issue 74): the run directory on a filesystem of a few MB
//! (a tmpfs the test mounts; skipped, saying why, where it cannot), filled to its last byte
//! during `plan`, during the embed jobs and the owner's ingest, and during `upload` into the
//! embedded Qdrant, and given back each time. Each stage says what is free and what to do, ends
//! with exit code 6 (or, the submit loop, holds its jobs and goes on by itself), and the run
//! ends exact: every paper once, no batch failed, no attempt used by the disk, no temporary
//! file left anywhere, no panic's exit 101 — through local jobs and the one-node Slurm (its job
//! logs on the full filesystem).

use crate::util::{slurm_up, wait_until, TestDir};
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// The plan of each test's run: 600 papers in two batches, into the small filesystem.
const PLAN: [&str; 7] = [
    "plan",
    "--corpus",
    "corpus.jsonl.gz",
    "--run-dir",
    "mnt/run",
    "--papers-per-job",
    "300",
];

/// The submit of each test's run, on this host's CPU.
const SUBMIT: [&str; 7] = [
    "submit",
    "--run-dir",
    "mnt/run",
    "--model-dir",
    "model",
    "--devices",
    "cpu",
];

/// A tmpfs mounted by the test, unmounted when dropped.
struct Tmpfs {
    path: PathBuf,
}

impl Tmpfs {
    /// A tmpfs of `size` (`mount`'s words: `4m`) at `t`'s `mnt`, or `None` (the test said to be
    /// skipped) where this machine cannot mount one: not root, or no mount in this sandbox.
    fn mount(t: &TestDir, size: &str, test: &str) -> Option<Self> {
        let path = t.join("mnt");
        std::fs::create_dir_all(&path).unwrap();
        let root = unsafe { libc::geteuid() } == 0;
        let mounted = root
            && std::process::Command::new("mount")
                .args([
                    "-t",
                    "tmpfs",
                    "-o",
                    &format!("size={size},mode=0755"),
                    "tmpfs",
                ])
                .arg(&path)
                .status()
                .is_ok_and(|s| s.success());
        if !mounted {
            assert!(
                std::env::var_os("EMBEDFLEET_REQUIRE_TMPFS").is_none(),
                "{test}: EMBEDFLEET_REQUIRE_TMPFS is set but no tmpfs could be mounted at {}",
                path.display()
            );
            eprintln!("skipping {test}: mounting a tmpfs needs root and mount(2) here");
            return None;
        }
        Some(Self { path })
    }

    /// Grows (or shrinks) it to `size`, as a quota raised would.
    fn resize(&self, size: &str) {
        let grown = std::process::Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.path)
            .status()
            .unwrap();
        assert!(grown.success());
    }

    /// Fills the filesystem to its last byte (a file of zeros written until it is full).
    fn fill(&self) -> PathBuf {
        self.fill_with("filler")
    }

    /// [`Tmpfs::fill`] with a file of its own name (to fill again what was given back).
    fn fill_with(&self, name: &str) -> PathBuf {
        let filler = self.path.join(name);
        let mut file = std::fs::File::create(&filler).unwrap();
        let block = vec![0u8; 64 << 10];
        loop {
            match std::io::Write::write(&mut file, &block) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
                    break;
                }
            }
        }
        assert_eq!(free(&self.path), 0);
        filler
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazily: a process of a failed test may still hold a file there.
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.path)
            .status();
    }
}

fn free(path: &Path) -> u64 {
    embedfleet_core::space::space_of(path).unwrap().free
}

/// Every temporary file ([`embedfleet_core::atomic::TMP_SUFFIX`]) under `dir`, but the embedded
/// Qdrant's own.
fn temporary_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                if !path.ends_with("qdrant") {
                    stack.push(path);
                }
            } else if path.to_string_lossy().ends_with(".tmp") {
                found.push(path);
            }
        }
    }
    found
}

/// What the run's embed jobs ended with, from run.db: (state, reason) of each.
fn job_ends(run: &Path) -> Vec<(String, String)> {
    let db = embedfleet_core::rundb::RunDb::open(run).unwrap();
    let mut stmt = db
        .conn()
        .prepare("SELECT state, COALESCE(exit_reason, '') FROM jobs ORDER BY id")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// The end every run here must reach: `papers` papers each once in the shards (pyarrow's
/// count aside, ours panics on a duplicate), every batch done, no temporary file, no exit 101,
/// the jobs the disk failed not counted against their batches.
fn assert_exact(run: &Path, papers: usize) {
    let rows = crate::util::shard_rows(run);
    assert_eq!(rows.len(), papers);
    let status = embedfleet_core::rundb::RunDb::open(run)
        .unwrap()
        .status()
        .unwrap();
    assert_eq!(
        status.batches_by_state.keys().collect::<Vec<_>>(),
        ["done"],
        "{:?}",
        status.batches_by_state
    );
    assert_eq!(temporary_files(run), Vec::<PathBuf>::new());
    for (state, reason) in job_ends(run) {
        assert!(!reason.contains("exit code 101"), "{state}: {reason}");
        if state != "completed" {
            assert!(
                reason.contains("not counted as an attempt"),
                "a job that failed for want of room is said not to count: {state}: {reason}"
            );
        }
    }
}

/// Starts a submit loop on the run in `mnt/run` with `extra` options, shards of 20 papers (15
/// a batch), fills the disk once the first shard is there (its job is still writing the
/// others), checks that the loop holds its jobs and says why without ending, gives the room
/// back, and waits for it to end: its stderr. The job the full disk met ended with exit code 6.
fn submit_through_a_full_disk(t: &TestDir, fs: &Tmpfs, extra: &[&str]) -> String {
    let mut args = SUBMIT.to_vec();
    args.extend_from_slice(&["--poll-interval", "0.3", "--shard-papers", "20"]);
    args.extend_from_slice(extra);
    // Each job waits after each shard: the disk fills while the first is mid-batch.
    let mut submit = t
        .cmd(&args)
        .env(embedfleet_embed::job::TEST_SHARD_DELAY_ENV, "300")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(t.join("submit.err")).unwrap())
        .spawn()
        .unwrap();
    let shards = t.join("mnt/run/shards");
    // A shard written whole (not one being written): its job has more to write.
    wait_until("a first shard", 120, || {
        std::fs::read_dir(&shards).is_ok_and(|d| {
            d.flatten()
                .any(|e| e.file_name().to_string_lossy().ends_with(".parquet"))
        })
    });
    let filler = fs.fill();
    let said = || std::fs::read_to_string(t.join("submit.err")).unwrap_or_default();
    wait_until("the loop says it has no room", 120, || {
        let err = said();
        err.contains("no room for another job") || err.contains("the run directory is full")
    });
    // The loop gives back what run.db's log held beyond its pages; taken too, so that the job
    // writing its shards meets the full disk.
    let again = fs.fill_with("filler-2");
    // Its end is taken in once run.db can be written again.
    let run = std::fs::canonicalize(t.join("mnt/run")).unwrap();
    let pattern = format!("embed-job --run-dir {}", run.display());
    wait_until("the job the full disk met ends", 120, || {
        !std::process::Command::new("pgrep")
            .args(["-f", &pattern])
            .status()
            .unwrap()
            .success()
    });
    // The loop waits: no exit while there is no room.
    std::thread::sleep(std::time::Duration::from_secs(2));
    assert!(submit.try_wait().unwrap().is_none(), "{}", said());
    std::fs::remove_file(filler).unwrap();
    std::fs::remove_file(again).unwrap();
    let status = submit.wait().unwrap();
    let err = said();
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let ends = job_ends(&t.join("mnt/run"));
    assert!(
        ends.iter()
            .any(|(_, reason)| reason.contains("exit code 6")),
        "a job met the full disk and ended with its exit code: {ends:?}\n{err}"
    );
    err
}

#[test]
fn a_full_disk_during_plan_jobs_ingest_and_upload_ends_exact_once_there_is_room() {
    let test = "a_full_disk_during_plan_jobs_ingest_and_upload_ends_exact_once_there_is_room";
    let t = TestDir::new();
    let Some(fs) = Tmpfs::mount(&t, "4m", test) else {
        return;
    };
    t.sample("corpus.jsonl.gz", 600, 1);
    t.run(&["make-tiny-model", "--out", "model"], 0);

    // plan: no room for its batch files. Exit 6, what to do, nothing half-written.
    let filler = fs.fill();
    let out = t.run(&PLAN, 6);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("No space left on device") && err.contains("run the same command again"),
        "{err}"
    );
    assert_eq!(temporary_files(&t.join("mnt")), Vec::<PathBuf>::new());
    std::fs::remove_file(&filler).unwrap();
    let out = t.run(&PLAN, 0);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("disk: the batch files take"), "{err}");

    // Before any job: a submit short of room says so with the numbers.
    let keep = 320_000;
    let partial = fs.path.join("partial");
    std::fs::write(&partial, vec![0u8; (free(&fs.path) - keep) as usize]).unwrap();
    let out = t.run(&[&SUBMIT[..], &["--dry-run"]].concat(), 0);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("warning: disk:")
            && err.contains("free at")
            && err.contains("the rest of the run writes about")
            && err.contains("more is needed before the run ends"),
        "{err}"
    );
    std::fs::remove_file(&partial).unwrap();

    // The jobs and the owner's ingest: the disk filled once a first shard is there.
    let err = submit_through_a_full_disk(&t, &fs, &["--queue", "local=1"]);
    assert!(
        err.contains("jobs are sent again") || err.contains("run.db written again"),
        "{err}"
    );
    assert_exact(&t.join("mnt/run"), 600);

    // upload into the embedded Qdrant: the engine maps a 32 MB log segment (a quota raised
    // for it: 64 MB), then no room at all.
    fs.resize("64m");
    let filler = fs.fill();
    let out = t.run(&["upload", "--run-dir", "mnt/run"], 6);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("free space or raise the quota") && err.contains("run the same command again"),
        "{err}"
    );
    std::fs::remove_file(&filler).unwrap();
    t.run(&["upload", "--run-dir", "mnt/run"], 0);
    let edge = embedfleet_vectordb::QdrantEdge::open(t.join("mnt/run/qdrant")).unwrap();
    let count =
        embedfleet_vectordb::Sink::count(&edge, embedfleet_vectordb::CountRequest::new("papers"))
            .unwrap();
    assert_eq!(count, 600);
    drop(edge);
    assert_exact(&t.join("mnt/run"), 600);
}

/// The same through the one-node Slurm: its jobs' logs are on the full filesystem too, so a job
/// that meets it cannot even say so there; it ends with exit code 6, never a panic's 101.
#[test]
fn a_full_disk_under_slurm_with_the_job_logs_on_it_ends_exact() {
    let test = "a_full_disk_under_slurm_with_the_job_logs_on_it_ends_exact";
    if !slurm_up(test) {
        return;
    }
    let t = TestDir::new();
    let Some(fs) = Tmpfs::mount(&t, "4m", test) else {
        return;
    };
    t.sample("corpus.jsonl.gz", 600, 1);
    t.run(&["make-tiny-model", "--out", "model"], 0);
    t.run(&PLAN, 0);
    submit_through_a_full_disk(&t, &fs, &["--backend", "slurm", "--queue", "debug=2"]);
    assert_exact(&t.join("mnt/run"), 600);
}
