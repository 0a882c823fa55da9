//! Ctrl-C (SIGINT) and SIGTERM as a request to stop, for the loops that must say what they
//! leave behind before they go: the submit loop stops this machine's own jobs, or tells the
//! user that a cluster's keep running. Without this, the process died at once and the local
//! embed jobs, each in a process group of its own, kept the CPU busy with nobody watching.
//!
//! [`StopSignals::catch`] installs the handler for as long as the guard lives (the previous
//! handlers come back when it drops: a Ctrl-C after the loop, during `run`'s upload, ends the
//! process as before). The handler only records the signal; the loop asks [`requested`] at
//! its own pace and sleeps with [`sleep_unless_stopped`].

use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// The signal caught, 0 for none.
static CAUGHT: AtomicI32 = AtomicI32::new(0);

/// The signals caught: Ctrl-C, and what `kill` and batch systems send first.
const SIGNALS: [libc::c_int; 2] = [libc::SIGINT, libc::SIGTERM];

extern "C" fn record(signal: libc::c_int) {
    // Async-signal-safe: one atomic store.
    CAUGHT.store(signal, Ordering::SeqCst);
}

/// The handlers in force while it lives; the previous ones come back when it drops.
pub struct StopSignals {
    previous: Vec<(libc::c_int, libc::sigaction)>,
}

impl StopSignals {
    /// Catches SIGINT and SIGTERM (see the module docs).
    pub fn catch() -> Self {
        CAUGHT.store(0, Ordering::SeqCst);
        let mut previous = Vec::new();
        for signal in SIGNALS {
            // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; the handler
            // only stores to an atomic, which is async-signal-safe; `old` receives the handler
            // in force, restored on drop.
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = record as *const () as libc::sighandler_t;
                action.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut action.sa_mask);
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(signal, &action, &mut old) == 0 {
                    previous.push((signal, old));
                }
            }
        }
        Self { previous }
    }
}

impl Drop for StopSignals {
    fn drop(&mut self) {
        for (signal, old) in &self.previous {
            // SAFETY: restores the handler `catch` found in force.
            unsafe {
                libc::sigaction(*signal, old, std::ptr::null_mut());
            }
        }
    }
}

/// The stop signal caught since [`StopSignals::catch`], if any.
pub fn requested() -> Option<i32> {
    match CAUGHT.load(Ordering::SeqCst) {
        0 => None,
        signal => Some(signal),
    }
}

/// Sleeps `duration`, waking early for a stop signal; returns it if one came.
pub fn sleep_unless_stopped(duration: Duration) -> Option<i32> {
    let until = Instant::now() + duration;
    loop {
        if let Some(signal) = requested() {
            return Some(signal);
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}

/// `SIGINT (Ctrl-C)`, `SIGTERM`, or the number.
pub fn name(signal: i32) -> String {
    match signal {
        libc::SIGINT => "SIGINT (Ctrl-C)".into(),
        libc::SIGTERM => "SIGTERM".into(),
        other => format!("signal {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caught_signal_wakes_the_sleep_and_the_old_handler_comes_back() {
        let guard = StopSignals::catch();
        assert_eq!(requested(), None);
        // SAFETY: raising a signal this process now handles by recording it.
        unsafe { libc::raise(libc::SIGTERM) };
        let started = Instant::now();
        assert_eq!(
            sleep_unless_stopped(Duration::from_secs(30)),
            Some(libc::SIGTERM)
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        drop(guard);
        // SAFETY: reading the handler in force, changing nothing.
        let restored = unsafe {
            let mut now: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGTERM, std::ptr::null(), &mut now);
            now.sa_sigaction
        };
        assert_ne!(restored, record as *const () as libc::sighandler_t);
        assert_eq!(name(libc::SIGINT), "SIGINT (Ctrl-C)");
    }
}
