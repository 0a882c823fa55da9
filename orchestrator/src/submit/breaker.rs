/*!
The breaker: stops the submit loop when every job fails the same way.

A missing cuDNN on the compute nodes, a bad `module load` line or a full quota makes every job
exit alike; without a breaker the loop sends each batch in turn, up to `--max-attempts`, and
burns the allocation on jobs that cannot work. After `after` jobs in a row failed with the same
[`Signature`] (at the first for a refusal, exit 2 or 4, which fails the same way everywhere) the
loop pauses the run and records why ([`PauseReason`]); `embedfleet resume` goes on after the fix.

What counts:
- A job that ended by itself without finishing its batches (a non-zero exit, or exit 0 with its
  batch not done): it counts, with its signature.
- A job that finished every batch: resets the count (the failures were not "every job").
- Walltime kills, node failures, preemption, out-of-memory kills, cancellations and lost jobs:
  neither count nor reset. They come from the scheduler and its limits, are retried as before,
  and say nothing about whether the job's own setup works; a walltime kill between two
  identical setup failures does not hide them.
- A failure with another signature starts a new count at 1.
*/

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use embedfleet_core::rundb::PauseReason;
use embedfleet_core::state::JobStatus;

use crate::scheduler::JobState;

/// The breaker's default: three jobs in a row failing alike pause the loop. One would pause on
/// a single bad node; three in a row on a week-long run are a pattern, and cost three jobs.
pub const DEFAULT_BREAKER_AFTER: u32 = 3;

/// Exit codes that pause at the first failure: embed-job's usage error (2) and refusal (4,
/// e.g. a model directory the node cannot read) come from settings every job shares: the
/// route's setup exit codes, which are not retried either.
use crate::route::SETUP_EXIT_CODES as PAUSE_AT_FIRST;

/// How much of the end of a job log is read for its first error line: a job that fails after
/// hours has a long log whose error is near its end.
const LOG_TAIL_BYTES: u64 = 256 * 1024;

/// The longest error line kept (characters), so a signature stays one readable line.
const MAX_LINE_CHARS: usize = 300;

/// What a failed job's end looked like: its exit (code, or the scheduler's words when there
/// is no code) and the first error line of its log, normalised (see [`normalise`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Signature {
    /// The job's exit code, when the scheduler reported one.
    pub exit_code: Option<i32>,
    /// `exit code N`, or the scheduler's reason normalised (`killed by signal #`).
    pub exit: String,
    /// The first error line of the log, normalised; `None` without a log or a non-empty line.
    pub first_error: Option<String>,
}

impl std::fmt::Display for Signature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.first_error {
            Some(line) => write!(f, "{}; first error line: {line}", self.exit),
            None => write!(f, "{}; no error line in the log", self.exit),
        }
    }
}

impl Signature {
    /// The signature of a job that ended in `state` (recorded as `status`) with its log at
    /// `log`; `None` when the end does not count for the breaker (see the module's doc).
    pub fn of(state: &JobState, status: JobStatus, log: Option<&Path>) -> Option<Self> {
        let (exit_code, exit) = match state {
            _ if status == JobStatus::Lost => return None,
            JobState::Completed => (Some(0), "exit code 0".to_string()),
            JobState::Failed {
                exit_code: Some(code),
                ..
            } => (Some(*code), format!("exit code {code}")),
            JobState::Failed {
                exit_code: None,
                reason,
            } => (None, normalise(reason)),
            _ => return None,
        };
        let first_error = log
            .and_then(read_tail)
            .as_deref()
            .and_then(first_error_line);
        Some(Self {
            exit_code,
            exit,
            first_error,
        })
    }

    /// A refusal (exit 2 or 4): the settings every job shares, never one queue's.
    pub fn pauses_at_first(&self) -> bool {
        self.exit_code.is_some_and(|c| PAUSE_AT_FIRST.contains(&c))
    }

    /// Its node's device refused (exit 5, a GPU without FP8 tensor cores): that queue is set
    /// aside at the first; the run pauses at the first when no other queue takes jobs.
    pub fn refused_by_device(&self) -> bool {
        self.exit_code == Some(embedfleet_core::exit::DEVICE_REFUSED)
    }
}

/// One failed job, as the breaker keeps it.
#[derive(Debug, Clone)]
pub struct Failure {
    pub job: String,
    pub log: Option<String>,
    pub signature: Signature,
}

/// Counts jobs in a row that failed alike.
#[derive(Debug)]
pub struct Breaker {
    after: u32,
    streak: Vec<Failure>,
}

