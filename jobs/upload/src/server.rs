//! [`QdrantServer`]: a Qdrant server or cluster over gRPC (`qdrant-client`).
//!
//! The sink owns a small tokio runtime and blocks on it, so it can be shared by K plain threads
//! (K requests in flight) without the caller running async code. Every call goes through
//! [`RetryPolicy`]. The API key is read once (from an environment variable or a file), handed to
//! the client and never printed: [`ServerConfig`]'s `Debug` shows only where it comes from.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use qdrant_client::qdrant::{
    self, point_id::PointIdOptions, value::Kind, vector, vectors::VectorsOptions, vectors_config,
    CollectionStatus, Condition, CountPointsBuilder, CreateCollectionBuilder,
    CreateFieldIndexCollectionBuilder, DenseVector, FieldType, Filter, HnswConfigDiffBuilder,
    OptimizersConfigDiffBuilder, PointId, QueryBatchPointsBuilder, QueryPoints, QueryPointsBuilder,
    ScalarQuantizationBuilder, SearchParamsBuilder, UpdateCollectionBuilder, UpsertPointsBuilder,
    VectorParamsBuilder,
};
use qdrant_client::{Qdrant, QdrantError};
use uuid::Uuid;

mod sharded;

pub use sharded::{KeyedShard, ServerCollection};

use super::retry::{with_retry, RetryPolicy};
use super::{
    check_collection_name, check_compatible, check_vector_size, CollectionInfo, CollectionSpec,
    Distance, Ensured, FinishReport, Hit, HnswParams, PayloadFilter, PayloadIndexKind, PointsBatch,
    SearchOptions, Sink, UploadError, UploadResult, PAYLOAD_N_CHARS, PAYLOAD_N_TOKENS,
    PAYLOAD_PAPER_ID, PAYLOAD_SOURCE, PAYLOAD_YEAR,
};

/// Where the API key comes from. The key itself is never stored in the config.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ApiKey {
    /// No API key.
    #[default]
    None,
    /// The value of this environment variable (e.g. `QDRANT_API_KEY`); unset or empty = no key.
    Env(String),
    /// The first line of this file (keep it mode 0600).
    File(PathBuf),
}

impl ApiKey {
    /// The key, read from where it comes from (`None`: no key).
    pub fn resolve(&self) -> UploadResult<Option<String>> {
        let key = match self {
            ApiKey::None => None,
            ApiKey::Env(var) => std::env::var(var).ok(),
            ApiKey::File(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| UploadError::Io {
                    action: "read the Qdrant API key file",
                    path: path.clone(),
                    source,
                })?;
                text.lines().next().map(str::to_owned)
            }
        };
        Ok(key.map(|k| k.trim().to_owned()).filter(|k| !k.is_empty()))
    }
}

/// How to reach a Qdrant server.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// `http://host:6334` or `https://host:6334` (TLS): the gRPC port.
    pub url: String,
    /// API key source.
    pub api_key: ApiKey,
    /// Per-request timeout; big batches need more than the client's 5 s default.
    pub timeout: Duration,
    /// Timeout of establishing a connection.
    pub connect_timeout: Duration,
    /// Retries of transient errors.
    pub retry: RetryPolicy,
    /// `wait=true` on upserts: the answer comes once the points are applied. With `false` the
    /// answer comes once they are in the server's WAL (durable, but not yet counted).
    pub wait: bool,
    /// How long [`Sink::finish`] waits for the collection to become green.
    pub green_timeout: Duration,
    /// Tokio worker threads of the sink's runtime.
    pub runtime_threads: usize,
    /// Send the API key over plain `http://` to a host that is not this machine (it travels in
    /// clear text); refused otherwise.
    pub allow_insecure: bool,
}

