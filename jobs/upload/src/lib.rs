//! The upload stage: a run's parquet shards into Qdrant — the sinks, the collection spec, the
//! conversion, the uploader, `tune`.
//!
//! A [`Sink`] is one connection to one Qdrant: [`QdrantEdge`] (the engine in-process, persisted
//! in a directory; the embedded default) or [`QdrantServer`] (a server or cluster over gRPC).
//! An uploader worker owns one sink; its methods take `&self`, so K threads sharing one sink give
//! K requests in flight.
//!
//! The data path: a shard's `RecordBatch` (sliced to the batch size with `RecordBatch::slice`,
//! which copies nothing) → [`PointsBatch::from_record_batch`] (schema checked once, columns
//! borrowed) → [`Sink::upsert`], which copies each vector once into the request.
//!
//! The uploader ([`upload`], [`upload_with_workers`]) drives a sink over a run's shards, resumably;
//! [`tune`] finds its batch size and requests in flight; [`query`] searches with a query vector.
//!
//! Durability: an upsert that returned `Ok` is acknowledged only after [`Sink::checkpoint`]
//! returned `Ok` too; record progress (run.db) after the checkpoint. Point ids are deterministic
//! ([`point_id`]), so re-sending a batch after a crash never duplicates points.

mod driver;
mod edge;
mod error;
pub mod integrity;
mod points;
mod progress;
pub mod query;
mod retry;
mod server;
pub mod shard_keys;
pub mod shard_settings;
pub mod shards;
pub mod tune;
mod workers;

use std::time::Duration;

pub use driver::{
    prepare, progress_key, send, shard_keys_of, upload, Prepared, SendReport, UploadOptions,
    UploadReport, UploadRunError, DEFAULT_CHECKPOINT_EVERY, DEFAULT_IN_FLIGHT,
    DEFAULT_UPSERT_BATCH, TEST_DELAY_ENV,
};
pub use edge::QdrantEdge;
pub use error::{KeyConflict, UploadError, UploadResult};
pub use points::{
    parse_year, point_id, PointRef, PointsBatch, PAPER_NAMESPACE, PAYLOAD_N_CHARS,
    PAYLOAD_N_TOKENS, PAYLOAD_PAPER_ID, PAYLOAD_SOURCE, PAYLOAD_YEAR,
};
pub use retry::{is_transient, RetryPolicy};
pub use server::{
    build_point_structs, sends_in_clear, ApiKey, KeyedShard, QdrantServer, ServerCollection,
    ServerConfig,
};
pub use uuid::Uuid;
pub use workers::{upload_with_workers, WorkerCommand};

/// Vector distance of a collection.
///
/// `Cosine` is the default; Qdrant normalises vectors on insert, so for embeddings that are
/// already normalised `Dot` gives the same ranking without that step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Distance {
    /// Cosine similarity.
    #[default]
    Cosine,
    /// Dot product (use only with normalised vectors).
    Dot,
}

impl std::fmt::Display for Distance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Distance::Cosine => "Cosine",
            Distance::Dot => "Dot",
        })
    }
}

/// Type of a payload index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadIndexKind {
    /// Integer index (range and match filters), e.g. `year`.
    Integer,
    /// Keyword index (exact match), e.g. `source`.
    Keyword,
}

/// HNSW graph parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HnswParams {
    /// Edges per node (Qdrant's default 16).
    pub m: u64,
    /// Candidates while building (Qdrant's default 100).
    pub ef_construct: u64,
}

impl Default for HnswParams {
    fn default() -> Self {
        Self {
            m: 16,
            ef_construct: 100,
        }
    }
}

