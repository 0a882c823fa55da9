//! The publish crate's integration tests, in one binary: a run directory made as the embed job
//! leaves it, published, and read back as users read it (`sha256sum -c`, pyarrow, `datasets`).

mod publish_common;

mod publish_complete;
mod publish_deleted;
mod publish_partial;
mod publish_python;
mod publish_resume;
mod publish_text;
