//! [`QdrantEdge`]: the Qdrant engine in-process (`qdrant-edge`), persisted in a directory.
//!
//! Layout: `DIR/collections/NAME/` is one edge shard per collection (with embedfleet's identity
//! marker in `embedfleet-collection-id`, the engine having no metadata); `DIR/embedfleet.lock` is held
//! (an OS file lock) while a `QdrantEdge` has the directory open, because qdrant-edge has no
//! locking of its own and two processes writing one shard corrupt it.
//!
//! qdrant-edge 0.7 runs no background work: points go into a plain appendable segment and HNSW
//! is built only by [`Sink::finish`] (the engine's blocking `optimize`). Bulk-load mode also
//! stores `m = 0` so that nothing builds a graph before `finish`. The engine does not replay its
//! WAL when a shard is opened, so durability comes from flushing segments: [`Sink::checkpoint`]
//! flushes, and so does dropping the sink.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use qdrant_edge::external::ordered_float::OrderedFloat;
use qdrant_edge::external::serde_json::{Map, Value};
use qdrant_edge::{
    Condition, CountRequest as EdgeCountRequest, CreateIndex, DeletePayloadOp, EdgeConfig,
    EdgeOptimizersConfig, EdgeShard, EdgeVectorParams, FieldCondition, FieldIndexOperations,
    Filter, HasIdCondition, HnswIndexConfig, JsonPath, Match, OperationError, Payload,
    PayloadFieldSchema, PayloadOps, PayloadSchemaType, PointId, PointInsertOperations,
    PointOperations, PointStructPersisted, QuantizationConfig, QueryEnum, Range,
    ScalarQuantizationConfig, ScalarType, ScoredPoint, SearchParams, SearchRequest, SetPayloadOp,
    UpdateOperation, ValueVariants, VectorInternal, VectorStructPersisted, WithPayloadInterface,
    DEFAULT_VECTOR_NAME,
};

use crate::error::{UploadError, UploadResult};
use crate::points::{
    PointsBatch, PAYLOAD_N_CHARS, PAYLOAD_N_TOKENS, PAYLOAD_PAPER_ID, PAYLOAD_SOURCE, PAYLOAD_YEAR,
};
use crate::request::{
    CountRequest, DeleteRequest, Hit, PayloadFilter, PayloadRequest, QueryRequest, SearchOptions,
    UpsertRequest,
};
use crate::sink::{shard_keys_unsupported, QdrantExtras, Sink};
use crate::spec::{
    check_collection_name, check_compatible, check_vector_size, CollectionInfo, CollectionSpec,
    Distance, Ensured, FinishReport, HnswParams, PayloadIndexKind, QdrantIndex, VectorIndex,
};

/// The file in a collection's directory holding the identity marker embedfleet gave it.
const MARKER_FILE: &str = "embedfleet-collection-id";

/// One open collection. Updates, counts and searches share the lock; flush and optimize take it
/// exclusively (the engine's flush panics if an update holds its WAL at that moment).
type OpenShard = Arc<RwLock<EdgeShard>>;

/// The Qdrant engine in-process; one directory, one process at a time.
pub struct QdrantEdge {
    // Declared before `_lock`: shards flush on drop while the directory is still locked.
    shards: Mutex<HashMap<String, OpenShard>>,
    root: PathBuf,
    _lock: File,
}

impl std::fmt::Debug for QdrantEdge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QdrantEdge")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

fn edge_err(action: &'static str) -> impl FnOnce(OperationError) -> UploadError {
    move |e| UploadError::Edge {
        action,
        message: e.to_string(),
    }
}

fn io_err<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> UploadError + 'a {
    move |source| UploadError::Io {
        action,
        path: path.to_owned(),
        cause: source,
    }
}

/// The size of a segment of the engine's write-ahead log (qdrant-edge's default): created as a
/// sparse file and written through a memory mapping.
pub const WAL_SEGMENT_BYTES: u64 = 32 << 20;