impl Breaker {
    /// Trips after `after` failures alike; 0 never trips.
    pub fn new(after: u32) -> Self {
        Self {
            after,
            streak: Vec::new(),
        }
    }

    /// A job finished its batches: the count starts again.
    pub fn success(&mut self) {
        self.streak.clear();
    }

    /// A job failed; the reason to pause when this one trips the breaker (the count then
    /// starts again).
    pub fn failed(&mut self, failure: Failure) -> Option<PauseReason> {
        if self.after == 0 {
            return None;
        }
        if self
            .streak
            .first()
            .is_some_and(|f| f.signature != failure.signature)
        {
            self.streak.clear();
        }
        let at_first = failure.signature.pauses_at_first() || failure.signature.refused_by_device();
        self.streak.push(failure);
        if !at_first && self.streak.len() < self.after as usize {
            return None;
        }
        let streak = std::mem::take(&mut self.streak);
        Some(pause_reason(&streak, at_first))
    }
}

/// Counts, per queue, jobs in a row there that failed alike: a queue (an ssh host, a partition
/// whose nodes lack a library) whose jobs all fail while the other queues' succeed is set aside
/// rather than fed every batch in turn; the run-wide [`Breaker`] would never trip, the other
/// queues' successes resetting it.
#[derive(Debug)]
pub struct QueueBreakers {
    after: u32,
    by_queue: std::collections::BTreeMap<String, Breaker>,
}

impl QueueBreakers {
    pub fn new(after: u32) -> Self {
        Self {
            after,
            by_queue: Default::default(),
        }
    }

    /// A job on `queue` finished its batches: that queue's count starts again.
    pub fn success(&mut self, queue: &str) {
        self.by_queue.remove(queue);
    }

    /// A job on `queue` failed; what its jobs had in common when this one trips the queue's
    /// breaker. A refusal (exit 2 or 4) never trips one queue's: it is the run-wide breaker's.
    /// Its device's refusal (exit 5) trips it at the first.
    pub fn failed(&mut self, queue: &str, failure: &Failure) -> Option<PauseReason> {
        if self.after == 0 || failure.signature.pauses_at_first() {
            return None;
        }
        if failure.signature.refused_by_device() {
            self.by_queue.remove(queue);
            return Some(pause_reason(std::slice::from_ref(failure), true));
        }
        self.by_queue
            .entry(queue.to_string())
            .or_insert_with(|| Breaker::new(self.after))
            .failed(failure.clone())
    }

    /// Every queue's count starts again (a `resume`).
    pub fn clear(&mut self) {
        self.by_queue.clear();
    }
}

/// The reason recorded in run.db and shown by `status`: what the jobs had in common, their
/// logs, and what to look at.
fn pause_reason(streak: &[Failure], at_first: bool) -> PauseReason {
    let signature = streak[0].signature.clone();
    let message = if at_first && signature.refused_by_device() {
        format!(
            "job {} was refused by its node's device ({}), and no other queue takes jobs: \
             paused at the first",
            streak[0].job, signature.exit
        )
    } else if at_first {
        format!(
            "job {} was refused ({}), as every job would be: paused at the first",
            streak[0].job, signature.exit
        )
    } else {
        format!("{} jobs in a row failed the same way", streak.len())
    };
    let mut check = vec![
        "the failed jobs' logs: their first error line is what the jobs had in common".to_string(),
        "`embedfleet doctor` run on a compute node (as a job, or in an interactive \
         allocation): the GPU, CUDA/cuDNN libraries and the model directory as the jobs see them"
            .to_string(),
        "the run config's [scheduler.script] modules, setup and env lines (a module name or \
         version the compute nodes do not have)"
            .to_string(),
        "disk quota and free space of the run directory's file system (`quota`, `df -h`, or the \
         site's own tool)"
            .to_string(),
    ];
    if signature.refused_by_device() {
        check.insert(
            1,
            "exit code 5 is embed-job refused by its node's device: a GPU without FP8 tensor \
             cores (an A100) for --precision fp8, a cuDNN the fused attention cannot use; send \
             the run to other nodes (`submit --queue`) or leave --precision out"
                .to_string(),
        );
    } else if at_first {
        check.insert(
            1,
            "exit code 4 is embed-job refusing the run directory or the model (changed \
             settings, a model file the node cannot read); exit code 2 is a command line it \
             does not take"
                .to_string(),
        );
    }
    check.push(
        "then `embedfleet resume --run-dir DIR`: the loop tries the batches that failed here \
         again and goes on"
            .to_string(),
    );
    PauseReason {
        by: "breaker".to_string(),
        message,
        signature: signature.to_string(),
        jobs: streak.iter().map(|f| f.job.clone()).collect(),
        logs: streak.iter().filter_map(|f| f.log.clone()).collect(),
        check,
        at_unix_s: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    }
}

