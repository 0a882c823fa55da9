//! The errors of the upload layer: a sink's ([`UploadError`]) and an upload run's
//! ([`UploadRunError`], a sink's among others).
//!
//! Every variant says what went wrong and what to do about it. Transient server errors are
//! retried inside the sinks; what reaches the caller is either permanent or retries exhausted.

use std::path::PathBuf;

use embedfleet_core::rundb::RunDbError;

use crate::shards::ShardReadError;

/// Result of the upload layer.
pub type UploadResult<T> = Result<T, UploadError>;

/// Errors of the sinks (Qdrant's, PostgreSQL's) and of the Arrow → point conversion.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    /// A required column is missing from the shard's record batch.
    #[error("shard has no column `{column}`; re-run the embed job that wrote it (expected columns: id, embedding, n_chars, n_tokens)")]
    MissingColumn {
        /// The column name.
        column: &'static str,
    },

    /// A column has a type the uploader does not read.
    #[error("shard column `{column}` has type {found}, expected {expected}")]
    ColumnType {
        /// The column name.
        column: &'static str,
        /// What the uploader reads.
        expected: &'static str,
        /// What the shard has.
        found: String,
    },

    /// The target cannot do this (shard keys on the embedded engine).
    #[error("{what} are a Qdrant server's feature; the embedded engine has one shard per collection: upload into a server (--qdrant URL)")]
    Unsupported {
        /// What was asked for.
        what: String,
    },

    /// A shard key of the collection belongs to another run: writing or loading into it would
    /// replace or mix that run's points.
    #[error("shard key `{}` of `{}` belongs to another run ({}, run {}), not this one (run {}); load into another collection, or pass --replace-keys to take that run's keys over (its points in them are replaced)", .0.key, .0.collection, .0.owner_dir, .0.owner_run, .0.run)]
    KeyOfAnotherRun(Box<KeyConflict>),

    /// The collection holds vectors another run made with another model, precision or
    /// pooling (its identity marker says which): they cannot be compared with this run's.
    #[error("collection `{collection}` holds vectors made with {theirs}, and this run's are made with {ours}: vectors made differently are not comparable and never share a collection; upload into another collection (--collection NAME), or delete that one first")]
    OtherVectors {
        collection: String,
        theirs: String,
        ours: String,
    },

    /// A value that every point needs (paper id, embedding) is null.
    #[error(
        "shard row {row} has a null `{column}`; every point needs a paper id and an embedding"
    )]
    NullValue {
        /// The column name.
        column: &'static str,
        /// Row index inside the record batch.
        row: usize,
    },

    /// The batch's vectors do not have the collection's size.
    #[error("collection `{collection}` holds {expected}-d vectors but this batch has {found}-d vectors; upload into a new collection (or delete the old one) for another model or dimension")]
    VectorSizeMismatch {
        /// The collection name.
        collection: String,
        /// The collection's vector size.
        expected: usize,
        /// The batch's vector size.
        found: usize,
    },

    /// An existing collection was created with another vector size or distance.
    #[error("collection `{collection}` already exists with {existing_size}-d {existing_distance} vectors, but this run needs {wanted_size}-d {wanted_distance}; choose another collection name or delete the existing one")]
    CollectionMismatch {
        /// The collection name.
        collection: String,
        /// Vector size of the existing collection.
        existing_size: usize,
        /// Distance of the existing collection (e.g. "Cosine").
        existing_distance: String,
        /// Vector size the spec asks for.
        wanted_size: usize,
        /// Distance the spec asks for.
        wanted_distance: String,
    },

    /// The collection does not exist (call `ensure_collection` first).
    #[error("collection `{collection}` does not exist; create it with ensure_collection (or check the name)")]
    NoSuchCollection {
        /// The collection name.
        collection: String,
    },

    /// A collection name that cannot be used (empty, path separators, ...).
    #[error("invalid collection name `{name}`: use letters, digits, `-`, `_` and `.` only")]
    InvalidCollectionName {
        /// The name as given.
        name: String,
    },

    /// The in-process engine failed.
    #[error("qdrant-edge failed to {action}: {message}")]
    Edge {
        /// What the sink was doing ("upsert points", "open shard", ...).
        action: &'static str,
        /// The engine's message.
        message: String,
    },

    /// The embedded engine's directory has too little room to open it: its write-ahead log maps
    /// a segment of [`crate::edge::WAL_SEGMENT_BYTES`] into memory, and a write into a mapping the
    /// filesystem cannot back ends the process (SIGBUS) instead of failing.
    #[error("the embedded Qdrant at {} needs {} free to open (its write-ahead log maps a {} segment into memory), and {} is free there: free space or raise the quota, then run the same command again {}", path.display(), embedfleet_core::space::size(*needed), embedfleet_core::space::size(crate::edge::WAL_SEGMENT_BYTES), embedfleet_core::space::size(*free), embedfleet_core::space::NO_ROOM)]
    NoRoom {
        /// The edge directory.
        path: PathBuf,
        free: u64,
        needed: u64,
    },

    /// Another process (or another `QdrantEdge` in this one) holds the edge directory.
    #[error("edge directory {} is in use by another process; qdrant-edge allows one process per directory (wait for it, or use a Qdrant server for parallel uploads)", path.display())]
    EdgeLocked {
        /// The directory.
        path: PathBuf,
    },

    /// A file-system operation on the edge directory or the API key file failed.
    #[error("failed to {action} {}: {cause}", path.display())]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        cause: std::io::Error,
    },

    /// An API key would go over plain `http://` to another machine.
    #[error("refusing to send the Qdrant API key over plain http to `{url}`: use https://, or --allow-insecure on a network you trust")]
    InsecureApiKey {
        /// The URL as given.
        url: String,
    },
    /// The server URL cannot be used.
    #[error("invalid Qdrant URL `{url}`: {reason} (expected http(s)://host:6334, the gRPC port)")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// Why it was refused.
        reason: String,
    },

    /// The server answered with an error that retrying will not fix.
    #[error("Qdrant server refused to {action}: {code:?}: {message}")]
    Server {
        /// What the sink was doing.
        action: &'static str,
        /// The gRPC status code.
        code: tonic::Code,
        /// The server's message.
        message: String,
    },

    /// The server refused every connection for the give-up time: it is not running there.
    #[error("the Qdrant server at {url} refused every connection for {seconds} s: it is not running there, or not on that port. Start it (or fix the URL), then re-run: finished batches are not sent again")]
    ServerRefused {
        /// The server's gRPC URL.
        url: String,
        /// How long it refused.
        seconds: u64,
    },

    /// The server refused every connection since the command started: nothing listens there.
    #[error("nothing listens at {url}: every connection was refused for {seconds} s since this command started. Start the Qdrant server, or fix the URL (its gRPC port is 6334 by default, the REST one 6333)")]
    NothingListens {
        /// The server's gRPC URL.
        url: String,
        /// How long it refused.
        seconds: u64,
    },

    /// A transient error persisted through every retry.
    #[error("Qdrant server kept failing to {action} after {attempts} attempts (last: {code:?}: {message}); check that the server is up and not overloaded, then re-run: finished batches are not sent again")]
    RetriesExhausted {
        /// What the sink was doing.
        action: &'static str,
        /// How many attempts were made.
        attempts: u32,
        /// The last gRPC status code.
        code: tonic::Code,
        /// The last message.
        message: String,
    },

    /// The client library failed before or after talking to the server (conversion, URI).
    #[error("Qdrant client failed to {action}: {message}")]
    Client {
        /// What the sink was doing.
        action: &'static str,
        /// The library's message.
        message: String,
    },

    /// A PostgreSQL URL (or its password or TLS settings) that cannot be used.
    #[error("cannot use the PostgreSQL target `{url}`: {reason}")]
    PgUrl {
        /// The URL as given (it holds no password: one there is refused).
        url: String,
        /// Why, and what to do.
        reason: String,
    },

    /// The pgpass file can be read by others: libpq ignores such a file.
    #[error("the pgpass file {} can be read by others (mode {mode:o}): `chmod 600 {}`, as libpq requires", path.display(), path.display())]
    PgPassfileOpen {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },

    /// No PostgreSQL server answered.
    #[error("no PostgreSQL server answers at {target}: {message}. Start it, or fix the host and port in --postgres")]
    PgUnreachable {
        /// `user@host:port/database`.
        target: String,
        /// The client's message.
        message: String,
    },

    /// The port answered, but not as PostgreSQL (or not within the connect deadline).
    #[error("no PostgreSQL at {target}: {message}. Fix the port in --postgres (PostgreSQL's is usually 5432), or add `?connect_timeout=SECONDS` for a slow network")]
    PgNotPostgres {
        /// `user@host:port/database`.
        target: String,
        /// What came back, or that nothing did.
        message: String,
    },

    /// PostgreSQL refused or failed a statement.
    #[error("PostgreSQL failed to {action}: {message}")]
    Postgres {
        /// What the sink was doing.
        action: &'static str,
        /// The server's message and SQLSTATE.
        message: String,
    },

    /// The database has no usable pgvector.
    #[error("pgvector is not usable in {target}: {message}; as a superuser: `CREATE EXTENSION vector` (pgvector 0.8 or newer installed on the server)")]
    PgNoExtension {
        /// `user@host:port/database`.
        target: String,
        /// Why.
        message: String,
    },

    /// Vectors past what any pgvector index takes (4,000 dimensions, as `halfvec`).
    #[error("`{collection}`: {dim}-d vectors are past the 4,000 dimensions a pgvector index takes (halfvec; 2,000 as vector), so nothing was sent. Embed at a smaller --dim (Qwen3-Embedding is Matryoshka-trained: 2,048 or 1,024 keep most of the quality), or index a binary quantization instead (an expression index on binary_quantize(embedding)::bit({dim}) with bit_hamming_ops, then re-rank its candidates by the full vectors), made by hand on a table of your own")]
    PgTooManyDims {
        /// The table.
        collection: String,
        /// The run's vector size.
        dim: usize,
    },

    /// The collection did not become green in time after indexing was restored.
    #[error("collection `{collection}` was not green after {waited_s} s (status {status}); indexing goes on in the server, check it later with `embedfleet status`")]
    NotGreen {
        /// The collection name.
        collection: String,
        /// Seconds waited.
        waited_s: u64,
        /// Last status seen.
        status: String,
    },
}

