//! Searches of a table: one transaction per request, its search effort set with `SET LOCAL`
//! (`hnsw.ef_search`, `ivfflat.probes`), filtered searches with pgvector's iterative index
//! scans (0.8+), then one `ORDER BY embedding <=> $1 LIMIT k` per query vector.
//!
//! Without iterative scans an HNSW search takes `ef_search` candidates and then applies the
//! filter: a selective filter leaves fewer rows than asked, with no error. With
//! `relaxed_order` (the default here) the index scan goes on until `k` rows pass the filter,
//! their order only nearly sorted: the rows are sorted again (a materialized CTE, as pgvector's
//! README shows). `strict_order` keeps the order exact at some cost. IVFFlat has
//! `relaxed_order` only.

use pgvector::{HalfVector, Vector};
use postgres::types::ToSql;
use uuid::Uuid;

use super::config::IterativeScan;
use super::connect::Session;
use super::sql::pg_err;
use super::table::{Shape, Storage};
use crate::error::UploadResult;
use crate::request::{Hit, PayloadFilter, SearchOptions};
use crate::spec::Distance;

/// pgvector's bounds of `hnsw.ef_search` and `ivfflat.probes`.
const MAX_EF_SEARCH: u64 = 1000;
const MAX_PROBES: u64 = 32768;

/// The conditions of `filter` as SQL, their parameters numbered from `first`.
pub(super) fn where_clause(
    filter: Option<&PayloadFilter>,
    first: usize,
) -> (Vec<String>, Vec<Box<dyn ToSql + Sync>>) {
    let mut conditions = Vec::new();
    let mut params: Vec<Box<dyn ToSql + Sync>> = Vec::new();
    let Some(f) = filter else {
        return (conditions, params);
    };
    let clamp = |y: i64| i32::try_from(y).unwrap_or(if y < 0 { i32::MIN } else { i32::MAX });
    if let Some(min) = f.year_min {
        conditions.push(format!("year >= ${}", first + params.len()));
        params.push(Box::new(clamp(min)));
    }
    if let Some(max) = f.year_max {
        conditions.push(format!("year <= ${}", first + params.len()));
        params.push(Box::new(clamp(max)));
    }
    match f.sources.as_slice() {
        [] => {}
        [source] => {
            conditions.push(format!("source = ${}", first + params.len()));
            params.push(Box::new(source.clone()));
        }
        any => {
            conditions.push(format!("source = ANY(${})", first + params.len()));
            params.push(Box::new(any.to_vec()));
        }
    }
    (conditions, params)
}

/// The `SET LOCAL`s of a request.
fn settings(options: &SearchOptions, scan: IterativeScan) -> String {
    // A search's statement is prepared once per session, and after five executions PostgreSQL
    // may plan it once for any parameters: that plan sees neither the filter's values nor the
    // LIMIT, guesses 0.5 % of the rows pass, and sorts every row passing a B-tree scan, an exact
    // search of half the table under a wide filter (measured: recall 1.0 at 2 queries/s where
    // the HNSW scan answers in milliseconds). Planned for its own values, each query gets the
    // scan its filter calls for.
    let mut sql = String::from("BEGIN; SET LOCAL plan_cache_mode = force_custom_plan");
    if let Some(ef) = options.hnsw_ef {
        sql.push_str(&format!(
            "; SET LOCAL hnsw.ef_search = {}",
            ef.clamp(1, MAX_EF_SEARCH)
        ));
    }
    if let Some(probes) = options.probes {
        sql.push_str(&format!(
            "; SET LOCAL ivfflat.probes = {}",
            probes.clamp(1, MAX_PROBES)
        ));
    }
    if options.filter.is_some() {
        if let Some(hnsw) = scan.hnsw() {
            sql.push_str(&format!(
                "; SET LOCAL hnsw.iterative_scan = {hnsw}; SET LOCAL ivfflat.iterative_scan = relaxed_order"
            ));
        }
    }
    if options.exact {
        // No index scan: every row compared (the filter's B-tree is not needed either).
        sql.push_str("; SET LOCAL enable_indexscan = off");
    }
    sql
}

/// The query of one vector: `$1` the vector, `$2` k, filter parameters from `$3`.
fn query_sql(table: &str, shape: Shape, conditions: &[String], resort: bool) -> String {
    let op = match shape.distance.unwrap_or(Distance::Cosine) {
        Distance::Cosine => "<=>",
        Distance::Dot => "<#>",
    };
    let filter = if conditions.is_empty() {
        String::new()
    } else {
        format!(" WHERE {}", conditions.join(" AND "))
    };
    let inner = format!(
        "SELECT id, paper_id, year, source, n_chars, n_tokens, embedding {op} $1 AS distance \
         FROM {table}{filter} ORDER BY distance LIMIT $2"
    );
    if resort {
        format!("WITH found AS MATERIALIZED ({inner}) SELECT * FROM found ORDER BY distance")
    } else {
        inner
    }
}