/// The last [`LOG_TAIL_BYTES`] of a log, from its first whole line; `None` if it cannot be read.
fn read_tail(path: &Path) -> Option<String> {
    let mut file = std::fs::File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    let start = len.saturating_sub(LOG_TAIL_BYTES);
    file.seek(SeekFrom::Start(start)).ok()?;
    let mut bytes = Vec::new();
    file.take(LOG_TAIL_BYTES).read_to_end(&mut bytes).ok()?;
    let text = String::from_utf8_lossy(&bytes).into_owned();
    Some(match (start > 0, text.split_once('\n')) {
        // Cut mid-line: drop the partial first line.
        (true, Some((_, rest))) => rest.to_string(),
        _ => text,
    })
}

/// The first line of `log` that looks like an error, normalised; the last non-empty line when
/// none does (what a person would read first then). `None` for an empty log.
///
/// "Looks like an error": after ANSI colours are stripped, a line that starts with `error`
/// (embedfleet's own `error: ...`, `ERROR:`), has `error:` in it (`sbatch: error:`, Lmod's
/// "detected the following error:", Python's `...Error:`), a tracing `ERROR` level, a Rust
/// panic (`panicked at`), `fatal`, or a shell's or loader's failure words (`No such file or
/// directory`, `command not found`, `Permission denied`, `Disk quota exceeded`, `No space left
/// on device`, `cannot open shared object file`, `Segmentation fault`, `Traceback`). Lines of
/// the tracing levels INFO, DEBUG, TRACE and WARN never count: a job logs retried hiccups
/// there on its way to success.
pub fn first_error_line(log: &str) -> Option<String> {
    let lines: Vec<String> = log
        .lines()
        .map(strip_ansi)
        .filter(|l| !l.trim().is_empty())
        .collect();
    let line = lines
        .iter()
        .find(|l| looks_like_error(l))
        .or(lines.last())?;
    Some(normalise(line))
}

fn looks_like_error(line: &str) -> bool {
    let lower = line.trim().to_lowercase();
    // tracing's format: `2026-12-02T09:00:00.000000Z  INFO target: message`; the level is the
    // word after the timestamp (or the first word, without one).
    let mut words = lower.split_whitespace();
    let first = words.next().unwrap_or("");
    let level = if first.starts_with(|c: char| c.is_ascii_digit()) {
        words.next().unwrap_or("")
    } else {
        first
    };
    match level {
        "info" | "debug" | "trace" | "warn" => return false,
        "error" => return true,
        _ => {}
    }
    if lower.starts_with("error") {
        return true;
    }
    [
        "error:",
        "panicked at",
        "fatal",
        "no such file or directory",
        "command not found",
        "permission denied",
        "quota exceeded",
        "no space left on device",
        "cannot open shared object file",
        "segmentation fault",
        "traceback (most recent call last)",
    ]
    .iter()
    .any(|w| lower.contains(w))
}

