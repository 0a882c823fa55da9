//! `submit --metrics-listen ADDR`: the owner's metrics over HTTP for a direct scrape. One thread,
//! one request at a time, plain `std::net`: a scrape every 15 s needs no more. A bare port
//! listens on loopback only; another address only when the user names it.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::metrics;

/// The metrics text of the latest poll and the status's time, shared with the server thread.
#[derive(Debug, Clone, Default)]
pub struct SharedMetrics(Arc<Mutex<(String, f64)>>);

impl SharedMetrics {
    pub fn set(&self, body: String, status_unix_s: f64) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = (body, status_unix_s);
        }
    }

    /// The text a scrape gets now (the status's age as of now).
    pub fn text(&self) -> String {
        let (body, at) = self.0.lock().map(|s| s.clone()).unwrap_or_default();
        format!(
            "{body}{}",
            metrics::age(at, embedfleet_core::owner::unix_now())
        )
    }
}

/// `PORT` (loopback) or `ADDRESS:PORT`, for clap.
pub fn parse_listen(text: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = text.parse::<u16>() {
        return Ok(SocketAddr::from((Ipv4Addr::LOCALHOST, port)));
    }
    text.parse().map_err(|_| {
        format!("`{text}` is not a port or an address with a port (127.0.0.1:9464, [::1]:9464)")
    })
}

/// Listens on `addr` and serves `metrics` from a thread of its own for the life of the process;
/// returns the address bound (the port the system chose for port 0).
pub fn serve(addr: SocketAddr, metrics: SharedMetrics) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)?;
    let bound = listener.local_addr()?;
    std::thread::Builder::new()
        .name("metrics-listen".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                // A client that breaks off costs its request only.
                let _ = answer(stream, &metrics);
            }
        })?;
    Ok(bound)
}

fn answer(mut stream: TcpStream, metrics: &SharedMetrics) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut request = Vec::new();
    let mut buf = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 16 * 1024 {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        request.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&request);
    let path = line.split_whitespace().nth(1).unwrap_or("");
    let (status, body) = if path == "/metrics" || path == "/" {
        ("200 OK", metrics.text())
    } else {
        ("404 Not Found", "only /metrics is served\n".to_string())
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_port_is_loopback_and_a_scrape_gets_the_text() {
        assert_eq!(
            parse_listen("9464").unwrap(),
            "127.0.0.1:9464".parse().unwrap()
        );
        assert_eq!(
            parse_listen("0.0.0.0:9464").unwrap(),
            "0.0.0.0:9464".parse().unwrap()
        );
        assert!(parse_listen("host:x").is_err());
        let shared = SharedMetrics::default();
        shared.set("embedfleet_papers_planned 3\n".into(), 1.0);
        let addr = serve(parse_listen("0").unwrap(), shared).unwrap();
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        assert!(reply.starts_with("HTTP/1.1 200 OK"), "{reply}");
        assert!(reply.contains("embedfleet_papers_planned 3\n"), "{reply}");
        assert!(
            reply.contains("embedfleet_status_snapshot_age_seconds "),
            "{reply}"
        );
    }
}
