//! [`PgVector`]: PostgreSQL with pgvector (0.8+), a [`Sink`] (no Qdrant extras).
//!
//! A collection is a table (`table.rs`): `id uuid` primary key (the point id), the vector as
//! `vector` (f32) or `halfvec` (f16, and f32 runs past 2,000 dimensions), the payload as typed
//! columns with B-tree indexes, embedfleet's identity marker in the table's comment. Rows go in
//! by binary `COPY` into a staging table and one `INSERT … ON CONFLICT` per batch (`load.rs`);
//! the vector index is built after the load (`index.rs`); searches set their effort per query
//! and scan iteratively under a filter (`search.rs`). The connection follows libpq: password
//! from `PGPASSWORD` or a pgpass file, `sslmode` and root certificates (`connect.rs`,
//! `tls.rs`).
//!
//! Every method blocks; sessions come from a pool, one per request in flight, so K threads
//! sharing the sink are K sessions.

mod config;
mod connect;
mod index;
mod load;
mod search;
mod sql;
mod table;
mod tls;

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use uuid::Uuid;

use crate::error::{UploadError, UploadResult};
use crate::request::{
    CountRequest, DeleteRequest, Hit, PayloadRequest, QueryRequest, UpsertRequest,
};
use crate::sink::{shard_keys_unsupported, Sink};
use crate::spec::{
    check_compatible, check_vector_size, CollectionInfo, CollectionSpec, Ensured, FinishReport,
    HnswParams, VectorIndex,
};

pub use config::{IterativeScan, PgConfig, PgIndex};
pub use index::{hnsw_build_bytes, ivfflat_lists};
pub use load::TEST_COPY_DELAY_ENV;
pub use table::{storage_for, Storage, MAX_HALFVEC_DIMS, MAX_VECTOR_DIMS};

use connect::{Connector, Pool};
use sql::{pg_err, quoted};
use table::Shape;

/// A PostgreSQL database with pgvector. See the module docs.
pub struct PgVector {
    config: PgConfig,
    pool: Pool,
    shapes: Mutex<HashMap<String, Shape>>,
    /// Tables this sink made: nobody queries them yet, so their index is built without
    /// `CONCURRENTLY` (faster, and a lock nobody waits on).
    made_here: Mutex<HashSet<String>>,
    extension_checked: std::sync::OnceLock<()>,
}

impl std::fmt::Debug for PgVector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgVector")
            .field("target", &self.pool.connector.target)
            .finish_non_exhaustive()
    }
}

