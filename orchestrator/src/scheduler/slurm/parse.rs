/*!
Parsers for Slurm's `squeue`, `sacct` and `scontrol show job` output, and the mapping of Slurm
state names onto [`JobState`]. Pure functions over text, so they are tested on captured output.
*/

use crate::scheduler::JobState;

/// The `squeue -o` format [`parse_squeue`] reads: id, state, partition, reason, name (last, so
/// a name may contain anything).
pub const SQUEUE_FORMAT: &str = "%i|%T|%P|%r|%j";

/// The `squeue --start -o` format [`parse_start_estimates`] reads: id and expected start.
pub const SQUEUE_START_FORMAT: &str = "%i|%S";

/// The `sacct -o` fields [`parse_sacct`] reads.
pub const SACCT_FIELDS: &str = "JobID,State,ExitCode,Reason";

/// One job as a Slurm command reported it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlurmRecord {
    /// Job id (`123`, `123_4` for an array task).
    pub id: String,
    /// State name as printed (`RUNNING`, `CANCELLED by 1000`).
    pub state: String,
    /// Partition, when the command reports it.
    pub partition: String,
    /// Slurm's reason field (`None`, `NonZeroExitCode`, `Resources`).
    pub reason: String,
    /// Job name, when the command reports it.
    pub name: String,
    /// Exit code and terminating signal (`ExitCode=3:0`), when reported.
    pub exit: Option<(i32, i32)>,
}

impl SlurmRecord {
    /// The backend-neutral state.
    pub fn job_state(&self) -> JobState {
        slurm_state(&self.state, self.exit, &self.reason)
    }
}

/// Parses `squeue -h -o '%i|%T|%P|%r|%j'` output.
pub fn parse_squeue(text: &str) -> Result<Vec<SlurmRecord>, String> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.splitn(5, '|').collect();
        if f.len() < 5 || f[0].trim().is_empty() {
            return Err(format!(
                "expected 5 `|`-separated fields, got line {line:?}"
            ));
        }
        out.push(SlurmRecord {
            id: f[0].trim().to_string(),
            state: f[1].trim().to_string(),
            partition: f[2].trim().to_string(),
            reason: f[3].trim().to_string(),
            name: f[4].to_string(),
            exit: None,
        });
    }
    Ok(out)
}

/// Parses `sacct -n -X -P -o JobID,State,ExitCode,Reason` output.
pub fn parse_sacct(text: &str) -> Result<Vec<SlurmRecord>, String> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.splitn(4, '|').collect();
        if f.len() < 3 || f[0].trim().is_empty() {
            return Err(format!(
                "expected `JobID|State|ExitCode|Reason`, got line {line:?}"
            ));
        }
        out.push(SlurmRecord {
            id: f[0].trim().to_string(),
            state: f[1].trim().to_string(),
            reason: f.get(3).map(|r| r.trim().to_string()).unwrap_or_default(),
            exit: parse_exit_code(f[2].trim()),
            ..SlurmRecord::default()
        });
    }
    Ok(out)
}

/// Parses `scontrol show job -o` output (one job per line, `Key=Value` pairs; values such as
/// `Comment=` may contain spaces).
pub fn parse_scontrol(text: &str) -> Result<Vec<SlurmRecord>, String> {
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let mut pairs: Vec<(String, String)> = Vec::new();
        for token in line.split_whitespace() {
            match token.split_once('=') {
                Some((k, v)) if is_key(k) => pairs.push((k.to_string(), v.to_string())),
                _ => match pairs.last_mut() {
                    Some((_, v)) => {
                        v.push(' ');
                        v.push_str(token);
                    }
                    None => return Err(format!("expected `Key=Value` pairs, got line {line:?}")),
                },
            }
        }
        let get = |key: &str| {
            pairs
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        let id = get("JobId");
        if id.is_empty() {
            return Err(format!("no JobId= in line {line:?}"));
        }
        out.push(SlurmRecord {
            id,
            state: get("JobState"),
            partition: get("Partition"),
            reason: get("Reason"),
            name: get("JobName"),
            exit: parse_exit_code(&get("ExitCode")),
        });
    }
    Ok(out)
}

