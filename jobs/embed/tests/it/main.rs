//! The embed crate's integration tests, in one binary (one link of candle and arrow).

mod embed_pipeline;
