//! Where points go (`--qdrant`, `--edge`, the API key, `--postgres`) and the collection's
//! settings, as the libraries take them: shared by `upload`, `delete`, `tune`, `query`, `eval`
//! and the snapshot load.

use crate::flags::TargetFlags;
use anyhow::Result;
use embedfleet_vectordb::Sink;
use std::path::Path;

/// The sink of `target` (the sink factory, `TargetFlags::open`, makes it).
pub(super) fn open_sink(run_dir: &Path, target: &TargetFlags) -> Result<Box<dyn Sink>> {
    Ok(target.open(run_dir)?)
}
