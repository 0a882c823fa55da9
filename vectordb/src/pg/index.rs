//! The vector index of a table, built after the load: HNSW (`m`, `ef_construction`) by default,
//! IVFFlat as an option (lists from the row count, as pgvector's README advises).
//!
//! The build gets parallel maintenance workers and a `maintenance_work_mem` sized from the
//! graph's estimate, within what the server and this machine allow; a graph that will not fit
//! is said before the build (pgvector then goes on, much slower, and says so too). A table
//! this process did not make may serve queries: it is indexed `CONCURRENTLY` (reads and writes
//! go on). An INVALID index, left by a concurrent build that failed or was stopped, is found,
//! said, dropped and built again.

use std::time::{Duration, Instant};

use postgres::Client;

use super::config::PgIndex;
use super::sql::{pg_err, quoted};
use super::table::{Shape, Storage};
use crate::error::UploadResult;
use crate::spec::{CollectionSpec, Distance, HnswParams};

/// A pgvector index of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Found {
    /// Schema-qualified, quoted: ready for `DROP INDEX`.
    pub name: String,
    /// `hnsw` or `ivfflat`.
    pub method: String,
    pub valid: bool,
    /// Its `WITH (…)` options, as `pg_class.reloptions` keeps them (`m=16`, `lists=100`).
    pub options: Vec<String>,
}

/// The pgvector indexes of `table` (quoted).
pub(super) fn found(client: &mut Client, table: &str) -> UploadResult<Vec<Found>> {
    let rows = client
        .query(
            "SELECT quote_ident(n.nspname) || '.' || quote_ident(ci.relname), am.amname, \
                    i.indisvalid, coalesce(ci.reloptions, '{}') \
             FROM pg_index i JOIN pg_class ci ON ci.oid = i.indexrelid \
             JOIN pg_namespace n ON n.oid = ci.relnamespace JOIN pg_am am ON am.oid = ci.relam \
             WHERE i.indrelid = to_regclass($1) AND am.amname IN ('hnsw', 'ivfflat') \
             ORDER BY ci.oid",
            &[&table],
        )
        .map_err(pg_err("read the table's indexes"))?;
    Ok(rows
        .iter()
        .map(|r| Found {
            name: r.get(0),
            method: r.get(1),
            valid: r.get(2),
            options: r.get(3),
        })
        .collect())
}

/// True while some session builds an index of `table` (quoted): an INVALID index is then one
/// being built, not one left broken.
pub(super) fn building(client: &mut Client, table: &str) -> UploadResult<bool> {
    let n: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_stat_progress_create_index WHERE relid = to_regclass($1)",
            &[&table],
        )
        .map_err(pg_err("read index builds in progress"))?
        .get(0);
    Ok(n > 0)
}

/// IVFFlat lists for `rows` rows: rows / 1000 up to a million rows, √rows above (pgvector's
/// README), at least 1.
pub fn ivfflat_lists(rows: u64) -> u64 {
    if rows <= 1_000_000 {
        (rows / 1000).max(1)
    } else {
        (rows as f64).sqrt().round() as u64
    }
}

/// The bytes pgvector's in-memory HNSW build takes for `rows` vectors: each element's vector,
/// its neighbour lists (2m on layer 0, m on the ~1/(m-1) of upper layers; 8-byte candidates),
/// and its header. An estimate to size `maintenance_work_mem`, not a promise.
pub fn hnsw_build_bytes(rows: u64, dim: usize, storage: Storage, m: u64) -> u64 {
    let element = match storage {
        Storage::Vector => 4,
        Storage::Halfvec => 2,
    };
    let vector = 8 + dim as u64 * element;
    let neighbours = (2 * m + m / (m.max(2) - 1) + 1) * 16;
    rows * (vector + neighbours + 96)
}

/// The options of an index of `kind` for a table of `rows` rows.
fn with_options(kind: PgIndex, hnsw: HnswParams, rows: u64) -> String {
    match kind {
        // pgvector refuses ef_construction below 2 m.
        PgIndex::Hnsw => format!(
            "m = {}, ef_construction = {}",
            hnsw.m,
            hnsw.ef_construct.max(2 * hnsw.m)
        ),
        PgIndex::IvfFlat => format!("lists = {}", ivfflat_lists(rows)),
    }
}

/// What [`build`] did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Built {
    pub took: Duration,
    pub rows: u64,
}

/// How the build may use the server.
#[derive(Debug, Clone, Copy)]
pub(super) struct BuildLimits {
    /// Most `maintenance_work_mem` to ask for, in MB.
    pub memory_mb: u64,
    /// Parallel maintenance workers to ask for.
    pub workers: u64,
    /// `CREATE INDEX CONCURRENTLY`: the table may be serving.
    pub concurrently: bool,
}

