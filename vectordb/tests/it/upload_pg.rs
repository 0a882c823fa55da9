//! The pgvector sink against a real PostgreSQL: the contract every sink passes
//! (`upload_common.rs`), then what is PostgreSQL's own (a batch sent twice, the vector types,
//! the identity marker in the table's comment, an INVALID index rebuilt, short results).
//!
//! The server is `EMBEDFLEET_PG_URL` (its password from `PGPASSFILE` or `PGPASSWORD`;
//! `.ci/pgvector/start-local-pg.sh` starts one on 127.0.0.1). Without it each test says it is
//! skipped, and fails where `EMBEDFLEET_REQUIRE_PG=1` (CI). Each test uses its own table
//! (`embedfleet_test_<name>_<pid>`) and drops it.

use crate::upload_common;

use embedfleet_vectordb::{
    CollectionSpec, CountRequest, Ensured, IterativeScan, PayloadFilter, PgConfig, PgIndex,
    PgVector, QueryRequest, SearchOptions, Sink, UploadError, VectorDtype, VectorIndex,
};
use upload_common::*;

/// The server's URL, or `None` (the test is skipped, saying why).
pub fn pg_url(test: &str) -> Option<String> {
    match std::env::var("EMBEDFLEET_PG_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            if std::env::var("EMBEDFLEET_REQUIRE_PG").as_deref() == Ok("1") {
                panic!("{test}: EMBEDFLEET_PG_URL is not set but EMBEDFLEET_REQUIRE_PG=1; run .ci/pgvector/start-local-pg.sh");
            }
            eprintln!("skipping {test}: no PostgreSQL (set EMBEDFLEET_PG_URL; .ci/pgvector/start-local-pg.sh starts one)");
            None
        }
    }
}

/// A sink of `config` (the URL filled in) on a fresh table, dropped afterwards even on failure.
fn with_table_config(test: &str, config: PgConfig, check: impl FnOnce(&PgVector, &str)) {
    let Some(url) = pg_url(test) else {
        return;
    };
    let sink = PgVector::connect(PgConfig { url, ..config }).expect("connect");
    let name = format!("embedfleet_test_{test}_{}", std::process::id());
    let _ = sink.delete_collection(&name);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&sink, &name)));
    let _ = sink.delete_collection(&name);
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

fn with_table(test: &str, check: impl FnOnce(&dyn Sink, &str)) {
    with_table_config(test, PgConfig::new(""), |sink, name| check(sink, name));
}

#[test]
fn pg_count_equals_rows_and_reupload_is_idempotent() {
    with_table("count", check_count_and_idempotence);
}

#[test]
fn pg_payload_filters_select_matching_rows() {
    with_table("filters", check_filters);
}

#[test]
fn pg_search_finds_each_point_first_with_payload() {
    with_table("search", check_search);
}

#[test]
fn pg_requests_count_by_ids_and_filter_query_several_vectors_delete_by_id() {
    with_table("requests", check_requests);
}

#[test]
fn pg_refuses_wrong_vector_size_and_mismatched_collection() {
    with_table("refusals", check_refusals);
}

#[test]
fn pg_bulk_load_builds_the_index_after_the_load() {
    with_table("bulk", check_bulk_load);
}

#[test]
fn pg_delete_collection_removes_it() {
    with_table("delete", check_delete);
}

#[test]
fn pg_the_marker_goes_with_the_table() {
    with_table("marker", |sink, name| {
        sink.ensure_collection(&CollectionSpec::new(name, 8))
            .expect("create");
        assert_eq!(sink.collection_marker(name).unwrap(), None);
        sink.set_collection_marker(name, "m-1").unwrap();
        assert_eq!(
            sink.collection_marker(name).unwrap().as_deref(),
            Some("m-1")
        );
        assert!(sink.delete_collection(name).unwrap());
        sink.ensure_collection(&CollectionSpec::new(name, 8))
            .expect("made again");
        assert_eq!(sink.collection_marker(name).unwrap(), None, "a new table");
    });
}

