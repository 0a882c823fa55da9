/*!
Running scheduler commands (`sbatch`, `squeue`, `qstat`, ...) safely.

Like ripgrep's `CommandReader`: stdout and stderr are drained on their own threads so a chatty
command never blocks on a full pipe, and the error carries the command line and the end of
stderr. On top of that every call has a timeout (the child runs in its own process group, which
is killed when the timeout passes), and failed calls are retried with exponential backoff. The
caller says which exit statuses it accepts, since `qstat` exits 153 for a job it does not know.
*/

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use embedfleet_core::process;
use serde::{Deserialize, Serialize};

use super::error::{SchedulerError, SchedulerResult};

/// How long to wait for a scheduler command and how often to retry it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CommandConfig {
    /// Seconds one call may run before it is killed.
    pub timeout_secs: f64,
    /// Retries after a failed or timed-out call (so `retries + 1` attempts in all).
    pub retries: u32,
    /// Seconds to wait before the first retry; doubles for each further retry.
    pub backoff_initial_secs: f64,
    /// Upper bound of the wait between retries, in seconds.
    pub backoff_max_secs: f64,
}

impl Default for CommandConfig {
    fn default() -> Self {
        Self {
            timeout_secs: 60.0,
            retries: 3,
            backoff_initial_secs: 1.0,
            backoff_max_secs: 30.0,
        }
    }
}

impl CommandConfig {
    fn timeout(&self) -> Duration {
        secs(self.timeout_secs)
    }

    /// The wait before retry number `retry` (0-based).
    fn backoff(&self, retry: u32) -> Duration {
        let factor = 2f64.powi(retry.min(30) as i32);
        secs((self.backoff_initial_secs * factor).min(self.backoff_max_secs))
    }
}

impl CommandConfig {
    /// Times that parse but cannot work (see [`seconds_problem`]), naming their keys.
    pub fn problems(&self) -> Vec<String> {
        [
            ("timeout_secs", self.timeout_secs, false),
            ("backoff_initial_secs", self.backoff_initial_secs, true),
            ("backoff_max_secs", self.backoff_max_secs, true),
        ]
        .into_iter()
        .filter_map(|(key, value, zero_ok)| {
            seconds_problem(&format!("[scheduler.command] {key}"), value, zero_ok)
        })
        .collect()
    }
}

/// A time of the run config that cannot work, in words: one that is not a finite number of
/// seconds (TOML allows `inf` and `nan`), a negative one, or a zero one unless `zero_ok`.
pub fn seconds_problem(key: &str, value: f64, zero_ok: bool) -> Option<String> {
    let works = value.is_finite() && (value > 0.0 || (zero_ok && value == 0.0));
    let want = if zero_ok { ">= 0" } else { "> 0" };
    (!works).then(|| format!("{key} = {value}: it takes a number of seconds {want}"))
}

fn secs(s: f64) -> Duration {
    Duration::try_from_secs_f64(s.max(0.0)).unwrap_or(Duration::MAX)
}

/// One scheduler program: where it is and which arguments go before every call's own.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProgramConfig {
    /// Path or name of the program; the backend's default name (`sbatch`) when unset.
    pub path: Option<PathBuf>,
    /// Arguments added to every call, e.g. `["--clusters=polaris"]` or `["--qos=debug"]`.
    pub extra_args: Vec<String>,
}

impl ProgramConfig {
    /// Neither a path nor an argument given: the backend's default program as it is.
    pub fn is_unset(&self) -> bool {
        self.path.is_none() && self.extra_args.is_empty()
    }
}

/// Which failures of a call may be retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryOn {
    /// Queries and cancellations: repeat on any failure or timeout.
    AnyFailure,
    /// Submissions: a timed-out `sbatch` may have queued the job, so only repeat calls that
    /// failed (an exit status the scheduler documents as "not submitted").
    FailureNotTimeout,
}

