//! Where a forward's time goes, stage by stage (`EF_PROFILE_STAGES=1`, for the GPU check's
//! comparison with PyTorch's profiler): each stage synchronizes its device before and after, so
//! its time is its own kernels'. Off (the default), a stage is a plain call. The
//! synchronizations cost throughput: a profiled bench's tokens/s are not the bench's.

use candle_core::{Device, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// One stage's total over the forwards since the last [`take`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageTime {
    pub stage: String,
    pub calls: u64,
    pub secs: f64,
}

fn enabled() -> bool {
    crate::ab_switch::AbSwitch::ProfileStages.on()
}

fn table() -> &'static Mutex<BTreeMap<&'static str, (u64, f64)>> {
    static TABLE: OnceLock<Mutex<BTreeMap<&'static str, (u64, f64)>>> = OnceLock::new();
    TABLE.get_or_init(Default::default)
}

/// Runs `f` as the stage `name` on `dev`: timed between two synchronizations when profiling.
pub fn stage<T>(name: &'static str, dev: &Device, f: impl FnOnce() -> Result<T>) -> Result<T> {
    if !enabled() {
        return f();
    }
    timed(name, dev, f)
}

fn timed<T>(name: &'static str, dev: &Device, f: impl FnOnce() -> Result<T>) -> Result<T> {
    dev.synchronize()?;
    let started = Instant::now();
    let out = f()?;
    dev.synchronize()?;
    let secs = started.elapsed().as_secs_f64();
    let mut table = table().lock().unwrap_or_else(|e| e.into_inner());
    let entry = table.entry(name).or_default();
    entry.0 += 1;
    entry.1 += secs;
    Ok(out)
}

/// The stages timed since the last call, longest first, and a fresh table; `None` when
/// profiling is off.
pub fn take() -> Option<Vec<StageTime>> {
    if !enabled() {
        return None;
    }
    Some(drain())
}

fn drain() -> Vec<StageTime> {
    let mut table = table().lock().unwrap_or_else(|e| e.into_inner());
    let mut stages: Vec<StageTime> = std::mem::take(&mut *table)
        .into_iter()
        .map(|(stage, (calls, secs))| StageTime {
            stage: stage.into(),
            calls,
            secs,
        })
        .collect();
    stages.sort_by(|a, b| b.secs.total_cmp(&a.secs));
    stages
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timed_stages_add_up_per_name_and_a_take_starts_afresh() {
        let dev = Device::Cpu;
        let sleep = |ms| {
            std::thread::sleep(std::time::Duration::from_millis(ms));
            Ok(())
        };
        drain();
        timed("short", &dev, || sleep(2)).unwrap();
        timed("long", &dev, || sleep(20)).unwrap();
        timed("short", &dev, || sleep(2)).unwrap();
        let err = timed("failing", &dev, || -> Result<()> {
            Err(candle_core::Error::Msg("no".into()))
        });
        assert!(err.is_err());
        let stages = drain();
        let names: Vec<&str> = stages.iter().map(|s| s.stage.as_str()).collect();
        assert_eq!(
            names,
            ["long", "short"],
            "longest first; a failed stage not counted"
        );
        assert_eq!(stages[1].calls, 2);
        assert!(stages[0].secs >= 0.020 && stages[1].secs >= 0.004);
        assert!(drain().is_empty());
    }
}