/// A second run directory whose vectors were made at another precision is refused by the
/// table its first run filled (the identity in the table's comment), nothing written.
#[test]
fn pg_a_run_of_other_vectors_is_refused_by_the_table() {
    with_table("identity", |sink, name| {
        crate::upload_integrity::check_a_run_of_other_vectors_is_refused(sink, name)
    });
}

/// A plain client of the test server.
fn client(sink: &PgVector) -> postgres::Client {
    let url = std::env::var("EMBEDFLEET_PG_URL").expect("the sink was connected");
    let _ = sink;
    embedfleet_vectordb::pg::client(&PgConfig::new(url)).expect("connect")
}

fn column_type(c: &mut postgres::Client, table: &str) -> Option<String> {
    c.query_opt(
        "SELECT format_type(atttypid, atttypmod) FROM pg_attribute \
         WHERE attrelid = to_regclass($1) AND attname = 'embedding'",
        &[&format!("\"{table}\"")],
    )
    .unwrap()
    .map(|r| r.get(0))
}

#[test]
fn pg_f16_runs_go_to_halfvec_exactly_and_wide_f32_too_past_4000_nothing_is_made() {
    with_table_config("types", PgConfig::new(""), |sink, name| {
        let mut c = client(sink);
        // f16 shards: halfvec, every value as the shard holds it.
        let spec = CollectionSpec {
            vector_dtype: VectorDtype::F16,
            ..CollectionSpec::new(name, 24)
        };
        sink.ensure_collection(&spec).unwrap();
        assert_eq!(column_type(&mut c, name).as_deref(), Some("halfvec(24)"));
        upsert_in_slices(sink, name, &shard_batch_f16(0, 30, 24), 16);
        let sql = format!("SELECT paper_id, embedding FROM \"{name}\"");
        for row in c.query(&sql, &[]).unwrap() {
            let id: String = row.get(0);
            let i: usize = id[1..].parse::<usize>().unwrap() - 1_000_000;
            let stored: pgvector::HalfVector = row.get(1);
            let want: Vec<half::f16> = vector_of(i, 24, 7)
                .into_iter()
                .map(half::f16::from_f32)
                .collect();
            assert_eq!(stored.to_vec(), want, "{id}");
        }
        sink.delete_collection(name).unwrap();
        // 2,560-d f32 (Qwen3-Embedding-4B): past vector's 2,000, so halfvec.
        sink.ensure_collection(&CollectionSpec::new(name, 2560))
            .unwrap();
        assert_eq!(column_type(&mut c, name).as_deref(), Some("halfvec(2560)"));
        sink.delete_collection(name).unwrap();
        // 4,096-d (8B): refused before anything is made.
        match sink.ensure_collection(&CollectionSpec::new(name, 4096)) {
            Err(UploadError::PgTooManyDims { dim: 4096, .. }) => {}
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert_eq!(column_type(&mut c, name), None, "no table made");
        assert!(sink.collection_info(name).unwrap().is_none());
    });
}

#[test]
fn pg_an_invalid_index_is_reported_red_then_dropped_and_built_again() {
    with_table("invalid", |sink, name| {
        let dim = 16;
        let spec = CollectionSpec {
            bulk_load: true,
            ..CollectionSpec::new(name, dim)
        };
        sink.ensure_collection(&spec).unwrap();
        upsert_in_slices(sink, name, &shard_batch(0, 200, dim), 100);
        // A concurrent build that fails half-way (row 0's n_chars is 1000: division by zero)
        // leaves its index behind, INVALID.
        let url = std::env::var("EMBEDFLEET_PG_URL").unwrap();
        let mut c = embedfleet_vectordb::pg::client(&PgConfig::new(url)).unwrap();
        let failed = c.batch_execute(&format!(
            "CREATE INDEX CONCURRENTLY ON \"{name}\" USING hnsw (embedding vector_cosine_ops) \
             WHERE 1 / (n_chars - 1000) >= 0"
        ));
        assert!(failed.is_err(), "the build fails");
        let info = sink.collection_info(name).unwrap().unwrap();
        assert!(info.red && !info.green, "an INVALID index: {info:?}");
        assert_eq!(
            info.indexed_vectors, 0,
            "no valid index: searches are exact"
        );
        let report = sink.finish(&spec).unwrap();
        assert_eq!(report.indexed_vectors, 200);
        let info = sink.collection_info(name).unwrap().unwrap();
        assert!(info.green && !info.red, "{info:?}");
        let invalid: i64 = c
            .query_one(
                "SELECT count(*) FROM pg_index WHERE indrelid = to_regclass($1) AND NOT indisvalid",
                &[&format!("\"{name}\"")],
            )
            .unwrap()
            .get(0);
        assert_eq!(invalid, 0, "the INVALID index was dropped");
    });
}

/// Queries with a filter passing about a sixth of the rows, `k` = 10: pgvector's default scan
/// (40 candidates, then the filter: ~7 pass) answers short; iterative scans answer in full.
fn short_answers(sink: &PgVector, name: &str) -> (usize, usize) {
    let filter = PayloadFilter::year(2019);
    let mut short = 0;
    let queries = 30;
    for i in 0..queries {
        let v = vector_of(10_000 + i, 32, 11);
        let options = SearchOptions {
            filter: Some(filter.clone()),
            ..SearchOptions::new(10)
        };
        let hits = sink
            .query(QueryRequest::one(name, &v, options))
            .unwrap()
            .remove(0);
        assert!(hits.iter().all(|h| h.year == Some(2019)));
        assert!(
            hits.windows(2).all(|w| w[0].score >= w[1].score),
            "best first"
        );
        short += usize::from(hits.len() < 10);
    }
    (short, queries)
}

#[test]
fn pg_filtered_searches_are_short_without_iterative_scans_and_full_with_them() {
    with_table_config(
        "iterative",
        PgConfig {
            iterative_scan: IterativeScan::Off,
            ..PgConfig::new("")
        },
        |off, name| {
            let spec = CollectionSpec {
                bulk_load: true,
                ..CollectionSpec::new(name, 32)
            };
            off.ensure_collection(&spec).unwrap();
            // Enough rows that the planner takes the HNSW index under the filter (on a small
            // table it sorts the filtered rows instead: exact, and never short).
            upsert_in_slices(off, name, &shard_batch(0, 20_000, 32), 2000);
            off.finish(&spec).unwrap();
            let (short, n) = short_answers(off, name);
            assert!(short > n / 3, "pgvector's defaults: {short} of {n} short");
            let url = std::env::var("EMBEDFLEET_PG_URL").unwrap();
            let relaxed = PgVector::connect(PgConfig::new(url.clone())).unwrap();
            assert_eq!(short_answers(&relaxed, name).0, 0, "relaxed_order");
            let strict = PgVector::connect(PgConfig {
                iterative_scan: IterativeScan::Strict,
                ..PgConfig::new(url)
            })
            .unwrap();
            assert_eq!(short_answers(&strict, name).0, 0, "strict_order");
        },
    );
}

#[test]
fn pg_ivfflat_gets_lists_from_the_row_count_and_probes_per_query() {
    with_table_config(
        "ivfflat",
        PgConfig {
            index: PgIndex::IvfFlat,
            ..PgConfig::new("")
        },
        |sink, name| {
            let spec = CollectionSpec {
                bulk_load: true,
                ..CollectionSpec::new(name, 16)
            };
            sink.ensure_collection(&spec).unwrap();
            upsert_in_slices(sink, name, &shard_batch(0, 3000, 16), 1000);
            sink.finish(&spec).unwrap();
            let info = sink.collection_info(name).unwrap().unwrap();
            assert_eq!(
                info.index,
                Some(VectorIndex::IvfFlat { lists: 3 }),
                "3,000 rows / 1,000"
            );
            // Every list probed: the exact answer.
            let v = vector_of(5, 16, 7);
            let all = SearchOptions {
                probes: Some(3),
                ..SearchOptions::new(1)
            };
            let hits = sink
                .query(QueryRequest::one(name, &v, all))
                .unwrap()
                .remove(0);
            assert_eq!(hits[0].paper_id.as_deref(), Some(paper_id(5).as_str()));
        },
    );
}

#[test]
fn pg_restamps_set_the_payload_columns_and_none_clears_them() {
    with_table("restamp", |sink, name| {
        sink.ensure_collection(&CollectionSpec::new(name, 8))
            .unwrap();
        upsert_in_slices(sink, name, &shard_batch(0, 20, 8), 10);
        let ids: Vec<_> = (0..5)
            .map(|i| embedfleet_vectordb::point_id(&paper_id(i)))
            .collect();
        let request =
            embedfleet_vectordb::PayloadRequest::new(name, &ids, Some(1999), Some("pubmed"));
        sink.set_payload(request).unwrap();
        let count = |f: PayloadFilter| {
            sink.count(embedfleet_vectordb::CountRequest::new(name).filter(Some(&f)))
                .unwrap()
        };
        assert_eq!(count(PayloadFilter::year(1999)), 5);
        assert_eq!(count(PayloadFilter::source("pubmed")), 5);
        let cleared = embedfleet_vectordb::PayloadRequest::new(name, &ids[..2], None, None);
        sink.set_payload(cleared).unwrap();
        assert_eq!(count(PayloadFilter::year(1999)), 3);
        let v = vector_of(0, 8, 7);
        let hit = sink
            .query(QueryRequest::one(name, &v, SearchOptions::new(1)))
            .unwrap()
            .remove(0)
            .remove(0);
        assert_eq!((hit.year, hit.source.as_deref()), (None, None), "{hit:?}");
    });
}

/// Whether the session of `config` is encrypted, or why it could not be opened.
fn encrypted(config: PgConfig) -> Result<bool, String> {
    let mut c = embedfleet_vectordb::pg::client(&config).map_err(|e| e.to_string())?;
    let row = c
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .map_err(|e| e.to_string())?;
    Ok(row.get(0))
}

#[test]
fn pg_tls_follows_libpqs_sslmode_and_root_certificates() {
    let Some(url) = pg_url("pg_tls") else {
        return;
    };
    let Ok(ca) = std::env::var("EMBEDFLEET_PG_CA") else {
        if std::env::var("EMBEDFLEET_REQUIRE_PG").as_deref() == Ok("1") {
            panic!("pg_tls: EMBEDFLEET_PG_CA is not set but EMBEDFLEET_REQUIRE_PG=1");
        }
        eprintln!("skipping pg_tls: no EMBEDFLEET_PG_CA (the server's CA certificate)");
        return;
    };
    let with = |url: &str, query: &str| PgConfig::new(format!("{url}?{query}"));
    assert_eq!(encrypted(with(&url, "sslmode=disable")), Ok(false));
    assert_eq!(encrypted(with(&url, "sslmode=prefer")), Ok(true));
    assert_eq!(
        encrypted(with(&url, "sslmode=require")),
        Ok(true),
        "no root: not checked"
    );
    let full = format!("sslmode=verify-full&sslrootcert={ca}");
    assert_eq!(encrypted(with(&url, &full)), Ok(true));
    // The server's certificate names 127.0.0.1 only: `localhost` is the right server (the CA
    // signed it) under another name.
    let localhost = url.replace("127.0.0.1", "localhost");
    let wrong_name = encrypted(with(&localhost, &full)).unwrap_err();
    assert!(wrong_name.contains("ertificate"), "{wrong_name}");
    let ca_only = format!("sslmode=verify-ca&sslrootcert={ca}");
    assert_eq!(
        encrypted(with(&localhost, &ca_only)),
        Ok(true),
        "verify-ca: chain only"
    );
    // Roots that did not sign it (the system's) refuse it.
    let system = encrypted(with(&url, "sslmode=verify-full&sslrootcert=system")).unwrap_err();
    assert!(system.contains("ertificate"), "{system}");
    // verify-full with no root certificate at all is refused before connecting.
    let none = PgConfig::new(format!("{url}?sslmode=verify-full"));
    let refused = match embedfleet_vectordb::pg::client(&none) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("verify-full with no root certificate connected"),
    };
    assert!(refused.contains("sslrootcert"), "{refused}");
}

