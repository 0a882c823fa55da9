//! placeholder

pub mod upload;
