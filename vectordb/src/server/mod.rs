//! [`QdrantServer`]: a Qdrant server or cluster over gRPC (`qdrant-client`).
//!
//! The sink owns a small tokio runtime and blocks on it, so it can be shared by K plain threads
//! (K requests in flight) without the caller running async code. Every call goes through
//! [`RetryPolicy`](crate::RetryPolicy). The API key is read once (from an environment variable
//! or a file), handed to the client and never printed: [`ServerConfig`]'s `Debug` shows only
//! where it comes from.
//!
//! A module per concern: `config` (where the server is and its API key, and where that key may
//! go), `collection` (creating and configuring collections, reading their state), `points`
//! (points to and from gRPC, upserts, queries), `sharded` (custom sharding: shard keys, where
//! they live, their owners). This file holds the connection and the [`Sink`] and
//! [`QdrantExtras`] implementations over them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use qdrant_client::qdrant::{
    value::Kind, Condition, CountPointsBuilder, DeletePayloadPointsBuilder, DeletePointsBuilder,
    Filter, PointId, PointsIdsList, QueryBatchPointsBuilder, QueryPoints, SetPayloadPointsBuilder,
    UpdateCollectionBuilder,
};
use qdrant_client::{Qdrant, QdrantError};

mod collection;
mod config;
mod points;
mod sharded;

pub use config::{check_url, is_this_machine, sends_in_clear, ApiKey, ServerConfig};
pub use points::build_point_structs;
pub use sharded::{KeyedShard, ServerCollection};

use collection::info_from_grpc;
use points::{grpc_filter, hit_from_grpc, query_points, string_value};

use crate::error::{UploadError, UploadResult};
use crate::outage::Outage;
use crate::points::{PAYLOAD_SOURCE, PAYLOAD_YEAR};
use crate::request::{
    CountRequest, DeleteRequest, Hit, PayloadRequest, QueryRequest, UpsertRequest,
};
use crate::retry::with_retry;
use crate::shard_keys::KeyOwner;
use crate::sink::{QdrantExtras, Sink};
use crate::spec::{
    check_collection_name, check_compatible, CollectionInfo, CollectionSpec, Ensured, FinishReport,
    HnswParams,
};

/// The key of the collection metadata entry holding embedfleet's identity marker.
const MARKER_METADATA: &str = "embedfleet_collection_id";

/// A Qdrant server or cluster over gRPC.
pub struct QdrantServer {
    client: Qdrant,
    runtime: tokio::runtime::Runtime,
    config: ServerConfig,
    /// Vector sizes of the collections seen, to refuse a wrong batch before sending it.
    sizes: std::sync::Mutex<HashMap<String, usize>>,
    /// Whether the server has stopped answering, shared by every request (`outage.rs`).
    outage: Outage,
}

