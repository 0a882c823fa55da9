/*!
The checks before a run's first job, on every host at once: ssh gets in without a prompt, the
embedfleet binary is there and runs, the run directory is the same directory there (the host
writes a nonce file into it; the owner reads it here), and the slots' GPUs are there. A host
that fails any is named with the reason, and `submit` sends it no job.
*/

use embedfleet_core::RunLayout;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use super::super::{QueueProblem, SchedulerError};
use super::config::{HostConfig, SshConfig};
use super::connect::{explain, unreachable, Retry, Ssh};
use super::remote;

/// The problems of every host, in the list's order.
pub(super) fn check_hosts(
    config: &SshConfig,
    ssh: &Ssh,
    script_binary: Option<&str>,
    run_dir: &Path,
) -> Vec<QueueProblem> {
    let own = std::env::current_exe()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "embedfleet".to_string());
    let fallback = script_binary.unwrap_or(&own);
    std::thread::scope(|scope| {
        let checks: Vec<_> = config
            .hosts
            .iter()
            .map(|host| scope.spawn(move || check_host(ssh, host, fallback, run_dir)))
            .collect();
        checks
            .into_iter()
            .flat_map(|c| c.join().expect("a host's check panicked. This is a bug."))
            .collect()
    })
}

fn check_host(ssh: &Ssh, host: &HostConfig, fallback: &str, run_dir: &Path) -> Vec<QueueProblem> {
    // A host that fails its checks is left out of the run (its own problems do not pass).
    let problem = |reason: String| QueueProblem {
        queue: host.name.clone(),
        reason,
        lasting: true,
    };
    let nonce = nonce();
    let nonce_file = RunLayout::new(run_dir).ssh_check_file(&host.name, &nonce);
    let mut gpus: Vec<u32> = host
        .parsed_slots()
        .iter()
        .flat_map(|s| s.needed_gpus())
        .collect();
    gpus.sort_unstable();
    gpus.dedup();
    let script = remote::preflight(&remote::Check {
        run_dir,
        nonce_file: &nonce_file,
        nonce: &nonce,
        binary: host.embedfleet.as_deref().unwrap_or(fallback),
        env: host.env.clone().into_iter().collect(),
        gpus,
    });
    let out = match ssh.run(host, &script, Retry::UnlessUnreachable, &|o| o.status.success()) {
        Ok(out) => out,
        Err(e) => return vec![problem(refusal(host, &e))],
    };
    let mut problems: Vec<QueueProblem> = out
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("problem "))
        .map(|why| problem(why.to_string()))
        .collect();
    if !out.stdout.lines().any(|l| l == "checked") {
        problems.push(problem(format!(
            "the checks did not finish there: {}",
            out.stderr.trim()
        )));
    }
    let wrote = !problems.iter().any(|p| p.reason.contains("run directory"));
    let seen = std::fs::read_to_string(&nonce_file).unwrap_or_default();
    let _ = std::fs::remove_file(&nonce_file);
    if wrote && seen.trim() != nonce {
        problems.push(problem(format!(
            "the run directory {} there is not this one (a file written into it there did \
             not appear here): mount the same shared directory at the same path on every host",
            run_dir.display()
        )));
    }
    problems
}

/// Why ssh could not run the checks, in the user's words.
fn refusal(host: &HostConfig, e: &SchedulerError) -> String {
    let stderr = match e {
        SchedulerError::CommandFailed { stderr_tail, .. }
        | SchedulerError::CommandTimedOut { stderr_tail, .. } => stderr_tail.as_str(),
        _ => "",
    };
    match unreachable(stderr) {
        Some(why) => explain(&why, host, stderr),
        None => format!("ssh to {} failed: {e}", host.describe()),
    }
}

/// A value no earlier check left behind: the time in nanoseconds and this process's id.
fn nonce() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{nanos:x}{:x}", std::process::id())
}