#[test]
fn pg_a_batch_partly_there_already_is_upserted_whole_into_a_table_made_here() {
    with_table("partly", |sink, name| {
        let dim = 8;
        let spec = CollectionSpec::new(name, dim);
        assert_eq!(sink.ensure_collection(&spec).unwrap(), Ensured::Created);
        // Copied straight in: nothing there yet.
        upsert_in_slices(sink, name, &shard_batch(0, 100, dim), 100);
        // Half of it there: the straight copy meets an id, leaves nothing, and the batch goes
        // the staging way, new rows and updated ones together.
        upsert_in_slices(sink, name, &shard_batch(50, 100, dim), 100);
        assert_eq!(sink.count(CountRequest::new(name)).unwrap(), 150);
        for i in [0, 75, 149] {
            let v = vector_of(i, dim, 7);
            let hits = sink
                .query(QueryRequest::one(name, &v, SearchOptions::new(1)))
                .unwrap()
                .remove(0);
            assert_eq!(hits[0].paper_id.as_deref(), Some(paper_id(i).as_str()));
        }
    });
}

/// Searches under `filter` at HNSW's `ef_search` `ef` (pgvector's default 40 when `None`),
/// without iterative scans: how many of 8 got fewer than 10 rows.
fn short_answers_at(sink: &PgVector, name: &str, filter: &PayloadFilter, ef: Option<u64>) -> usize {
    (0..8)
        .filter(|i| {
            let options = SearchOptions {
                filter: Some(filter.clone()),
                hnsw_ef: ef,
                ..SearchOptions::new(10)
            };
            let v = vector_of(20_000 + i, 32, 11);
            let hits = sink.query(QueryRequest::one(name, &v, options)).unwrap();
            hits[0].len() < 10
        })
        .count()
}

