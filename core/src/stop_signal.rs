//! Ctrl-C (SIGINT) and SIGTERM as a request to stop, for the loops that must say what they
//! leave behind before they go: the submit loop stops this machine's own jobs, or tells the
//! user that a cluster's keep running. Without this, the process died at once and the local
//! embed jobs, each in a process group of its own, kept the CPU busy with nobody watching.
//!
//! [`StopSignals::catch`] installs the handler for as long as the guard lives (the previous
//! handlers come back when it drops: a Ctrl-C after the loop, during `run`'s upload, ends the
//! process as before). The handler only records the signal and writes a byte to a pipe; the
//! loop asks [`requested`] at its own pace and sleeps with [`sleep_unless_stopped`], which
//! waits on that pipe: one wake-up a sleep, not one every few milliseconds (the owner sleeps
//! through most of a week's run).

use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// The signal caught, 0 for none.
static CAUGHT: AtomicI32 = AtomicI32::new(0);

/// The pipe a caught signal wakes the sleeper through: read end, write end (-1: none yet).
/// Made once and kept for the process's life: a handler may write to it at any moment.
static WAKE_READ: AtomicI32 = AtomicI32::new(-1);
static WAKE_WRITE: AtomicI32 = AtomicI32::new(-1);

/// The signals caught: Ctrl-C, and what `kill` and batch systems send first.
const SIGNALS: [libc::c_int; 2] = [libc::SIGINT, libc::SIGTERM];

extern "C" fn record(signal: libc::c_int) {
    // Async-signal-safe: an atomic store, and write(2) of one byte to a non-blocking pipe (a
    // full pipe already wakes the sleeper).
    CAUGHT.store(signal, Ordering::SeqCst);
    let fd = WAKE_WRITE.load(Ordering::SeqCst);
    if fd >= 0 {
        // SAFETY: writes one byte from a live local to a descriptor this module owns.
        unsafe {
            libc::write(fd, [1u8].as_ptr().cast(), 1);
        }
    }
}

/// Makes the wake-up pipe if there is none yet.
fn wake_pipe() {
    static MADE: std::sync::Once = std::sync::Once::new();
    MADE.call_once(|| {
        let mut fds = [-1; 2];
        // SAFETY: pipe2 fills the two descriptors it is given.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } == 0 {
            WAKE_READ.store(fds[0], Ordering::SeqCst);
            WAKE_WRITE.store(fds[1], Ordering::SeqCst);
        }
    });
}

/// Empties the wake-up pipe (the bytes of signals already recorded in [`CAUGHT`]).
fn drain_wake_pipe(fd: libc::c_int) {
    let mut buf = [0u8; 64];
    // SAFETY: reads into a live local buffer of its length; the descriptor is non-blocking.
    while unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
}

/// The handlers in force while it lives; the previous ones come back when it drops.
pub struct StopSignals {
    previous: Vec<(libc::c_int, libc::sigaction)>,
}

impl StopSignals {
    /// Catches SIGINT and SIGTERM (see the module docs).
    pub fn catch() -> Self {
        wake_pipe();
        if let fd @ 0.. = WAKE_READ.load(Ordering::SeqCst) {
            drain_wake_pipe(fd);
        }
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
    let fd = WAKE_READ.load(Ordering::SeqCst);
    loop {
        if let Some(signal) = requested() {
            return Some(signal);
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        if fd < 0 {
            // No pipe could be made: look again every 50 ms.
            std::thread::sleep(left.min(Duration::from_millis(50)));
            continue;
        }
        let mut wait = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // Whole milliseconds, rounded up: never a busy loop on a sub-millisecond rest.
        let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        // SAFETY: polls one live pollfd; EINTR (the signal itself) just loops.
        if unsafe { libc::poll(&mut wait, 1, ms) } > 0 {
            drain_wake_pipe(fd);
        }
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

    #[test]
    fn a_signal_sent_while_the_loop_sleeps_wakes_it() {
        let _guard = StopSignals::catch();
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            // SAFETY: sends a signal this process handles by recording it.
            unsafe { libc::kill(pid, libc::SIGINT) };
        });
        let started = Instant::now();
        assert_eq!(
            sleep_unless_stopped(Duration::from_secs(60)),
            Some(libc::SIGINT)
        );
        assert!(started.elapsed() < Duration::from_secs(30));
        sender.join().unwrap();
        // A new guard starts with nothing caught, and a sleep with no signal runs its length.
        drop(_guard);
        let _again = StopSignals::catch();
        assert_eq!(sleep_unless_stopped(Duration::from_millis(20)), None);
    }
}