impl QdrantEdge {
    /// Opens (creating if needed) the edge directory `root` and locks it for this process.
    /// Refused where the filesystem has less free than a segment of the engine's write-ahead
    /// log and a little more ([`UploadError::NoRoom`]): the engine writes it through a memory
    /// mapping, and a mapping the filesystem cannot back kills the process (SIGBUS) where a
    /// write would have failed.
    pub fn open(root: impl Into<PathBuf>) -> UploadResult<Self> {
        let root = root.into();
        let needed = WAL_SEGMENT_BYTES + (WAL_SEGMENT_BYTES >> 4);
        if let Ok(space) = embedfleet_core::space::space_of(&root) {
            if space.free < needed {
                return Err(UploadError::NoRoom {
                    path: root,
                    free: space.free,
                    needed,
                });
            }
        }
        let collections = root.join("collections");
        std::fs::create_dir_all(&collections)
            .map_err(io_err("create the edge directory", &collections))?;
        let lock_path = root.join("embedfleet.lock");
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io_err("open the lock file", &lock_path))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(UploadError::EdgeLocked { path: root })
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io_err("lock", &lock_path)(e)),
        }
        Ok(Self {
            shards: Mutex::new(HashMap::new()),
            root,
            _lock: lock,
        })
    }

    /// The edge directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn shard_dir(&self, name: &str) -> PathBuf {
        self.root.join("collections").join(name)
    }

    fn registry(&self) -> std::sync::MutexGuard<'_, HashMap<String, OpenShard>> {
        self.shards.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The open shard of `name`, opening it from disk if it exists there.
    fn shard(&self, name: &str) -> UploadResult<Option<OpenShard>> {
        check_collection_name(name)?;
        let mut shards = self.registry();
        if let Some(shard) = shards.get(name) {
            return Ok(Some(Arc::clone(shard)));
        }
        let dir = self.shard_dir(name);
        if !dir.join("edge_config.json").exists() {
            return Ok(None);
        }
        let shard = EdgeShard::load(&dir, None).map_err(edge_err("open the collection"))?;
        let shard = Arc::new(RwLock::new(shard));
        shards.insert(name.to_owned(), Arc::clone(&shard));
        Ok(Some(shard))
    }

    fn existing(&self, name: &str) -> UploadResult<OpenShard> {
        self.shard(name)?
            .ok_or_else(|| UploadError::NoSuchCollection {
                collection: name.to_owned(),
            })
    }

    fn create(&self, spec: &CollectionSpec) -> UploadResult<OpenShard> {
        let dir = self.shard_dir(&spec.name);
        std::fs::create_dir_all(&dir).map_err(io_err("create the collection directory", &dir))?;
        let vector = EdgeVectorParams::builder(spec.vector_size, edge_distance(spec.distance))
            .on_disk(spec.qdrant.on_disk_vectors)
            .build();
        let mut config = EdgeConfig::builder()
            .vector(DEFAULT_VECTOR_NAME, vector)
            .hnsw_config(hnsw_config(spec))
            .optimizers(optimizers(spec.qdrant.indexing_threshold_kb))
            .build();
        if spec.qdrant.int8_quantization {
            config.quantization_config = Some(QuantizationConfig::from(ScalarQuantizationConfig {
                r#type: ScalarType::Int8,
                quantile: Some(0.99),
                always_ram: Some(true),
            }));
        }
        let shard = EdgeShard::new(&dir, config).map_err(edge_err("create the collection"))?;
        let shard = Arc::new(RwLock::new(shard));
        self.registry()
            .insert(spec.name.clone(), Arc::clone(&shard));
        Ok(shard)
    }

    /// Refuses a request naming a shard key: the engine has one shard per collection.
    fn refuse_shard_key(&self, collection: &str, key: Option<&str>) -> UploadResult<()> {
        match key {
            None => Ok(()),
            Some(_) => Err(shard_keys_unsupported(collection, &self.target())),
        }
    }

    /// The nearest points to `vector` as `options` say, best first, with their payload.
    fn search(
        &self,
        collection: &str,
        vector: &[f32],
        options: &SearchOptions,
    ) -> UploadResult<Vec<Hit>> {
        let shard = self.existing(collection)?;
        check_vector_size(collection, shape(&read(&shard)).0, vector.len())?;
        let request = SearchRequest {
            query: QueryEnum::Nearest(qdrant_edge::NamedQuery {
                query: VectorInternal::Dense(vector.to_vec()),
                using: None,
            }),
            filter: options.filter.as_ref().map(edge_filter).transpose()?,
            params: Some(SearchParams {
                hnsw_ef: options.hnsw_ef.map(|ef| ef as usize),
                exact: options.exact,
                ..SearchParams::default()
            }),
            limit: options.k,
            offset: 0,
            with_payload: Some(WithPayloadInterface::Bool(true)),
            with_vector: None,
            score_threshold: None,
        };
        let points = read(&shard).search(request).map_err(edge_err("search"))?;
        Ok(points.into_iter().map(hit_from_edge).collect())
    }
}