impl ServerConfig {
    /// Defaults: no API key, 120 s request timeout, 10 s connect timeout, default retries,
    /// `wait=true`, 24 h green timeout, 2 runtime threads.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            api_key: ApiKey::None,
            timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(10),
            retry: RetryPolicy::default(),
            wait: true,
            green_timeout: Duration::from_secs(24 * 3600),
            runtime_threads: 2,
            allow_insecure: false,
        }
    }
}

/// The key of the collection metadata entry holding embedfleet's identity marker.
const MARKER_METADATA: &str = "embedfleet_collection_id";

/// A Qdrant server or cluster over gRPC.
pub struct QdrantServer {
    client: Qdrant,
    runtime: tokio::runtime::Runtime,
    config: ServerConfig,
    /// Vector sizes of the collections seen, to refuse a wrong batch before sending it.
    sizes: std::sync::Mutex<HashMap<String, usize>>,
}

impl std::fmt::Debug for QdrantServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QdrantServer")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl QdrantServer {
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
                source,
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
        self.runtime
            .block_on(with_retry(&self.config.retry, action, attempt))
    }

    fn exists(&self, name: &str) -> UploadResult<bool> {
        self.retry("check whether the collection exists", || {
            self.client.collection_exists(name)
        })
    }

    fn set_indexing(&self, name: &str, hnsw: HnswParams, threshold_kb: u64) -> UploadResult<()> {
        self.retry("update the collection's index settings", || {
            self.client.update_collection(
                UpdateCollectionBuilder::new(name)
                    .hnsw_config(
                        HnswConfigDiffBuilder::default()
                            .m(hnsw.m)
                            .ef_construct(hnsw.ef_construct),
                    )
                    .optimizers_config(
                        OptimizersConfigDiffBuilder::default().indexing_threshold(threshold_kb),
                    ),
            )
        })?;
        Ok(())
    }

    fn create(&self, spec: &CollectionSpec) -> UploadResult<()> {
        let (hnsw, threshold) = if spec.bulk_load {
            (HnswParams { m: 0, ..spec.hnsw }, 0)
        } else {
            (spec.hnsw, spec.indexing_threshold_kb)
        };
        let mut request = CreateCollectionBuilder::new(&spec.name)
            .vectors_config(
                VectorParamsBuilder::new(spec.vector_size as u64, grpc_distance(spec.distance))
                    .on_disk(spec.on_disk_vectors),
            )
            .hnsw_config(
                HnswConfigDiffBuilder::default()
                    .m(hnsw.m)
                    .ef_construct(hnsw.ef_construct),
            )
            .optimizers_config(
                OptimizersConfigDiffBuilder::default().indexing_threshold(threshold),
            );
        if spec.int8_quantization {
            request = request.quantization_config(
                ScalarQuantizationBuilder::default()
                    .r#type(qdrant::QuantizationType::Int8.into())
                    .quantile(0.99)
                    .always_ram(true),
            );
        }
        if spec.custom_sharding {
            // One shard per shard key (each key is one built shard); keys are made later.
            request = request
                .sharding_method(qdrant::ShardingMethod::Custom.into())
                .shard_number(1);
        } else if let Some(n) = spec.shard_number {
            request = request.shard_number(n);
        }
        if let Some(n) = spec.replication_factor {
            request = request.replication_factor(n);
        }
        let request = request.build();
        self.retry("create the collection", || {
            self.client.create_collection(request.clone())
        })?;
        Ok(())
    }

    fn create_payload_indexes(&self, spec: &CollectionSpec) -> UploadResult<()> {
        for (field, kind) in &spec.payload_indexes {
            let field_type = match kind {
                PayloadIndexKind::Integer => FieldType::Integer,
                PayloadIndexKind::Keyword => FieldType::Keyword,
            };
            self.retry("create a payload index", || {
                self.client.create_field_index(
                    CreateFieldIndexCollectionBuilder::new(&spec.name, field, field_type)
                        .wait(true),
                )
            })?;
        }
        Ok(())
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

    /// Upserts `points`, into shard key `key` when given; refuses a batch of the wrong vector
    /// size before sending it.
    fn upsert_to(
        &self,
        collection: &str,
        key: Option<&str>,
        points: &PointsBatch<'_>,
    ) -> UploadResult<()> {
        check_vector_size(collection, self.collection_size(collection)?, points.dim())?;
        if points.is_empty() {
            return Ok(());
        }
        // Rebuilt per attempt from the borrowed batch: nothing is cloned on the happy path.
        self.retry("upsert points", || {
            let mut request = UpsertPointsBuilder::new(collection, build_point_structs(points))
                .wait(self.config.wait);
            if let Some(key) = key {
                request = request.shard_key_selector(key.to_owned());
            }
            self.client.upsert_points(request)
        })?;
        Ok(())
    }

    fn remember(&self, collection: &str, size: usize) {
        self.sizes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(collection.to_owned(), size);
    }
}

