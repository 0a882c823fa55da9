//! The vectordb crate's integration tests, in one binary: every test binary links Qdrant's engine,
//! so one link instead of four keeps the test build's time and disk down.

mod upload_common;

mod upload_convert;
mod upload_driver;
mod upload_edge;
mod upload_integrity;
mod upload_pg;
mod upload_server;