fn hnsw_config(spec: &CollectionSpec) -> HnswIndexConfig {
    // Bulk load: m = 0 means "no graph", so an optimize before `finish` builds none.
    let m = if spec.bulk_load {
        0
    } else {
        spec.qdrant.hnsw.m
    };
    HnswIndexConfig {
        m: m as usize,
        ef_construct: spec.qdrant.hnsw.ef_construct as usize,
        ..HnswIndexConfig::default()
    }
}

fn optimizers(indexing_threshold_kb: u64) -> EdgeOptimizersConfig {
    EdgeOptimizersConfig {
        indexing_threshold: Some(indexing_threshold_kb as usize),
        ..EdgeOptimizersConfig::default()
    }
}

fn edge_distance(d: Distance) -> qdrant_edge::Distance {
    match d {
        Distance::Cosine => qdrant_edge::Distance::Cosine,
        Distance::Dot => qdrant_edge::Distance::Dot,
    }
}

/// Vector size and distance of the shard's default vector.
fn shape(shard: &EdgeShard) -> (usize, Option<Distance>) {
    let config = shard.config();
    match config.vectors.get(DEFAULT_VECTOR_NAME) {
        Some(v) => (
            v.size,
            match v.distance {
                qdrant_edge::Distance::Cosine => Some(Distance::Cosine),
                qdrant_edge::Distance::Dot => Some(Distance::Dot),
                _ => None,
            },
        ),
        None => (0, None),
    }
}

fn read(shard: &OpenShard) -> std::sync::RwLockReadGuard<'_, EdgeShard> {
    shard.read().unwrap_or_else(|p| p.into_inner())
}

fn write(shard: &OpenShard) -> std::sync::RwLockWriteGuard<'_, EdgeShard> {
    shard.write().unwrap_or_else(|p| p.into_inner())
}

/// A payload key as the engine's path type; our keys are plain names, so this cannot fail.
fn json_path(key: &str) -> UploadResult<JsonPath> {
    key.parse().map_err(|_| UploadError::Edge {
        action: "parse a payload key",
        message: format!("`{key}` is not a valid payload key"),
    })
}

fn create_payload_indexes(shard: &EdgeShard, spec: &CollectionSpec) -> UploadResult<()> {
    for (field, kind) in &spec.payload_indexes {
        let schema = match kind {
            PayloadIndexKind::Integer => PayloadSchemaType::Integer,
            PayloadIndexKind::Keyword => PayloadSchemaType::Keyword,
        };
        let op = FieldIndexOperations::CreateIndex(CreateIndex {
            field_name: json_path(field)?,
            field_schema: Some(PayloadFieldSchema::FieldType(schema)),
        });
        shard
            .update(UpdateOperation::FieldIndexOperation(op))
            .map_err(edge_err("create a payload index"))?;
    }
    Ok(())
}

