//! `tune`'s settings, resolved once: which sweep (the upload's, or with `--queries` the query
//! workload's), its options from the flags, and where the upload sweep's tables go.

use crate::flags::TuneFlags;
use embedfleet_core::rundb::RunDb;
use embedfleet_core::RunLayout;
use embedfleet_query::tune::QueryTuneOptions;
use embedfleet_vectordb::tune::TuneOptions;
use embedfleet_vectordb::Sink;
use std::path::PathBuf;

/// What one `tune` measures.
#[derive(Debug, Clone)]
pub enum TuneSettings {
    /// The upload's batch size and requests in flight, into a scratch collection; the tables
    /// written into `out` (default: the run's `tune/`).
    Upload { options: TuneOptions, out: PathBuf },
    /// The query workload's, against the run's collection.
    Queries { options: QueryTuneOptions },
}

impl TuneSettings {
    /// `flags` resolved against the run in `db`, for `sink`. Refuses a scratch collection
    /// this run uploaded into: the upload sweep drops it before and after.
    pub fn resolve(db: &RunDb, sink: &dyn Sink, flags: &TuneFlags) -> anyhow::Result<Self> {
        if flags.queries {
            return Ok(Self::Queries {
                options: QueryTuneOptions::new(&flags.collection),
            });
        }
        let key = embedfleet_vectordb::progress_key(sink, &flags.scratch);
        let (acked, _) = db.upload_totals(&key)?;
        if acked > 0 {
            anyhow::bail!(
                "`{}` holds this run's upload ({acked} points): tune drops its scratch collection, so give it another --scratch name",
                flags.scratch
            );
        }
        let mut options = TuneOptions::new(&flags.scratch);
        options.sample = flags.sample.max(1);
        options.batch_sizes.retain(|&b| b <= flags.max_batch.max(1));
        let out = flags
            .out
            .clone()
            .unwrap_or_else(|| RunLayout::new(&flags.run_dir).tune_dir());
        Ok(Self::Upload { options, out })
    }
}
