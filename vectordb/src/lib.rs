//! The vector databases a run writes to and searches, for `upload`, `query`, `eval`, `delete`
//! and `tune`: the sinks, the collection spec, the conversion, the uploader.
//!
//! A [`Sink`] is one connection to one vector database, in two layers (`sink.rs`): the core
//! every database can serve (collections; upsert, count, query and delete points, each a request
//! type of `request.rs`) and Qdrant's extras ([`QdrantExtras`]: shard keys, the collection
//! marker, peers). Qdrant's sinks are [`QdrantEdge`] (the engine in-process, persisted in a
//! directory; the embedded default) and [`QdrantServer`] (a server or cluster over gRPC);
//! [`PgVector`] is PostgreSQL with pgvector. What differs between them that a command must know
//! (their kind, name, whether an upload may be several processes) is a method of [`Sink`].
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
mod ledger;
mod open;
mod options;
mod outage;
pub mod pg;
mod points;
mod prepared;
mod progress;
pub mod query;
mod request;
pub mod restamp;
mod retry;
mod server;
pub mod shard_keys;
pub mod shard_settings;
pub mod shards;
mod sink;
mod spec;
pub mod tune;
pub mod vectors_identity;
mod workers;

pub use driver::{send, upload, upload_on, UploadReport, TEST_DELAY_ENV};
pub use edge::QdrantEdge;
pub use error::{KeyConflict, UploadError, UploadResult, UploadRunError};
pub use ledger::SendReport;
pub use open::shard_keys_of;
pub use options::{
    UploadOptions, DEFAULT_CHECKPOINT_EVERY, DEFAULT_IN_FLIGHT, DEFAULT_UPSERT_BATCH,
};
pub use pg::{
    IterativeScan, PgConfig, PgIndex, PgVector, TEST_COPY_DELAY_ENV as PG_TEST_COPY_DELAY_ENV,
};
pub use points::{
    parse_year, point_id, PointRef, PointsBatch, PAPER_NAMESPACE, PAYLOAD_N_CHARS,
    PAYLOAD_N_TOKENS, PAYLOAD_PAPER_ID, PAYLOAD_SOURCE, PAYLOAD_YEAR,
};
pub use prepared::{prepare, progress_key, Prepared};
pub use request::{
    CountRequest, DeleteRequest, Hit, PayloadFilter, PayloadRequest, QueryRequest, SearchOptions,
    UpsertRequest,
};
pub use retry::{is_transient, RetryPolicy};
pub use server::{
    build_point_structs, check_url, is_this_machine, sends_in_clear, ApiKey, KeyedShard,
    QdrantServer, ServerCollection, ServerConfig,
};
pub use sink::{is_keyed, QdrantExtras, Sink};
pub use spec::{
    CollectionInfo, CollectionSpec, Distance, Ensured, FinishReport, HnswParams, PayloadIndexKind,
    QdrantIndex, QdrantSpec, VectorDtype, VectorIndex,
};
pub use uuid::Uuid;

/// The collection (a table in PostgreSQL) the commands fill and search when none is named.
pub const DEFAULT_COLLECTION: &str = "papers";
pub use workers::{upload_with_workers, WorkerCommand};
