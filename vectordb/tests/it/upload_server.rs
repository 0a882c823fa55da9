//! The server sink against a real Qdrant: run where `QDRANT_URL` is set (e.g.
//! `QDRANT_URL=http://127.0.0.1:6334`; `QDRANT_API_KEY` is used when set), said to be skipped
//! where it is not, and failed instead under `EMBEDFLEET_REQUIRE_QDRANT_SERVER=1` (CI).
//! Each test uses its own collection (`embedfleet-test-<name>-<pid>`) and deletes it.

use crate::upload_common;

use std::time::Duration;

use embedfleet_vectordb::{CountRequest, QdrantServer, ServerConfig, Sink};
use upload_common::*;

/// Runs `check` on a fresh collection and deletes it afterwards, even on failure; nothing
/// without a server.
fn with_collection(test: &str, check: impl FnOnce(&dyn Sink, &str)) {
    let Some(sink) = server_from_env(test, None) else {
        return;
    };
    let name = format!("embedfleet-test-{test}-{}", std::process::id());
    let _ = sink.delete_collection(&name);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&sink, &name)));
    let _ = sink.delete_collection(&name);
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

#[test]
fn server_count_equals_rows_and_reupload_is_idempotent() {
    with_collection("count", check_count_and_idempotence);
}

#[test]
fn server_payload_filters_select_matching_rows() {
    with_collection("filters", check_filters);
}

#[test]
fn server_search_finds_each_point_first_with_payload() {
    with_collection("search", check_search);
}

#[test]
fn server_requests_count_by_ids_and_filter_query_several_vectors_delete_by_id() {
    with_collection("requests", check_requests);
}

#[test]
fn server_refuses_wrong_vector_size_and_mismatched_collection() {
    with_collection("refusals", check_refusals);
}

#[test]
fn server_bulk_load_settings_applied_and_restored() {
    with_collection("bulk", check_bulk_load);
}

#[test]
fn server_delete_collection_removes_it() {
    with_collection("delete", check_delete);
}

#[test]
fn server_refuses_a_run_of_other_vectors_by_the_collections_metadata() {
    with_collection("identity", |sink, name| {
        crate::upload_integrity::check_a_run_of_other_vectors_is_refused(sink, name)
    });
}

#[test]
fn unreachable_server_is_a_typed_error_once_it_has_refused_for_the_give_up_time() {
    // A closed loopback port: connection refused (qdrant-client: Internal). The probe tells
    // it refused, so it is retried past the attempt count until the give-up time, then
    // NothingListens (it never answered this command). Loopback only; nothing leaves the machine.
    let mut config = ServerConfig::new("http://127.0.0.1:9");
    config.retry.max_attempts = 2;
    config.retry.base_delay = Duration::from_millis(10);
    config.retry.never_answered_give_up = Duration::from_millis(300);
    let sink = QdrantServer::connect(config).expect("client");
    let started = std::time::Instant::now();
    match sink.count(CountRequest::new("x")) {
        Err(embedfleet_vectordb::UploadError::NothingListens { url, .. }) => {
            assert_eq!(url, "http://127.0.0.1:9");
        }
        other => panic!("expected NothingListens, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "not the minute a server that went away gets: {:?}",
        started.elapsed()
    );
    // Refused for the give-up time: the next request fails at once, with no attempt made.
    assert!(matches!(
        sink.count(CountRequest::new("x")),
        Err(embedfleet_vectordb::UploadError::NothingListens { .. })
    ));
}
