//! The build settings a run's shards are made with, pinned in `snapshots/settings.json` by the
//! first build, so every later build (a node's, a group job's, the login node's) makes shards
//! the one collection can take. The settings themselves are the vectordb crate's
//! [`ShardSettings`]: the server reports a collection's in the same form.

use embedfleet_core::RunLayout;

use super::{io_err, read_json, ShardSettings, SnapshotError};

/// Pinning [`ShardSettings`] in a run directory.
pub trait PinnedSettings: Sized {
    /// The settings the run's shards are built with, written by the first `build-shard`;
    /// `None` before any.
    fn pinned(layout: &RunLayout) -> Result<Option<Self>, SnapshotError>;
    /// Pins these settings for the run's later builds, unless some are pinned already: then
    /// they must be these.
    fn pin(&self, layout: &RunLayout) -> Result<(), SnapshotError>;
}

impl PinnedSettings for ShardSettings {
    fn pinned(layout: &RunLayout) -> Result<Option<Self>, SnapshotError> {
        read_json(&layout.snapshot_settings_file(), "pinned build settings")
    }

    fn pin(&self, layout: &RunLayout) -> Result<(), SnapshotError> {
        let asked = ShardSettings {
            vector_size: 0,
            ..self.clone()
        };
        let dir = layout.snapshot_dir();
        std::fs::create_dir_all(&dir).map_err(io_err("create", &dir))?;
        // The first build to pin wins, on any host; every other compares with its pin.
        let path = layout.snapshot_settings_file();
        let bytes = serde_json::to_vec_pretty(&asked).expect("settings serialise. This is a bug.");
        embedfleet_core::pin::write_once(&path, &bytes).map_err(io_err("pin", &path))?;
        let pinned =
            Self::pinned(layout)?.expect("the pin is there: this build or another wrote it");
        let differences = asked.differences_from(&pinned);
        if differences.is_empty() {
            return Ok(());
        }
        Err(SnapshotError::SettingsDiffer {
            what: format!(
                "this run's shards (pinned in {})",
                RunLayout::SNAPSHOT_SETTINGS_FILE
            ),
            differences,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use embedfleet_vectordb::CollectionSpec;

    #[test]
    fn settings_pin_once_and_other_settings_are_refused() {
        let mut spec = CollectionSpec::new("papers", 64);
        spec.qdrant.hnsw.m = 32;
        let settings = ShardSettings::of(&spec);
        let dir = tempfile::tempdir().unwrap();
        let layout = RunLayout::new(dir.path());
        assert_eq!(ShardSettings::pinned(&layout).unwrap(), None);
        settings.pin(&layout).unwrap();
        settings.pin(&layout).unwrap();
        let pinned = ShardSettings::pinned(&layout).unwrap().unwrap();
        assert_eq!(pinned.hnsw_m, 32);
        let other = ShardSettings::of(&CollectionSpec::new("papers", 64));
        let err = other.pin(&layout).unwrap_err().to_string();
        assert!(err.contains("hnsw m: the run's 32, here 16"), "{err}");
    }
}
