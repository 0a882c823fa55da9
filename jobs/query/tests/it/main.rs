//! The query crate's integration tests, in one binary.

mod eval;
mod precision;
