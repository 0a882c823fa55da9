/*!
Waiting for a child process until a deadline: the scheduler commands' runner and the notify
hook both poll their child this way, napping a little longer each time up to a cap, so a quick
command is seen at once and a slow one costs few wake-ups.
*/

use std::process::{Child, ExitStatus};
use std::thread;
use std::time::{Duration, Instant};

/// Polls `child` until it exits (its status) or `deadline` passes (`None`). The naps between
/// looks start at `first_nap` and double up to `max_nap`, never past the deadline.
pub(crate) fn wait_until(
    child: &mut Child,
    deadline: Instant,
    first_nap: Duration,
    max_nap: Duration,
) -> std::io::Result<Option<ExitStatus>> {
    let mut nap = first_nap;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        thread::sleep(nap.min(deadline - now));
        nap = (nap * 2).min(max_nap);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn an_exit_before_the_deadline_is_seen_and_a_late_one_is_not() {
        let mut quick = Command::new("true").spawn().unwrap();
        let far = Instant::now() + Duration::from_secs(10);
        let status = wait_until(
            &mut quick,
            far,
            Duration::from_millis(1),
            Duration::from_millis(20),
        );
        assert!(status.unwrap().unwrap().success());
        let mut slow = Command::new("sleep").arg("5").spawn().unwrap();
        let soon = Instant::now() + Duration::from_millis(50);
        let status = wait_until(
            &mut slow,
            soon,
            Duration::from_millis(1),
            Duration::from_millis(20),
        );
        assert!(status.unwrap().is_none());
        assert!(Instant::now() < far, "it gave up at the deadline");
        slow.kill().unwrap();
        slow.wait().unwrap();
    }
}
