//! placeholder

pub mod scheduler;
