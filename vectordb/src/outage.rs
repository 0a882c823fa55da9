//! A server that stops answering, said and bounded.
//!
//! Riding out a restart is right, but a command that retries in silence for minutes looks
//! hung. While requests fail, [`Outage`] says so about every [`OutageLimits::say_every`], with
//! how long the upload goes on trying, and says when the server answers again.
//!
//! A refused connection is told from an overloaded server without reading any message text:
//! after a failed request the server's address is probed with a plain TCP connect, whose error
//! kind is typed. Refused on every probe for [`OutageLimits::refused_give_up`], the server is
//! not running there, and every request fails at once with [`UploadError::ServerRefused`]
//! instead of going through all its retries (8 attempts, batches in a row).

use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tonic::Code;

use crate::error::{UploadError, UploadResult};

/// How long one probe may take: a refused connection answers at once.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// How an outage is said and bounded (from the retry policy, `RetryPolicy::outage_limits`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OutageLimits {
    /// Refused this long, the server is taken as not running.
    pub refused_give_up: Duration,
    /// The same for a server that has not answered once since the command started: nothing
    /// listens there (a wrong port, a server not started), and a minute of patience, meant
    /// for a restart, only hides it.
    pub never_answered_give_up: Duration,
    /// How often the outage is said while it lasts.
    pub say_every: Duration,
    /// Attempts of one request, and the longest its retries wait in all (said to the user).
    pub max_attempts: u32,
    pub longest_retry: Duration,
}

/// The state of one server's outage, shared by every request to it (workers included).
#[derive(Debug)]
pub(crate) struct Outage {
    url: String,
    /// `host:port` of the server, probed after a failure; `None` when the URL names none.
    address: Option<String>,
    policy: OutageLimits,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The first failure since the server last answered.
    since: Option<Instant>,
    /// The first of the probes that have all been refused since.
    refused_since: Option<Instant>,
    /// When the outage was last said.
    said_at: Option<Instant>,
    /// The server has answered a request of this command (kept across outages).
    answered_once: bool,
}

impl State {
    /// How long refused connections are borne: less for a server that never answered.
    fn give_up(&self, limits: &OutageLimits) -> Duration {
        if self.answered_once {
            limits.refused_give_up
        } else {
            limits.never_answered_give_up.min(limits.refused_give_up)
        }
    }
}

/// What a failed request's probe found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probe {
    Refused,
    Other,
}

impl Outage {
    /// The outage tracker of the server at `url` (a gRPC URL such as `http://q:6334`).
    pub fn new(url: &str, policy: OutageLimits) -> Self {
        Self {
            url: url.to_owned(),
            address: address_of(url),
            policy,
            state: Mutex::new(State::default()),
        }
    }

    /// Fails at once when the server has refused every connection for the policy's
    /// `refused_give_up`: retrying a server that is not running only hides that it is not.
    pub fn check(&self) -> UploadResult<()> {
        let state = self.state.lock().expect("outage lock. This is a bug.");
        match state.refused_since {
            Some(since) if since.elapsed() >= state.give_up(&self.policy) => {
                Err(self.refused(since.elapsed(), state.answered_once))
            }
            _ => Ok(()),
        }
    }

    /// A request failed with the transient `code`: probes the server's address, says the
    /// outage when it is time, and fails once connections have been refused long enough.
    /// Returns whether the connection was refused: then the give-up time, not the request's
    /// attempt count, bounds its retries.
    pub async fn failed(&self, code: Code, message: &str) -> UploadResult<bool> {
        let probe = self.probe().await;
        let mut state = self.state.lock().expect("outage lock. This is a bug.");
        let now = Instant::now();
        let since = *state.since.get_or_insert(now);
        match probe {
            Probe::Refused => {
                state.refused_since.get_or_insert(now);
            }
            Probe::Other => state.refused_since = None,
        }
        let refused_for = state.refused_since.map(|s| now - s);
        let give_up = state.give_up(&self.policy);
        if let Some(refused_for) = refused_for.filter(|d| *d >= give_up) {
            return Err(self.refused(refused_for, state.answered_once));
        }
        // The first word after a third of the interval: a user should not wait long to learn
        // why nothing moves. A server that never answered is said at once.
        let never = !state.answered_once && refused_for.is_some();
        let due = match state.said_at {
            Some(said) => now - said >= self.policy.say_every,
            None => never || now - since >= self.policy.say_every / 3,
        };
        if due {
            state.said_at = Some(now);
            let plan = match refused_for {
                Some(refused_for) if never => format!(
                    "connection refused: nothing listens there (not started, or not its gRPC port, 6334 by default); giving up in {}",
                    secs(give_up.saturating_sub(refused_for))
                ),
                Some(refused_for) => format!(
                    "connection refused: it is down or restarting; giving up if it still refuses in {}",
                    secs(give_up.saturating_sub(refused_for))
                ),
                None => format!(
                    "{code:?}: {message}; each request is tried {} times, over up to {}",
                    self.policy.max_attempts,
                    secs(self.policy.longest_retry)
                ),
            };
            eprintln!(
                "warning: the Qdrant server at {} has not answered for {} ({plan})",
                self.url,
                secs(now - since)
            );
        }
        Ok(refused_for.is_some())
    }

