//! What a [`Sink`](crate::Sink) is asked to do with points: upsert, count, query, delete. Each
//! request takes its required fields in `new` and its optional ones as setters (qdrant-client's
//! builders, without the `build` step), and borrows what it carries: nothing is copied until a
//! sink turns it into its engine's request.
//!
//! A request may name a shard key (a Qdrant collection with custom sharding, see
//! [`QdrantExtras`](crate::QdrantExtras)); a sink without shard keys refuses a request that names
//! one ([`UploadError::Unsupported`](crate::UploadError::Unsupported)).

use uuid::Uuid;

use crate::points::PointsBatch;

/// Upserts the points of a batch into a collection.
#[derive(Debug, Clone, Copy)]
pub struct UpsertRequest<'a> {
    pub collection: &'a str,
    pub points: &'a PointsBatch<'a>,
    /// The shard key the points go to (custom sharding), `None`: the collection decides.
    pub shard_key: Option<&'a str>,
}

impl<'a> UpsertRequest<'a> {
    /// Upserts `points` into `collection`.
    pub fn new(collection: &'a str, points: &'a PointsBatch<'a>) -> Self {
        Self {
            collection,
            points,
            shard_key: None,
        }
    }

    /// Into shard key `key` (`None`: no key).
    pub fn shard_key(mut self, key: Option<&'a str>) -> Self {
        self.shard_key = key;
        self
    }
}

/// Counts the points of a collection exactly: all of them, or those matching every condition
/// set (a payload filter, a list of ids, a shard key).
#[derive(Debug, Clone, Copy)]
pub struct CountRequest<'a> {
    pub collection: &'a str,
    /// Only points matching this filter.
    pub filter: Option<&'a PayloadFilter>,
    /// Only these points (an empty list counts 0): the upload's per-batch check counts a
    /// batch's own points this way.
    pub ids: Option<&'a [Uuid]>,
    /// Only the points in this shard key.
    pub shard_key: Option<&'a str>,
}

impl<'a> CountRequest<'a> {
    /// Every point of `collection`.
    pub fn new(collection: &'a str) -> Self {
        Self {
            collection,
            filter: None,
            ids: None,
            shard_key: None,
        }
    }

    /// Only points matching `filter` (`None`: no filter).
    pub fn filter(mut self, filter: Option<&'a PayloadFilter>) -> Self {
        self.filter = filter;
        self
    }

    /// Only the points `ids`.
    pub fn ids(mut self, ids: &'a [Uuid]) -> Self {
        self.ids = Some(ids);
        self
    }

    /// Only the points in shard key `key` (`None`: every key).
    pub fn shard_key(mut self, key: Option<&'a str>) -> Self {
        self.shard_key = key;
        self
    }
}

/// Deletes points by id.
#[derive(Debug, Clone, Copy)]
pub struct DeleteRequest<'a> {
    pub collection: &'a str,
    pub ids: &'a [Uuid],
    /// The shard key holding them: a custom-sharded collection needs it (without it the delete
    /// goes to no shard).
    pub shard_key: Option<&'a str>,
}

impl<'a> DeleteRequest<'a> {
    /// Deletes the points `ids` of `collection`.
    pub fn new(collection: &'a str, ids: &'a [Uuid]) -> Self {
        Self {
            collection,
            ids,
            shard_key: None,
        }
    }

    /// From shard key `key` (`None`: no key).
    pub fn shard_key(mut self, key: Option<&'a str>) -> Self {
        self.shard_key = key;
        self
    }
}

/// Sets what a point's payload holds of its paper's corpus metadata, `year` and `source`, on
/// points by id: a `None` removes the key (as an upsert of the paper would leave it out). A
/// corpus release that changes a paper's metadata but not its text (see `plan --update`).
#[derive(Debug, Clone, Copy)]
pub struct PayloadRequest<'a> {
    pub collection: &'a str,
    pub ids: &'a [Uuid],
    pub year: Option<i64>,
    pub source: Option<&'a str>,
    /// The shard key holding them (custom sharding).
    pub shard_key: Option<&'a str>,
}

impl<'a> PayloadRequest<'a> {
    /// Sets `year` and `source` on the points `ids` of `collection`.
    pub fn new(
        collection: &'a str,
        ids: &'a [Uuid],
        year: Option<i64>,
        source: Option<&'a str>,
    ) -> Self {
        Self {
            collection,
            ids,
            year,
            source,
            shard_key: None,
        }
    }

    /// In shard key `key` (`None`: no key).
    pub fn shard_key(mut self, key: Option<&'a str>) -> Self {
        self.shard_key = key;
        self
    }
}

/// One search per query vector, each as [`SearchOptions`] say. The answer is one list of hits
/// per vector, in order, best first; a sink sends them in as few requests as its engine allows.
#[derive(Debug, Clone)]
pub struct QueryRequest<'a> {
    pub collection: &'a str,
    pub vectors: Vec<&'a [f32]>,
    pub options: SearchOptions,
}

impl<'a> QueryRequest<'a> {
    /// A search in `collection` for each of `vectors`.
    pub fn new(collection: &'a str, vectors: &'a [Vec<f32>], options: SearchOptions) -> Self {
        Self {
            collection,
            vectors: vectors.iter().map(Vec::as_slice).collect(),
            options,
        }
    }

    /// One search in `collection`, for `vector`.
    pub fn one(collection: &'a str, vector: &'a [f32], options: SearchOptions) -> Self {
        Self {
            collection,
            vectors: vec![vector],
            options,
        }
    }
}

/// A payload filter; the conditions set are all required (AND).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PayloadFilter {
    /// `year >= min`.
    pub year_min: Option<i64>,
    /// `year <= max`.
    pub year_max: Option<i64>,
    /// `source` is one of these (empty: any source). `query --filter source=s2orc` resolves
    /// to the run's sources it selects (`s2orc/train`, ...), as `plan --source` selects them.
    pub sources: Vec<String>,
}

impl PayloadFilter {
    /// Points of exactly this year.
    pub fn year(year: i64) -> Self {
        Self {
            year_min: Some(year),
            year_max: Some(year),
            sources: Vec::new(),
        }
    }

    /// Points with `min <= year <= max`.
    pub fn years(min: i64, max: i64) -> Self {
        Self {
            year_min: Some(min),
            year_max: Some(max),
            sources: Vec::new(),
        }
    }

    /// Points of this source.
    pub fn source(source: impl Into<String>) -> Self {
        Self {
            sources: vec![source.into()],
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
    /// HNSW beam width (`ef`; pgvector's `hnsw.ef_search`); `None`: the collection's default.
    pub hnsw_ef: Option<u64>,
    /// IVF lists probed (pgvector's `ivfflat.probes`); `None`: the database's default. A
    /// database without IVF lists ignores it.
    pub probes: Option<u64>,
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
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Hit {
    /// The point id ([`point_id`](crate::point_id) of the paper id).
    pub id: Uuid,
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
