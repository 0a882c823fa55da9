//! End-to-end tests of the `embedfleet` binary: one test binary, a module per area (as
//! ripgrep's `tests/tests.rs`). Each test gets its own temporary directory.

mod browser;
mod sshd;
mod util;

mod access;
mod architecture;
mod breaker;
mod delete;
mod doctor;
mod embed;
mod gpu_check;
mod guidance;
mod integrity;
mod json_docs;
mod owner;
mod pgvector;
mod pipes;
mod plan;
mod publish;
mod query;
mod query_job;
mod readme;
mod rehearsal;
mod report;
mod report_html;
mod routing;
mod run;
mod run_config;
mod shared_fs;
mod snapshot;
mod snapshot_cluster;
mod snapshot_server;
mod ssh;
mod submit;
mod submit_setup;
mod update;
mod update_metadata;
mod update_moved;
mod update_pack;
mod upload;