    /// A request succeeded: the outage, if there was one, is over.
    pub fn answered(&self) {
        let mut state = self.state.lock().expect("outage lock. This is a bug.");
        if let (Some(since), Some(_)) = (state.since, state.said_at) {
            eprintln!(
                "note: the Qdrant server at {} answers again, after {}",
                self.url,
                secs(since.elapsed())
            );
        }
        *state = State {
            answered_once: true,
            ..State::default()
        };
    }

    fn refused(&self, refused_for: Duration, answered_once: bool) -> UploadError {
        let url = self.url.clone();
        let seconds = refused_for.as_secs();
        if answered_once {
            UploadError::ServerRefused { url, seconds }
        } else {
            UploadError::NothingListens { url, seconds }
        }
    }

    /// Connects to the server's address: refused, or anything else (it answered, timed out,
    /// or the name does not resolve now).
    async fn probe(&self) -> Probe {
        let Some(address) = &self.address else {
            return Probe::Other;
        };
        let Ok(addresses) = tokio::net::lookup_host(address.as_str()).await else {
            return Probe::Other;
        };
        let addresses: Vec<SocketAddr> = addresses.collect();
        if addresses.is_empty() {
            return Probe::Other;
        }
        for addr in addresses {
            match tokio::time::timeout(PROBE_TIMEOUT, tokio::net::TcpStream::connect(addr)).await {
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {}
                _ => return Probe::Other,
            }
        }
        Probe::Refused
    }
}

/// `host:port` of a gRPC URL (`http://host:port/...`; Qdrant's gRPC port when none is given).
fn address_of(url: &str) -> Option<String> {
    let uri: http::Uri = url.parse().ok()?;
    let host = uri.host()?;
    let port = uri.port_u16().unwrap_or(6334);
    // An IPv6 literal keeps its brackets for lookup_host.
    Some(if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    })
}

/// Whole seconds, for a person.
fn secs(d: Duration) -> String {
    format!("{} s", d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_address_of_a_grpc_url() {
        assert_eq!(address_of("http://q:6334").as_deref(), Some("q:6334"));
        assert_eq!(
            address_of("https://q.example/").as_deref(),
            Some("q.example:6334")
        );
        assert_eq!(
            address_of("http://[::1]:7000").as_deref(),
            Some("[::1]:7000")
        );
        assert_eq!(address_of("not a url"), None);
    }

    /// The default retry policy's limits.
    fn limits() -> OutageLimits {
        OutageLimits {
            refused_give_up: Duration::from_secs(60),
            never_answered_give_up: Duration::from_secs(10),
            say_every: Duration::from_secs(30),
            max_attempts: 8,
            longest_retry: Duration::from_millis(31_750),
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("test runtime")
    }

    #[test]
    fn refused_for_the_give_up_time_fails_at_once_and_an_answer_resets_it() {
        // A port bound and closed again: nothing listens there, so a connect is refused.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let policy = OutageLimits {
            refused_give_up: Duration::from_millis(200),
            ..limits()
        };
        let outage = Outage::new(&format!("http://127.0.0.1:{port}"), policy);
        // A server that was up, then went away.
        outage.answered();
        let rt = runtime();
        let refused = rt.block_on(outage.failed(Code::Internal, "boom")).unwrap();
        assert!(refused, "nothing listens there");
        assert!(outage.check().is_ok(), "not refused for long yet");
        std::thread::sleep(Duration::from_millis(250));
        let err = rt
            .block_on(outage.failed(Code::Internal, "boom"))
            .unwrap_err();
        assert!(matches!(err, UploadError::ServerRefused { .. }), "{err:?}");
        assert!(err
            .to_string()
            .contains("re-run: finished batches are not sent again"));
        assert!(matches!(
            outage.check(),
            Err(UploadError::ServerRefused { .. })
        ));
        outage.answered();
        assert!(outage.check().is_ok(), "answered: the outage is over");
    }

    #[test]
    fn a_server_that_never_answered_is_given_up_on_sooner_and_said_as_nothing_listening() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let policy = OutageLimits {
            never_answered_give_up: Duration::from_millis(150),
            ..limits()
        };
        let outage = Outage::new(&format!("http://127.0.0.1:{port}"), policy);
        let rt = runtime();
        assert!(rt.block_on(outage.failed(Code::Internal, "boom")).unwrap());
        std::thread::sleep(Duration::from_millis(200));
        // Well before the minute a server that went away gets.
        let err = rt
            .block_on(outage.failed(Code::Internal, "boom"))
            .unwrap_err();
        assert!(matches!(err, UploadError::NothingListens { .. }), "{err:?}");
        assert!(err.to_string().contains("nothing listens at"), "{err}");
        assert!(matches!(
            outage.check(),
            Err(UploadError::NothingListens { .. })
        ));
    }

    #[test]
    fn a_server_that_accepts_connections_is_not_refused() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let policy = OutageLimits {
            refused_give_up: Duration::ZERO,
            ..limits()
        };
        let outage = Outage::new(&format!("http://127.0.0.1:{port}"), policy);
        // Overloaded, not down: a failure is only retried, within its attempts.
        let refused = runtime()
            .block_on(outage.failed(Code::Unavailable, "busy"))
            .unwrap();
        assert!(!refused);
        assert!(outage.check().is_ok());
    }
}
