//! Child processes supervised by process group: the local scheduler's jobs, the scheduler
//! commands (`sbatch`, `qstat`, ...) and the upload's worker processes all start in a group of
//! their own and stop the same way — SIGTERM to the group, a grace period, SIGKILL to the group
//! (stragglers too), reap — so nothing they started outlives them.

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::thread;
use std::time::{Duration, Instant};

/// Makes `cmd` start as the leader of a new process group.
pub fn in_own_group(cmd: &mut Command) -> &mut Command {
    cmd.process_group(0)
}

/// Sends `signal` to the process group `pgid`.
pub fn signal_group(pgid: i32, signal: i32) {
    // SAFETY: killpg only sends a signal; callers pass the group of a child that is not yet
    // reaped (or verified alive), so the group id has not been reused.
    unsafe {
        libc::killpg(pgid, signal);
    }
}

/// True once our child `pid` has exited, without reaping it (WNOWAIT), so its group id (= its
/// pid) cannot be reused while we still signal the group.
pub fn has_exited(pid: i32) -> bool {
    // SAFETY: siginfo_t is plain data; waitid with WNOWAIT only inspects our own child.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let rc = libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        );
        rc == 0 && info.si_pid() != 0
    }
}

/// Stops `child`, the leader of its own group: SIGTERM to the group, up to `grace` for the
/// leader to exit, SIGKILL to the group, then reaps the leader.
pub fn terminate_group(child: &mut Child, grace: Duration) -> std::io::Result<ExitStatus> {
    let Ok(pid) = i32::try_from(child.id()) else {
        return child.wait();
    };
    if !has_exited(pid) {
        signal_group(pid, libc::SIGTERM);
        let deadline = Instant::now() + grace;
        while !has_exited(pid) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
    }
    signal_group(pid, libc::SIGKILL);
    child.wait()
}

/// SIGKILL to the group of `child` (no grace), then reaps the leader.
pub fn kill_group(child: &mut Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        signal_group(pid, libc::SIGKILL);
    }
    let _ = child.wait();
}

/// Ends this process with `code` when its parent goes away (killed, say), checking every
/// 200 ms on a thread of its own: a worker must never outlive the command that started it.
pub fn exit_when_parent_gone(what: &'static str, code: i32) {
    let parent = std::os::unix::process::parent_id();
    thread::spawn(move || loop {
        thread::sleep(Duration::from_millis(200));
        if std::os::unix::process::parent_id() != parent {
            eprintln!("{what}: the parent process is gone; stopping");
            std::process::exit(code);
        }
    });
}

/// This process's CPU time so far, user and system (its children excluded).
pub fn own_cpu() -> Duration {
    // SAFETY: getrusage fills the struct it is given; rusage is plain data.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// When process `pid` of this machine started, in unix seconds (to about a second: the boot
/// time's resolution); `None` when no such process runs.
pub fn started_unix_s(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces or parentheses: the
    // fields are counted from its last `)`. The start time is field 22, in clock ticks since
    // the boot.
    let after = stat.get(stat.rfind(')')? + 1..)?;
    let ticks: u64 = after.split_whitespace().nth(19)?.parse().ok()?;
    let boot: u64 = std::fs::read_to_string("/proc/stat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| boot as f64 + ticks as f64 / hz as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alive(pid: i32) -> bool {
        // SAFETY: signal 0 only checks that the process exists.
        unsafe { libc::kill(pid, 0) == 0 }
    }

    #[test]
    fn this_process_started_a_moment_ago_and_a_dead_pid_never() {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let started = started_unix_s(std::process::id()).expect("this process runs");
        assert!(
            started <= now + 2.0 && started > now - 3600.0,
            "{started} vs {now}"
        );
        let mut child = Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert_eq!(started_unix_s(pid), None, "reaped: no such process");
    }

    #[test]
    fn terminating_a_group_stops_its_grandchildren_too() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("grandchild");
        // The leader ignores SIGTERM, so only the SIGKILL after the grace ends it; its
        // background grandchild must not survive either.
        let script = format!(
            "trap '' TERM; sleep 60 & echo $! > {}; wait",
            pidfile.display()
        );
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c").arg(script);
        let mut child = in_own_group(&mut cmd).spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let grandchild = loop {
            if let Some(pid) = std::fs::read_to_string(&pidfile)
                .ok()
                .and_then(|s| s.trim().parse::<i32>().ok())
            {
                break pid;
            }
            assert!(Instant::now() < deadline, "the script never started");
            thread::sleep(Duration::from_millis(10));
        };
        let started = Instant::now();
        let status = terminate_group(&mut child, Duration::from_millis(300)).unwrap();
        assert!(
            started.elapsed() >= Duration::from_millis(300),
            "grace was honoured"
        );
        assert!(!status.success());
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive(grandchild) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
        }
        assert!(
            !alive(grandchild),
            "grandchild {grandchild} survived its group"
        );
    }
}