/// A plain client of `config`'s database, its password and TLS found as the sink's are: for
/// tests, benchmarks, and SQL run beside the sink.
pub fn client(config: &PgConfig) -> UploadResult<postgres::Client> {
    Connector::new(config)?.connect()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl PgVector {
    /// Checks `config` (URL, password, TLS) and connects once, so that a wrong URL or password
    /// is said now rather than at the first batch.
    pub fn connect(config: PgConfig) -> UploadResult<Self> {
        let pool = Pool::new(Connector::new(&config)?);
        drop(pool.get()?);
        Ok(Self {
            config,
            pool,
            shapes: Mutex::new(HashMap::new()),
            made_here: Mutex::new(HashSet::new()),
            extension_checked: std::sync::OnceLock::new(),
        })
    }

    /// The table's shape, read once (a table dropped here is read again).
    fn shape(&self, name: &str) -> UploadResult<Shape> {
        if let Some(shape) = lock(&self.shapes).get(name) {
            return Ok(*shape);
        }
        let shape = self
            .fresh_shape(name)?
            .ok_or_else(|| UploadError::NoSuchCollection {
                collection: name.to_owned(),
            })?;
        Ok(shape)
    }

    fn fresh_shape(&self, name: &str) -> UploadResult<Option<Shape>> {
        table::check_table_name(name)?;
        let shape = table::shape(&mut self.pool.get()?.client, name)?;
        match shape {
            Some(s) => drop(lock(&self.shapes).insert(name.to_owned(), s)),
            None => drop(lock(&self.shapes).remove(name)),
        }
        Ok(shape)
    }

    /// pgvector in the database, 0.8 or newer (iterative scans); created if missing and allowed.
    fn check_extension(&self, client: &mut postgres::Client) -> UploadResult<()> {
        if self.extension_checked.get().is_some() {
            return Ok(());
        }
        let version = |client: &mut postgres::Client| -> UploadResult<Option<String>> {
            let rows = client
                .query(
                    "SELECT extversion FROM pg_extension WHERE extname = 'vector'",
                    &[],
                )
                .map_err(pg_err("read pgvector's version"))?;
            Ok(rows.first().map(|r| r.get(0)))
        };
        let found = match version(client)? {
            Some(v) => v,
            None => {
                client
                    .batch_execute("CREATE EXTENSION IF NOT EXISTS vector")
                    .map_err(|e| UploadError::PgNoExtension {
                        target: self.pool.connector.target.clone(),
                        message: pg_err("create the extension")(e).to_string(),
                    })?;
                version(client)?.unwrap_or_default()
            }
        };
        let numbers: Vec<u64> = found.split('.').filter_map(|p| p.parse().ok()).collect();
        if numbers.as_slice() < [0, 8].as_slice() {
            return Err(UploadError::PgNoExtension {
                target: self.pool.connector.target.clone(),
                message: format!("pgvector {found} is older than 0.8 (iterative index scans): install 0.8 or newer on the server, then `ALTER EXTENSION vector UPDATE`"),
            });
        }
        let _ = self.extension_checked.set(());
        Ok(())
    }

    /// The build's memory and workers: the configured ones, else sized from this machine when
    /// the server is on it.
    fn build_limits(&self, name: &str) -> UploadResult<index::BuildLimits> {
        let local = self.pool.connector.is_local();
        let memory_mb = self.config.maintenance_mem_mb.unwrap_or_else(|| {
            match (local, available_memory_mb()) {
                (true, Some(mb)) => (mb / 2).max(64),
                _ => 2048,
            }
        });
        let workers = match self.config.maintenance_workers {
            Some(n) => n,
            None => {
                let server: String = self
                    .pool
                    .get()?
                    .client
                    .query_one("SELECT current_setting('max_parallel_workers')", &[])
                    .map_err(pg_err("read max_parallel_workers"))?
                    .get(0);
                let server = server.parse::<u64>().unwrap_or(2);
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
                if local {
                    server.min(cores.saturating_sub(1))
                } else {
                    server
                }
            }
        };
        Ok(index::BuildLimits {
            memory_mb,
            workers,
            concurrently: !lock(&self.made_here).contains(name),
        })
    }
}

/// `MemAvailable` of this machine in MB.
fn available_memory_mb() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024)
}

fn refuse_shard_key(sink: &PgVector, collection: &str, key: Option<&str>) -> UploadResult<()> {
    match key {
        None => Ok(()),
        Some(_) => Err(shard_keys_unsupported(collection, &sink.target())),
    }
}

/// The search index an index's reloptions describe.
fn vector_index(found: &index::Found) -> Option<VectorIndex> {
    let option = |key: &str| {
        found
            .options
            .iter()
            .find_map(|o| o.strip_prefix(key)?.strip_prefix('=')?.parse::<u64>().ok())
    };
    match found.method.as_str() {
        // pgvector's defaults where the index was made without options.
        "hnsw" => Some(VectorIndex::Hnsw(HnswParams {
            m: option("m").unwrap_or(16),
            ef_construct: option("ef_construction").unwrap_or(64),
        })),
        "ivfflat" => Some(VectorIndex::IvfFlat {
            lists: option("lists").unwrap_or(100),
        }),
        _ => None,
    }
}