impl Sink for QdrantEdge {
    fn kind(&self) -> &'static str {
        "edge"
    }

    fn database_name(&self) -> &'static str {
        "qdrant (embedded)"
    }

    fn one_process_because(&self) -> Option<&'static str> {
        Some("the embedded engine is one process")
    }

    fn target(&self) -> String {
        // Canonical, so `--edge run/qdrant` and the default `<run-dir>/qdrant` are one target.
        let dir = std::fs::canonicalize(&self.root).unwrap_or_else(|_| self.root.clone());
        format!("edge:{}", dir.display())
    }

    fn target_flag(&self) -> String {
        format!("--edge {}", self.root.display())
    }

    fn ensure_collection(&self, spec: &CollectionSpec) -> UploadResult<Ensured> {
        check_collection_name(&spec.name)?;
        let (shard, ensured) = match self.shard(&spec.name)? {
            Some(shard) => {
                let (size, distance) = shape(&read(&shard));
                check_compatible(spec, size, distance)?;
                if spec.bulk_load {
                    write(&shard)
                        .set_hnsw_config(hnsw_config(spec))
                        .map_err(edge_err("defer indexing"))?;
                }
                (shard, Ensured::Existing)
            }
            None => (self.create(spec)?, Ensured::Created),
        };
        // Creating an index that exists rebuilds it from the stored points: only on creation.
        if ensured == Ensured::Created {
            create_payload_indexes(&read(&shard), spec)?;
        }
        Ok(ensured)
    }

    fn upsert(&self, request: UpsertRequest<'_>) -> UploadResult<()> {
        let UpsertRequest {
            collection, points, ..
        } = request;
        self.refuse_shard_key(collection, request.shard_key)?;
        let shard = self.existing(collection)?;
        let shard = read(&shard);
        check_vector_size(collection, shape(&shard).0, points.dim())?;
        if points.is_empty() {
            return Ok(());
        }
        let list = edge_points(points);
        let op = UpdateOperation::PointOperation(PointOperations::UpsertPoints(
            PointInsertOperations::PointsList(list),
        ));
        shard.update(op).map_err(edge_err("upsert points"))
    }

    fn checkpoint(&self, collection: &str) -> UploadResult<()> {
        let shard = self.existing(collection)?;
        write(&shard).flush();
        Ok(())
    }

    fn finish(&self, spec: &CollectionSpec) -> UploadResult<FinishReport> {
        let shard = self.existing(&spec.name)?;
        let shard = write(&shard);
        let restored = CollectionSpec {
            bulk_load: false,
            ..spec.clone()
        };
        shard
            .set_hnsw_config(hnsw_config(&restored))
            .map_err(edge_err("restore the HNSW settings"))?;
        shard
            .set_optimizers_config(optimizers(spec.qdrant.indexing_threshold_kb))
            .map_err(edge_err("restore the indexing threshold"))?;
        let start = Instant::now();
        shard.optimize().map_err(edge_err("build the index"))?;
        let indexing = start.elapsed();
        shard.flush();
        let info = shard.info();
        Ok(FinishReport {
            indexing,
            points: info.points_count as u64,
            indexed_vectors: info.indexed_vectors_count as u64,
        })
    }

    fn count(&self, request: CountRequest<'_>) -> UploadResult<u64> {
        let collection = request.collection;
        self.refuse_shard_key(collection, request.shard_key)?;
        let mut filter = request.filter.map(edge_filter).transpose()?;
        let action = match request.ids {
            None => "count points",
            Some([]) => return Ok(0),
            Some(ids) => {
                let has_id: HasIdCondition = ids.iter().map(|id| PointId::Uuid(*id)).collect();
                let must = filter
                    .get_or_insert_with(Filter::default)
                    .must
                    .get_or_insert_with(Vec::new);
                must.push(Condition::HasId(has_id));
                "count points by id"
            }
        };
        let shard = self.existing(collection)?;
        let request = EdgeCountRequest {
            filter,
            exact: true,
        };
        let n = read(&shard).count(request).map_err(edge_err(action))?;
        Ok(n as u64)
    }

    fn query(&self, request: QueryRequest<'_>) -> UploadResult<Vec<Vec<Hit>>> {
        // The engine searches one vector at a time: one after another.
        request
            .vectors
            .iter()
            .map(|vector| self.search(request.collection, vector, &request.options))
            .collect()
    }

    fn collection_info(&self, collection: &str) -> UploadResult<Option<CollectionInfo>> {
        let Some(shard) = self.shard(collection)? else {
            return Ok(None);
        };
        let shard = read(&shard);
        let (vector_size, distance) = shape(&shard);
        let info = shard.info();
        let config = shard.config();
        let hnsw = HnswParams {
            m: config.hnsw_config.m as u64,
            ef_construct: config.hnsw_config.ef_construct as u64,
        };
        Ok(Some(CollectionInfo {
            vector_size,
            distance,
            points: info.points_count as u64,
            indexed_vectors: info.indexed_vectors_count as u64,
            // Nothing runs in the background: what is stored is all there is.
            green: true,
            red: false,
            qdrant: Some(QdrantIndex {
                hnsw,
                indexing_threshold_kb: config.optimizers.get_indexing_threshold_kb() as u64,
            }),
            index: (hnsw.m > 0).then_some(VectorIndex::Hnsw(hnsw)),
        }))
    }

    fn delete(&self, request: DeleteRequest<'_>) -> UploadResult<()> {
        let DeleteRequest {
            collection, ids, ..
        } = request;
        self.refuse_shard_key(collection, request.shard_key)?;
        if ids.is_empty() {
            return Ok(());
        }
        let shard = self.existing(collection)?;
        let op = UpdateOperation::PointOperation(PointOperations::DeletePoints {
            ids: ids.iter().map(|id| PointId::Uuid(*id)).collect(),
        });
        let result = read(&shard).update(op).map_err(edge_err("delete points"));
        result
    }

    fn set_payload(&self, request: PayloadRequest<'_>) -> UploadResult<()> {
        self.refuse_shard_key(request.collection, request.shard_key)?;
        if request.ids.is_empty() {
            return Ok(());
        }
        let shard = self.existing(request.collection)?;
        let points: Vec<PointId> = request.ids.iter().map(|id| PointId::Uuid(*id)).collect();
        let mut set = Map::new();
        let mut remove = Vec::new();
        match request.year {
            Some(year) => drop(set.insert(PAYLOAD_YEAR.to_owned(), Value::from(year))),
            None => remove.push(json_path(PAYLOAD_YEAR)?),
        }
        match request.source {
            Some(source) => drop(set.insert(PAYLOAD_SOURCE.to_owned(), Value::from(source))),
            None => remove.push(json_path(PAYLOAD_SOURCE)?),
        }
        if !set.is_empty() {
            let op = UpdateOperation::PayloadOperation(PayloadOps::SetPayload(SetPayloadOp {
                payload: Payload(set),
                points: Some(points.clone()),
                filter: None,
                key: None,
            }));
            read(&shard).update(op).map_err(edge_err("set payload"))?;
        }
        if !remove.is_empty() {
            let op =
                UpdateOperation::PayloadOperation(PayloadOps::DeletePayload(DeletePayloadOp {
                    keys: remove,
                    points: Some(points),
                    filter: None,
                }));
            read(&shard)
                .update(op)
                .map_err(edge_err("delete payload keys"))?;
        }
        Ok(())
    }

    fn delete_collection(&self, collection: &str) -> UploadResult<bool> {
        check_collection_name(collection)?;
        // Dropping the last handle flushes the shard; then its files go.
        drop(self.registry().remove(collection));
        let dir = self.shard_dir(collection);
        if !dir.exists() {
            return Ok(false);
        }
        std::fs::remove_dir_all(&dir).map_err(io_err("delete the collection directory", &dir))?;
        Ok(true)
    }

    // The engine keeps no metadata: the marker is a file in the collection's directory.
    fn collection_marker(&self, collection: &str) -> UploadResult<Option<String>> {
        check_collection_name(collection)?;
        let path = self.shard_dir(collection).join(MARKER_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(Some(text.trim().to_owned()).filter(|m| !m.is_empty())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err("read the collection marker", &path)(e)),
        }
    }

    fn set_collection_marker(&self, collection: &str, marker: &str) -> UploadResult<()> {
        // The engine keeps no metadata of its own: the marker is a file in the collection's
        // directory, so it goes wherever the collection goes (removed, replaced, restored).
        self.existing(collection)?;
        let path = self.shard_dir(collection).join(MARKER_FILE);
        embedfleet_core::atomic::write(&path, format!("{marker}\n").as_bytes())
            .map_err(io_err("write the collection marker", &path))
    }

    fn qdrant(&self) -> Option<&dyn QdrantExtras> {
        Some(self)
    }
}