/// Everything needed to create (or check) a collection.
///
/// `CollectionSpec::new(name, vector_size)` gives the defaults; set the public fields for the rest.
#[derive(Debug, Clone, PartialEq)]
pub struct CollectionSpec {
    /// Collection name (letters, digits, `-`, `_`, `.`).
    pub name: String,
    /// Vector size (the model's output dimension, from the shards).
    pub vector_size: usize,
    /// Distance; cosine by default.
    pub distance: Distance,
    /// HNSW parameters restored by [`Sink::finish`] after a bulk load.
    pub hnsw: HnswParams,
    /// Segments above this size (KB) get an HNSW index; Qdrant's default is 10,000.
    pub indexing_threshold_kb: u64,
    /// Keep the original vectors on disk (mmap) instead of RAM.
    pub on_disk_vectors: bool,
    /// Add int8 scalar quantization (quantile 0.99, quantized vectors kept in RAM).
    pub int8_quantization: bool,
    /// Defer HNSW building (`m = 0`, `indexing_threshold = 0`) until [`Sink::finish`].
    pub bulk_load: bool,
    /// Shards of the collection (server only; `None` = server default).
    pub shard_number: Option<u32>,
    /// Copies of each shard (server only; `None` = server default).
    pub replication_factor: Option<u32>,
    /// Custom sharding, one shard per shard key (server only): a collection loaded from built
    /// shards (`snapshot`), where every write names its batch's key.
    pub custom_sharding: bool,
    /// Payload indexes, created before any data.
    pub payload_indexes: Vec<(String, PayloadIndexKind)>,
}

impl CollectionSpec {
    /// A cosine collection with Qdrant's default HNSW, `year` (integer) and `source` (keyword)
    /// indexes, vectors in RAM, no quantization, no bulk-load mode.
    pub fn new(name: impl Into<String>, vector_size: usize) -> Self {
        Self {
            name: name.into(),
            vector_size,
            distance: Distance::Cosine,
            hnsw: HnswParams::default(),
            indexing_threshold_kb: 10_000,
            on_disk_vectors: false,
            int8_quantization: false,
            bulk_load: false,
            shard_number: None,
            replication_factor: None,
            custom_sharding: false,
            payload_indexes: vec![
                (PAYLOAD_YEAR.to_owned(), PayloadIndexKind::Integer),
                (PAYLOAD_SOURCE.to_owned(), PayloadIndexKind::Keyword),
            ],
        }
    }
}

/// What [`Sink::ensure_collection`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ensured {
    /// The collection was created from the spec.
    Created,
    /// A compatible collection existed; it was left as it is.
    Existing,
}

/// The live settings of a collection, as the engine reports them.
#[derive(Debug, Clone, PartialEq)]
pub struct CollectionInfo {
    /// Vector size.
    pub vector_size: usize,
    /// Distance, `None` when it is one embedfleet does not create (Euclid, Manhattan).
    pub distance: Option<Distance>,
    /// Exact number of points (server: approximate while optimizing).
    pub points: u64,
    /// Vectors in HNSW-indexed segments.
    pub indexed_vectors: u64,
    /// Current HNSW parameters.
    pub hnsw: HnswParams,
    /// Current indexing threshold in KB (0 = indexing disabled).
    pub indexing_threshold_kb: u64,
    /// True when no optimization is pending ("green").
    pub green: bool,
    /// True when an optimization failed ("red"): the collection will not turn green by itself.
    pub red: bool,
}

/// What [`Sink::finish`] did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FinishReport {
    /// Time from restoring the index settings until the collection was green.
    pub indexing: Duration,
    /// Points in the collection at the end.
    pub points: u64,
    /// Vectors in HNSW-indexed segments at the end.
    pub indexed_vectors: u64,
}

/// A payload filter; the conditions set are all required (AND).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PayloadFilter {
    /// `year >= min`.
    pub year_min: Option<i64>,
    /// `year <= max`.
    pub year_max: Option<i64>,
    /// `source == value`.
    pub source: Option<String>,
}

impl PayloadFilter {
    /// Points of exactly this year.
    pub fn year(year: i64) -> Self {
        Self {
            year_min: Some(year),
            year_max: Some(year),
            source: None,
        }
    }

    /// Points with `min <= year <= max`.
    pub fn years(min: i64, max: i64) -> Self {
        Self {
            year_min: Some(min),
            year_max: Some(max),
            source: None,
        }
    }