fn is_key(k: &str) -> bool {
    !k.is_empty()
        && k.chars().next().is_some_and(|c| c.is_ascii_uppercase())
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || "/:_".contains(c))
}

/// `3:0` → (3, 0); `0:15` → (0, 15).
fn parse_exit_code(s: &str) -> Option<(i32, i32)> {
    let (code, sig) = s.split_once(':')?;
    Some((code.parse().ok()?, sig.parse().ok()?))
}

/// Maps a Slurm state name (as `squeue %T`, `sacct State` or `scontrol JobState` print it)
/// and the exit code, when known, onto [`JobState`].
pub fn slurm_state(state: &str, exit: Option<(i32, i32)>, reason: &str) -> JobState {
    let word = state
        .split_whitespace()
        .next()
        .unwrap_or("")
        .trim_end_matches('+');
    match word {
        "PENDING" | "CONFIGURING" | "REQUEUED" | "REQUEUE_HOLD" | "REQUEUE_FED"
        | "RESV_DEL_HOLD" => JobState::Pending,
        // A suspended job holds its allocation and resumes by itself.
        "SUSPENDED" | "STOPPED" => JobState::Running,
        "RUNNING" | "COMPLETING" | "SIGNALING" | "STAGE_OUT" | "RESIZING" => JobState::Running,
        "COMPLETED" => JobState::Completed,
        "CANCELLED" | "REVOKED" => JobState::Cancelled,
        "TIMEOUT" | "DEADLINE" => JobState::Timeout,
        "NODE_FAIL" | "BOOT_FAIL" => JobState::NodeFail,
        "OUT_OF_MEMORY" => JobState::OutOfMemory,
        "PREEMPTED" => JobState::Preempted,
        "FAILED" | "SPECIAL_EXIT" => failed(word, exit, reason),
        _ => JobState::Failed {
            exit_code: exit.map(|e| e.0),
            reason: format!("unrecognised Slurm state {state:?}"),
        },
    }
}

fn failed(word: &str, exit: Option<(i32, i32)>, reason: &str) -> JobState {
    let why = match exit {
        Some((_, sig)) if sig > 0 => format!("killed by signal {sig}"),
        Some((code, _)) if code != 0 => format!("exit code {code}"),
        _ if !reason.is_empty() && reason != "None" => format!("{word}: {reason}"),
        _ => word.to_lowercase(),
    };
    JobState::Failed {
        exit_code: match exit {
            Some((code, 0)) => Some(code),
            _ => None,
        },
        reason: why,
    }
}

/// Parses `squeue --start -h -o '%i|%S'`: (job id, unix seconds) for each job whose expected
/// start Slurm knows (`N/A` and unparsable times are left out: no estimate is no estimate).
/// Slurm prints the controller's local time without a zone; it is read as this host's local
/// time (a login node and its controller share the site's zone).
pub fn parse_start_estimates(text: &str) -> Vec<(String, f64)> {
    text.lines()
        .filter_map(|line| {
            let (id, when) = line.trim().split_once('|')?;
            Some((id.trim().to_string(), local_time_s(when.trim())?))
        })
        .collect()
}

/// Parses what `sbatch --test-only` says (on stderr) of a job it would queue:
/// `sbatch: Job 12 to start at 2026-12-04T10:20:03 using 1 processors on nodes n1 in partition
/// debug`, as unix seconds (local time, as [`parse_start_estimates`]).
pub fn parse_test_only(text: &str) -> Option<f64> {
    text.lines().find_map(|line| {
        let (_, rest) = line.split_once(" to start at ")?;
        local_time_s(rest.split_whitespace().next()?)
    })
}

/// `YYYY-MM-DDTHH:MM:SS` in local time, as unix seconds.
fn local_time_s(text: &str) -> Option<f64> {
    let (date, time) = text.split_once('T')?;
    let d: Vec<i32> = date.split('-').map(|x| x.parse().ok()).collect::<Option<_>>()?;
    let t: Vec<i32> = time.split(':').map(|x| x.parse().ok()).collect::<Option<_>>()?;
    let ([y, mo, da], [h, mi, se]) = (d.as_slice(), t.as_slice()) else {
        return None;
    };
    crate::scheduler::state::local_unix_s(*y, *mo, *da, *h, *mi, *se)
}