impl std::fmt::Debug for QdrantServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QdrantServer")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl QdrantServer {
    /// The collection's metadata (Qdrant 1.16+; empty when it has none): embedfleet keeps its
    /// identity marker and the owners of shard keys there.
    pub(crate) fn collection_metadata(
        &self,
        collection: &str,
    ) -> UploadResult<HashMap<String, qdrant_client::qdrant::Value>> {
        let response = self.retry("read the collection info", || {
            self.client.collection_info(collection)
        })?;
        Ok(response
            .result
            .and_then(|info| info.config)
            .map(|config| config.metadata)
            .unwrap_or_default())
    }

    /// Builds the client. Connects lazily: the first call reports an unreachable server.
    pub fn connect(config: ServerConfig) -> UploadResult<Self> {
        check_url(&config.url)?;
        let api_key = config.api_key.resolve()?;
        if api_key.is_some() && !config.allow_insecure && sends_in_clear(&config.url) {
            return Err(UploadError::InsecureApiKey {
                url: config.url.clone(),
            });
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(config.runtime_threads.max(1))
            .thread_name("qdrant-grpc")
            .enable_all()
            .build()
            .map_err(|source| UploadError::Io {
                action: "start the gRPC runtime for",
                path: PathBuf::from(&config.url),
                cause: source,
            })?;
        let client = {
            let _guard = runtime.enter();
            Qdrant::from_url(&config.url)
                .api_key(api_key)
                .timeout(config.timeout)
                .connect_timeout(config.connect_timeout)
                // The check prints to stdout and costs a round trip; the first call reports errors.
                .skip_compatibility_check()
                .build()
                .map_err(|e| UploadError::InvalidUrl {
                    url: config.url.clone(),
                    reason: e.to_string(),
                })?
        };
        Ok(Self {
            client,
            runtime,
            outage: Outage::new(&config.url, config.retry.outage_limits()),
            config,
            sizes: Default::default(),
        })
    }

    /// The configuration this sink was built with (the API key is not in it).
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    fn retry<T, F, Fut>(&self, action: &'static str, attempt: F) -> UploadResult<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, QdrantError>>,
    {
        self.runtime.block_on(with_retry(
            &self.config.retry,
            &self.outage,
            action,
            attempt,
        ))
    }

    fn exists(&self, name: &str) -> UploadResult<bool> {
        self.retry("check whether the collection exists", || {
            self.client.collection_exists(name)
        })
    }

    fn collection_size(&self, collection: &str) -> UploadResult<usize> {
        if let Some(size) = self
            .sizes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(collection)
        {
            return Ok(*size);
        }
        let info =
            self.collection_info(collection)?
                .ok_or_else(|| UploadError::NoSuchCollection {
                    collection: collection.to_owned(),
                })?;
        self.remember(collection, info.vector_size);
        Ok(info.vector_size)
    }

    fn remember(&self, collection: &str, size: usize) {
        self.sizes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(collection.to_owned(), size);
    }
}

impl Sink for QdrantServer {
    fn kind(&self) -> &'static str {
        "server"
    }

    fn database_name(&self) -> &'static str {
        "qdrant (server)"
    }

    fn target(&self) -> String {
        format!("server:{}", self.config.url.trim_end_matches('/'))
    }

    fn target_flag(&self) -> String {
        format!("--qdrant {}", self.config.url.trim_end_matches('/'))
    }

    fn ensure_collection(&self, spec: &CollectionSpec) -> UploadResult<Ensured> {
        check_collection_name(&spec.name)?;
        let ensured = match self.collection_info(&spec.name)? {
            Some(info) => {
                check_compatible(spec, info.vector_size, info.distance)?;
                if spec.bulk_load {
                    self.set_indexing(
                        &spec.name,
                        HnswParams {
                            m: 0,
                            ..spec.qdrant.hnsw
                        },
                        0,
                    )?;
                }
                Ensured::Existing
            }
            None => {
                self.create(spec)?;
                Ensured::Created
            }
        };
        // Indexes before data; creating an existing index again is a no-op on the server.
        self.create_payload_indexes(spec)?;
        self.remember(&spec.name, spec.vector_size);
        Ok(ensured)
    }

    fn upsert(&self, request: UpsertRequest<'_>) -> UploadResult<()> {
        self.upsert_points(request)
    }

    fn checkpoint(&self, _collection: &str) -> UploadResult<()> {
        // An acknowledged upsert is in the server's WAL already.
        Ok(())
    }

    fn finish(&self, spec: &CollectionSpec) -> UploadResult<FinishReport> {
        let start = Instant::now();
        self.set_indexing(
            &spec.name,
            spec.qdrant.hnsw,
            spec.qdrant.indexing_threshold_kb,
        )?;
        // The optimizers may not have picked the change up yet: look again after a moment.
        std::thread::sleep(Duration::from_millis(500));
        loop {
            let info =
                self.collection_info(&spec.name)?
                    .ok_or_else(|| UploadError::NoSuchCollection {
                        collection: spec.name.clone(),
                    })?;
            if info.green {
                return Ok(FinishReport {
                    indexing: start.elapsed(),
                    points: info.points,
                    indexed_vectors: info.indexed_vectors,
                });
            }
            if info.red {
                // An optimizer failed: waiting (up to the green timeout) cannot help.
                return Err(UploadError::NotGreen {
                    collection: spec.name.clone(),
                    waited_s: start.elapsed().as_secs(),
                    status: "red: an optimization failed; the server's log says why (disk full, out of memory); fix it, then `embedfleet upload` again".to_owned(),
                });
            }
            if start.elapsed() > self.config.green_timeout {
                return Err(UploadError::NotGreen {
                    collection: spec.name.clone(),
                    waited_s: start.elapsed().as_secs(),
                    status: "not green".to_owned(),
                });
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    fn count(&self, request: CountRequest<'_>) -> UploadResult<u64> {
        let mut filter = request.filter.map(grpc_filter);
        let action = match request.ids {
            None => "count points",
            Some([]) => return Ok(0),
            Some(ids) => {
                let ids: Vec<PointId> = ids.iter().map(|id| id.to_string().into()).collect();
                let filter = filter.get_or_insert_with(Filter::default);
                filter.must.push(Condition::has_id(ids));
                "count points by id"
            }
        };
        let response = self.retry(action, || {
            let mut count = CountPointsBuilder::new(request.collection).exact(true);
            if let Some(filter) = &filter {
                count = count.filter(filter.clone());
            }
            if let Some(key) = request.shard_key {
                count = count.shard_key_selector(key.to_owned());
            }
            self.client.count(count)
        })?;
        Ok(response.result.map_or(0, |r| r.count))
    }

    fn query(&self, request: QueryRequest<'_>) -> UploadResult<Vec<Vec<Hit>>> {
        let QueryRequest {
            collection,
            vectors,
            options,
        } = &request;
        if vectors.is_empty() {
            return Ok(Vec::new());
        }
        if let [vector] = vectors.as_slice() {
            let response = self.retry("search points", || {
                self.client.query(query_points(collection, vector, options))
            })?;
            return Ok(vec![response
                .result
                .into_iter()
                .map(hit_from_grpc)
                .collect()]);
        }
        let response = self.retry("search points in a batch", || {
            let queries: Vec<QueryPoints> = vectors
                .iter()
                .map(|v| query_points(collection, v, options).build())
                .collect();
            self.client
                .query_batch(QueryBatchPointsBuilder::new(*collection, queries))
        })?;
        Ok(response
            .result
            .into_iter()
            .map(|r| r.result.into_iter().map(hit_from_grpc).collect())
            .collect())
    }

    fn delete(&self, request: DeleteRequest<'_>) -> UploadResult<()> {
        if request.ids.is_empty() {
            return Ok(());
        }
        let ids: Vec<PointId> = request.ids.iter().map(|id| id.to_string().into()).collect();
        self.retry("delete points", || {
            let mut delete = DeletePointsBuilder::new(request.collection)
                .points(PointsIdsList { ids: ids.clone() })
                .wait(true);
            if let Some(key) = request.shard_key {
                delete = delete.shard_key_selector(key.to_owned());
            }
            self.client.delete_points(delete)
        })?;
        Ok(())
    }

    fn set_payload(&self, request: PayloadRequest<'_>) -> UploadResult<()> {
        if request.ids.is_empty() {
            return Ok(());
        }
        let ids: Vec<PointId> = request.ids.iter().map(|id| id.to_string().into()).collect();
        let mut set: HashMap<String, qdrant_client::qdrant::Value> = HashMap::new();
        let mut remove = Vec::new();
        match request.year {
            Some(year) => drop(set.insert(PAYLOAD_YEAR.to_owned(), year.into())),
            None => remove.push(PAYLOAD_YEAR.to_owned()),
        }
        match request.source {
            Some(source) => drop(set.insert(PAYLOAD_SOURCE.to_owned(), source.into())),
            None => remove.push(PAYLOAD_SOURCE.to_owned()),
        }
        if !set.is_empty() {
            self.retry("set payload", || {
                let mut op = SetPayloadPointsBuilder::new(request.collection, set.clone())
                    .points_selector(PointsIdsList { ids: ids.clone() })
                    .wait(true);
                if let Some(key) = request.shard_key {
                    op = op.shard_key_selector(key.to_owned());
                }
                self.client.set_payload(op)
            })?;
        }
        if !remove.is_empty() {
            self.retry("delete payload keys", || {
                let mut op = DeletePayloadPointsBuilder::new(request.collection, remove.clone())
                    .points_selector(PointsIdsList { ids: ids.clone() })
                    .wait(true);
                if let Some(key) = request.shard_key {
                    op = op.shard_key_selector(key.to_owned());
                }
                self.client.delete_payload(op)
            })?;
        }
        Ok(())
    }

    fn collection_info(&self, collection: &str) -> UploadResult<Option<CollectionInfo>> {
        if !self.exists(collection)? {
            return Ok(None);
        }
        let response = self.retry("read the collection info", || {
            self.client.collection_info(collection)
        })?;
        Ok(response.result.map(info_from_grpc))
    }

    fn delete_collection(&self, collection: &str) -> UploadResult<bool> {
        self.sizes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(collection);
        if !self.exists(collection)? {
            return Ok(false);
        }
        let response = self.retry("delete the collection", || {
            self.client.delete_collection(collection)
        })?;
        Ok(response.result)
    }

    fn collection_marker(&self, collection: &str) -> UploadResult<Option<String>> {
        if !self.exists(collection)? {
            return Ok(None);
        }
        let metadata = self.collection_metadata(collection)?;
        Ok(
            match metadata.get(MARKER_METADATA).and_then(|v| v.kind.as_ref()) {
                Some(Kind::StringValue(marker)) => Some(marker.clone()),
                _ => None,
            },
        )
    }

    fn set_collection_marker(&self, collection: &str, marker: &str) -> UploadResult<()> {
        // Qdrant 1.16+ keeps a collection's `metadata` with its config (merged on update), and a
        // dropped collection's goes with it. An older server drops the field: the upload reads the
        // marker back and, finding none, relies on its per-batch counts alone.
        let mut request = UpdateCollectionBuilder::new(collection).build();
        request
            .metadata
            .insert(MARKER_METADATA.to_owned(), string_value(marker));
        self.retry("store the collection's marker", || {
            self.client.update_collection(request.clone())
        })?;
        Ok(())
    }

    fn qdrant(&self) -> Option<&dyn QdrantExtras> {
        Some(self)
    }
}

impl QdrantExtras for QdrantServer {
    fn keyed(&self, collection: &str) -> UploadResult<bool> {
        Ok(self
            .server_collection(collection)?
            .is_some_and(|c| c.custom_sharding))
    }

    fn ensure_shard_key(&self, collection: &str, key: &str, owner: &KeyOwner) -> UploadResult<()> {
        self.claim_shard_key(collection, key, owner, false)?;
        if self.keyed_shards(collection)?.iter().any(|s| s.key == key) {
            return Ok(());
        }
        self.create_shard_key(collection, key, &[], None)
    }

    fn peers(&self, collection: &str) -> UploadResult<Option<usize>> {
        let info = self.retry("read the collection's cluster info", || {
            self.client.collection_cluster_info(collection)
        })?;
        let mut peers: Vec<u64> = info.remote_shards.iter().map(|s| s.peer_id).collect();
        if !info.local_shards.is_empty() {
            peers.push(info.peer_id);
        }
        peers.sort_unstable();
        peers.dedup();
        Ok(Some(peers.len().max(1)))
    }
}
