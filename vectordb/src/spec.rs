//! What a collection is: the spec it is created from ([`CollectionSpec`]), what a sink reports
//! of it ([`CollectionInfo`], [`FinishReport`]), and the checks every sink makes of names and
//! sizes.
//!
//! A spec has two parts: what every vector database has (name, vector size, distance, payload
//! indexes, deferring the index during a bulk load) and Qdrant's own settings
//! ([`QdrantSpec`]: HNSW, the indexing threshold, storage, quantization, sharding), which
//! another database's sink reads what it can of or ignores.

use std::time::Duration;

pub use embedfleet_core::shardfile::VectorDtype;

use crate::error::{UploadError, UploadResult};
use crate::points::{PAYLOAD_SOURCE, PAYLOAD_YEAR};

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
    /// The element type of the run's vectors (the shards'): a database that stores half
    /// precision keeps f16 runs in it (pgvector's `halfvec`); Qdrant stores f32 either way.
    pub vector_dtype: VectorDtype,
    /// Distance; cosine by default.
    pub distance: Distance,
    /// Defer index building until [`Sink::finish`](crate::Sink::finish) (a bulk load).
    pub bulk_load: bool,
    /// Payload indexes, created before any data.
    pub payload_indexes: Vec<(String, PayloadIndexKind)>,
    /// Qdrant's settings of the collection.
    pub qdrant: QdrantSpec,
}

impl CollectionSpec {
    /// A cosine collection with `year` (integer) and `source` (keyword) indexes, no bulk-load
    /// mode, and Qdrant's defaults ([`QdrantSpec::default`]).
    pub fn new(name: impl Into<String>, vector_size: usize) -> Self {
        Self {
            name: name.into(),
            vector_size,
            vector_dtype: VectorDtype::F32,
            distance: Distance::Cosine,
            bulk_load: false,
            payload_indexes: vec![
                (PAYLOAD_YEAR.to_owned(), PayloadIndexKind::Integer),
                (PAYLOAD_SOURCE.to_owned(), PayloadIndexKind::Keyword),
            ],
            qdrant: QdrantSpec::default(),
        }
    }
}

/// A collection's settings that are Qdrant's own (both the embedded engine and a server read
/// them; the sharding ones only a server).
#[derive(Debug, Clone, PartialEq)]
pub struct QdrantSpec {
    /// HNSW parameters restored by [`Sink::finish`](crate::Sink::finish) after a bulk load
    /// (which defers the graph with `m = 0` and `indexing_threshold = 0`).
    pub hnsw: HnswParams,
    /// Segments above this size (KB) get an HNSW index; Qdrant's default is 10,000.
    pub indexing_threshold_kb: u64,
    /// Keep the original vectors on disk (mmap) instead of RAM.
    pub on_disk_vectors: bool,
    /// Add int8 scalar quantization (quantile 0.99, quantized vectors kept in RAM).
    pub int8_quantization: bool,
    /// Shards of the collection (server only; `None` = server default).
    pub shard_number: Option<u32>,
    /// Copies of each shard (server only; `None` = server default).
    pub replication_factor: Option<u32>,
    /// Custom sharding, one shard per shard key (server only): a collection loaded from built
    /// shards (`snapshot`), where every write names its batch's key.
    pub custom_sharding: bool,
}

impl Default for QdrantSpec {
    /// Qdrant's default HNSW and indexing threshold, vectors in RAM, no quantization, the
    /// server's sharding.
    fn default() -> Self {
        Self {
            hnsw: HnswParams::default(),
            indexing_threshold_kb: 10_000,
            on_disk_vectors: false,
            int8_quantization: false,
            shard_number: None,
            replication_factor: None,
            custom_sharding: false,
        }
    }
}

/// What [`Sink::ensure_collection`](crate::Sink::ensure_collection) found.
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
    /// True when no optimization is pending ("green").
    pub green: bool,
    /// True when an optimization failed ("red"): the collection will not turn green by itself.
    pub red: bool,
    /// Qdrant's index settings, `None` from a database that is not Qdrant.
    pub qdrant: Option<QdrantIndex>,
    /// The vector index searches go through, `None` when there is none (every search exact).
    pub index: Option<VectorIndex>,
}

/// A collection's vector index: what its search effort is (HNSW's `ef`, IVFFlat's probes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VectorIndex {
    /// A graph, searched with a beam of `ef` candidates.
    Hnsw(HnswParams),
    /// Lists of vectors around k-means centres (pgvector), searched `probes` lists at a time.
    IvfFlat {
        /// The number of lists.
        lists: u64,
    },
}

impl std::fmt::Display for VectorIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Hnsw(p) => write!(f, "hnsw (m={}, ef_construction={})", p.m, p.ef_construct),
            Self::IvfFlat { lists } => write!(f, "ivfflat (lists={lists})"),
        }
    }
}

/// A Qdrant collection's current index settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QdrantIndex {
    /// Current HNSW parameters.
    pub hnsw: HnswParams,
    /// Current indexing threshold in KB (0 = indexing disabled).
    pub indexing_threshold_kb: u64,
}

/// What [`Sink::finish`](crate::Sink::finish) did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FinishReport {
    /// Time from restoring the index settings until the collection was green.
    pub indexing: Duration,
    /// Points in the collection at the end.
    pub points: u64,
    /// Vectors in HNSW-indexed segments at the end.
    pub indexed_vectors: u64,
}

/// Refuses names that could escape the edge directory or that Qdrant rejects.
pub(crate) fn check_collection_name(name: &str) -> UploadResult<()> {
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
pub(crate) fn check_vector_size(
    collection: &str,
    expected: usize,
    found: usize,
) -> UploadResult<()> {
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
pub(crate) fn check_compatible(
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
