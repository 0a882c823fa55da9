//! A model on a made-up GPU for the unit tests: its free memory, its pool's high-water mark and
//! what a probe of its free memory reads are the test's to set. It embeds nothing.

use std::sync::{Arc, Mutex};

use embedfleet_models::{Embedder, MemoryProbe, ModelError, PackedSequences, PeakWatch};

/// 10 GiB: the device's total memory.
pub(crate) const TOTAL: u64 = 10 << 30;

#[derive(Default)]
pub(crate) struct FakeDevice {
    /// Free bytes the token budget plans with (a token a byte); `None`: no budget (a CPU).
    pub free: Option<u64>,
    /// The peak a watch reports; `None`: no high-water mark to read.
    pub mark: Option<u64>,
    /// Free bytes each probe reads in turn (the last one repeats); `None`: no probe.
    pub readings: Option<Arc<Mutex<Vec<u64>>>>,
}

impl Embedder for FakeDevice {
    fn embed(&self, _: &PackedSequences) -> Result<Vec<Vec<f32>>, ModelError> {
        Ok(Vec::new())
    }
    fn max_position_embeddings(&self) -> usize {
        1024
    }
    fn hidden_size(&self) -> usize {
        4
    }
    fn output_dim(&self) -> usize {
        4
    }
    fn estimate_memory(&self, _: &[usize]) -> u64 {
        0
    }
    fn set_memory_limit(&self, _: Option<u64>) {}
    fn token_budget(&self, workers: usize) -> Option<u64> {
        Some(embedfleet_models::memory::share_of_free(
            self.free?, workers,
        ))
    }
    fn watch_peak_memory(&self) -> Option<PeakWatch> {
        let mark = self.mark?;
        Some(Box::new(move || Some(mark)))
    }
    fn memory_probe(&self) -> Option<MemoryProbe> {
        let readings = self.readings.clone()?;
        Some(Box::new(move || {
            let mut readings = readings.lock().unwrap();
            let now = if readings.len() > 1 {
                readings.remove(0)
            } else {
                readings[0]
            };
            Some((now, TOTAL))
        }))
    }
}
