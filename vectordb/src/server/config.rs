//! Where a Qdrant server is and how to reach it: its URL, the API key's source, timeouts and
//! retries; and where the key may go (never in clear text to another machine unless allowed).

use std::path::PathBuf;
use std::time::Duration;

use crate::error::{UploadError, UploadResult};
use crate::retry::RetryPolicy;

/// Where the API key comes from. The key itself is never stored in the config.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ApiKey {
    /// No API key.
    #[default]
    None,
    /// The value of this environment variable (e.g. `QDRANT_API_KEY`); unset or empty = no key.
    Env(String),
    /// The first line of this file (keep it mode 0600).
    File(PathBuf),
}

impl ApiKey {
    /// The key, read from where it comes from (`None`: no key).
    pub fn resolve(&self) -> UploadResult<Option<String>> {
        let key = match self {
            ApiKey::None => None,
            ApiKey::Env(var) => std::env::var(var).ok(),
            ApiKey::File(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| UploadError::Io {
                    action: "read the Qdrant API key file",
                    path: path.clone(),
                    cause: source,
                })?;
                text.lines().next().map(str::to_owned)
            }
        };
        Ok(key.map(|k| k.trim().to_owned()).filter(|k| !k.is_empty()))
    }
}

/// How to reach a Qdrant server.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// `http://host:6334` or `https://host:6334` (TLS): the gRPC port.
    pub url: String,
    /// API key source.
    pub api_key: ApiKey,
    /// Per-request timeout; big batches need more than the client's 5 s default.
    pub timeout: Duration,
    /// Timeout of establishing a connection.
    pub connect_timeout: Duration,
    /// Retries of transient errors.
    pub retry: RetryPolicy,
    /// `wait=true` on upserts: the answer comes once the points are applied. With `false` the
    /// answer comes once they are in the server's WAL (durable, but not yet counted).
    pub wait: bool,
    /// How long [`Sink::finish`] waits for the collection to become green.
    pub green_timeout: Duration,
    /// Tokio worker threads of the sink's runtime.
    pub runtime_threads: usize,
    /// Send the API key over plain `http://` to a host that is not this machine (it travels in
    /// clear text); refused otherwise.
    pub allow_insecure: bool,
}

impl ServerConfig {
    /// Defaults: no API key, 120 s request timeout, 10 s connect timeout, default retries,
    /// `wait=true`, 24 h green timeout, 2 runtime threads.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            api_key: ApiKey::None,
            timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(10),
            retry: RetryPolicy::default(),
            wait: true,
            green_timeout: Duration::from_secs(24 * 3600),
            runtime_threads: 2,
            allow_insecure: false,
        }
    }
}

/// True when `url` is plain `http://` to another machine: an API key would cross the network
/// in clear text. The URL is parsed, not matched as text (`HTTP://` is plain http too); a URL
/// that does not parse is taken as another machine (the key is refused, not sent).
pub fn sends_in_clear(url: &str) -> bool {
    match url.parse::<http::Uri>() {
        Ok(uri) => {
            uri.scheme_str()
                .is_some_and(|s| s.eq_ignore_ascii_case("http"))
                && !is_this_machine(&uri)
        }
        Err(_) => true,
    }
}

/// True when `uri`'s host is this machine: every address it resolves to is loopback. The text
/// decides nothing (`127.0.0.1.example.org` is a name like any other), and a host that does not
/// resolve is taken as another machine.
pub fn is_this_machine(uri: &http::Uri) -> bool {
    let Some(host) = uri.host() else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(80);
    match std::net::ToSocketAddrs::to_socket_addrs(&(host, port)) {
        Ok(addrs) => {
            let addrs: Vec<std::net::SocketAddr> = addrs.collect();
            !addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback())
        }
        Err(_) => false,
    }
}

/// Refuses a server URL that is not `http(s)://host[:port]`: the scheme compared as a URL
/// parser does, whatever its case.
pub fn check_url(url: &str) -> UploadResult<()> {
    let invalid = |reason: &str| UploadError::InvalidUrl {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    let uri: http::Uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| invalid(&e.to_string()))?;
    match uri.scheme_str() {
        Some(s) if s.eq_ignore_ascii_case("http") || s.eq_ignore_ascii_case("https") => {}
        _ => return Err(invalid("the scheme must be http or https")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(invalid("no host"));
    }
    Ok(())
}

#[cfg(test)]
mod insecure_tests {
    use super::*;
    use crate::server::QdrantServer;

    #[test]
    fn an_api_key_goes_over_plain_http_only_to_this_machine_or_when_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key");
        std::fs::write(&key, "secret\n").unwrap();
        let config = |url: &str| ServerConfig {
            api_key: ApiKey::File(key.clone()),
            ..ServerConfig::new(url)
        };
        let err = QdrantServer::connect(config("http://qdrant.example:6334")).unwrap_err();
        assert!(matches!(err, UploadError::InsecureApiKey { .. }), "{err}");
        assert!(err.to_string().contains("--allow-insecure"), "{err}");
        let allowed = ServerConfig {
            allow_insecure: true,
            ..config("http://qdrant.example:6334")
        };
        assert!(QdrantServer::connect(allowed).is_ok());
        for local in [
            "http://127.0.0.1:6334",
            "http://localhost:6334",
            "http://[::1]:6334",
        ] {
            assert!(QdrantServer::connect(config(local)).is_ok(), "{local}");
        }
        let no_key = ServerConfig::new("http://qdrant.example:6334");
        assert!(
            QdrantServer::connect(no_key).is_ok(),
            "no key, nothing to leak"
        );
        assert!(!sends_in_clear("https://qdrant.example:6334"));
        // The scheme is parsed, not matched as text.
        assert!(sends_in_clear("HTTP://qdrant.example:6334"));
        assert!(sends_in_clear("Http://qdrant.example:6334"));
        assert!(!sends_in_clear("HTTPS://qdrant.example:6334"));
        assert!(check_url("HTTP://qdrant.example:6334").is_ok());
        assert!(check_url("ftp://qdrant.example").is_err());
        assert!(check_url("http://").is_err());
    }

    #[test]
    fn loopback_is_decided_by_the_resolved_address_not_the_hosts_text() {
        for remote in [
            "http://127.0.0.1.example.org:6334",
            "http://127.0.0.1.example.org",
            "http://localhost.example.org:6334",
            "http://user@10.0.0.1:6334",
            "http://[2001:db8::1]:6334",
        ] {
            assert!(sends_in_clear(remote), "{remote}");
        }
        for local in [
            "http://127.0.0.1:6334/",
            "http://127.3.4.5:6334",
            "http://localhost:6334",
            "http://[::1]:6334",
            "http://[::1]",
        ] {
            assert!(!sends_in_clear(local), "{local}");
        }
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key");
        std::fs::write(&key, "secret\n").unwrap();
        let config = ServerConfig {
            api_key: ApiKey::File(key),
            ..ServerConfig::new("http://127.0.0.1.example.org:6334")
        };
        let err = QdrantServer::connect(config).unwrap_err();
        assert!(matches!(err, UploadError::InsecureApiKey { .. }), "{err}");
    }
}
