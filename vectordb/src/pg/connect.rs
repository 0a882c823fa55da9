//! Reaching a PostgreSQL server as libpq would from the same URL: the password from
//! `PGPASSWORD` or a pgpass file (never from the URL, so it is never on a command line or in a
//! log), `sslmode` and root certificates (`tls.rs`), and a pool of sessions, one per request in
//! flight.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use postgres::config::Host;
use postgres::{Client, NoTls, Statement};

use super::config::PgConfig;
use super::table::Storage;
use super::tls::{self, SslMode};
use crate::error::{UploadError, UploadResult};

/// How to open a session: the client's config (password included), and its TLS.
pub(super) struct Connector {
    config: postgres::Config,
    tls: Option<tokio_postgres_rustls::MakeRustlsConnect>,
    /// `postgres://user@host:port/db`: what run.db keys progress by, never with a password.
    pub(super) target: String,
    /// Where the password came from, or where none was found: what a refused login names.
    password_source: String,
    /// The deadline of a whole connection: TCP, TLS and the startup exchange (libpq's
    /// `connect_timeout`, else [`CONNECT_TIMEOUT`]).
    deadline: Duration,
}

/// How long a connection may take when the URL gives no `connect_timeout`: a port that
/// accepts but never answers as PostgreSQL (an HTTP server, a firewall's tarpit) is said as
/// such instead of waited on forever.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

impl std::fmt::Debug for Connector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connector")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

fn bad_url(url: &str, reason: impl Into<String>) -> UploadError {
    UploadError::PgUrl {
        // A password typed into the URL is what this refuses: never said back.
        url: embedfleet_core::secret::redact(url),
        reason: reason.into(),
    }
}

/// Splits `url`'s query into what tokio-postgres reads and what libpq reads that it does not
/// (`sslmode` beyond `require`, `sslrootcert`).
fn split_query(url: &str) -> UploadResult<(String, Vec<(String, String)>)> {
    if !(url.starts_with("postgresql://") || url.starts_with("postgres://")) {
        return Err(bad_url(
            url,
            "expected postgresql://user@host:port/database",
        ));
    }
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), Vec::new()));
    };
    let mut kept = Vec::new();
    let mut ours = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        match k {
            "sslmode" | "sslrootcert" => ours.push((k.to_owned(), v.to_owned())),
            "password" => {
                return Err(bad_url(url, "it holds a password, which would show on the command line and in logs: put it in a pgpass file (PGPASSFILE, mode 0600) or PGPASSWORD"))
            }
            "sslcert" | "sslkey" => {
                return Err(bad_url(url, "client certificates (sslcert, sslkey) are not supported: log in with a password from a pgpass file"))
            }
            _ => kept.push(pair),
        }
    }
    let base = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((base, ours))
}

impl Connector {
    /// Parses `config.url` and finds the password and TLS settings libpq would use.
    pub(super) fn new(config: &PgConfig) -> UploadResult<Self> {
        let url = config.url.as_str();
        let (base, ours) = split_query(url)?;
        let mut pg: postgres::Config = base
            .parse()
            .map_err(|e: postgres::Error| bad_url(url, e.to_string()))?;
        if pg.get_password().is_some() {
            return Err(bad_url(url, "it holds a password, which would show on the command line and in logs: put it in a pgpass file (PGPASSFILE, mode 0600) or PGPASSWORD"));
        }
        if pg.get_user().is_none() {
            // libpq's default: PGUSER, else the operating system's user name.
            match std::env::var("PGUSER").or_else(|_| std::env::var("USER")) {
                Ok(user) => drop(pg.user(&user)),
                Err(_) => {
                    return Err(bad_url(
                        url,
                        "no user: give it as postgresql://USER@host/db",
                    ))
                }
            }
        }
        if pg.get_hosts().is_empty() {
            return Err(bad_url(
                url,
                "no host: give it as postgresql://user@HOST:port/db",
            ));
        }
        if pg.get_connect_timeout().is_none() {
            pg.connect_timeout(CONNECT_TIMEOUT);
        }
        let deadline = pg
            .get_connect_timeout()
            .copied()
            .filter(|t| !t.is_zero())
            .unwrap_or(CONNECT_TIMEOUT);
        let user = pg.get_user().unwrap_or_default().to_owned();
        let host = host_name(&pg);
        let port = pg.get_ports().first().copied().unwrap_or(5432);
        let dbname = pg.get_dbname().unwrap_or(&user).to_owned();
        let (password, password_source) = password_for(&host, port, &dbname, &user)?;
        if let Some(password) = password {
            pg.password(password);
        }
        let get = |k: &str| {
            ours.iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
        };
        let mode = match get("sslmode").or_else(|| std::env::var("PGSSLMODE").ok()) {
            Some(m) => SslMode::parse(&m).ok_or_else(|| {
                bad_url(url, format!("sslmode `{m}`: use disable, allow, prefer, require, verify-ca or verify-full"))
            })?,
            None => SslMode::Prefer,
        };
        let root = get("sslrootcert").or_else(|| std::env::var("PGSSLROOTCERT").ok());
        let tls = tls::client_config(mode, root.as_deref(), url)?;
        pg.ssl_mode(mode.client_mode());
        pg.notice_callback(say_notice);
        let target = format!("postgres://{user}@{host}:{port}/{dbname}");
        Ok(Self {
            config: pg,
            tls: tls.map(tokio_postgres_rustls::MakeRustlsConnect::new),
            target,
            password_source,
            deadline,
        })
    }

