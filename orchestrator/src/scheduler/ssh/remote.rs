/*!
The bash scripts the ssh backend runs on a host, each fed to `bash -s` on ssh's stdin (so no
value of the run travels on a command line), and what they print.

A job is found again by its pid, its start time (field 22 of `/proc/PID/stat`, clock ticks
since boot) and the `EMBEDFLEET_JOB_NAME` in its environment: a pid alone may have been reused
by another process (after a reboot, or once pids wrap around). Each job leads its own session
and process group (`setsid`), carries `EMBEDFLEET_SSH_HOST` and `EMBEDFLEET_SSH_SLOT`, and its
slot is free again once it is gone.
*/

use std::path::Path;

use super::super::shell_quote;
use super::JobRef;

/// Shell functions every script starts with. `fields PID` sets `$1...` to the fields of
/// `/proc/PID/stat` after the command name (state, ppid, pgrp, ... start time is `${20}`);
/// `is_job PID START NAME`: that process is the job.
const PRELUDE: &str = r#"set -u
fields() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*) }; set -f; FIELDS=($s); set +f; }
is_job() {
  fields "$1" || return 1
  [ "${FIELDS[0]}" != Z ] && [ "${FIELDS[2]}" = "$1" ] && [ "${FIELDS[19]}" = "$2" ] || return 1
  grep -q -a -z -x -F "EMBEDFLEET_JOB_NAME=$3" "/proc/$1/environ" 2>/dev/null
}
host_jobs() {
  local f p
  for f in $(grep -l -a -z -x -F "EMBEDFLEET_SSH_HOST=$1" /proc/[0-9]*/environ 2>/dev/null); do
    p=${f#/proc/}; p=${p%/environ}
    fields "$p" || continue
    [ "${FIELDS[0]}" != Z ] && [ "${FIELDS[2]}" = "$p" ] || continue
    echo "job $(env_of "$p" EMBEDFLEET_SSH_SLOT) $p ${FIELDS[19]} $(env_of "$p" EMBEDFLEET_JOB_NAME)"
  done
}
env_of() { grep -a -z "^$2=" "/proc/$1/environ" 2>/dev/null | tr -d '\0' | cut -d= -f2-; }
"#;

fn q(s: &str) -> String {
    shell_quote(s)
}

fn qp(p: &Path) -> String {
    shell_quote(&p.display().to_string())
}

/// What a launch needs to know.
pub(super) struct Launch<'a> {
    pub host: &'a str,
    pub name: &'a str,
    pub run_dir: &'a Path,
    pub script: &'a Path,
    pub log: &'a Path,
    /// Per slot: `CUDA_VISIBLE_DEVICES`, or `None` to leave it as it is.
    pub slots: Vec<Option<String>>,
}

/// Exit status of a launch that found every slot taken.
pub(super) const SLOTS_TAKEN: i32 = 3;

/// Starts the job on the first free slot, detached (`setsid`, stdin from /dev/null, output
/// into its log), and prints `started SLOT PID START`.
pub(super) fn launch(l: &Launch<'_>) -> String {
    let devices: Vec<String> = l
        .slots
        .iter()
        .map(|d| match d {
            None => "-".to_string(),
            Some(d) => q(&format!("={d}")),
        })
        .collect();
    format!(
        r#"{PRELUDE}host={host}; name={name}; run_dir={run_dir}; script={script}; log={log}
devices=({devices})
busy=" $(host_jobs "$host" | cut -d' ' -f2 | tr '\n' ' ')"
slot=
for i in "${{!devices[@]}}"; do case "$busy" in *" $i "*) ;; *) slot=$i; break;; esac; done
if [ -z "$slot" ]; then echo "embedfleet: every slot of host $host is taken (${{#devices[@]}} slots)" >&2; exit {taken}; fi
cd "$run_dir" || {{ echo "embedfleet: the run directory $run_dir is not there" >&2; exit 5; }}
(
  export EMBEDFLEET_JOB_NAME="$name" EMBEDFLEET_QUEUE="$host" EMBEDFLEET_SSH_HOST="$host" EMBEDFLEET_SSH_SLOT="$slot"
  d=${{devices[$slot]}}
  if [ "$d" != - ]; then export CUDA_VISIBLE_DEVICES="${{d#=}}"; fi
  exec setsid bash "$script" >>"$log" 2>&1 </dev/null
) &
pid=$!
fields "$pid" && echo "started $slot $pid ${{FIELDS[19]}}"
"#,
        host = q(l.host),
        name = q(l.name),
        run_dir = qp(l.run_dir),
        script = qp(l.script),
        log = qp(l.log),
        devices = devices.join(" "),
        taken = SLOTS_TAKEN,
    )
}

/// Prints `running ID` or `gone ID` for each job.
pub(super) fn poll(jobs: &[&JobRef]) -> String {
    let mut s = PRELUDE.to_string();
    for job in jobs {
        s.push_str(&format!(
            "if is_job {} {} {}; then echo running {id}; else echo gone {id}; fi\n",
            job.pid,
            job.start,
            q(&job.name),
            id = q(&job.id),
        ));
    }
    s
}

