//! The snapshot bulk load, a stage of its own: a run's Qdrant shards built offline, one per
//! group of consecutive batches, then recovered on the server ready to serve.
//!
//! The server's slow part of a load is not receiving points but building its HNSW graph, on the
//! database's cores, after the last upsert. A built shard moves that work off the database:
//! [`build_shard`] inserts a group's parquet shards into a qdrant-edge shard (the server's own
//! engine, in-process) with the target collection's settings, optimises it, and packs it in the
//! server's shard-snapshot layout ([`pack`]) with a manifest ([`BuiltShardManifest`]).
//! [`load_snapshots`] creates a custom-sharded collection with one shard key per group
//! ([`ShardKeys`]) and recovers each group's snapshot into its key's shard.
//!
//! Why custom sharding with a key per group of consecutive batches (and not shards routed as
//! the server's own hash routing would route each id): a snapshot replaces one whole server
//! shard; under hash sharding every shard holds points of every batch, so no shard could be
//! built before the last batch is embedded, and the routing would have to match the server's
//! internal hash ring exactly, or updates by id would miss. With a key per group, a group's
//! build starts when its own batches are done, every write of a paper names its group's key
//! (the vectordb crate's [`ShardKeys`]), and counts stay exact. Keys are named after their run
//! and the collection records their owner ([`KeyOwner`]), so runs never replace each other's.
//!
//! Pinned together: the segment format is the edge crate's Qdrant version; the server must be of
//! the same minor version ([`check_engine_version`]). The server checks neither the vector size
//! nor the index settings on recovery, so the manifest's [`ShardSettings`] are checked against
//! the collection here.

mod build;
mod load;
mod manifest;
pub mod pack;
mod request;
mod rest;
mod settings;

pub use build::{
    build_shard, build_shard_without, cpu_seconds, describe_batches, find_built, find_usable,
    group_rows, sources_of_attempt, sources_of_batch, BuildOutcome, EDGE_QDRANT_VERSION,
    EDGE_VERSION,
};
pub use embedfleet_vectordb::shard_keys::{
    GroupCount, KeyOwner, ShardKeys, DEFAULT_GROUPS_PER_PEER,
};
pub use embedfleet_vectordb::shard_settings::ShardSettings;
pub use load::{load_snapshots, LoadOptions, LoadReport, SNAPSHOT_TEST_DELAY_ENV};
pub use manifest::{
    built_digest, sources_digest, BuildTimings, BuiltShardManifest, SourceShard, BUILT_SHARD_FORMAT,
};
pub use request::GroupBuildRequest;
pub use rest::RestClient;
pub use settings::PinnedSettings;

use std::path::PathBuf;

/// Server minor versions, newer than the segment format's, measured to recover its shards:
/// (format minor, server minor). A 1.19.0 server recovers 1.18-format shards and serves them
/// (the server suite passed against it; README, "Compatibility").
const NEWER_SERVERS_MEASURED: &[(MinorVersion, MinorVersion)] = &[((1, 18), (1, 19))];

/// (major, minor) of a version.
type MinorVersion = (u32, u32);

/// Refuses a server that is not of the segment format's minor version (`1.18.2-dev` built
/// shards) or of a newer one measured to recover it ([`NEWER_SERVERS_MEASURED`]).
pub fn check_engine_version(engine: &str, server: &str) -> Result<(), SnapshotError> {
    let minor = |v: &str| -> Option<(u32, u32)> {
        let mut parts = v.split(['.', '-']);
        Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
    };
    match (minor(engine), minor(server)) {
        (Some(a), Some(b)) if a == b || NEWER_SERVERS_MEASURED.contains(&(a, b)) => Ok(()),
        _ => Err(SnapshotError::VersionMismatch {
            engine: engine.to_owned(),
            server: server.to_owned(),
        }),
    }
}

/// The error of a failed file operation `action` on `path`.
fn io_err(
    action: &'static str,
    path: &std::path::Path,
) -> impl FnOnce(std::io::Error) -> SnapshotError {
    let path = path.to_owned();
    move |source| SnapshotError::Io {
        action,
        path,
        cause: source,
    }
}

/// The JSON file at `path` as a `T`, `None` when there is none.
fn read_json<T: serde::de::DeserializeOwned>(
    path: &std::path::Path,
    what: &str,
) -> Result<Option<T>, SnapshotError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(io_err("read", path)(source)),
    };
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| SnapshotError::Layout {
            path: path.to_owned(),
            message: format!("not {what}: {e}"),
        })
}

