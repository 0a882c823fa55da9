//! The two layers a vector database plugs in at.
//!
//! [`Sink`] is what every vector database can serve, and all the upload, the query workload,
//! `eval` and `tune` need: create or check a collection; upsert, count, query and delete points,
//! each a request type ([`UpsertRequest`], [`CountRequest`], [`QueryRequest`],
//! [`DeleteRequest`]); make writes durable; restore the index after a bulk load.
//! It also keeps a collection's identity: a marker the run stores in the collection and records
//! in run.db ([`Sink::set_collection_marker`]), stored where it goes with the collection (a
//! dropped and re-made collection has none), so that upload progress is trusted only for the
//! collection it is about. A database that cannot keep one leaves the default (no marker: the
//! per-batch counts are the upload's check).
//! [`QdrantExtras`] is what embedfleet uses of Qdrant beyond that: shard keys (custom sharding,
//! for collections loaded from built shards), the peers of a cluster. A sink offers its extras
//! through [`Sink::qdrant`]; callers ask for them there and do without where a sink has none
//! (no keys: writes name none; no peers: one upload worker per core).
//!
//! Both Qdrant sinks ([`QdrantEdge`](crate::QdrantEdge), [`QdrantServer`](crate::QdrantServer))
//! implement both traits; [`PgVector`](crate::PgVector) (PostgreSQL + pgvector) the core only. A server's snapshot-load calls (placing shard keys, claiming them,
//! reading the cluster's shards) are [`QdrantServer`](crate::QdrantServer)'s own methods: only a
//! Qdrant cluster loads built shards.

use crate::error::{UploadError, UploadResult};
use crate::request::{
    CountRequest, DeleteRequest, Hit, PayloadRequest, QueryRequest, UpsertRequest,
};
use crate::shard_keys::KeyOwner;
use crate::spec::{CollectionInfo, CollectionSpec, Ensured, FinishReport};

/// One connection to one vector database. See the module docs.
///
/// All methods block; do not call them from inside an async runtime. Methods take `&self`, so
/// K threads sharing one sink give K requests in flight.
pub trait Sink: Send + Sync {
    /// Which database this is, for run.db's upload progress: `edge:<directory>` or
    /// `server:<url>`.
    fn target(&self) -> String;

    /// `edge`, `server` or `postgres`: the kind of database, which run.db's tuned settings are
    /// saved under (`tune` measures each kind apart).
    fn kind(&self) -> &'static str;

    /// What a comparison table calls the database.
    fn database_name(&self) -> &'static str;

    /// Why an upload into it is one process, for a database that is (`None`: a server, which
    /// takes writes from worker processes, one per peer holding the collection).
    fn one_process_because(&self) -> Option<&'static str> {
        None
    }

    /// How a command line names this target (`--postgres postgresql://…`, `--qdrant URL`,
    /// `--edge DIR`): what a suggested next command repeats, so that it reaches the same
    /// database. Empty for a sink no flag names.
    fn target_flag(&self) -> String {
        String::new()
    }

    /// Creates the collection from `spec` (payload indexes first), or checks that an existing one
    /// has the same vector size and distance ([`UploadError::CollectionMismatch`] otherwise).
    /// With `spec.bulk_load`, index building is (again) deferred on the collection.
    fn ensure_collection(&self, spec: &CollectionSpec) -> UploadResult<Ensured>;

    /// Upserts the request's points.
    ///
    /// Refuses a batch whose vector size differs from the collection's
    /// ([`UploadError::VectorSizeMismatch`]) before sending anything.
    fn upsert(&self, request: UpsertRequest<'_>) -> UploadResult<()>;

    /// Makes every upsert that returned `Ok` durable. Record progress only after this.
    fn checkpoint(&self, collection: &str) -> UploadResult<()>;

    /// Restores the spec's index settings, waits until the collection is green, and reports how
    /// long that took.
    fn finish(&self, spec: &CollectionSpec) -> UploadResult<FinishReport>;

    /// Exact number of points matching the request.
    fn count(&self, request: CountRequest<'_>) -> UploadResult<u64>;

    /// One list of hits per query vector, in order, best first, with their payload.
    fn query(&self, request: QueryRequest<'_>) -> UploadResult<Vec<Vec<Hit>>>;

    /// Deletes the request's points (deleting a point that is not there is no error).
    fn delete(&self, request: DeleteRequest<'_>) -> UploadResult<()>;

    /// Sets the request's payload keys on its points (every point must exist).
    fn set_payload(&self, request: PayloadRequest<'_>) -> UploadResult<()>;

    /// The collection's live settings, `None` when it does not exist.
    fn collection_info(&self, collection: &str) -> UploadResult<Option<CollectionInfo>>;

    /// Deletes the collection; `Ok(false)` when it did not exist.
    fn delete_collection(&self, collection: &str) -> UploadResult<bool>;

    /// The identity marker embedfleet stored in `collection` ([`Sink::set_collection_marker`]),
    /// `None` when it holds none (made by someone else, before markers existed, or by a
    /// database that keeps none: the default).
    fn collection_marker(&self, collection: &str) -> UploadResult<Option<String>> {
        let _ = collection;
        Ok(None)
    }

    /// Stores `marker` as `collection`'s identity where it goes with the collection (dropping
    /// the collection drops it), so a run that recorded it can tell its collection from
    /// another. A database that keeps none does nothing (the default); the caller reads it back
    /// with [`Sink::collection_marker`] before trusting it.
    fn set_collection_marker(&self, collection: &str, marker: &str) -> UploadResult<()> {
        let _ = (collection, marker);
        Ok(())
    }

    /// Points per upsert batch when neither `--batch-size` nor `tune` says otherwise.
    fn default_batch_size(&self) -> usize {
        crate::options::DEFAULT_UPSERT_BATCH
    }

    /// Qdrant's extras, `None` for a database that is not Qdrant.
    fn qdrant(&self) -> Option<&dyn QdrantExtras> {
        None
    }
}

/// What embedfleet uses of Qdrant beyond [`Sink`]. See the module docs.
pub trait QdrantExtras: Sink {
    /// True when writes to `collection` must name a shard key (custom sharding: a collection
    /// loaded from built shards).
    fn keyed(&self, _collection: &str) -> UploadResult<bool> {
        Ok(false)
    }

    /// Creates shard key `key` of a custom-sharded collection unless it exists, owned by
    /// `owner`'s run; refused ([`UploadError::KeyOfAnotherRun`]) when another run owns it.
    fn ensure_shard_key(&self, collection: &str, key: &str, owner: &KeyOwner) -> UploadResult<()> {
        let _ = (key, owner);
        Err(shard_keys_unsupported(collection, &self.target()))
    }

    /// The Qdrant peers holding shards of `collection` (an existing one), `None` where that
    /// means nothing (the embedded engine). `upload` starts one worker process per peer.
    fn peers(&self, _collection: &str) -> UploadResult<Option<usize>> {
        Ok(None)
    }
}

/// True when writes to `collection` of `sink` must name a shard key; false for a sink without
/// shard keys.
pub fn is_keyed(sink: &dyn Sink, collection: &str) -> UploadResult<bool> {
    sink.qdrant().map_or(Ok(false), |q| q.keyed(collection))
}

/// The refusal of a request that names a shard key, by a sink that has none.
pub(crate) fn shard_keys_unsupported(collection: &str, target: &str) -> UploadError {
    UploadError::Unsupported {
        what: format!("shard keys (`{collection}` on {target})"),
    }
}