    /// True when the server is on this machine (a loopback address, `localhost`, a socket).
    pub(super) fn is_local(&self) -> bool {
        self.config.get_hosts().iter().all(|h| match h {
            Host::Tcp(name) => {
                name == "localhost"
                    || name
                        .parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| ip.is_loopback())
            }
            Host::Unix(_) => true,
        })
    }

    /// A new session, or why none: the whole exchange (TCP, TLS, startup, login) within the
    /// deadline. The client's own `connect_timeout` covers only the TCP connect: a port that
    /// accepts and then answers nothing would hold it forever. The connect runs on a thread of
    /// its own, left behind (with its socket) when the deadline passes first.
    pub(super) fn connect(&self) -> UploadResult<Client> {
        let (config, tls) = (self.config.clone(), self.tls.clone());
        let (send, receive) = std::sync::mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("pg-connect".into())
            .spawn(move || {
                let result = match tls {
                    Some(tls) => config.connect(tls),
                    None => config.connect(NoTls),
                };
                let _ = send.send(result);
            })
            .map_err(|source| UploadError::Postgres {
                action: "connect",
                message: format!("{}: no thread to connect on: {source}", self.target),
            })?;
        match receive.recv_timeout(self.deadline) {
            Ok(result) => result.map_err(|e| connect_error(self, &e)),
            Err(_) => Err(UploadError::PgNotPostgres {
                target: self.target.clone(),
                message: format!(
                    "nothing answered as PostgreSQL within {} s (connect_timeout): the port accepted the connection but the startup exchange got no answer, so something else listens there (a web server, a proxy), or the server hangs",
                    self.deadline.as_secs_f64()
                ),
            }),
        }
    }
}

/// The host as pgpass names it: a socket directory is `localhost`.
fn host_name(pg: &postgres::Config) -> String {
    match pg.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        _ => "localhost".to_owned(),
    }
}

/// What the server says beyond results: pgvector's note that an index build no longer fits
/// `maintenance_work_mem` is one the user must see; the rest is for the log.
fn say_notice(notice: postgres::error::DbError) {
    let text = notice.message();
    if text.contains("maintenance_work_mem") || notice.severity() == "WARNING" {
        let detail = notice
            .detail()
            .map(|d| format!(" ({d})"))
            .unwrap_or_default();
        let hint = notice.hint().map(|h| format!("; {h}")).unwrap_or_default();
        eprintln!("note: PostgreSQL says: {text}{detail}{hint}");
    } else {
        tracing::debug!("PostgreSQL notice: {text}");
    }
}