    /// Points of this source.
    pub fn source(source: impl Into<String>) -> Self {
        Self {
            source: Some(source.into()),
            ..Self::default()
        }
    }
}

/// How to search: how many results, among which points, how hard.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SearchOptions {
    /// Results per query.
    pub k: usize,
    /// Only points matching this filter.
    pub filter: Option<PayloadFilter>,
    /// HNSW beam width (`ef`); `None`: the collection's default.
    pub hnsw_ef: Option<u64>,
    /// Exact search (every vector compared), no index.
    pub exact: bool,
}

impl SearchOptions {
    /// The `k` nearest, with the collection's defaults.
    pub fn new(k: usize) -> Self {
        Self {
            k,
            ..Self::default()
        }
    }
}

/// A search result with its payload.
#[derive(Debug, Clone, PartialEq)]
pub struct Hit {
    /// The point id ([`point_id`] of the paper id).
    pub id: uuid::Uuid,
    /// Similarity (higher is closer for cosine and dot).
    pub score: f32,
    /// `paper_id` payload.
    pub paper_id: Option<String>,
    /// `year` payload.
    pub year: Option<i64>,
    /// `source` payload.
    pub source: Option<String>,
    /// `n_chars` payload.
    pub n_chars: Option<i64>,
    /// `n_tokens` payload.
    pub n_tokens: Option<i64>,
}

/// One connection to one Qdrant (in-process or server). See the module docs.
///
/// All methods block; do not call them from inside an async runtime.
pub trait Sink: Send + Sync {
    /// Creates the collection from `spec` (payload indexes first), or checks that an existing one
    /// has the same vector size and distance ([`UploadError::CollectionMismatch`] otherwise).
    /// With `spec.bulk_load`, HNSW building is (again) deferred on the collection.
    fn ensure_collection(&self, spec: &CollectionSpec) -> UploadResult<Ensured>;

