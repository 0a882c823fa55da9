//! A PostgreSQL team's first mistakes (issue 60, items 7-9): a `--postgres` port that answers
//! something else, a password typed into the URL, a password that is nowhere, a table that
//! does not exist. Each is said in words that name what is wrong, within seconds, and no
//! secret is printed. The port tests need no PostgreSQL (a listener of the test's own on
//! 127.0.0.1); the login tests use CI's server (`EMBEDFLEET_PG_URL`).

use crate::util::TestDir;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::{Duration, Instant};

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A listener on 127.0.0.1 that takes connections and reads them; when `answer` is given it
/// writes that back and hangs up as an HTTP server does (its side closed, then what the client
/// still sends read to the end: a close with unread bytes would be a reset, which races the
/// client's read of the answer), else it never answers (a tarpit).
fn listener(answer: Option<&'static [u8]>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 512];
                let _ = stream.read(&mut buf);
                match answer {
                    Some(bytes) => {
                        let _ = stream.write_all(bytes);
                        let _ = stream.shutdown(std::net::Shutdown::Write);
                        let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
                        while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
                    }
                    // Held open, unanswered, until the test process ends.
                    None => std::thread::sleep(Duration::from_secs(3600)),
                }
            });
        }
    });
    port
}

#[test]
fn a_postgres_port_that_answers_something_else_is_said_within_the_deadline() {
    let t = TestDir::new();
    t.small_run("run", 20, 20, &[]);
    // An HTTP server: it answers the startup packet with its own protocol and hangs up.
    let http = listener(Some(
        b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
    ));
    let url = format!("postgresql://me@127.0.0.1:{http}/db");
    let started = Instant::now();
    let out = t
        .cmd(&["upload", "--run-dir", "run", "--postgres", &url])
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no PostgreSQL at") && err.contains("not as PostgreSQL"),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(20), "{err}");
    // A port that accepts and never answers: the default deadline (10 s), and a URL's own
    // `connect_timeout` (libpq's) when it gives one.
    let silent = listener(None);
    for (url, within) in [
        (format!("postgresql://me@127.0.0.1:{silent}/db"), 25),
        (
            format!("postgresql://me@127.0.0.1:{silent}/db?connect_timeout=2"),
            10,
        ),
    ] {
        let started = Instant::now();
        let out = t
            .cmd(&["upload", "--run-dir", "run", "--postgres", &url])
            .output()
            .unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains("nothing answered as PostgreSQL within"),
            "{err}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(within),
            "{url}: {:?}",
            started.elapsed()
        );
    }
}

#[test]
fn a_password_in_the_url_is_refused_without_being_printed_or_kept() {
    let t = TestDir::new();
    t.small_run("run", 20, 20, &[]);
    let secret = "hunter2-Zq9";
    for url in [
        format!("postgresql://me:{secret}@127.0.0.1:1/db"),
        format!("postgresql://me@127.0.0.1:1/db?sslmode=prefer&password={secret}"),
    ] {
        for command in ["upload", "query"] {
            let mut args = vec![command, "--run-dir", "run", "--postgres", &url];
            if command == "query" {
                args.push("protein folding");
            }
            let out = t.cmd(&args).output().unwrap();
            let err = stderr(&out);
            assert_ne!(out.status.code(), Some(0), "{err}");
            assert!(err.contains("pgpass"), "{err}");
            assert!(!err.contains(secret), "the password is printed: {err}");
            assert!(err.contains("***"), "{err}");
        }
    }
    // Nothing of the run keeps it either: run.db, its history, the status it writes.
    let status = t.run(&["status", "--run-dir", "run"], 0);
    assert!(!String::from_utf8_lossy(&status.stdout).contains(secret));
    for (path, bytes) in crate::util::tree(&t.join("run")) {
        if let Some(bytes) = bytes {
            let text = String::from_utf8_lossy(&bytes);
            assert!(!text.contains(secret), "{} keeps it", path.display());
        }
    }
}

/// The server is up: a missing password is said as one (where it was looked for), not as a dead
/// server; a table that does not exist suggests the upload to the same database.
#[test]
fn a_missing_password_and_a_wrong_table_name_are_said_as_such() {
    let Some(url) = crate::pgvector::pg_url("pg_first_day_login") else {
        return;
    };
    let t = TestDir::new();
    t.small_run("run", 20, 20, &[]);
    let empty = t.join("empty.pgpass");
    std::fs::write(&empty, "# no line here\n").unwrap();
    std::fs::set_permissions(&empty, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let out = t
        .cmd(&["upload", "--run-dir", "run", "--postgres", &url])
        .env("PGPASSFILE", &empty)
        .env_remove("PGPASSWORD")
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("asks for a password and none was found")
            && err.contains(&empty.display().to_string()),
        "{err}"
    );
    assert!(!err.contains("no PostgreSQL server answers"), "{err}");
    assert!(!err.contains("Start it"), "{err}");

    // A table of that name does not exist: the upload that makes it, to the same database.
    let table = format!("e2e_nosuch_{}", std::process::id());
    let out = t
        .cmd(&[
            "query",
            "--run-dir",
            "run",
            "--postgres",
            &url,
            "--collection",
            &table,
            "protein folding",
        ])
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(4), "{err}");
    let without_password = url
        .split('?')
        .next()
        .unwrap()
        .replace("postgres://", "postgresql://");
    let upload = format!("embedfleet upload --run-dir run --postgres {without_password}");
    assert!(
        err.contains(&upload) && err.contains(&format!("--collection {table}")),
        "expected `{upload} --collection {table}` in: {err}"
    );
}