/// Builds `kind`'s index on the table of `spec` unless a valid one is there (an INVALID one is
/// dropped first, and said).
pub(super) fn build(
    client: &mut Client,
    spec: &CollectionSpec,
    shape: Shape,
    kind: PgIndex,
    limits: BuildLimits,
) -> UploadResult<Option<Built>> {
    let table = quoted(&spec.name);
    let existing = found(client, &table)?;
    for bad in existing.iter().filter(|i| !i.valid) {
        eprintln!(
            "note: the {} index {} of `{}` is INVALID (a concurrent build that failed or was stopped): dropping it and building it again",
            bad.method, bad.name, spec.name
        );
        client
            .batch_execute(&format!("DROP INDEX CONCURRENTLY IF EXISTS {}", bad.name))
            .map_err(pg_err("drop the invalid index"))?;
    }
    if let Some(good) = existing.iter().find(|i| i.valid) {
        if good.method != kind.method() {
            eprintln!(
                "note: `{}` keeps its {} index ({}); drop it to build {} instead",
                spec.name,
                good.method,
                good.name,
                kind.method()
            );
        }
        return Ok(None);
    }
    let rows: i64 = client
        .query_one(&format!("SELECT count(*) FROM {table}"), &[])
        .map_err(pg_err("count rows"))?
        .get(0);
    let rows = rows.max(0) as u64;
    let memory = memory_setting(client, spec, shape, kind, rows, limits.memory_mb)?;
    let distance = shape.distance.unwrap_or(Distance::Cosine);
    let sql = format!(
        "CREATE INDEX {}ON {table} USING {} (embedding {}) WITH ({})",
        if limits.concurrently {
            "CONCURRENTLY "
        } else {
            ""
        },
        kind.method(),
        shape.storage.opclass(distance),
        with_options(kind, spec.qdrant.hnsw, rows)
    );
    client
        .batch_execute(&format!(
            "SET maintenance_work_mem = '{memory}MB'; SET max_parallel_maintenance_workers = {}",
            limits.workers
        ))
        .map_err(pg_err("set the build's memory and workers"))?;
    let start = Instant::now();
    let result = client.batch_execute(&sql);
    let took = start.elapsed();
    // The session goes back to the pool: its settings go back to the server's.
    let reset =
        client.batch_execute("RESET maintenance_work_mem; RESET max_parallel_maintenance_workers");
    result.map_err(pg_err("build the vector index"))?;
    reset.map_err(pg_err("reset the build's settings"))?;
    client
        .batch_execute(&format!("ANALYZE {table}"))
        .map_err(pg_err("analyze the table"))?;
    Ok(Some(Built { took, rows }))
}

/// The `maintenance_work_mem` (MB) for the build: the graph's estimate with a quarter more,
/// at least the server's own setting, at most `cap_mb`; says when the graph will not fit.
fn memory_setting(
    client: &mut Client,
    spec: &CollectionSpec,
    shape: Shape,
    kind: PgIndex,
    rows: u64,
    cap_mb: u64,
) -> UploadResult<u64> {
    let server_kb: String = client
        .query_one(
            "SELECT setting FROM pg_settings WHERE name = 'maintenance_work_mem'",
            &[],
        )
        .map_err(pg_err("read maintenance_work_mem"))?
        .get(0);
    let server_mb = server_kb.parse::<u64>().unwrap_or(65_536) / 1024;
    if kind == PgIndex::IvfFlat {
        // IVFFlat's k-means samples rows; its memory is small beside HNSW's graph.
        return Ok(server_mb.max(cap_mb.min(1024)));
    }
    let need_mb =
        hnsw_build_bytes(rows, shape.dim, shape.storage, spec.qdrant.hnsw.m).div_ceil(1 << 20);
    let want = (need_mb + need_mb / 4).max(server_mb).max(64);
    if want > cap_mb.max(server_mb) {
        eprintln!(
            "note: the HNSW graph of `{}` ({rows} rows of {}-d {}) needs about {need_mb} MB to build in memory, more than the {} MB of maintenance_work_mem allowed: the build goes on past that point much slower (give --pg-maintenance-mem more, on a server with the memory, or load f16 vectors into halfvec)",
            spec.name,
            shape.dim,
            shape.storage.sql(),
            cap_mb.max(server_mb)
        );
        return Ok(cap_mb.max(server_mb));
    }
    Ok(want)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_follow_pgvectors_advice() {
        assert_eq!(ivfflat_lists(0), 1);
        assert_eq!(ivfflat_lists(200_000), 200);
        assert_eq!(ivfflat_lists(1_000_000), 1000);
        assert_eq!(ivfflat_lists(4_000_000), 2000);
    }

    #[test]
    fn halfvec_halves_the_vectors_of_the_graph_estimate() {
        let f32 = hnsw_build_bytes(200_000, 768, Storage::Vector, 16);
        let f16 = hnsw_build_bytes(200_000, 768, Storage::Halfvec, 16);
        // 200,000 × 768-d f32 is 614 MB of vectors alone: the graph is more.
        assert!(f32 > 614_400_000, "{f32}");
        assert_eq!(f32 - f16, 200_000 * 768 * 2);
        let options = with_options(
            PgIndex::Hnsw,
            HnswParams {
                m: 16,
                ef_construct: 20,
            },
            1,
        );
        assert_eq!(options, "m = 16, ef_construction = 32");
    }
}