/// A shard key another run owns (boxed in [`UploadError`]: every upload result carries the
/// error's size).
#[derive(Debug)]
pub struct KeyConflict {
    pub collection: String,
    pub key: String,
    /// The owning run's identity and directory.
    pub owner_run: String,
    pub owner_dir: String,
    /// This run's identity.
    pub run: String,
}

/// Why an upload could not run (rows that failed are not errors: see [`SendReport`]).
#[derive(Debug, thiserror::Error)]
pub enum UploadRunError {
    /// run.db could not be read or written.
    #[error(transparent)]
    RunDb(#[from] RunDbError),
    /// The sink refused or failed.
    #[error(transparent)]
    Sink(#[from] UploadError),
    /// A shard's footer could not be read.
    #[error(transparent)]
    Shard(#[from] ShardReadError),
    /// The run's shards do not all have one vector size.
    #[error("shard {} has {found}-d vectors but {first} has {expected}-d; one collection holds one vector size: upload the runs of different models or dimensions into different collections", path.display())]
    MixedDims {
        /// The shard that differs.
        path: PathBuf,
        /// Its vector size.
        found: usize,
        /// The first shard.
        first: PathBuf,
        /// The first shard's vector size.
        expected: usize,
    },
    /// The run's shard-key pin (`snapshots/keys.json`) could not be read.
    #[error("failed to read the run's shard keys (snapshots/keys.json): {0}")]
    ShardKeys(std::io::Error),
    /// Too many batches in a row failed; the upload stopped.
    #[error("the upload stopped after {failures} failed batches in a row (last: {last}); what was acknowledged is recorded, run `embedfleet upload` again once the cause is fixed")]
    TooManyFailures {
        /// Consecutive failed batches.
        failures: usize,
        /// The last error.
        last: String,
    },
    /// A worker process failed.
    #[error("upload worker {index} failed: {why}; run `embedfleet upload` again, it continues")]
    Worker {
        /// The worker's index.
        index: u64,
        /// Its exit status or spawn error.
        why: String,
    },
}

impl UploadRunError {
    /// True when the target collection refused the run's vectors: exit code "refused".
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            UploadRunError::MixedDims { .. }
                | UploadRunError::Sink(
                    UploadError::CollectionMismatch { .. }
                        | UploadError::VectorSizeMismatch { .. }
                        | UploadError::KeyOfAnotherRun(_)
                        | UploadError::OtherVectors { .. }
                        | UploadError::PgTooManyDims { .. }
                )
        )
    }
}
