//! Retries of transient gRPC errors: exponential backoff with jitter, typed fields only.
//!
//! A failure is transient when its gRPC status code says the server may succeed later
//! ([`is_transient`]); a `ResourceExhausted` answer's `retry-after` (which qdrant-client lifts
//! into `QdrantError::ResourceExhaustedError`) is honoured. Message text is never inspected.

use std::future::Future;
use std::time::Duration;

use qdrant_client::QdrantError;
use rand::Rng as _;
use tonic::Code;

use super::error::{UploadError, UploadResult};
use super::outage::{Outage, OutageLimits};

/// How often and how long to retry a transient failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (1 = no retry).
    pub max_attempts: u32,
    /// Backoff before the first retry; doubled after each further failure.
    pub base_delay: Duration,
    /// Upper bound of one backoff.
    pub max_delay: Duration,
    /// Upper bound of a server-requested `retry-after` wait.
    pub max_retry_after: Duration,
    /// A server that refuses every connection this long is not running: requests fail at once
    /// (see `outage.rs`).
    pub refused_give_up: Duration,
    /// The same for a server that has not answered once since the command started.
    pub never_answered_give_up: Duration,
    /// How often an outage is said while it lasts.
    pub say_every: Duration,
}

impl Default for RetryPolicy {
    /// 8 attempts, 250 ms doubling to at most 30 s (about 1 min of retries in all); a server
    /// refusing connections for 1 min is given up on (10 s when it never answered); an outage
    /// said every 30 s.
    fn default() -> Self {
        Self {
            max_attempts: 8,
            base_delay: Duration::from_millis(250),
            max_delay: Duration::from_secs(30),
            max_retry_after: Duration::from_secs(120),
            refused_give_up: Duration::from_secs(60),
            never_answered_give_up: Duration::from_secs(10),
            say_every: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// What an [`Outage`] of a server this policy retries goes by.
    pub(crate) fn outage_limits(&self) -> OutageLimits {
        OutageLimits {
            refused_give_up: self.refused_give_up,
            never_answered_give_up: self.never_answered_give_up,
            say_every: self.say_every,
            max_attempts: self.max_attempts,
            longest_retry: self.longest_retry(),
        }
    }

    /// The longest one request's retries wait in all (every backoff at its upper bound).
    pub fn longest_retry(&self) -> Duration {
        (0..self.max_attempts.saturating_sub(1))
            .map(|retry| {
                self.base_delay
                    .saturating_mul(1u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX))
                    .min(self.max_delay)
            })
            .sum()
    }

    /// The backoff before retry number `retry` (0-based): `base * 2^retry`, capped, with "equal
    /// jitter" (uniform in the upper half) so that many workers do not retry in lockstep.
    pub fn backoff(&self, retry: u32) -> Duration {
        let full = self
            .base_delay
            .saturating_mul(1u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX))
            .min(self.max_delay);
        let half = full / 2;
        half + full
            .saturating_sub(half)
            .mul_f64(rand::rng().random::<f64>())
    }
}

/// True for the gRPC codes that a later attempt may get past: `Unavailable` (server down or
/// restarting), `DeadlineExceeded` (timeout), `ResourceExhausted` (rate limit, with or without
/// `retry-after`), `Aborted` (conflict, e.g. during resharding), `Internal` and `Unknown`.
///
/// `Unknown` is here because tonic reports a connection that broke with a request in flight —
/// the server killed (SIGKILL, the OOM killer, a node lost) — as `Unknown: transport error`.
/// Every write embedfleet sends is idempotent (an upsert by the paper's own point id, a delete
/// by id), so sending it again is safe; a server that keeps answering `Unknown` still surfaces,
/// as `RetriesExhausted`.
///
/// `Internal` is here because qdrant-client 1.20 reports a failed (re)connection — the server is
/// down or restarting — as `Status::internal("Failed to connect ...")`, with no typed field to
/// tell it from a server-side internal error. Retrying it keeps an upload going through a server
/// restart; a persistent server-side `Internal` still surfaces, as `RetriesExhausted`.
pub fn is_transient(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable
            | Code::DeadlineExceeded
            | Code::ResourceExhausted
            | Code::Aborted
            | Code::Internal
            | Code::Unknown
    )
}

/// One failed attempt, classified.
enum Failure {
    Transient {
        code: Code,
        message: String,
        retry_after: Option<Duration>,
    },
    Permanent(UploadError),
}

fn classify(err: QdrantError, action: &'static str) -> Failure {
    match err {
        QdrantError::ResourceExhaustedError {
            status,
            retry_after_seconds,
        } => Failure::Transient {
            code: status.code(),
            message: status.message().to_owned(),
            retry_after: Some(Duration::from_secs(retry_after_seconds)),
        },
        QdrantError::ResponseError { status } if is_transient(status.code()) => {
            Failure::Transient {
                code: status.code(),
                message: status.message().to_owned(),
                retry_after: None,
            }
        }
        QdrantError::ResponseError { status } => Failure::Permanent(UploadError::Server {
            action,
            code: status.code(),
            message: status.message().to_owned(),
        }),
        other => Failure::Permanent(UploadError::Client {
            action,
            message: other.to_string(),
        }),
    }
}