/// Searches `table` (quoted) for each of `vectors` as `options` say: one list of hits each,
/// best first.
pub(super) fn search(
    session: &mut Session,
    table: &str,
    shape: Shape,
    scan: IterativeScan,
    vectors: &[&[f32]],
    options: &SearchOptions,
) -> UploadResult<Vec<Vec<Hit>>> {
    let (conditions, filter_params) = where_clause(options.filter.as_ref(), 3);
    let resort = options.filter.is_some() && scan == IterativeScan::Relaxed && !options.exact;
    let sql = query_sql(table, shape, &conditions, resort);
    let statement = session.statement(&sql).map_err(pg_err("search"))?;
    let k = options.k as i64;
    let begin = settings(options, scan);
    session
        .client
        .batch_execute(&begin)
        .map_err(pg_err("set the search's options"))?;
    let result = vectors
        .iter()
        .map(|v| {
            let vector: Box<dyn ToSql + Sync> = match shape.storage {
                Storage::Vector => Box::new(Vector::from(v.to_vec())),
                Storage::Halfvec => Box::new(HalfVector::from_f32_slice(v)),
            };
            let mut params: Vec<&(dyn ToSql + Sync)> = vec![vector.as_ref(), &k];
            params.extend(filter_params.iter().map(|p| p.as_ref()));
            let rows = session
                .client
                .query(&statement, &params)
                .map_err(pg_err("search"))?;
            Ok(rows.iter().map(|r| hit(r, shape)).collect())
        })
        .collect::<UploadResult<Vec<Vec<Hit>>>>();
    // Read-only: COMMIT and ROLLBACK are the same; a failed search has aborted it anyway.
    let end = session
        .client
        .batch_execute(if result.is_ok() { "COMMIT" } else { "ROLLBACK" });
    let hits = result?;
    end.map_err(pg_err("end the search"))?;
    Ok(hits)
}

fn hit(row: &postgres::Row, shape: Shape) -> Hit {
    let distance: f64 = row.get(6);
    let score = match shape.distance.unwrap_or(Distance::Cosine) {
        Distance::Cosine => 1.0 - distance,
        // `<#>` is the negative inner product.
        Distance::Dot => -distance,
    };
    Hit {
        id: row.get::<_, Uuid>(0),
        score: score as f32,
        paper_id: row.get(1),
        year: row.get::<_, Option<i32>>(2).map(i64::from),
        source: row.get(3),
        n_chars: row.get::<_, Option<i32>>(4).map(i64::from),
        n_tokens: row.get::<_, Option<i32>>(5).map(i64::from),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_becomes_numbered_conditions() {
        let f = PayloadFilter {
            sources: vec!["arxiv".into()],
            ..PayloadFilter::years(2019, 2020)
        };
        let (conditions, params) = where_clause(Some(&f), 3);
        assert_eq!(conditions, ["year >= $3", "year <= $4", "source = $5"]);
        assert_eq!(params.len(), 3);
        let any = PayloadFilter {
            sources: vec!["s2orc/train".into(), "s2orc/valid".into()],
            ..PayloadFilter::default()
        };
        assert_eq!(where_clause(Some(&any), 1).0, ["source = ANY($1)"]);
        assert!(where_clause(None, 1).0.is_empty());
    }

    #[test]
    fn filtered_searches_scan_iteratively_and_effort_is_set_locally() {
        let options = SearchOptions {
            filter: Some(PayloadFilter::year(2020)),
            hnsw_ef: Some(64),
            ..SearchOptions::new(10)
        };
        let sql = settings(&options, IterativeScan::Relaxed);
        assert!(sql.contains("SET LOCAL hnsw.ef_search = 64"), "{sql}");
        assert!(sql.contains("hnsw.iterative_scan = relaxed_order"), "{sql}");
        let strict = settings(&options, IterativeScan::Strict);
        assert!(
            strict.contains("hnsw.iterative_scan = strict_order"),
            "{strict}"
        );
        let off = settings(&options, IterativeScan::Off);
        assert!(!off.contains("iterative_scan"), "{off}");
        let unfiltered = settings(&SearchOptions::new(10), IterativeScan::Relaxed);
        assert_eq!(
            unfiltered,
            "BEGIN; SET LOCAL plan_cache_mode = force_custom_plan"
        );
    }
}