/// A failed connection said by what is wrong: the host and port (nothing listens, or not
/// PostgreSQL), TLS, the password and where it came from, or the database.
fn connect_error(connector: &Connector, e: &postgres::Error) -> UploadError {
    let target = connector.target.as_str();
    if let Some(db) = e.as_db_error() {
        let hint = match db.code().code() {
            "28P01" | "28000" => format!(
                "; the password sent came from {}: check it for this host, port, database and user",
                connector.password_source
            ),
            "3D000" => "; create the database, or name another in the URL".to_owned(),
            _ => String::new(),
        };
        return UploadError::Postgres {
            action: "log in",
            message: format!("{target}: {}{hint}", db.message()),
        };
    }
    // The client's error, then what caused it (a TLS handshake's error says why there).
    let message = embedfleet_core::cause::chain_line(e);
    if message.contains("password missing") {
        // The server asked for a password and the client had none to send: the server is up.
        return UploadError::Postgres {
            action: "log in",
            message: format!(
                "{target} asks for a password and none was found: {}. Put a line `host:port:database:user:password` in the pgpass file (mode 0600), or set PGPASSWORD",
                connector.password_source
            ),
        };
    }
    if not_postgres(&message) {
        return UploadError::PgNotPostgres {
            target: target.to_owned(),
            message: format!("the port answered, but not as PostgreSQL ({message})"),
        };
    }
    if message.contains("TLS") || message.contains("certificate") {
        return UploadError::PgUrl {
            url: target.to_owned(),
            reason: format!("the TLS handshake failed ({message}): check sslmode and sslrootcert (verify-full checks the host name against the server's certificate)"),
        };
    }
    UploadError::PgUnreachable {
        target: target.to_owned(),
        message,
    }
}

/// What a client gets when the port holds another protocol's server: it answered, but its
/// bytes are no PostgreSQL message, or it hung up on the startup packet.
fn not_postgres(message: &str) -> bool {
    [
        "unexpected message",
        "invalid message",
        "error parsing",
        "unexpected EOF",
        "early eof",
        "bytes remaining on stream",
        "unexpected response",
        "connection closed",
    ]
    .iter()
    .any(|m| message.contains(m))
}

/// The password libpq would send: `PGPASSWORD`, else the first matching line of the pgpass
/// file (`PGPASSFILE`, else `~/.pgpass`), with where it came from (or where none was found:
/// what a refused login says). A pgpass file others can read is refused (libpq ignores it
/// with a warning; a refusal says what to fix).
fn password_for(
    host: &str,
    port: u16,
    db: &str,
    user: &str,
) -> UploadResult<(Option<String>, String)> {
    if let Ok(p) = std::env::var("PGPASSWORD") {
        return Ok((Some(p), "PGPASSWORD".to_owned()));
    }
    let wanted = format!("{host}:{port}:{db}:{user}");
    let path = match std::env::var_os("PGPASSFILE") {
        Some(p) => PathBuf::from(p),
        None => match std::env::var_os("HOME") {
            Some(home) => Path::new(&home).join(".pgpass"),
            None => {
                return Ok((
                    None,
                    "no PGPASSWORD, no PGPASSFILE, and no HOME for ~/.pgpass".to_owned(),
                ))
            }
        },
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok((
                None,
                format!("no PGPASSWORD, and no pgpass file at {}", path.display()),
            ))
        }
        Err(source) => {
            return Err(UploadError::Io {
                action: "read the pgpass file",
                path,
                cause: source,
            })
        }
    };
    check_private(&path)?;
    Ok(
        match pgpass_lookup(&text, host, &port.to_string(), db, user) {
            Some(password) => (
                Some(password),
                format!("the pgpass file {} (its line for {wanted})", path.display()),
            ),
            None => (
                None,
                format!(
                    "no PGPASSWORD, and no line for {wanted} in the pgpass file {}",
                    path.display()
                ),
            ),
        },
    )
}

fn check_private(path: &Path) -> UploadResult<()> {
    use std::os::unix::fs::MetadataExt;
    let mode = std::fs::metadata(path)
        .map(|m| m.mode() & 0o777)
        .unwrap_or(0);
    if mode & 0o077 != 0 {
        return Err(UploadError::PgPassfileOpen {
            path: path.to_owned(),
            mode,
        });
    }
    Ok(())
}

/// The password of the first pgpass line matching (`*` matches anything; `\:` and `\\` are a
/// colon and a backslash), as libpq reads it.
pub(super) fn pgpass_lookup(
    text: &str,
    host: &str,
    port: &str,
    db: &str,
    user: &str,
) -> Option<String> {
    let wanted = [host, port, db, user];
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty())
        .find_map(|line| {
            let fields = pgpass_fields(line);
            if fields.len() < 5 {
                return None;
            }
            let matches = fields.iter().zip(wanted).all(|(f, w)| f == "*" || f == w);
            matches.then(|| fields[4..].join(":"))
        })
}

fn pgpass_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(next) = chars.next() {
                    fields.last_mut().expect("one field at least").push(next);
                }
            }
            ':' => fields.push(String::new()),
            c => fields.last_mut().expect("one field at least").push(c),
        }
    }
    fields
}