/// What a finished command printed.
#[derive(Debug, Clone)]
pub struct CommandOutput {
    /// Its exit status.
    pub status: ExitStatus,
    /// Everything it wrote to stdout (lossy UTF-8).
    pub stdout: String,
    /// Everything it wrote to stderr (lossy UTF-8).
    pub stderr: String,
}

/// Runs one scheduler program with a [`CommandConfig`] policy.
#[derive(Debug, Clone)]
pub struct CommandRunner {
    policy: CommandConfig,
}

impl CommandRunner {
    /// A runner with the given timeout and retry policy.
    pub fn new(policy: CommandConfig) -> Self {
        Self { policy }
    }

    /// Runs `program` (its default name is `default_name`) with its extra arguments and the
    /// call's own. An exit status that `call.accept` rejects is retried per `call.retry` unless
    /// `call.permanent` says repeating cannot help, and is finally returned as an error.
    pub fn run(
        &self,
        program: &ProgramConfig,
        default_name: &str,
        call: Call<'_>,
    ) -> SchedulerResult<CommandOutput> {
        let path = program
            .path
            .clone()
            .unwrap_or_else(|| PathBuf::from(default_name));
        let mut all_args: Vec<OsString> = program.extra_args.iter().map(OsString::from).collect();
        all_args.extend(call.args.iter().cloned());
        let line = command_line(&path, &all_args);
        let attempts = self.policy.retries + 1;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (err, permanent) =
                match run_once(&path, &all_args, &call, self.policy.timeout(), &line)? {
                    Outcome::Done(out) if (call.accept)(&out) => return Ok(out),
                    Outcome::Done(out) => {
                        let permanent = (call.permanent)(&out);
                        let err = SchedulerError::CommandFailed {
                            command: line.clone(),
                            status: describe_status(out.status),
                            attempts: attempt,
                            stderr_tail: tail(&out.stderr, 2000),
                        };
                        (err, permanent)
                    }
                    Outcome::TimedOut { stderr } => {
                        let err = SchedulerError::CommandTimedOut {
                            command: line.clone(),
                            timeout: self.policy.timeout(),
                            attempts: attempt,
                            stderr_tail: tail(&stderr, 2000),
                        };
                        (err, call.retry == RetryOn::FailureNotTimeout)
                    }
                };
            if attempt >= attempts || permanent {
                return Err(err);
            }
            let wait = self.policy.backoff(attempt - 1);
            tracing::warn!(error = %err, retry_in = ?wait, "scheduler command failed; retrying");
            thread::sleep(wait);
        }
    }
}

/// One call of a program: its arguments and how to judge the result.
pub struct Call<'a> {
    args: Vec<OsString>,
    stdin: Option<&'a [u8]>,
    cwd: Option<&'a Path>,
    retry: RetryOn,
    accept: &'a dyn Fn(&CommandOutput) -> bool,
    permanent: &'a dyn Fn(&CommandOutput) -> bool,
}

impl<'a> Call<'a> {
    /// A query-like call: accepts exit status 0, retries any failure.
    pub fn new<I, S>(args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        Self {
            args: args.into_iter().map(Into::into).collect(),
            stdin: None,
            cwd: None,
            retry: RetryOn::AnyFailure,
            accept: &|o| o.status.success(),
            permanent: &|_| false,
        }
    }

    /// Feeds `data` to the command's stdin.
    pub fn stdin(mut self, data: &'a [u8]) -> Self {
        self.stdin = Some(data);
        self
    }

    /// Runs the command in `dir`.
    pub fn cwd(mut self, dir: &'a Path) -> Self {
        self.cwd = Some(dir);
        self
    }

    /// Sets which failures are retried.
    pub fn retry(mut self, retry: RetryOn) -> Self {
        self.retry = retry;
        self
    }

    /// Sets which results are usable (default: exit status 0).
    pub fn accept(mut self, f: &'a dyn Fn(&CommandOutput) -> bool) -> Self {
        self.accept = f;
        self
    }

    /// Sets which rejected results must not be retried (e.g. "invalid partition").
    pub fn permanent(mut self, f: &'a dyn Fn(&CommandOutput) -> bool) -> Self {
        self.permanent = f;
        self
    }
}

