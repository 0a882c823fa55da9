//! The pgvector sink against a real PostgreSQL: the contract every sink passes
//! (`upload_common.rs`), then what is PostgreSQL's own (a batch sent twice, the vector types,
//! the identity marker in the table's comment, an INVALID index rebuilt, short results).
//!
//! The server is `EMBEDFLEET_PG_URL` (its password from `PGPASSFILE` or `PGPASSWORD`;
//! `.ci/pgvector/start-local-pg.sh` starts one on 127.0.0.1). Without it each test says it is
//! skipped, and fails where `EMBEDFLEET_REQUIRE_PG=1` (CI). Each test uses its own table
//! (`embedfleet_test_<name>_<pid>`) and drops it.

use crate::upload_common;

use embedfleet_upload::{CollectionSpec, PgConfig, PgVector, Sink};
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