impl Sink for PgVector {
    fn kind(&self) -> &'static str {
        "postgres"
    }

    fn database_name(&self) -> &'static str {
        "pgvector"
    }

    fn one_process_because(&self) -> Option<&'static str> {
        // K sessions: the server, not the client, is its bottleneck.
        Some("a PostgreSQL upload is one process, a session per request in flight")
    }

    fn target(&self) -> String {
        format!("postgres:{}", self.pool.connector.target)
    }

    fn target_flag(&self) -> String {
        let url = self
            .pool
            .connector
            .target
            .replacen("postgres://", "postgresql://", 1);
        format!("--postgres {url}")
    }

    fn ensure_collection(&self, spec: &CollectionSpec) -> UploadResult<Ensured> {
        table::check_table_name(&spec.name)?;
        // Refused before anything is sent: past 4,000 dimensions no pgvector index applies.
        let (storage, note) = storage_for(spec)?;
        let mut session = self.pool.get()?;
        self.check_extension(&mut session.client)?;
        lock(&self.shapes).remove(&spec.name);
        if let Some(shape) = table::shape(&mut session.client, &spec.name)? {
            check_compatible(spec, shape.dim, shape.distance)?;
            return Ok(Ensured::Existing);
        }
        if let Some(note) = note {
            eprintln!("{note}");
        }
        if !table::create(&mut session.client, spec, storage)? {
            return Ok(Ensured::Existing);
        }
        lock(&self.made_here).insert(spec.name.clone());
        if !spec.bulk_load {
            // Not a bulk load: the index is there from the start and kept up by every insert.
            let shape = self.shape(&spec.name)?;
            let limits = self.build_limits(&spec.name)?;
            index::build(&mut session.client, spec, shape, self.config.index, limits)?;
        }
        Ok(Ensured::Created)
    }

    fn upsert(&self, request: UpsertRequest<'_>) -> UploadResult<()> {
        let UpsertRequest {
            collection, points, ..
        } = request;
        refuse_shard_key(self, collection, request.shard_key)?;
        let shape = self.shape(collection)?;
        check_vector_size(collection, shape.dim, points.dim())?;
        if points.is_empty() {
            return Ok(());
        }
        let fresh = lock(&self.made_here).contains(collection);
        let mut session = self.pool.get()?;
        load::upsert(
            &mut session,
            &quoted(collection),
            shape.storage,
            points,
            fresh,
        )
    }

    fn default_batch_size(&self) -> usize {
        load::DEFAULT_BATCH
    }

    fn checkpoint(&self, _collection: &str) -> UploadResult<()> {
        // Upserts commit without waiting for their WAL to reach the disk (`load.rs`). This
        // commit waits (sessions run with synchronous_commit on), and the WAL is flushed in
        // order: every upsert acknowledged before it is durable after it. Assigning a
        // transaction id is what gives the commit a WAL record to wait for.
        let mut session = self.pool.get()?;
        session
            .client
            .batch_execute("BEGIN; SELECT txid_current(); COMMIT")
            .map_err(pg_err("make the upserts durable"))
    }

    fn finish(&self, spec: &CollectionSpec) -> UploadResult<FinishReport> {
        let shape = self
            .fresh_shape(&spec.name)?
            .ok_or_else(|| UploadError::NoSuchCollection {
                collection: spec.name.clone(),
            })?;
        let limits = self.build_limits(&spec.name)?;
        let mut session = self.pool.get()?;
        let built = index::build(&mut session.client, spec, shape, self.config.index, limits)?;
        drop(session);
        let info =
            self.collection_info(&spec.name)?
                .ok_or_else(|| UploadError::NoSuchCollection {
                    collection: spec.name.clone(),
                })?;
        Ok(FinishReport {
            indexing: built.map_or(Duration::ZERO, |b| b.took),
            points: info.points,
            indexed_vectors: info.indexed_vectors,
        })
    }

    fn count(&self, request: CountRequest<'_>) -> UploadResult<u64> {
        refuse_shard_key(self, request.collection, request.shard_key)?;
        self.shape(request.collection)?;
        if request.ids.is_some_and(<[Uuid]>::is_empty) {
            return Ok(0);
        }
        let (mut conditions, params) = search::where_clause(request.filter, 1);
        let ids = request.ids.map(<[Uuid]>::to_vec);
        if ids.is_some() {
            conditions.push(format!("id = ANY(${})", params.len() + 1));
        }
        let mut sql = format!("SELECT count(*) FROM {}", quoted(request.collection));
        if !conditions.is_empty() {
            sql.push_str(&format!(" WHERE {}", conditions.join(" AND ")));
        }
        let mut refs: Vec<&(dyn postgres::types::ToSql + Sync)> =
            params.iter().map(|p| p.as_ref()).collect();
        if let Some(ids) = &ids {
            refs.push(ids);
        }
        let mut session = self.pool.get()?;
        let statement = session.statement(&sql).map_err(pg_err("count rows"))?;
        let n: i64 = session
            .client
            .query_one(&statement, &refs)
            .map_err(pg_err("count rows"))?
            .get(0);
        Ok(n.max(0) as u64)
    }

    fn query(&self, request: QueryRequest<'_>) -> UploadResult<Vec<Vec<Hit>>> {
        let shape = self.shape(request.collection)?;
        for v in &request.vectors {
            check_vector_size(request.collection, shape.dim, v.len())?;
        }
        let mut session = self.pool.get()?;
        search::search(
            &mut session,
            &quoted(request.collection),
            shape,
            self.config.iterative_scan,
            &request.vectors,
            &request.options,
        )
    }

    fn delete(&self, request: DeleteRequest<'_>) -> UploadResult<()> {
        refuse_shard_key(self, request.collection, request.shard_key)?;
        self.shape(request.collection)?;
        if request.ids.is_empty() {
            return Ok(());
        }
        let sql = format!(
            "DELETE FROM {} WHERE id = ANY($1)",
            quoted(request.collection)
        );
        let ids = request.ids.to_vec();
        let mut session = self.pool.get()?;
        let statement = session.statement(&sql).map_err(pg_err("delete rows"))?;
        session
            .client
            .execute(&statement, &[&ids])
            .map_err(pg_err("delete rows"))?;
        Ok(())
    }

    fn set_payload(&self, request: PayloadRequest<'_>) -> UploadResult<()> {
        refuse_shard_key(self, request.collection, request.shard_key)?;
        self.shape(request.collection)?;
        if request.ids.is_empty() {
            return Ok(());
        }
        let sql = format!(
            "UPDATE {} SET year = $2, source = $3 WHERE id = ANY($1)",
            quoted(request.collection)
        );
        let ids = request.ids.to_vec();
        let year = request.year.and_then(|y| i32::try_from(y).ok());
        let mut session = self.pool.get()?;
        let statement = session
            .statement(&sql)
            .map_err(pg_err("update the payload columns"))?;
        session
            .client
            .execute(&statement, &[&ids, &year, &request.source])
            .map_err(pg_err("update the payload columns"))?;
        Ok(())
    }

    fn collection_info(&self, collection: &str) -> UploadResult<Option<CollectionInfo>> {
        let Some(shape) = self.fresh_shape(collection)? else {
            return Ok(None);
        };
        let table = quoted(collection);
        let mut session = self.pool.get()?;
        let points: i64 = session
            .client
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .map_err(pg_err("count rows"))?
            .get(0);
        let points = points.max(0) as u64;
        let indexes = index::found(&mut session.client, &table)?;
        let building = index::building(&mut session.client, &table)?;
        let valid = indexes.iter().find(|i| i.valid);
        let broken = indexes.iter().any(|i| !i.valid && !building);
        Ok(Some(CollectionInfo {
            vector_size: shape.dim,
            distance: shape.distance,
            points,
            // An index covers every row once it is valid; a table without one is searched
            // exactly, and `eval` says so.
            indexed_vectors: if valid.is_some() { points } else { 0 },
            green: !building && !broken,
            red: broken,
            qdrant: None,
            index: valid.and_then(vector_index),
        }))
    }

    fn delete_collection(&self, collection: &str) -> UploadResult<bool> {
        table::check_table_name(collection)?;
        lock(&self.shapes).remove(collection);
        lock(&self.made_here).remove(collection);
        let mut session = self.pool.get()?;
        let existed = table::shape(&mut session.client, collection)?.is_some();
        session
            .client
            .batch_execute(&format!("DROP TABLE IF EXISTS {}", quoted(collection)))
            .map_err(pg_err("drop the table"))?;
        session.forget(collection);
        drop(session);
        self.pool.for_each_idle(|s| s.forget(collection));
        Ok(existed)
    }

    fn collection_marker(&self, collection: &str) -> UploadResult<Option<String>> {
        table::check_table_name(collection)?;
        table::marker(&mut self.pool.get()?.client, collection)
    }

    fn set_collection_marker(&self, collection: &str, marker: &str) -> UploadResult<()> {
        self.shape(collection)?;
        table::set_marker(&mut self.pool.get()?.client, collection, marker)
    }
}