/// The engine has one shard per collection: no shard keys, no peers.
impl QdrantExtras for QdrantEdge {}

/// The edge points of `points`: one vector copy and a five-entry payload map per point.
fn edge_points(points: &PointsBatch<'_>) -> Vec<PointStructPersisted> {
    points
        .iter()
        .map(|p| {
            let mut payload = Map::new();
            payload.insert(PAYLOAD_PAPER_ID.to_owned(), Value::from(p.paper_id));
            if let Some(year) = p.year {
                payload.insert(PAYLOAD_YEAR.to_owned(), Value::from(year));
            }
            if let Some(source) = p.source {
                payload.insert(PAYLOAD_SOURCE.to_owned(), Value::from(source));
            }
            if let Some(n) = p.n_chars {
                payload.insert(PAYLOAD_N_CHARS.to_owned(), Value::from(n));
            }
            if let Some(n) = p.n_tokens {
                payload.insert(PAYLOAD_N_TOKENS.to_owned(), Value::from(n));
            }
            PointStructPersisted {
                id: PointId::Uuid(p.id()),
                vector: VectorStructPersisted::Single(p.vector.to_vec()),
                payload: Some(Payload(payload)),
            }
        })
        .collect()
}

fn edge_filter(f: &PayloadFilter) -> UploadResult<Filter> {
    let mut must = Vec::new();
    if f.year_min.is_some() || f.year_max.is_some() {
        let range = Range {
            gte: f.year_min.map(|y| OrderedFloat(y as f64)),
            lte: f.year_max.map(|y| OrderedFloat(y as f64)),
            lt: None,
            gt: None,
        };
        must.push(Condition::Field(FieldCondition::new_range(
            json_path(PAYLOAD_YEAR)?,
            range,
        )));
    }
    let sources = match f.sources.as_slice() {
        [] => None,
        [source] => Some(Match::new_value(ValueVariants::String(source.clone()))),
        any => Some(Match::from(any.to_vec())),
    };
    if let Some(value) = sources {
        must.push(Condition::Field(FieldCondition::new_match(
            json_path(PAYLOAD_SOURCE)?,
            value,
        )));
    }
    Ok(Filter {
        must: Some(must),
        ..Filter::default()
    })
}

fn hit_from_edge(point: ScoredPoint) -> Hit {
    let id = match point.id {
        PointId::Uuid(u) => u,
        PointId::NumId(_) => uuid::Uuid::nil(),
    };
    let payload = point.payload.map(|p| p.0).unwrap_or_default();
    let string = |key: &str| payload.get(key).and_then(Value::as_str).map(str::to_owned);
    let int = |key: &str| payload.get(key).and_then(Value::as_i64);
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