impl Sink for QdrantServer {
    fn target(&self) -> String {
        format!("server:{}", self.config.url.trim_end_matches('/'))
    }

    fn ensure_collection(&self, spec: &CollectionSpec) -> UploadResult<Ensured> {
        check_collection_name(&spec.name)?;
        let ensured = match self.collection_info(&spec.name)? {
            Some(info) => {
                check_compatible(spec, info.vector_size, info.distance)?;
                if spec.bulk_load {
                    self.set_indexing(&spec.name, HnswParams { m: 0, ..spec.hnsw }, 0)?;
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

    fn upsert(&self, collection: &str, points: &PointsBatch<'_>) -> UploadResult<()> {
        self.upsert_to(collection, None, points)
    }

    fn checkpoint(&self, _collection: &str) -> UploadResult<()> {
        // An acknowledged upsert is in the server's WAL already.
        Ok(())
    }

    fn finish(&self, spec: &CollectionSpec) -> UploadResult<FinishReport> {
        let start = Instant::now();
        self.set_indexing(&spec.name, spec.hnsw, spec.indexing_threshold_kb)?;
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

    fn count(&self, collection: &str, filter: Option<&PayloadFilter>) -> UploadResult<u64> {
        let response = self.retry("count points", || {
            let mut request = CountPointsBuilder::new(collection).exact(true);
            if let Some(f) = filter {
                request = request.filter(grpc_filter(f));
            }
            self.client.count(request)
        })?;
        Ok(response.result.map_or(0, |r| r.count))
    }

    fn search_with(
        &self,
        collection: &str,
        vector: &[f32],
        options: &SearchOptions,
    ) -> UploadResult<Vec<Hit>> {
        let response = self.retry("search points", || {
            self.client.query(query_points(collection, vector, options))
        })?;
        Ok(response.result.into_iter().map(hit_from_grpc).collect())
    }

    fn search_batch(
        &self,
        collection: &str,
        vectors: &[Vec<f32>],
        options: &SearchOptions,
    ) -> UploadResult<Vec<Vec<Hit>>> {
        let response = self.retry("search points in a batch", || {
            let queries: Vec<QueryPoints> = vectors
                .iter()
                .map(|v| query_points(collection, v, options).build())
                .collect();
            self.client
                .query_batch(QueryBatchPointsBuilder::new(collection, queries))
        })?;
        Ok(response
            .result
            .into_iter()
            .map(|r| r.result.into_iter().map(hit_from_grpc).collect())
            .collect())
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

    fn keyed(&self, collection: &str) -> UploadResult<bool> {
        Ok(self
            .server_collection(collection)?
            .is_some_and(|c| c.custom_sharding))
    }

    fn ensure_shard_key(&self, collection: &str, key: &str) -> UploadResult<()> {
        if self.keyed_shards(collection)?.iter().any(|s| s.key == key) {
            return Ok(());
        }
        self.create_shard_key(collection, key, None, None)
    }

    fn upsert_keyed(
        &self,
        collection: &str,
        key: Option<&str>,
        points: &PointsBatch<'_>,
    ) -> UploadResult<()> {
        match key {
            Some(key) => self.upsert_in_key(collection, key, points),
            None => self.upsert(collection, points),
        }
    }

    fn delete(&self, collection: &str, ids: &[Uuid], key: Option<&str>) -> UploadResult<()> {
        self.delete_ids(collection, ids, key)
    }

    fn count_ids(&self, collection: &str, ids: &[Uuid], key: Option<&str>) -> UploadResult<u64> {
        if ids.is_empty() {
            return Ok(0);
        }
        let ids: Vec<PointId> = ids.iter().map(|id| id.to_string().into()).collect();
        let response = self.retry("count points by id", || {
            let mut request = CountPointsBuilder::new(collection)
                .exact(true)
                .filter(Filter::must([Condition::has_id(ids.clone())]));
            if let Some(key) = key {
                request = request.shard_key_selector(key.to_owned());
            }
            self.client.count(request)
        })?;
        Ok(response.result.map_or(0, |r| r.count))
    }

    fn collection_marker(&self, collection: &str) -> UploadResult<Option<String>> {
        if !self.exists(collection)? {
            return Ok(None);
        }
        let response = self.retry("read the collection info", || {
            self.client.collection_info(collection)
        })?;
        let metadata = response
            .result
            .and_then(|info| info.config)
            .map(|config| config.metadata)
            .unwrap_or_default();
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
}

/// The gRPC points of `points`: one `Vec<f32>` copy (a memcpy) per vector, the id as a UUID
/// string, five payload entries. This is the whole client-side cost of a batch.
pub fn build_point_structs(points: &PointsBatch<'_>) -> Vec<qdrant::PointStruct> {
    let mut out = Vec::with_capacity(points.len());
    let mut id_buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
    for p in points.iter() {
        let id = p.id().hyphenated().encode_lower(&mut id_buf).to_owned();
        let mut payload = HashMap::with_capacity(5);
        payload.insert(PAYLOAD_PAPER_ID.to_owned(), string_value(p.paper_id));
        if let Some(year) = p.year {
            payload.insert(PAYLOAD_YEAR.to_owned(), int_value(year));
        }
        if let Some(source) = p.source {
            payload.insert(PAYLOAD_SOURCE.to_owned(), string_value(source));
        }
        if let Some(n) = p.n_chars {
            payload.insert(PAYLOAD_N_CHARS.to_owned(), int_value(i64::from(n)));
        }
        if let Some(n) = p.n_tokens {
            payload.insert(PAYLOAD_N_TOKENS.to_owned(), int_value(i64::from(n)));
        }
        out.push(qdrant::PointStruct {
            id: Some(PointId {
                point_id_options: Some(PointIdOptions::Uuid(id)),
            }),
            payload,
            vectors: Some(qdrant::Vectors {
                vectors_options: Some(VectorsOptions::Vector(qdrant::Vector {
                    vector: Some(vector::Vector::Dense(DenseVector {
                        data: p.vector.to_vec(),
                    })),
                    ..Default::default()
                })),
            }),
        });
    }
    out
}

fn string_value(s: &str) -> qdrant::Value {
    qdrant::Value {
        kind: Some(Kind::StringValue(s.to_owned())),
    }
}

fn int_value(i: i64) -> qdrant::Value {
    qdrant::Value {
        kind: Some(Kind::IntegerValue(i)),
    }
}

/// True when `url` is plain `http://` to another machine: an API key would cross the network
/// in clear text. Only a host whose every resolved address is loopback never leaves this
/// machine; the text decides nothing (`127.0.0.1.example.org` is a name like any other), and a
/// host that does not resolve is taken as another machine (the key is refused, not sent).
pub(crate) fn sends_in_clear(url: &str) -> bool {
    let Some(rest) = url.strip_prefix("http://") else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    // Credentials (`user:pass@`) are not the host.
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (host, tail) = v6.split_once(']').unwrap_or((v6, ""));
            (host, tail.strip_prefix(':'))
        }
        None => match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        },
    };
    let port = port.and_then(|p| p.parse::<u16>().ok()).unwrap_or(80);
    match std::net::ToSocketAddrs::to_socket_addrs(&(host, port)) {
        Ok(addrs) => {
            let addrs: Vec<std::net::SocketAddr> = addrs.collect();
            addrs.is_empty() || !addrs.iter().all(|a| a.ip().is_loopback())
        }
        Err(_) => true,
    }
}

fn check_url(url: &str) -> UploadResult<()> {
    let invalid = |reason: &str| UploadError::InvalidUrl {
        url: url.to_owned(),
        reason: reason.to_owned(),
    };
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| invalid("the scheme must be http or https"))?;
    if rest.trim_end_matches('/').is_empty() {
        return Err(invalid("no host"));
    }
    Ok(())
}

fn grpc_distance(d: Distance) -> qdrant::Distance {
    match d {
        Distance::Cosine => qdrant::Distance::Cosine,
        Distance::Dot => qdrant::Distance::Dot,
    }
}

/// The query of one search, as `options` say.
fn query_points(collection: &str, vector: &[f32], options: &SearchOptions) -> QueryPointsBuilder {
    let mut params = SearchParamsBuilder::default().exact(options.exact);
    if let Some(ef) = options.hnsw_ef {
        params = params.hnsw_ef(ef);
    }
    let mut request = QueryPointsBuilder::new(collection)
        .query(vector.to_vec())
        .limit(options.k as u64)
        .with_payload(true)
        .params(params);
    if let Some(f) = &options.filter {
        request = request.filter(grpc_filter(f));
    }
    request
}

fn grpc_filter(f: &PayloadFilter) -> Filter {
    let mut conditions = Vec::new();
    if f.year_min.is_some() || f.year_max.is_some() {
        let range = qdrant::Range {
            gte: f.year_min.map(|y| y as f64),
            lte: f.year_max.map(|y| y as f64),
            ..Default::default()
        };
        conditions.push(Condition::range(PAYLOAD_YEAR, range));
    }
    if let Some(source) = &f.source {
        conditions.push(Condition::matches(PAYLOAD_SOURCE, source.clone()));
    }
    Filter::must(conditions)
}

fn info_from_grpc(info: qdrant::CollectionInfo) -> CollectionInfo {
    let config = info.config.unwrap_or_default();
    let params = config
        .params
        .and_then(|p| p.vectors_config)
        .and_then(|v| v.config);
    let (vector_size, distance) = match params {
        Some(vectors_config::Config::Params(p)) => (
            p.size as usize,
            match qdrant::Distance::try_from(p.distance) {
                Ok(qdrant::Distance::Cosine) => Some(Distance::Cosine),
                Ok(qdrant::Distance::Dot) => Some(Distance::Dot),
                _ => None,
            },
        ),
        _ => (0, None),
    };
    let hnsw = config.hnsw_config.unwrap_or_default();
    let queue_empty = info.update_queue.is_none_or(|q| q.length == 0);
    CollectionInfo {
        vector_size,
        distance,
        points: info.points_count.unwrap_or(0),
        indexed_vectors: info.indexed_vectors_count.unwrap_or(0),
        hnsw: HnswParams {
            m: hnsw.m.unwrap_or(0),
            ef_construct: hnsw.ef_construct.unwrap_or(0),
        },
        indexing_threshold_kb: config
            .optimizer_config
            .and_then(|o| o.indexing_threshold)
            .unwrap_or(0),
        green: info.status == CollectionStatus::Green as i32 && queue_empty,
        red: info.status == CollectionStatus::Red as i32,
    }
}

fn hit_from_grpc(point: qdrant::ScoredPoint) -> Hit {
    let id = match point.id.and_then(|i| i.point_id_options) {
        Some(PointIdOptions::Uuid(s)) => Uuid::parse_str(&s).unwrap_or_default(),
        _ => Uuid::nil(),
    };
    let string = |key: &str| match point.payload.get(key).and_then(|v| v.kind.as_ref()) {
        Some(Kind::StringValue(s)) => Some(s.clone()),
        _ => None,
    };
    let int = |key: &str| match point.payload.get(key).and_then(|v| v.kind.as_ref()) {
        Some(Kind::IntegerValue(i)) => Some(*i),
        Some(Kind::DoubleValue(d)) => Some(*d as i64),
        _ => None,
    };
    Hit {
        id,
        score: point.score,
        paper_id: string(PAYLOAD_PAPER_ID),
        year: int(PAYLOAD_YEAR),
        source: string(PAYLOAD_SOURCE),
        n_chars: int(PAYLOAD_N_CHARS),
        n_tokens: int(PAYLOAD_N_TOKENS),
    }
}

#[cfg(test)]
mod status_tests {
    use super::*;

    #[test]
    fn a_red_collection_is_told_from_a_busy_one() {
        let with = |status: CollectionStatus| {
            info_from_grpc(qdrant::CollectionInfo {
                status: status as i32,
                ..Default::default()
            })
        };
        let red = with(CollectionStatus::Red);
        assert!(red.red && !red.green);
        let yellow = with(CollectionStatus::Yellow);
        assert!(!yellow.red && !yellow.green, "still optimizing: wait");
        assert!(with(CollectionStatus::Green).green);
    }
}

#[cfg(test)]
mod insecure_tests {
    use super::*;

    #[test]
    fn an_api_key_goes_over_plain_http_only_to_this_machine_or_when_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key");
        std::fs::write(&key, "secret\n").unwrap();
        let config = |url: &str| ServerConfig {
            api_key: ApiKey::File(key.clone()),
            ..ServerConfig::new(url)
        };
        let err = QdrantServer::connect(config("http://qdrant.example:6334")).unwrap_err();
        assert!(matches!(err, UploadError::InsecureApiKey { .. }), "{err}");
        assert!(err.to_string().contains("--allow-insecure"), "{err}");
        let allowed = ServerConfig {
            allow_insecure: true,
            ..config("http://qdrant.example:6334")
        };
        assert!(QdrantServer::connect(allowed).is_ok());
        for local in [
            "http://127.0.0.1:6334",
            "http://localhost:6334",
            "http://[::1]:6334",
        ] {
            assert!(QdrantServer::connect(config(local)).is_ok(), "{local}");
        }
        let no_key = ServerConfig::new("http://qdrant.example:6334");
        assert!(
            QdrantServer::connect(no_key).is_ok(),
            "no key, nothing to leak"
        );
        assert!(!sends_in_clear("https://qdrant.example:6334"));
    }

    #[test]
    fn loopback_is_decided_by_the_resolved_address_not_the_hosts_text() {
        for remote in [
            "http://127.0.0.1.example.org:6334",
            "http://127.0.0.1.example.org",
            "http://localhost.example.org:6334",
            "http://user@10.0.0.1:6334",
            "http://[2001:db8::1]:6334",
        ] {
            assert!(sends_in_clear(remote), "{remote}");
        }
        for local in [
            "http://127.0.0.1:6334/",
            "http://127.3.4.5:6334",
            "http://localhost:6334",
            "http://[::1]:6334",
            "http://[::1]",
        ] {
            assert!(!sends_in_clear(local), "{local}");
        }
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key");
        std::fs::write(&key, "secret\n").unwrap();
        let config = ServerConfig {
            api_key: ApiKey::File(key),
            ..ServerConfig::new("http://127.0.0.1.example.org:6334")
        };
        let err = QdrantServer::connect(config).unwrap_err();
        assert!(matches!(err, UploadError::InsecureApiKey { .. }), "{err}");
    }
}
