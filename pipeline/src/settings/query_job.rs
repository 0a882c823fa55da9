//! `query --submit`'s job settings: the scheduler config the run stored (the local backend's
//! before any `submit`), the devices the job asks for, and how often the owner polls it. Each
//! as given, else the backend's default.

use std::time::Duration;

use embedfleet_core::pin::Resolved;
use embedfleet_core::rundb::RunDb;
use embedfleet_orchestrator::scheduler::SchedulerConfig;
use embedfleet_orchestrator::stored_config::{self, GivenConfig, Origin};

use crate::error::Result;

/// How a query job is run and followed.
#[derive(Debug, Clone)]
pub struct QueryJobSettings {
    /// The run's stored scheduler config, or the default one (the local backend).
    pub scheduler: SchedulerConfig,
    /// The job's devices: as given, else this host's CPU where jobs run on it, else every GPU
    /// of the job's node.
    pub devices: Resolved<String>,
    pub poll_interval: Resolved<Duration>,
    /// A job the scheduler stops knowing for this long is lost.
    pub lost_after: Duration,
    /// What the user should know of the choices made.
    pub notes: Vec<String>,
}

impl QueryJobSettings {
    /// `devices` and `poll_interval_s` as given on the command line, resolved against the run.
    pub fn resolve(
        db: &RunDb,
        devices: Option<String>,
        poll_interval_s: Option<f64>,
    ) -> Result<Self> {
        let chosen = stored_config::choose(db, &GivenConfig::default())?;
        let mut notes = Vec::new();
        if chosen.origin == Origin::First {
            notes.push("this run has no stored run config (no `submit` has run yet): the query job goes to the local backend".into());
        }
        let scheduler = chosen.config.scheduler;
        // What the backend uses where the command line says nothing.
        let defaults = scheduler.backend.kind().defaults(&scheduler);
        let devices = Resolved::of(devices, None, || {
            let cpu = defaults.devices.starts_with("cpu");
            if cpu { "cpu" } else { "cuda" }.to_string()
        });
        let poll_interval =
            Resolved::of(poll_interval_s.map(Duration::from_secs_f64), None, || {
                defaults.poll_interval
            });
        Ok(Self {
            scheduler,
            devices,
            poll_interval,
            lost_after: defaults.lost_after,
            notes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use embedfleet_core::pin::Source;

    #[test]
    fn before_any_submit_the_job_goes_to_the_local_backend_on_this_hosts_cpu() {
        let dir = tempfile::tempdir().unwrap();
        let db = RunDb::create(dir.path()).unwrap();
        let settings = QueryJobSettings::resolve(&db, None, None).unwrap();
        assert_eq!(
            settings.scheduler.backend,
            embedfleet_orchestrator::scheduler::Backend::Local
        );
        assert_eq!(settings.devices.value, "cpu");
        assert_eq!(settings.devices.source, Source::Default);
        assert_eq!(settings.notes.len(), 1, "{:?}", settings.notes);
        let given = QueryJobSettings::resolve(&db, Some("cuda:0".into()), Some(0.25)).unwrap();
        assert_eq!(given.devices.value, "cuda:0");
        assert_eq!(given.poll_interval.value, Duration::from_millis(250));
        assert_eq!(given.poll_interval.source, Source::Given);
    }
}