/// Runs `attempt` until it succeeds, fails permanently, or `policy.max_attempts` is reached;
/// `outage` says a server that stops answering and fails at once on one that is not running.
pub(crate) async fn with_retry<T, F, Fut>(
    policy: &RetryPolicy,
    outage: &Outage,
    action: &'static str,
    mut attempt: F,
) -> UploadResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, QdrantError>>,
{
    let max_attempts = policy.max_attempts.max(1);
    let mut done = 0;
    loop {
        outage.check()?;
        let err = match attempt().await {
            Ok(value) => {
                outage.answered();
                return Ok(value);
            }
            Err(err) => err,
        };
        done += 1;
        let failure = classify(err, action);
        // A refused connection is retried until the outage's give-up time, whatever the
        // attempt count: a restart takes longer than the attempts' backoff.
        let refused = match &failure {
            Failure::Transient { code, message, .. } => outage.failed(*code, message).await?,
            Failure::Permanent(_) => false,
        };
        match failure {
            Failure::Permanent(err) => return Err(err),
            Failure::Transient { code, message, .. } if done >= max_attempts && !refused => {
                return Err(UploadError::RetriesExhausted {
                    action,
                    attempts: done,
                    code,
                    message,
                });
            }
            Failure::Transient {
                code, retry_after, ..
            } => {
                let backoff = policy.backoff(done - 1);
                let wait = match retry_after {
                    Some(asked) => asked.min(policy.max_retry_after).max(backoff),
                    None => backoff,
                };
                tracing::debug!(
                    action,
                    ?code,
                    attempt = done,
                    ?wait,
                    "transient Qdrant error, retrying"
                );
                tokio::time::sleep(wait).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    fn fast() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 4,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(4),
            max_retry_after: Duration::from_millis(5),
            ..RetryPolicy::default()
        }
    }

    /// An outage tracker with no address to probe (failures are never "refused").
    fn no_probe() -> Outage {
        Outage::new("", fast().outage_limits())
    }

    fn run<T>(fut: impl Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("test runtime")
            .block_on(fut)
    }

    fn status(code: Code) -> QdrantError {
        QdrantError::from(tonic::Status::new(code, "boom"))
    }

    #[test]
    fn transient_codes_are_the_documented_six() {
        for code in [
            Code::Unavailable,
            Code::DeadlineExceeded,
            Code::ResourceExhausted,
            Code::Aborted,
            Code::Internal,
            // A connection broken mid-request by a server killed (tonic's "transport error").
            Code::Unknown,
        ] {
            assert!(is_transient(code), "{code:?}");
        }
        for code in [
            Code::InvalidArgument,
            Code::NotFound,
            Code::Unauthenticated,
            Code::PermissionDenied,
        ] {
            assert!(!is_transient(code), "{code:?}");
        }
    }

    #[test]
    fn retries_transient_until_success() {
        let calls = AtomicU32::new(0);
        let out = run(with_retry(&fast(), &no_probe(), "upsert points", || {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < 2 {
                    Err(status(Code::Unavailable))
                } else {
                    Ok(n)
                }
            }
        }));
        assert_eq!(out.expect("third attempt succeeds"), 2);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn permanent_error_is_not_retried_and_keeps_its_code() {
        let calls = AtomicU32::new(0);
        let out: UploadResult<()> = run(with_retry(&fast(), &no_probe(), "upsert points", || {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err(status(Code::InvalidArgument)) }
        }));
        assert!(matches!(
            out,
            Err(UploadError::Server {
                code: Code::InvalidArgument,
                ..
            })
        ));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn gives_up_after_max_attempts_with_typed_error() {
        let calls = AtomicU32::new(0);
        let out: UploadResult<()> = run(with_retry(&fast(), &no_probe(), "count points", || {
            calls.fetch_add(1, Ordering::SeqCst);
            async { Err(status(Code::DeadlineExceeded)) }
        }));
        match out {
            Err(UploadError::RetriesExhausted { attempts, code, .. }) => {
                assert_eq!(attempts, 4);
                assert_eq!(code, Code::DeadlineExceeded);
            }
            other => panic!("expected RetriesExhausted, got {other:?}"),
        }
        assert_eq!(calls.load(Ordering::SeqCst), 4);
    }

    #[test]
    fn retry_after_header_is_read_and_retried() {
        let calls = AtomicU32::new(0);
        let out = run(with_retry(&fast(), &no_probe(), "upsert points", || {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                if n == 0 {
                    let mut s = tonic::Status::new(Code::ResourceExhausted, "slow down");
                    s.metadata_mut()
                        .insert("retry-after", "0".parse().expect("ascii"));
                    let err = QdrantError::from(s);
                    assert!(matches!(err, QdrantError::ResourceExhaustedError { .. }));
                    Err(err)
                } else {
                    Ok(())
                }
            }
        }));
        assert!(out.is_ok());
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = RetryPolicy {
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(1000),
            ..RetryPolicy::default()
        };
        for retry in 0..12 {
            let full = Duration::from_millis(100 * (1u64 << retry.min(20))).min(p.max_delay);
            let d = p.backoff(retry);
            assert!(
                d >= full / 2 && d <= full,
                "retry {retry}: {d:?} not in [{:?}, {full:?}]",
                full / 2
            );
        }
    }

    #[test]
    fn the_longest_retry_sums_the_capped_backoffs() {
        let p = RetryPolicy::default();
        // 0.25 + 0.5 + 1 + 2 + 4 + 8 + 16 s for the 7 retries of 8 attempts.
        assert_eq!(p.longest_retry(), Duration::from_millis(31_750));
    }
}
