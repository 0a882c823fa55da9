//! The few REST calls a snapshot load needs that the public gRPC API does not offer: the
//! cluster's peers and the shard-snapshot upload (multipart, streamed from the file).

use std::fs::File;
use std::io::{Cursor, Read};
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use super::SnapshotError;

/// A peer of the cluster: its id and the REST address its shards are uploaded to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub id: u64,
    pub rest_url: String,
}

/// A blocking REST client of one Qdrant server (its HTTP port, 6333 by default).
#[derive(Clone)]
pub struct RestClient {
    url: String,
    api_key: Option<String>,
    /// Send the API key over plain http to another machine (`--allow-insecure`).
    allow_insecure: bool,
    /// Bounds each request.
    timeout: Duration,
    agent: ureq::Agent,
    /// A peer of the cluster found through `/cluster` (not the URL the user gave): when it
    /// does not answer, it is down, not mistyped.
    peer: bool,
}

impl std::fmt::Debug for RestClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The API key is never printed.
        f.debug_struct("RestClient")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl RestClient {
    /// A client of `url` (`http://host:6333`); `timeout` bounds each request (a big snapshot's
    /// upload and recovery takes minutes). An API key over plain `http://` to another machine is
    /// refused unless `allow_insecure`, as for the gRPC client.
    pub fn new(
        url: &str,
        api_key: Option<String>,
        allow_insecure: bool,
        timeout: Duration,
    ) -> Result<Self, SnapshotError> {
        embedfleet_vectordb::check_url(url)?;
        let url = url.trim_end_matches('/').to_owned();
        let client = Self {
            agent: agent_for(&url, timeout),
            url,
            api_key,
            allow_insecure,
            timeout,
            peer: false,
        };
        client.check_key_goes_safely(&client.url)?;
        Ok(client)
    }

    /// Refuses `url` when this client's API key would travel to it in clear text (plain http to
    /// a host that is not this machine) without `allow_insecure`. Every URL the key goes to
    /// passes here: the one given and each peer's from `/cluster`.
    fn check_key_goes_safely(&self, url: &str) -> Result<(), SnapshotError> {
        if self.api_key.is_some()
            && !self.allow_insecure
            && embedfleet_vectordb::sends_in_clear(url)
        {
            return Err(embedfleet_vectordb::UploadError::InsecureApiKey {
                url: url.to_owned(),
            }
            .into());
        }
        Ok(())
    }

    /// The same client (and API key) for another peer of the cluster; refused as
    /// [`RestClient::new`] refuses a URL the key would reach in clear text.
    pub fn for_peer(&self, url: &str) -> Result<Self, SnapshotError> {
        embedfleet_vectordb::check_url(url)?;
        self.check_key_goes_safely(url)?;
        let url = url.trim_end_matches('/').to_owned();
        Ok(Self {
            agent: agent_for(&url, self.timeout),
            peer: url != self.url,
            url,
            ..self.clone()
        })
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The REST URL of a server from its gRPC one, by Qdrant's convention of the two ports side
    /// by side: the gRPC port minus one (6334 → 6333); a URL without a port is kept.
    pub fn url_from_grpc(grpc: &str) -> String {
        let trimmed = grpc.trim_end_matches('/');
        match trimmed.rsplit_once(':') {
            Some((head, port)) => match port.parse::<u16>() {
                Ok(p) if p > 1 && !head.ends_with('/') => format!("{head}:{}", p - 1),
                _ => trimmed.to_owned(),
            },
            None => trimmed.to_owned(),
        }
    }

    fn get(&self, path: &str, what: &str) -> Result<Value, SnapshotError> {
        let mut request = self.agent.get(format!("{}{path}", self.url));
        if let Some(key) = &self.api_key {
            request = request.header("api-key", key);
        }
        let response = request.call().map_err(|e| self.unreachable(what, e))?;
        self.json(response, what)
    }

    fn json(
        &self,
        mut response: ureq::http::Response<ureq::Body>,
        what: &str,
    ) -> Result<Value, SnapshotError> {
        let status = response.status().as_u16();
        let body = response
            .body_mut()
            .read_to_string()
            .map_err(|e| self.unreachable(what, e))?;
        if (300..400).contains(&status) {
            // No redirect is followed: a header such as `api-key` would go wherever it points.
            let to = response
                .headers()
                .get("location")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("?")
                .to_owned();
            return Err(SnapshotError::Http {
                what: what.to_owned(),
                status,
                body: format!(
                    "a redirect to {to}, not followed (the API key goes only where it was sent): give the server's own URL"
                ),
            });
        }
        if !(200..300).contains(&status) {
            return Err(SnapshotError::Http {
                what: what.to_owned(),
                status,
                body: body.chars().take(500).collect(),
            });
        }
        serde_json::from_str(&body).map_err(|e| SnapshotError::Http {
            what: what.to_owned(),
            status,
            body: format!(
                "not JSON ({e}): {}",
                body.chars().take(200).collect::<String>()
            ),
        })
    }

    fn unreachable(&self, what: &str, e: ureq::Error) -> SnapshotError {
        let (url, what, message) = (self.url.clone(), what.to_owned(), e.to_string());
        if self.peer {
            SnapshotError::PeerDown { url, what, message }
        } else {
            SnapshotError::Unreachable { url, what, message }
        }
    }

    /// The cluster's peers, sorted by id, each with a REST URL: this server's own for itself,
    /// and for the others their cluster address's host with the REST port at the same offset
    /// from their p2p port as this server's (6335 → 6333 on every host by default; peers on one
    /// machine have ports of their own, e.g. 6445 → 6443). The snapshot of a shard must reach a
    /// peer that holds it: uploaded elsewhere, the server adds that peer as one more replica.
    /// Refused ([`SnapshotError::NeedsCluster`]) when the server is not in cluster mode.
    pub fn peers(&self) -> Result<Vec<Peer>, SnapshotError> {
        let cluster = self.get("/cluster", "the cluster status")?;
        let result = &cluster["result"];
        if result["status"].as_str() != Some("enabled") {
            return Err(SnapshotError::NeedsCluster {
                message: format!("the server at {} is not in cluster mode", self.url),
            });
        }
        let own = result["peer_id"].as_u64();
        let port_of = |url: &str| -> Option<i64> {
            url.trim_end_matches('/').rsplit_once(':')?.1.parse().ok()
        };
        let host_and_port = |uri: &str| -> Option<(String, Option<i64>)> {
            let rest = uri.split("://").nth(1)?.trim_end_matches('/');
            Some(match rest.rsplit_once(':') {
                Some((h, p)) => (h.to_owned(), p.parse().ok()),
                None => (rest.to_owned(), None),
            })
        };
        let own_rest_port = port_of(&self.url);
        let own_p2p_port = own
            .and_then(|id| result["peers"][id.to_string()]["uri"].as_str())
            .and_then(host_and_port)
            .and_then(|(_, p)| p);
        let offset = own_rest_port.zip(own_p2p_port).map(|(r, p)| p - r);
        let mut peers: Vec<Peer> = result["peers"]
            .as_object()
            .into_iter()
            .flatten()
            .filter_map(|(id, info)| {
                let id: u64 = id.parse().ok()?;
                let rest_url = if Some(id) == own {
                    self.url.clone()
                } else {
                    let (host, p2p) = host_and_port(info["uri"].as_str()?)?;
                    let scheme = self.url.split("://").next().unwrap_or("http");
                    let port = match (p2p, offset) {
                        (Some(p), Some(o)) => Some(p - o),
                        _ => own_rest_port,
                    };
                    match port {
                        Some(p) => format!("{scheme}://{host}:{p}"),
                        None => format!("{scheme}://{host}"),
                    }
                };
                Some(Peer { id, rest_url })
            })
            .collect();
        peers.sort_by_key(|p| p.id);
        // The key goes to each peer too: a cluster whose peers talk plain http over the network
        // is refused here, before anything is built or created, not at the first recovery.
        for peer in &peers {
            self.check_key_goes_safely(&peer.rest_url)?;
        }
        if peers.is_empty() {
            return Err(SnapshotError::NeedsCluster {
                message: format!(
                    "the server at {} lists no peers in its cluster status",
                    self.url
                ),
            });
        }
        Ok(peers)
    }

    /// Exact count of the points under shard key `key`, as this peer answers it: from its own
    /// replica while that is readable.
    pub fn count_in_key(&self, collection: &str, key: &str) -> Result<u64, SnapshotError> {
        let what = format!("the count of shard key {key} of `{collection}`");
        let mut request = self
            .agent
            .post(format!(
                "{}/collections/{collection}/points/count",
                self.url
            ))
            .header("Content-Type", "application/json");
        if let Some(api_key) = &self.api_key {
            request = request.header("api-key", api_key);
        }
        let body = serde_json::json!({ "exact": true, "shard_key": key }).to_string();
        let response = request
            .send(body.as_bytes())
            .map_err(|e| self.unreachable(&what, e))?;
        let value = self.json(response, &what)?;
        value["result"]["count"]
            .as_u64()
            .ok_or_else(|| SnapshotError::Http {
                what,
                status: 200,
                body: value.to_string().chars().take(200).collect(),
            })
    }

    /// Uploads `snapshot` into shard `shard_id` of `collection` and waits until the server has
    /// recovered it. The server checks `sha256` before it touches the shard.
    pub fn recover_shard(
        &self,
        collection: &str,
        shard_id: u32,
        snapshot: &Path,
        sha256: &str,
    ) -> Result<(), SnapshotError> {
        let what = format!("the snapshot of shard {shard_id} of `{collection}`");
        let file = File::open(snapshot).map_err(super::io_err("read", snapshot))?;
        let boundary = format!("embedfleet-{sha256}");
        let head = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"snapshot\"; filename=\"shard.snapshot\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        );
        let tail = format!("\r\n--{boundary}--\r\n");
        let body = Cursor::new(head.into_bytes())
            .chain(file)
            .chain(Cursor::new(tail.into_bytes()));
        let url = format!(
            "{}/collections/{collection}/shards/{shard_id}/snapshots/upload?priority=snapshot&wait=true&checksum={sha256}",
            self.url
        );
        let mut request = self.agent.post(url).header(
            "Content-Type",
            format!("multipart/form-data; boundary={boundary}"),
        );
        if let Some(key) = &self.api_key {
            request = request.header("api-key", key);
        }
        let response = request
            .send(ureq::SendBody::from_owned_reader(body))
            .map_err(|e| self.unreachable(&what, e))?;
        self.json(response, &what).map(drop)
    }
}

/// The HTTP agent for `url`: `timeout` per request, no redirect followed, and no proxy to this
/// machine. To another machine the environment's proxy (`HTTPS_PROXY`, `ALL_PROXY`, ...) is
/// used as everywhere else, and said once.
fn agent_for(url: &str, timeout: Duration) -> ureq::Agent {
    let this_machine = url
        .parse::<ureq::http::Uri>()
        .is_ok_and(|uri| embedfleet_vectordb::is_this_machine(&uri));
    let proxy = if this_machine {
        None
    } else {
        ureq::Proxy::try_from_env()
    };
    if let Some(proxy) = &proxy {
        eprintln!(
            "note: REST requests to {url} go through the proxy {}:{} (from the environment; NO_PROXY lists hosts that do not)",
            proxy.host(),
            proxy.port()
        );
    }
    ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        .max_redirects(0)
        .proxy(proxy)
        .build()
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_api_key_in_clear_text_to_another_machine_is_refused_unless_allowed() {
        let key = || Some("secret".to_owned());
        let t = Duration::from_secs(1);
        let err = RestClient::new("http://q1:6333", key(), false, t).unwrap_err();
        assert!(err.to_string().contains("http://q1:6333"), "{err}");
        RestClient::new("http://q1:6333", key(), true, t).unwrap();
        RestClient::new("https://q1:6333", key(), false, t).unwrap();
        RestClient::new("http://127.0.0.1:6333", key(), false, t).unwrap();
        RestClient::new("http://q1:6333", None, false, t).unwrap();
    }

    #[test]
    fn the_rest_url_of_the_default_grpc_port_is_the_default_http_port() {
        assert_eq!(
            RestClient::url_from_grpc("http://q1:6334/"),
            "http://q1:6333"
        );
        assert_eq!(
            RestClient::url_from_grpc("http://127.0.0.1:7334"),
            "http://127.0.0.1:7333"
        );
        assert_eq!(
            RestClient::url_from_grpc("https://q.example"),
            "https://q.example"
        );
    }

    /// A one-shot HTTP server on loopback answering every request with `body` (JSON, 200).
    fn answering(body: &'static str) -> String {
        recording(ok_json(body)).0
    }

    /// A whole `200 OK` response carrying the JSON `body`.
    fn ok_json(body: &str) -> String {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    }

    #[test]
    fn a_server_not_in_cluster_mode_is_refused_with_what_to_do() {
        let url = answering(r#"{"result":{"status":"disabled"},"status":"ok","time":0.0}"#);
        let err = RestClient::new(&url, None, false, Duration::from_secs(5))
            .unwrap()
            .peers()
            .unwrap_err();
        assert!(err.is_refusal(), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("not in cluster mode") && text.contains("--mode upsert"),
            "{text}"
        );
    }

    #[test]
    fn the_peers_of_a_cluster_get_the_rest_port_of_the_server_asked() {
        let url = answering(
            r#"{"result":{"status":"enabled","peer_id":7,"peers":{"9":{"uri":"http://q2.cluster:6335/"},"7":{"uri":"http://q1.cluster:6335/"}}}}"#,
        );
        let peers = RestClient::new(&url, None, false, Duration::from_secs(5))
            .unwrap()
            .peers()
            .unwrap();
        let port = url.rsplit_once(':').unwrap().1;
        assert_eq!(
            peers,
            [
                Peer {
                    id: 7,
                    rest_url: url.clone()
                },
                Peer {
                    id: 9,
                    rest_url: format!("http://q2.cluster:{port}")
                }
            ]
        );
    }

    #[test]
    fn peers_on_one_machine_get_their_own_rest_ports() {
        // Three peers on loopback: p2p 6435/6445/6455, REST two below each.
        let url = answering(
            r#"{"result":{"status":"enabled","peer_id":1,"peers":{"1":{"uri":"http://127.0.0.1:6435/"},"2":{"uri":"http://127.0.0.1:6445/"},"3":{"uri":"http://127.0.0.1:6455/"}}}}"#,
        );
        let port: i64 = url.rsplit_once(':').unwrap().1.parse().unwrap();
        let peers = RestClient::new(&url, None, false, Duration::from_secs(5))
            .unwrap()
            .peers()
            .unwrap();
        let urls: Vec<String> = peers.iter().map(|p| p.rest_url.clone()).collect();
        let offset = 6435 - port;
        assert_eq!(
            urls,
            [
                url.clone(),
                format!("http://127.0.0.1:{}", 6445 - offset),
                format!("http://127.0.0.1:{}", 6455 - offset)
            ]
        );
    }

    #[test]
    fn the_api_key_is_not_sent_to_a_peer_over_plain_http_to_another_machine() {
        let cluster = r#"{"result":{"status":"enabled","peer_id":7,"peers":{"9":{"uri":"http://q2.cluster:6335/"},"7":{"uri":"http://q1.cluster:6335/"}}}}"#;
        let key = || Some("secret".to_owned());
        let t = Duration::from_secs(5);
        let url = answering(cluster);
        let err = RestClient::new(&url, key(), false, t)
            .unwrap()
            .peers()
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("http://q2.cluster:") && text.contains("--allow-insecure"),
            "{text}"
        );
        let url = answering(cluster);
        let client = RestClient::new(&url, key(), true, t).unwrap();
        assert_eq!(
            client.peers().unwrap().len(),
            2,
            "allowed: the operator said so"
        );
        let client = RestClient::new(&url, key(), false, t).unwrap();
        assert!(client.for_peer("http://q2.cluster:6333").is_err());
        assert!(client.for_peer("https://q2.cluster:6333").is_ok());
        let err =
            RestClient::new("http://127.0.0.1.example.org:6333", key(), false, t).unwrap_err();
        assert!(err.to_string().contains("127.0.0.1.example.org"), "{err}");
    }

    #[test]
    fn an_unreachable_server_names_the_url_and_the_port_to_check() {
        let client =
            RestClient::new("http://127.0.0.1:9", None, false, Duration::from_secs(2)).unwrap();
        let err = client.peers().unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("127.0.0.1:9") && text.contains("--qdrant-rest"),
            "{text}"
        );
        // Another peer of the cluster that does not answer is down, not mistyped: said so, and
        // what to do.
        let peer = client.for_peer("http://127.0.0.2:9").unwrap();
        let text = peer.peers().unwrap_err().to_string();
        assert!(
            text.contains("the cluster's peer at http://127.0.0.2:9 does not answer")
                && text.contains("start it again")
                && !text.contains("--qdrant-rest"),
            "{text}"
        );
        let same = client.for_peer("http://127.0.0.1:9/").unwrap();
        assert!(same
            .peers()
            .unwrap_err()
            .to_string()
            .contains("--qdrant-rest"));
    }

    /// A loopback HTTP server that answers every request with `reply` (a whole response) and
    /// keeps each request's head, lowercased.
    fn recording(reply: String) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
        use std::io::{BufRead, BufReader, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let heads = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().take(8) {
                let mut stream = stream.unwrap();
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let (mut head, mut line) = (String::new(), String::new());
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    head.push_str(&line.to_lowercase());
                    line.clear();
                }
                heads.lock().unwrap().push(head);
                let _ = stream.write_all(reply.as_bytes());
            }
        });
        (url, seen)
    }

    #[test]
    fn a_redirect_is_not_followed_so_the_key_goes_nowhere_else() {
        let (elsewhere, reached) = recording(String::new());
        let (url, asked) = recording(format!(
            "HTTP/1.1 302 Found\r\nLocation: {elsewhere}/cluster\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        ));
        let client =
            RestClient::new(&url, Some("secret".into()), false, Duration::from_secs(5)).unwrap();
        let err = client.peers().unwrap_err().to_string();
        assert!(
            err.contains("redirect") && err.contains(&elsewhere),
            "{err}"
        );
        assert!(asked.lock().unwrap()[0].contains("api-key: secret"));
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            reached.lock().unwrap().is_empty(),
            "the redirect was followed"
        );
    }

    #[test]
    fn a_loopback_server_is_reached_directly_whatever_the_proxy_settings() {
        let (proxy, proxied) = recording(String::new());
        for var in ["HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "ALL_PROXY"] {
            // This test's process only (nextest runs each test in a process of its own).
            std::env::set_var(var, &proxy);
        }
        let body = r#"{"result":{"status":"disabled"},"status":"ok","time":0.0}"#;
        let (url, asked) = recording(ok_json(body));
        let client =
            RestClient::new(&url, Some("secret".into()), false, Duration::from_secs(5)).unwrap();
        let err = client.peers().unwrap_err();
        assert!(err.is_refusal(), "the server itself answered: {err}");
        assert_eq!(asked.lock().unwrap().len(), 1);
        assert!(proxied.lock().unwrap().is_empty(), "went through the proxy");
    }
}