enum Outcome {
    Done(CommandOutput),
    TimedOut { stderr: String },
}

/// One attempt: spawn in a new process group, drain both pipes, wait with a deadline.
fn run_once(
    path: &Path,
    args: &[OsString],
    call: &Call<'_>,
    timeout: Duration,
    line: &str,
) -> SchedulerResult<Outcome> {
    let stdin = call.stdin;
    let mut cmd = Command::new(path);
    if let Some(dir) = call.cwd {
        cmd.current_dir(dir);
    }
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // Own process group: a timeout kills the command and anything it started.
    process::in_own_group(&mut cmd);
    let mut child = cmd.spawn().map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => SchedulerError::CommandNotFound {
            program: path.display().to_string(),
        },
        _ => SchedulerError::CommandSpawn {
            command: line.to_string(),
            cause: source,
        },
    })?;
    if let (Some(data), Some(mut pipe)) = (stdin, child.stdin.take()) {
        let data = data.to_vec();
        // A writer thread: a command that does not read its stdin must not block us.
        thread::spawn(move || {
            let _ = pipe.write_all(&data);
        });
    }
    let out = Drain::start(child.stdout.take());
    let err = Drain::start(child.stderr.take());
    let deadline = Instant::now() + timeout;
    match wait_until(&mut child, deadline, line)? {
        Some(status) => Ok(Outcome::Done(CommandOutput {
            status,
            stdout: out.finish(),
            stderr: err.finish(),
        })),
        None => {
            process::kill_group(&mut child);
            Ok(Outcome::TimedOut {
                stderr: err.finish(),
            })
        }
    }
}

/// Waits for the child until the deadline (`None`: it passed); a failed wait kills its group.
fn wait_until(
    child: &mut Child,
    deadline: Instant,
    line: &str,
) -> SchedulerResult<Option<ExitStatus>> {
    let (first_nap, max_nap) = (Duration::from_millis(1), Duration::from_millis(20));
    crate::child::wait_until(child, deadline, first_nap, max_nap).map_err(|source| {
        process::kill_group(child);
        SchedulerError::CommandSpawn {
            command: line.to_string(),
            cause: source,
        }
    })
}

/// A pipe read to the end on its own thread into a shared buffer, so a timeout can still
/// report what was written so far.
struct Drain {
    buf: Arc<Mutex<Vec<u8>>>,
    done: crossbeam_channel::Receiver<()>,
}

impl Drain {
    fn start(pipe: Option<impl Read + Send + 'static>) -> Self {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let (tx, done) = crossbeam_channel::bounded(1);
        if let Some(mut pipe) = pipe {
            let shared = Arc::clone(&buf);
            thread::spawn(move || {
                let mut chunk = [0u8; 8192];
                while let Ok(n) = pipe.read(&mut chunk) {
                    if n == 0 {
                        break;
                    }
                    shared
                        .lock()
                        .expect("pipe buffer lock poisoned. This is a bug.")
                        .extend_from_slice(&chunk[..n]);
                }
                let _ = tx.send(());
            });
        } else {
            let _ = tx.send(());
        }
        Self { buf, done }
    }

    /// Waits briefly for EOF (a grandchild that left the process group may hold the pipe
    /// open forever), then returns what was read.
    fn finish(self) -> String {
        let _ = self.done.recv_timeout(Duration::from_secs(2));
        let bytes = self
            .buf
            .lock()
            .expect("pipe buffer lock poisoned. This is a bug.");
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// `exit status 1`, `signal 9`.
pub(crate) fn describe_status(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(sig)) => format!("signal {sig}"),
        (None, None) => "an unknown status".to_string(),
    }
}

/// The command line as a user could paste it into a shell.
fn command_line(path: &Path, args: &[OsString]) -> String {
    let mut parts = vec![shell_quote(&path.to_string_lossy())];
    parts.extend(args.iter().map(|a| shell_quote(&a.to_string_lossy())));
    parts.join(" ")
}

