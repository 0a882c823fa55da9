//! The jobs crate's integration tests, in one binary: every test binary links the whole
//! dependency set (Qdrant's engine, candle, arrow), so one link instead of five keeps the
//! test build's time and disk down.

mod upload_common;

mod embed_pipeline;
mod upload_convert;
mod upload_driver;
mod upload_edge;
mod upload_server;
