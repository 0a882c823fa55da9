//! The stages after the upload that read the collection: the query workload (`embedfleet
//! query`: terms → query vectors → batched searches → a parquet file of results), `eval`
//! (recall@k against exact search over the run's parquet shards, per HNSW `ef`, filtered too)
//! and `tune --queries`.
//!
//! Queries are embedded by `embedfleet_embed`'s one embedder setup (the embed job's device
//! workers) and searched through `embedfleet_vectordb`'s `Sink`, the same two sinks the upload
//! writes to.

pub mod compare;
pub mod eval;
pub mod exact;
pub mod filter;
pub mod held;
mod plot;
pub mod request;
pub mod results;
pub mod search;
pub mod terms;
pub mod tune;
pub mod vectors;
pub mod workload;

pub use eval::{eval, render, sample_queries, EvalError, EvalOptions, EvalReport, DEFAULT_EFS};
pub use filter::{parse_filters, run_filters};
pub use plot::write_recall_plot;
pub use request::{QueryRequest, Searched};
pub use search::{search_batched, Percentiles};
pub use terms::read_terms;
pub use vectors::{PrecomputedVectors, QueryWork, QueryWorkDir, VectorsError};
pub use workload::{run, EmbedQueries, QueryError, QueryModel, QueryOptions, QueryReport};