/// Quotes `s` for a POSIX shell when it needs quoting.
pub fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The last `max` bytes of `s` (on a char boundary), for error messages.
pub(crate) fn tail(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    format!("...{}", &s[start..])
}

/// This process's user: `$USER`, else `$LOGNAME`, else `id -un` (a job's or a daemon's
/// environment may have neither).
pub(crate) fn user_name() -> Option<String> {
    let from_env = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .ok()
        .filter(|u| !u.is_empty());
    from_env.or_else(|| {
        let out = std::process::Command::new("id").arg("-un").output().ok()?;
        let name = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (out.status.success() && !name.is_empty()).then_some(name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quick() -> CommandRunner {
        CommandRunner::new(CommandConfig {
            timeout_secs: 5.0,
            retries: 2,
            backoff_initial_secs: 0.01,
            backoff_max_secs: 0.02,
        })
    }

    fn sh(script: &str) -> (ProgramConfig, Vec<OsString>) {
        let p = ProgramConfig {
            path: Some("/bin/sh".into()),
            extra_args: vec!["-c".into()],
        };
        (p, vec![script.into()])
    }

    #[test]
    fn captures_stdout_and_stderr_of_large_outputs() {
        let (p, a) =
            sh("head -c 300000 /dev/zero | tr '\\0' x; head -c 200000 /dev/zero | tr '\\0' y >&2");
        let out = quick().run(&p, "sh", Call::new(a)).unwrap();
        assert_eq!(out.stdout.len(), 300000);
        assert_eq!(out.stderr.len(), 200000);
    }

    #[test]
    fn feeds_stdin() {
        let (p, a) = sh("cat");
        let out = quick().run(&p, "sh", Call::new(a).stdin(b"hello")).unwrap();
        assert_eq!(out.stdout, "hello");
    }

    #[test]
    fn failure_is_retried_then_reported_with_stderr() {
        let dir = tempfile::tempdir().unwrap();
        let count = dir.path().join("count");
        let script = format!(
            "echo x >> {}; echo 'boom happened' >&2; exit 4",
            count.display()
        );
        let (p, a) = sh(&script);
        let err = quick().run(&p, "sh", Call::new(a)).unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, SchedulerError::CommandFailed { attempts: 3, .. }),
            "{msg}"
        );
        assert!(
            msg.contains("boom happened") && msg.contains("exit status 4"),
            "{msg}"
        );
        assert!(msg.contains("/bin/sh -c"), "{msg}");
        assert_eq!(std::fs::read_to_string(count).unwrap().lines().count(), 3);
    }

    #[test]
    fn accept_can_take_a_nonzero_status() {
        let (p, a) = sh("echo known; exit 153");
        let out = quick()
            .run(
                &p,
                "sh",
                Call::new(a).accept(&|o| o.status.code() == Some(153)),
            )
            .unwrap();
        assert_eq!(out.stdout.trim(), "known");
    }

    #[test]
    fn missing_program_is_not_retried() {
        let p = ProgramConfig {
            path: Some("/nonexistent/sbatch".into()),
            extra_args: vec![],
        };
        let err = quick()
            .run(&p, "sbatch", Call::new(Vec::<OsString>::new()))
            .unwrap_err();
        assert!(
            matches!(err, SchedulerError::CommandNotFound { .. }),
            "{err}"
        );
        assert!(err.to_string().contains("/nonexistent/sbatch"));
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        let c = CommandConfig {
            backoff_initial_secs: 1.0,
            backoff_max_secs: 5.0,
            ..CommandConfig::default()
        };
        assert_eq!(c.backoff(0), Duration::from_secs(1));
        assert_eq!(c.backoff(1), Duration::from_secs(2));
        assert_eq!(c.backoff(2), Duration::from_secs(4));
        assert_eq!(c.backoff(3), Duration::from_secs(5));
        assert_eq!(c.backoff(100), Duration::from_secs(5));
    }

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("abc-1.sh"), "abc-1.sh");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }
}