/// Writes `value` as JSON to `path`, atomically.
fn write_json<T: serde::Serialize>(path: &std::path::Path, value: &T) -> Result<(), SnapshotError> {
    let bytes = serde_json::to_vec_pretty(value).expect("plain data serializes");
    embedfleet_core::atomic::write(path, &bytes).map_err(io_err("write", path))
}

/// Errors of building and loading shard snapshots.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error("failed to {action} {}: {cause}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{}: {message}", path.display())]
    Layout { path: PathBuf, message: String },
    #[error("batch {batch}: {message}")]
    Sources { batch: i64, message: String },
    #[error("{what} was made with other collection settings ({}); build it again with these settings (remove it from snapshots/) or load with `--mode upsert`", embedfleet_core::pin::join(differences))]
    SettingsDiffer {
        what: String,
        differences: Vec<embedfleet_core::pin::Difference>,
    },
    #[error("built shards are in Qdrant {engine}'s segment format but the server runs {server}; load them into a {engine_minor}.x server (or a newer minor measured to recover them: README, \"Compatibility\"), or use `upload --mode upsert`", engine_minor = engine.rsplitn(2, '.').last().unwrap_or(engine))]
    VersionMismatch { engine: String, server: String },
    #[error("{message}; snapshot loading needs a Qdrant server started in cluster mode (QDRANT__CLUSTER__ENABLED=true, see .ci/qdrant/qdrant-server.sh), or use `upload --mode upsert`")]
    NeedsCluster { message: String },
    #[error("the server refused {what}: HTTP {status}: {body}")]
    Http {
        what: String,
        status: u16,
        body: String,
    },
    #[error("the server at {url} cannot be reached for {what}: {message}; check --qdrant-rest (the REST port, 6333 by default)")]
    Unreachable {
        url: String,
        what: String,
        message: String,
    },
    /// A peer of the cluster (from `/cluster`, not `--qdrant-rest`) that does not answer.
    #[error("the cluster's peer at {url} does not answer for {what}: {message}; it is down or restarting: start it again (it rejoins the cluster from its storage), then run the same command: what is loaded stays loaded")]
    PeerDown {
        url: String,
        what: String,
        message: String,
    },
    #[error("after loading, {what}: {message}")]
    Check { what: String, message: String },
    #[error(transparent)]
    Upload(#[from] embedfleet_vectordb::UploadError),
    #[error(transparent)]
    Shard(#[from] embedfleet_vectordb::shards::ShardReadError),
    #[error(transparent)]
    RunDb(#[from] embedfleet_core::rundb::RunDbError),
}

impl SnapshotError {
    /// True when the load or build was refused for what it was given (other settings, another
    /// server version, no cluster mode, another run's key): exit code "refused".
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            SnapshotError::SettingsDiffer { .. }
                | SnapshotError::VersionMismatch { .. }
                | SnapshotError::NeedsCluster { .. }
                | SnapshotError::Upload(
                    embedfleet_vectordb::UploadError::KeyOfAnotherRun(_)
                        | embedfleet_vectordb::UploadError::OtherVectors { .. }
                )
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recorded_edge_version_is_the_one_built_with() {
        let lock = include_str!("../../../Cargo.lock");
        let at = lock
            .find("name = \"qdrant-edge\"")
            .expect("qdrant-edge in Cargo.lock");
        let version = lock[at..]
            .lines()
            .nth(1)
            .and_then(|l| l.strip_prefix("version = \""))
            .and_then(|l| l.strip_suffix('"'))
            .expect("its version line");
        assert_eq!(
            version, EDGE_VERSION,
            "qdrant-edge was upgraded: set EDGE_VERSION, and EDGE_QDRANT_VERSION to its QDRANT_VERSION_STRING"
        );
    }

    #[test]
    fn engine_and_server_must_share_a_minor_version() {
        check_engine_version("1.18.2-dev", "1.18.3").unwrap();
        check_engine_version("1.18.2-dev", "1.18.0").unwrap();
        // Measured: a 1.19 server recovers 1.18-format shards; nothing else newer or older.
        check_engine_version("1.18.2-dev", "1.19.0").unwrap();
        let err = check_engine_version("1.18.2-dev", "1.20.0").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("1.18") && text.contains("1.20.0"), "{text}");
        assert!(check_engine_version("1.18.2-dev", "1.17.3").is_err());
        assert!(check_engine_version("1.19.0", "1.18.3").is_err());
        assert!(check_engine_version("1.18.2-dev", "2.18.0").is_err());
        assert!(check_engine_version("", "1.18.0").is_err());
    }
}