/// Prints `job SLOT PID START NAME` for each job of `host` there.
pub(super) fn list(host: &str) -> String {
    format!("{PRELUDE}host_jobs {}\n", q(host))
}

/// Sends SIGTERM to each job's process group, then SIGKILL after `grace` seconds from a
/// detached helper (so the call returns at once), each only while the pid is still the job.
/// Prints `cancelled ID` or `gone ID`.
pub(super) fn cancel(jobs: &[&JobRef], grace: f64) -> String {
    let mut s = PRELUDE.to_string();
    for job in jobs {
        let check = format!("is_job {} {} {}", job.pid, job.start, q(&job.name));
        let later = format!(
            "{}sleep {grace}; {check} && kill -KILL -- -{pid}",
            PRELUDE,
            pid = job.pid
        );
        s.push_str(&format!(
            "if {check}; then kill -TERM -- -{pid}; (setsid bash -c {later} </dev/null >/dev/null 2>&1 &); echo cancelled {id}; else echo gone {id}; fi\n",
            pid = job.pid,
            later = q(&later),
            id = q(&job.id),
        ));
    }
    s
}

/// What preflight checks on a host.
pub(super) struct Check<'a> {
    pub run_dir: &'a Path,
    /// Written by the host, read back by the owner.
    pub nonce_file: &'a Path,
    pub nonce: &'a str,
    pub binary: &'a str,
    pub env: Vec<(String, String)>,
    pub gpus: Vec<u32>,
}

/// Prints `problem WHY` for each thing that is wrong, then `checked`.
pub(super) fn preflight(c: &Check<'_>) -> String {
    let mut s = String::from("set -u\n");
    for (k, v) in &c.env {
        s.push_str(&format!("export {k}={}\n", q(v)));
    }
    s.push_str(&format!(
        r#"run_dir={run_dir}; bin={bin}
if [ ! -d "$run_dir" ]; then
  echo "problem the run directory $run_dir is not there: mount the shared filesystem at the same path on every host"
elif ! (umask 077; printf '%s\n' {nonce} > {file}.tmp && mv -f {file}.tmp {file}) 2>/dev/null; then
  echo "problem cannot write in the run directory $run_dir there: it must be the same shared directory, writable by this user"
fi
if ! command -v "$bin" >/dev/null 2>&1; then
  echo "problem the embedfleet binary $bin is not there: install it, or set this host's embedfleet = \"/path/to/embedfleet\""
elif ! out=$("$bin" --version 2>&1); then
  echo "problem the embedfleet binary $bin does not run there: $(printf '%s' "$out" | head -c 300 | tr '\n' ' ')"
fi
"#,
        run_dir = qp(c.run_dir),
        bin = q(c.binary),
        nonce = q(c.nonce),
        file = qp(c.nonce_file),
    ));
    for gpu in &c.gpus {
        s.push_str(&format!(
            "[ -e /dev/nvidia{gpu} ] || echo \"problem GPU cuda:{gpu} of its slots is not there (no /dev/nvidia{gpu})\"\n"
        ));
    }
    s.push_str("echo checked\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};

    fn bash(script: &str) -> String {
        use std::io::Write;
        let mut child = Command::new("bash")
            .arg("-s")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(script.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    #[test]
    fn a_launched_job_is_found_listed_told_from_a_stranger_and_cancelled() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("job.sh");
        std::fs::write(&script, "echo \"dev=${CUDA_VISIBLE_DEVICES-unset}\"; sleep 30\n").unwrap();
        let log = dir.path().join("job.log");
        let host = format!("test-{}", std::process::id());
        let launch_on = |name: &'static str| Launch {
            host: &host,
            name,
            run_dir: dir.path(),
            script: &script,
            log: &log,
            slots: vec![Some("1".to_string())],
        };
        let out = bash(&launch(&launch_on("j1")));
        let words: Vec<&str> = out.split_whitespace().collect();
        assert_eq!(words[..2], ["started", "0"], "{out}");
        let job = JobRef {
            id: format!("{host}:0:{}:{}", words[2], words[3]),
            pid: words[2].parse().unwrap(),
            start: words[3].to_string(),
            name: "j1".to_string(),
        };
        // The one slot is taken: a second launch is refused.
        assert_eq!(bash(&launch(&launch_on("j2"))), "");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !bash(&poll(&[&job])).starts_with("running") {
            assert!(std::time::Instant::now() < deadline, "the job never ran");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let listed = bash(&list(&host));
        assert_eq!(listed.trim(), format!("job 0 {} {} j1", job.pid, job.start));
        let stranger = JobRef {
            start: "1".to_string(),
            ..job.clone()
        };
        assert!(bash(&poll(&[&stranger])).starts_with("gone"));
        assert!(bash(&cancel(&[&job], 0.2)).starts_with("cancelled"));
        while !bash(&poll(&[&job])).starts_with("gone") {
            assert!(std::time::Instant::now() < deadline, "the job outlived its cancel");
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert_eq!(std::fs::read_to_string(&log).unwrap(), "dev=1\n");
    }
}