/// One session and what it prepared: statements by their text, its temporary staging tables.
pub(super) struct Session {
    pub(super) client: Client,
    statements: HashMap<String, Statement>,
    /// The column types of the session's staging table for each storage (`load.rs`).
    pub(super) staged: HashMap<Storage, Vec<postgres::types::Type>>,
}

impl Session {
    /// The prepared statement of `sql`, prepared once per session.
    pub(super) fn statement(&mut self, sql: &str) -> Result<Statement, postgres::Error> {
        if let Some(s) = self.statements.get(sql) {
            return Ok(s.clone());
        }
        let s = self.client.prepare(sql)?;
        self.statements.insert(sql.to_owned(), s.clone());
        Ok(s)
    }

    /// Forgets the statements prepared for `collection` (it was dropped).
    pub(super) fn forget(&mut self, collection: &str) {
        let table = super::sql::quoted(collection);
        self.statements.retain(|sql, _| !sql.contains(&table));
    }
}

/// Idle sessions, reused; a request takes one (or opens one) and gives it back unless it broke.
pub(super) struct Pool {
    pub(super) connector: Connector,
    idle: Mutex<Vec<Session>>,
}

/// A session taken from the pool; back into it when dropped, unless its connection is gone.
pub(super) struct Lease<'a> {
    pool: &'a Pool,
    session: Option<Session>,
}

impl std::ops::Deref for Lease<'_> {
    type Target = Session;
    fn deref(&self) -> &Session {
        self.session
            .as_ref()
            .expect("a lease holds its session. This is a bug.")
    }
}

impl std::ops::DerefMut for Lease<'_> {
    fn deref_mut(&mut self) -> &mut Session {
        self.session
            .as_mut()
            .expect("a lease holds its session. This is a bug.")
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            if !session.client.is_closed() {
                lock(&self.pool.idle).push(session);
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Pool {
    pub(super) fn new(connector: Connector) -> Self {
        Self {
            connector,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// An idle session, or a new one.
    pub(super) fn get(&self) -> UploadResult<Lease<'_>> {
        let idle = lock(&self.idle).pop();
        let session = match idle {
            Some(s) => s,
            None => {
                let mut client = self.connector.connect()?;
                // What is acknowledged must survive a server crash, whatever the server's
                // default (an upsert batch alone waits for its WAL at the next checkpoint).
                client
                    .batch_execute("SET synchronous_commit = on")
                    .map_err(super::sql::pg_err("start a session"))?;
                Session {
                    client,
                    statements: HashMap::new(),
                    staged: HashMap::new(),
                }
            }
        };
        Ok(Lease {
            pool: self,
            session: Some(session),
        })
    }

    /// Runs `f` on every idle session (a dropped table's statements forgotten).
    pub(super) fn for_each_idle(&self, f: impl Fn(&mut Session)) {
        lock(&self.idle).iter_mut().for_each(f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pgpass_takes_the_first_matching_line_with_wildcards_and_escapes() {
        let text = "# comment\n\
                    other:5432:*:me:nope\n\
                    db.example:*:papers:me:p\\:w\\\\d\n\
                    *:*:*:me:fallback\n";
        assert_eq!(
            pgpass_lookup(text, "db.example", "5432", "papers", "me").as_deref(),
            Some("p:w\\d")
        );
        assert_eq!(
            pgpass_lookup(text, "db.example", "5432", "other", "me").as_deref(),
            Some("fallback")
        );
        assert_eq!(pgpass_lookup(text, "h", "1", "d", "you"), None);
    }

    #[test]
    fn a_password_in_the_url_is_refused_and_libpq_only_parameters_are_taken_out() {
        let refused = |url: &str| {
            let config = PgConfig::new(url);
            match Connector::new(&config) {
                Err(UploadError::PgUrl { reason, .. }) => reason,
                other => panic!("{url}: expected a refusal, got {other:?}"),
            }
        };
        assert!(refused("postgresql://me:secret@h/db").contains("pgpass"));
        assert!(refused("postgresql://me@h/db?password=secret").contains("pgpass"));
        assert!(refused("mysql://me@h/db").contains("postgresql://"));
        assert!(refused("postgresql://me@h/db?sslmode=sometimes").contains("verify-full"));
        let (base, ours) = split_query(
            "postgresql://me@h/db?sslmode=verify-full&application_name=x&sslrootcert=/r.pem",
        )
        .unwrap();
        assert_eq!(base, "postgresql://me@h/db?application_name=x");
        assert_eq!(ours.len(), 2);
    }
}