/// Removes ANSI escape sequences (colours of tracing's output on a terminal).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            if chars.peek() == Some(&'[') {
                chars.next();
                // Parameters and intermediates, up to the final byte (a letter, `@`..`~`).
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// One error line made comparable across jobs: what differs from job to job is written as `#`
/// so that the same failure of batch 3 on node nid001234 and of batch 17 on nid005678 give the
/// same line.
///
/// Word by word (runs of ASCII letters and digits): a hex word of 8 or more characters with a
/// digit in it (a PBS job name, a hash, an address; `0x...` too) becomes one `#`; in any other
/// word each run of digits becomes `#` (`b000017` -> `b#`, `nid001234` -> `nid#`, `line 12`
/// -> `line #`, `/var/spool/slurmd/job4711/slurm_script` -> `/var/spool/slurmd/job#/slurm_script`).
/// Whitespace runs become one space; the line is cut at 300 characters. Letters that differ
/// per job (a random temporary name) still make lines differ: a stricter rule would make
/// different errors look alike, which is worse than pausing later.
pub fn normalise(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        if word.is_empty() {
            return;
        }
        out.push_str(&normalise_word(word));
        word.clear();
    };
    for c in line.trim().chars() {
        if c.is_ascii_alphanumeric() {
            word.push(c);
            continue;
        }
        flush(&mut word, &mut out);
        if c.is_whitespace() {
            if !out.ends_with(' ') {
                out.push(' ');
            }
        } else {
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    match out.char_indices().nth(MAX_LINE_CHARS) {
        Some((i, _)) => out[..i].to_string(),
        None => out,
    }
}

fn normalise_word(word: &str) -> String {
    let hex = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_hexdigit());
    let has_digit = word.chars().any(|c| c.is_ascii_digit());
    let prefixed = word
        .strip_prefix("0x")
        .or_else(|| word.strip_prefix("0X"))
        .is_some_and(hex);
    if prefixed || (word.len() >= 8 && has_digit && hex(word)) {
        return "#".to_string();
    }
    let mut out = String::with_capacity(word.len());
    for c in word.chars() {
        if c.is_ascii_digit() {
            if !out.ends_with('#') {
                out.push('#');
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(code: Option<i32>, reason: &str) -> JobState {
        JobState::Failed {
            exit_code: code,
            reason: reason.into(),
        }
    }

    fn failure(job: &str, code: i32, line: &str) -> Failure {
        Failure {
            job: job.into(),
            log: Some(format!("/run/logs/{job}.log")),
            signature: Signature {
                exit_code: Some(code),
                exit: format!("exit code {code}"),
                first_error: Some(normalise(line)),
            },
        }
    }

    #[test]
    fn numbers_that_differ_per_job_are_masked() {
        let a = normalise(
            "/var/spool/slurmd/job4711/slurm_script: line 12: /p/run/ef0123456789abcdef-b000003-a1: No such file",
        );
        let b = normalise(
            "/var/spool/slurmd/job4799/slurm_script: line 12: /p/run/ef0123456789abcdef-b000017-a2: No such file",
        );
        assert_eq!(a, b);
        assert_eq!(
            a,
            "/var/spool/slurmd/job#/slurm_script: line #: /p/run/#-b#-a#: No such file"
        );
        assert_eq!(
            normalise("error: batch 17 on nid001234 at 0x7f3a2b1c"),
            normalise("error: batch 3 on nid005678 at 0x55aa")
        );
        // A PBS short job name (hex hash) and a tracing timestamp.
        assert_eq!(
            normalise("2026-12-02T09:00:01.5Z job e1a2b3c4d5e6f70   failed"),
            "#-#-#T#:#:#.#Z job # failed"
        );
    }

    #[test]
    fn different_errors_stay_different() {
        assert_ne!(
            normalise("error: libcudnn.so.9: cannot open shared object file"),
            normalise("error: Disk quota exceeded")
        );
        // Letters are kept: a word is masked only where it has digits.
        assert_eq!(normalise("cuda:0 vs cpu"), "cuda:# vs cpu");
        let long = "x".repeat(1000);
        assert_eq!(normalise(&long).chars().count(), MAX_LINE_CHARS);
    }

    #[test]
    fn the_first_error_line_skips_info_and_warnings_and_colours() {
        let log = "\u{1b}[2m2026-12-02T09:00:00Z\u{1b}[0m \u{1b}[32m INFO\u{1b}[0m embedfleet: loading model, 0 errors so far\n\
                   2026-12-02T09:00:01Z  WARN embedfleet: upload error: retrying\n\
                   Lmod has detected the following error: The following module(s) are unknown: \"cudnn/9\"\n\
                   error: the model directory /m has no config.json\n";
        assert_eq!(
            first_error_line(log).unwrap(),
            "Lmod has detected the following error: The following module(s) are unknown: \"cudnn/#\""
        );
        assert_eq!(
            first_error_line(
                "starting batch 4\n\nerror: the model directory /m has no config.json\n"
            )
            .unwrap(),
            "error: the model directory /m has no config.json"
        );
        assert_eq!(
            first_error_line("thread 'main' panicked at src/x.rs:10:5:\nboom\n").unwrap(),
            "thread 'main' panicked at src/x.rs:#:#:"
        );
        assert_eq!(
            first_error_line("2026-12-02T09:00:01Z ERROR embedfleet: shard 3 write").unwrap(),
            "#-#-#T#:#:#Z ERROR embedfleet: shard # write"
        );
        // No line looks like an error: the last one stands for the log.
        assert_eq!(
            first_error_line("starting\nKilled at step 12\n\n").unwrap(),
            "Killed at step #"
        );
        assert_eq!(first_error_line("\n \n"), None);
    }

    #[test]
    fn signatures_count_only_the_jobs_own_failures() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("j.log");
        std::fs::write(&log, "setup\nerror: no cudnn on nid0042\n").unwrap();
        let sig = Signature::of(
            &failed(Some(1), "exit code 1"),
            JobStatus::Failed,
            Some(&log),
        )
        .unwrap();
        assert_eq!(sig.exit_code, Some(1));
        assert_eq!(sig.first_error.as_deref(), Some("error: no cudnn on nid#"));
        assert_eq!(
            sig.to_string(),
            "exit code 1; first error line: error: no cudnn on nid#"
        );
        let signal =
            Signature::of(&failed(None, "killed by signal 9"), JobStatus::Failed, None).unwrap();
        assert_eq!(signal.exit, "killed by signal #");
        assert_eq!(signal.first_error, None);
        // Exit 0 with the batch not done is the job's own failure too.
        assert!(Signature::of(&JobState::Completed, JobStatus::Completed, None).is_some());
        // The scheduler's ends, and lost jobs, do not count.
        for state in [
            JobState::Timeout,
            JobState::NodeFail,
            JobState::Preempted,
            JobState::OutOfMemory,
            JobState::Cancelled,
        ] {
            assert!(
                Signature::of(&state, state.status(), None).is_none(),
                "{state}"
            );
        }
        let lost = failed(None, "lost: the scheduler has not known the job");
        assert!(Signature::of(&lost, JobStatus::Lost, None).is_none());
    }

    #[test]
    fn trips_after_k_alike_and_resets_on_success_or_another_signature() {
        let mut b = Breaker::new(3);
        assert!(b
            .failed(failure("j1", 1, "error: no cudnn (batch 1)"))
            .is_none());
        assert!(b
            .failed(failure("j2", 1, "error: no cudnn (batch 2)"))
            .is_none());
        b.success();
        assert!(b
            .failed(failure("j3", 1, "error: no cudnn (batch 3)"))
            .is_none());
        assert!(b
            .failed(failure("j4", 1, "error: no cudnn (batch 4)"))
            .is_none());
        // Another signature starts a new count at 1.
        assert!(b.failed(failure("j5", 1, "error: quota")).is_none());
        assert!(b
            .failed(failure("j6", 1, "error: no cudnn (batch 6)"))
            .is_none());
        assert!(b
            .failed(failure("j7", 1, "error: no cudnn (batch 7)"))
            .is_none());
        let reason = b
            .failed(failure("j8", 1, "error: no cudnn (batch 8)"))
            .expect("the third alike trips");
        assert_eq!(reason.by, "breaker");
        assert_eq!(reason.jobs, vec!["j6", "j7", "j8"]);
        assert_eq!(reason.logs[0], "/run/logs/j6.log");
        assert_eq!(
            reason.signature,
            "exit code 1; first error line: error: no cudnn (batch #)"
        );
        assert!(
            reason.message.contains("3 jobs in a row"),
            "{}",
            reason.message
        );
        assert!(reason.check.iter().any(|c| c.contains("embedfleet doctor")));
        assert!(reason.check.iter().any(|c| c.contains("quota")));
        // Tripping starts the count again.
        assert!(b
            .failed(failure("j9", 1, "error: no cudnn (batch 9)"))
            .is_none());
    }

    #[test]
    fn a_refusal_trips_at_the_first_and_zero_never_trips() {
        let mut b = Breaker::new(3);
        let reason = b
            .failed(failure("j1", 4, "error: the model has no config.json"))
            .expect("exit 4 trips at once");
        assert_eq!(reason.jobs, vec!["j1"]);
        assert!(reason.message.contains("refused"), "{}", reason.message);
        assert!(b
            .failed(failure("j2", 2, "error: unexpected argument"))
            .is_some());
        let mut off = Breaker::new(0);
        for i in 0..10 {
            assert!(off
                .failed(failure(&format!("j{i}"), 4, "error: x"))
                .is_none());
        }
    }

    #[test]
    fn only_the_end_of_a_long_log_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("long.log");
        let mut text = "error: an early hiccup that the job survived\n".to_string();
        text.push_str(&"progress line\n".repeat(40_000));
        text.push_str("error: out of disk at the end\n");
        std::fs::write(&log, text).unwrap();
        let tail = read_tail(&log).unwrap();
        assert!(tail.len() as u64 <= LOG_TAIL_BYTES);
        assert!(tail.starts_with("progress line\n"), "cut at a line start");
        assert_eq!(
            first_error_line(&tail).unwrap(),
            "error: out of disk at the end"
        );
    }
}