    /// Upserts the points of `points` into `collection`.
    ///
    /// Refuses a batch whose vector size differs from the collection's
    /// ([`UploadError::VectorSizeMismatch`]) before sending anything.
    fn upsert(&self, collection: &str, points: &PointsBatch<'_>) -> UploadResult<()>;

    /// Makes every upsert that returned `Ok` durable. Record progress only after this.
    fn checkpoint(&self, collection: &str) -> UploadResult<()>;

    /// Restores the spec's HNSW and indexing settings, waits until the collection is green, and
    /// reports how long that took.
    fn finish(&self, spec: &CollectionSpec) -> UploadResult<FinishReport>;

    /// Exact number of points, optionally only those matching `filter`.
    fn count(&self, collection: &str, filter: Option<&PayloadFilter>) -> UploadResult<u64>;

    /// The `k` nearest points to `vector`, best first, with their payload.
    fn search(
        &self,
        collection: &str,
        vector: &[f32],
        k: usize,
        filter: Option<&PayloadFilter>,
    ) -> UploadResult<Vec<Hit>> {
        let options = SearchOptions {
            filter: filter.cloned(),
            ..SearchOptions::new(k)
        };
        self.search_with(collection, vector, &options)
    }

    /// The nearest points to `vector` as `options` say (k, filter, HNSW beam, exact), best
    /// first, with their payload.
    fn search_with(
        &self,
        collection: &str,
        vector: &[f32],
        options: &SearchOptions,
    ) -> UploadResult<Vec<Hit>>;

    /// One search per vector, in order, in as few requests as the engine allows (a server
    /// takes them in one batch request; the embedded engine runs them one after another).
    fn search_batch(
        &self,
        collection: &str,
        vectors: &[Vec<f32>],
        options: &SearchOptions,
    ) -> UploadResult<Vec<Vec<Hit>>> {
        vectors
            .iter()
            .map(|v| self.search_with(collection, v, options))
            .collect()
    }

    /// The collection's live settings, `None` when it does not exist.
    fn collection_info(&self, collection: &str) -> UploadResult<Option<CollectionInfo>>;

    /// Deletes the collection; `Ok(false)` when it did not exist.
    fn delete_collection(&self, collection: &str) -> UploadResult<bool>;

    /// Which Qdrant this is, for run.db's upload progress: `edge:<directory>` or
    /// `server:<url>`.
    fn target(&self) -> String;

    /// True when writes to `collection` must name a shard key (custom sharding: a collection
    /// loaded from built shards).
    fn keyed(&self, _collection: &str) -> UploadResult<bool> {
        Ok(false)
    }

    /// Creates shard key `key` of a custom-sharded collection unless it exists, owned by
    /// `owner`'s run; refused ([`UploadError::KeyOfAnotherRun`]) when another run owns it.
    fn ensure_shard_key(
        &self,
        collection: &str,
        key: &str,
        owner: &shard_keys::KeyOwner,
    ) -> UploadResult<()> {
        let _ = (key, owner);
        Err(UploadError::Unsupported {
            what: format!("shard keys (`{collection}` on {})", self.target()),
        })
    }

    /// Upserts into shard key `key` (`None`: as [`Sink::upsert`]).
    fn upsert_keyed(
        &self,
        collection: &str,
        key: Option<&str>,
        points: &PointsBatch<'_>,
    ) -> UploadResult<()> {
        match key {
            None => self.upsert(collection, points),
            Some(_) => Err(UploadError::Unsupported {
                what: format!("shard keys (`{collection}` on {})", self.target()),
            }),
        }
    }

    /// Deletes the points `ids`, from shard key `key` when given.
    fn delete(&self, collection: &str, ids: &[uuid::Uuid], key: Option<&str>) -> UploadResult<()>;

    /// How many of the points `ids` the collection holds (in shard key `key` when given): the
    /// upload's per-batch check counts a batch's own points this way.
    fn count_ids(
        &self,
        collection: &str,
        ids: &[uuid::Uuid],
        key: Option<&str>,
    ) -> UploadResult<u64>;

    /// The identity marker embedfleet stored in `collection` ([`Sink::set_collection_marker`]),
    /// `None` when it holds none (made by someone else, or before markers existed).
    fn collection_marker(&self, collection: &str) -> UploadResult<Option<String>>;

    /// Stores `marker` as `collection`'s identity; it goes with the collection (dropping the
    /// collection drops it), so a run that recorded it can tell its collection from another.
    fn set_collection_marker(&self, collection: &str, marker: &str) -> UploadResult<()>;

    /// The Qdrant peers holding shards of `collection` (an existing one), `None` where that
    /// means nothing (the embedded engine). `upload` starts one worker process per peer.
    fn peers(&self, _collection: &str) -> UploadResult<Option<usize>> {
        Ok(None)
    }
}

/// Refuses names that could escape the edge directory or that Qdrant rejects.
fn check_collection_name(name: &str) -> UploadResult<()> {
    let ok = !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(UploadError::InvalidCollectionName {
            name: name.to_owned(),
        })
    }
}

/// Refuses vectors of `found` dimensions for `collection`, which holds `expected`-d ones.
fn check_vector_size(collection: &str, expected: usize, found: usize) -> UploadResult<()> {
    if found == expected {
        return Ok(());
    }
    Err(UploadError::VectorSizeMismatch {
        collection: collection.to_owned(),
        expected,
        found,
    })
}

/// Refuses an existing collection whose vector size or distance differs from the spec.
fn check_compatible(
    spec: &CollectionSpec,
    size: usize,
    distance: Option<Distance>,
) -> UploadResult<()> {
    if size == spec.vector_size && distance == Some(spec.distance) {
        return Ok(());
    }
    Err(UploadError::CollectionMismatch {
        collection: spec.name.clone(),
        existing_size: size,
        existing_distance: distance.map_or_else(|| "other".to_owned(), |d| d.to_string()),
        wanted_size: spec.vector_size,
        wanted_distance: spec.distance.to_string(),
    })
}