#[test]
fn pg_each_filtered_search_is_planned_for_its_own_values() {
    with_table_config(
        "plans",
        PgConfig {
            iterative_scan: IterativeScan::Off,
            ..PgConfig::new("")
        },
        |sink, name| {
            let spec = CollectionSpec {
                bulk_load: true,
                ..CollectionSpec::new(name, 32)
            };
            sink.ensure_collection(&spec).unwrap();
            upsert_in_slices(sink, name, &shard_batch(0, 20_000, 32), 2000);
            sink.finish(&spec).unwrap();
            // 2 % of the rows in a year of their own: planned for its own value, a search under
            // it (HNSW, ef_search 40) costs more than what PostgreSQL guesses for a plan made
            // once for any values (0.5 % of the rows passing, sorted after the year's B-tree),
            // so that after five such runs it would keep that plan for the statement.
            let url = std::env::var("EMBEDFLEET_PG_URL").unwrap();
            let mut client = embedfleet_vectordb::pg::client(&PgConfig::new(url)).unwrap();
            client
                .batch_execute(&format!(
                    "UPDATE \"{name}\" SET year = 2010 WHERE n_chars % 50 = 0; ANALYZE \"{name}\""
                ))
                .unwrap();
            short_answers_at(sink, name, &PayloadFilter::year(2010), None);
            // Then every year, through the same statement in the same session. Planned for its
            // own values, it takes the HNSW index, whose ef_search 1 yields one row at most; the
            // plan for any values would sort every row passing the year's B-tree: 10 rows.
            let wide = short_answers_at(sink, name, &PayloadFilter::years(2018, 2022), Some(1));
            assert_eq!(wide, 8, "the wide filter searched through the HNSW index");
        },
    );
}
