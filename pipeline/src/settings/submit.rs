//! `submit`'s settings: what was typed ([`SubmitFlags`]) resolved once against what the run
//! keeps ([`SubmitSettings`]). A restart typed with `--run-dir` alone (after a crash, from
//! notes, by a colleague) embeds and loops exactly as the run did.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use embedfleet_core::handoff::OutputSettings;
use embedfleet_core::pin::{Resolved, Source};
use embedfleet_core::rundb::RunDb;
use embedfleet_core::shardfile::VectorDtype;
use embedfleet_core::Precision;
use embedfleet_models::TextRule;
use embedfleet_orchestrator::config::RunConfig;
use embedfleet_orchestrator::route::Route;
use embedfleet_orchestrator::scheduler::Backend;
use embedfleet_orchestrator::stored_config::{self, ChosenConfig, GivenConfig};
use embedfleet_orchestrator::submit::{LoopPolicy, SessionOptions};
use serde::{Deserialize, Serialize};

use crate::error::{PipelineError, Result};
use crate::job_command::JobSettings;

/// The run.db setting that keeps the last `submit --devices`.
pub const DEVICES_SETTING: &str = "submit.devices";
/// The run.db setting that keeps the loop options a submit was given.
pub const LOOP_SETTING: &str = "submit.loop";
/// The run.db setting that keeps `submit --group-builds` for the run's later submits.
pub const GROUP_BUILDS_SETTING: &str = "submit.group_builds";

/// `submit`'s flags as typed: `None` where the command line gave none.
#[derive(Debug, Clone, Default)]
pub struct SubmitFlags {
    pub run_dir: PathBuf,
    /// `--config FILE`.
    pub config: Option<PathBuf>,
    pub backend: Option<Backend>,
    pub replace_config: bool,
    pub queues: Vec<(String, u32)>,
    pub devices: Option<String>,
    pub model_dir: Option<PathBuf>,
    pub dim: Option<usize>,
    pub vector_dtype: Option<VectorDtype>,
    pub precision: Option<Precision>,
    pub max_tokens: Option<usize>,
    /// `--text-rule`.
    pub text_rule: Option<TextRule>,
    pub shard_papers: Option<usize>,
    pub build_shard: bool,
    /// `--group-builds QUEUE|local|off`.
    pub group_builds: Option<String>,
    pub group_count: Option<i64>,
    pub build_cpus: u32,
    pub loop_options: LoopOptions,
    /// `--watch`, `--trial`, `--stalled-*`, `--kill-stalled`, `--metrics-listen`: this
    /// session's own, handed to the loop as typed.
    pub session: SessionOptions,
    pub dry_run: bool,
    /// A preset of these flags (`run`'s), not a user's choice: the set-up pins the output
    /// settings but keeps nothing for the run's later submits (run config, devices, loop
    /// options), which a `submit` on a cluster chooses for itself.
    pub preset: bool,
}

/// The submit loop's options as given to the run's submits: `None` where none gave one. Kept
/// in run.db ([`LOOP_SETTING`]).
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoopOptions {
    pub max_attempts: Option<u32>,
    pub breaker_after: Option<u32>,
    pub poll_interval_s: Option<f64>,
    pub lost_after_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<Route>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speculate: Option<bool>,
    /// `--max-jobs`: 0 for none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_jobs: Option<u32>,
}

impl LoopOptions {
    /// Each option as given here, else as the run's earlier submits were given it.
    pub fn given_else(&self, stored: &LoopOptions) -> LoopOptions {
        fn pick<T: Clone>(given: &Option<T>, stored: &Option<T>) -> Option<T> {
            Resolved::optional(given.clone(), stored.clone()).value
        }
        LoopOptions {
            max_attempts: pick(&self.max_attempts, &stored.max_attempts),
            breaker_after: pick(&self.breaker_after, &stored.breaker_after),
            poll_interval_s: pick(&self.poll_interval_s, &stored.poll_interval_s),
            lost_after_s: pick(&self.lost_after_s, &stored.lost_after_s),
            route: pick(&self.route, &stored.route),
            speculate: pick(&self.speculate, &stored.speculate),
            max_jobs: pick(&self.max_jobs, &stored.max_jobs),
        }
    }
}

/// Where group builds go, as `submit --group-builds` was given it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupBuildsSetting {
    /// A queue of the run's scheduler, or `local`.
    pub queue: String,
    pub cpus: u32,
}

/// `submit`'s settings, each resolved once: as given, else as the run keeps it, else the
/// default.
#[derive(Debug, Clone)]
pub struct SubmitSettings {
    /// The run config: the given one, the stored one, or the default (see
    /// [`stored_config::choose`]).
    pub config: ChosenConfig,
    pub devices: Resolved<String>,
    /// What every embed job runs with.
    pub job: JobSettings,
    /// The loop options as given or kept (`None`: none ever given), and the values they come
    /// to.
    pub loop_options: LoopOptions,
    /// What they come to, handed to the loop whole. Its `max_jobs` is `--max-jobs` as given or
    /// kept, else the run config's `[scheduler] max_jobs`; `None` for no limit of the run's own.
    pub policy: LoopPolicy,
    /// The queue caps to set (`None` keeps run.db's).
    pub queues: Option<BTreeMap<String, u32>>,
    /// Group builds, as given or kept; `None` for none. A trial builds nothing.
    pub group_builds: Option<GroupBuildsSetting>,
    /// Options of the run's earlier submits that this one takes, as flags (for the user).
    pub kept: Vec<String>,
    /// Notes for the user on defaults taken.
    pub notes: Vec<String>,
}

impl SubmitSettings {
    /// Resolves `flags` against the run in `db` (read only: storing is the set-up's).
    pub fn resolve(db: &RunDb, flags: &SubmitFlags) -> Result<Self> {
        let given = GivenConfig {
            file: flags.config.as_deref().map(RunConfig::load).transpose()?,
            backend: flags.backend,
            replace: flags.replace_config,
        };
        let config = stored_config::choose(db, &given)?;
        // What the backend uses where neither the command line nor the run says.
        let defaults = config
            .config
            .scheduler
            .backend
            .kind()
            .defaults(&config.config.scheduler);
        let devices = Resolved::of(
            flags.devices.clone(),
            db.setting::<String>(DEVICES_SETTING)?,
            || defaults.devices.clone(),
        );
        let job = job_settings(db, flags, devices.value.clone())?;
        let stored: LoopOptions = db.setting(LOOP_SETTING)?.unwrap_or_default();
        let loop_options = flags.loop_options.given_else(&stored);
        let secs =
            |given: Option<f64>, default: Duration| given.map_or(default, Duration::from_secs_f64);
        let mut notes = Vec::new();
        // Caps given replace the run's; with none given the run's stay (`None`: nothing to
        // set); a run with none takes the backend's own queues, said in a note.
        let given_caps = (!flags.queues.is_empty())
            .then(|| Some(flags.queues.iter().cloned().collect::<BTreeMap<_, _>>()));
        let run_has_caps = (!db.queue_caps()?.is_empty()).then_some(None);
        let queues = Resolved::of(given_caps, run_has_caps, || {
            defaults.queues.as_ref().map(|(caps, _)| caps.clone())
        });
        if let (Source::Default, Some((_, described))) = (queues.source, &defaults.queues) {
            notes.push(format!("no queues given: using {described}"));
        }
        let queues = queues.value;
        let script = &config.config.scheduler.script;
        if devices.source == Source::Default
            && devices.value.starts_with("cuda:")
            && script.gpus_per_node.is_none()
        {
            notes.push(format!(
                "note: the run config gives no `gpus_per_node`, so the jobs ask the scheduler for no GPUs yet run with --devices {} (the 4 GPUs of the nodes this default is for): set `[scheduler.script] gpus_per_node`, or give --devices cpu for CPU nodes",
                devices.value
            ));
        }
        Ok(Self {
            kept: kept_loop_flags(&flags.loop_options, &stored),
            policy: LoopPolicy {
                max_attempts: loop_options.max_attempts.unwrap_or(3).max(1),
                breaker_after: loop_options
                    .breaker_after
                    .unwrap_or(embedfleet_orchestrator::submit::breaker::DEFAULT_BREAKER_AFTER),
                poll_interval: secs(loop_options.poll_interval_s, defaults.poll_interval),
                lost_after: secs(loop_options.lost_after_s, defaults.lost_after),
                route: loop_options.route.unwrap_or_default(),
                speculate: loop_options.speculate.unwrap_or(true),
                max_jobs: loop_options
                    .max_jobs
                    .or(config.config.scheduler.max_jobs)
                    .filter(|n| *n > 0),
            },
            loop_options,
            group_builds: group_builds(db, flags)?,
            config,
            devices,
            job,
            queues,
            notes,
        })
    }

    /// Whether the loop options differ from the ones the run keeps (a submit stores them).
    pub fn loop_options_changed(&self, db: &RunDb) -> Result<bool> {
        let stored: LoopOptions = db.setting(LOOP_SETTING)?.unwrap_or_default();
        Ok(self.loop_options != stored)
    }
}

/// The embed jobs' settings: the output options as given, else as the run's first submit
/// fixed them (`output-settings.json`), else the defaults.
fn job_settings(db: &RunDb, flags: &SubmitFlags, devices: String) -> Result<JobSettings> {
    let pinned = OutputSettings::read(&db.layout())?;
    let model_dir = Resolved::of(
        flags.model_dir.clone(),
        pinned.as_ref().map(|p| PathBuf::from(&p.model_dir)),
        PathBuf::new,
    );
    if model_dir.source == Source::Default {
        return Err(PipelineError::NoModelForFirstSubmit);
    }
    let model_dir = std::path::absolute(&model_dir.value).map_err(crate::error::io(
        "find the absolute path of",
        &model_dir.value,
    ))?;
    let pinned = pinned.as_ref();
    let precision = Resolved::of(
        flags.precision,
        pinned.map(|p| p.precision),
        Precision::default,
    )
    .value;
    refuse_fp8_on_cpus(precision, &devices)?;
    // A run pinned before the rule was recorded keeps its old one (`None`), unless told.
    let pinned_rule = pinned
        .map(|p| TextRule::recorded(p.text_rule.as_deref()))
        .transpose()
        .map_err(|problem| crate::error::Refused {
            problems: vec![problem],
        })?;
    let text_rule = Resolved::of(flags.text_rule.map(Some), pinned_rule, || {
        Some(TextRule::default())
    })
    .value;
    Ok(JobSettings {
        devices,
        model_dir,
        dim: Resolved::optional(flags.dim, pinned.and_then(|p| p.dim)).value,
        vector_dtype: Resolved::of(flags.vector_dtype, pinned.map(|p| p.vector_dtype), || {
            VectorDtype::F32
        })
        .value,
        precision,
        max_tokens: Resolved::optional(flags.max_tokens, pinned.and_then(|p| p.max_tokens)).value,
        shard_papers: Resolved::of(flags.shard_papers, pinned.map(|p| p.shard_papers), || {
            embedfleet_embed::job::DEFAULT_SHARD_PAPERS
        })
        .value,
        memory_limit: None,
        build_shard: flags.build_shard,
        text_rule,
    })
}

/// FP8 projections on jobs whose devices include the CPU, refused before any job: they would
/// fail at their model's load, on every node.
fn refuse_fp8_on_cpus(precision: Precision, devices: &str) -> Result<()> {
    let on_cpu = embedfleet_models::parse_devices(devices)
        .is_ok_and(|list| list.contains(&embedfleet_models::DeviceSpec::Cpu));
    if precision == Precision::Fp8 && on_cpu {
        let reason = embedfleet_models::fp8::refusal(None).unwrap_or_default();
        let reason = format!("the jobs' --devices are {devices}: {reason}");
        return Err(embedfleet_models::ModelError::PrecisionRefused { reason }.into());
    }
    Ok(())
}

/// `--group-builds` as given (`off` forgets it), else as the run's last submit was given it,
/// else none.
fn group_builds(db: &RunDb, flags: &SubmitFlags) -> Result<Option<GroupBuildsSetting>> {
    let given = flags.group_builds.as_deref().map(|queue| {
        (queue != "off").then(|| GroupBuildsSetting {
            queue: queue.to_string(),
            cpus: flags.build_cpus,
        })
    });
    let run = db.setting::<Option<GroupBuildsSetting>>(GROUP_BUILDS_SETTING)?;
    Ok(Resolved::of(given, run, || None).value)
}

/// The loop options this submit takes from the run's earlier ones, as their flags.
fn kept_loop_flags(given: &LoopOptions, stored: &LoopOptions) -> Vec<String> {
    [
        (
            given.poll_interval_s.is_none(),
            stored
                .poll_interval_s
                .map(|s| format!("--poll-interval {s}")),
        ),
        (
            given.max_attempts.is_none(),
            stored.max_attempts.map(|n| format!("--max-attempts {n}")),
        ),
        (
            given.lost_after_s.is_none(),
            stored.lost_after_s.map(|s| format!("--lost-after {s}")),
        ),
        (
            given.breaker_after.is_none(),
            stored.breaker_after.map(|k| format!("--breaker-after {k}")),
        ),
        (
            given.route.is_none(),
            stored.route.map(|r| format!("--route {r}")),
        ),
        (
            given.speculate.is_none(),
            stored.speculate.map(|b| format!("--speculate {b}")),
        ),
        (
            given.max_jobs.is_none(),
            stored.max_jobs.map(|n| format!("--max-jobs {n}")),
        ),
    ]
    .into_iter()
    .filter_map(|(not_given, value)| value.filter(|_| not_given))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> (tempfile::TempDir, RunDb) {
        let dir = tempfile::tempdir().unwrap();
        let db = RunDb::create(dir.path()).unwrap();
        (dir, db)
    }

    #[test]
    fn a_restart_with_the_run_dir_alone_takes_the_runs_options() {
        let (dir, db) = run();
        let model = dir.path().join("model");
        let first = SubmitFlags {
            run_dir: dir.path().into(),
            model_dir: Some(model.clone()),
            shard_papers: Some(3),
            vector_dtype: Some(VectorDtype::F16),
            devices: Some("cpu:2".into()),
            loop_options: LoopOptions {
                poll_interval_s: Some(0.5),
                ..Default::default()
            },
            ..Default::default()
        };
        let settings = SubmitSettings::resolve(&db, &first).unwrap();
        assert_eq!(settings.devices.source, Source::Given);
        assert_eq!(settings.policy.poll_interval, Duration::from_millis(500));
        // What the first submit pins and stores.
        settings.job.output_settings().pin(&db.layout()).unwrap();
        db.set_setting(DEVICES_SETTING, &"cpu:2".to_string())
            .unwrap();
        db.set_setting(LOOP_SETTING, &settings.loop_options)
            .unwrap();

        let restart = SubmitFlags {
            run_dir: dir.path().into(),
            ..Default::default()
        };
        let again = SubmitSettings::resolve(&db, &restart).unwrap();
        assert_eq!(again.job.model_dir, std::path::absolute(&model).unwrap());
        assert_eq!(again.job.shard_papers, 3);
        assert_eq!(again.job.vector_dtype, VectorDtype::F16);
        assert_eq!(
            (again.devices.value.as_str(), again.devices.source),
            ("cpu:2", Source::Run)
        );
        assert_eq!(again.policy.poll_interval, Duration::from_millis(500));
        assert_eq!(again.kept, ["--poll-interval 0.5"]);
        assert!(!again.loop_options_changed(&db).unwrap());
    }

    #[test]
    fn the_route_and_speculation_given_once_are_kept_by_a_restart() {
        let (dir, db) = run();
        let fresh = SubmitFlags {
            run_dir: dir.path().into(),
            model_dir: Some("m".into()),
            ..Default::default()
        };
        let s = SubmitSettings::resolve(&db, &fresh).unwrap();
        assert_eq!(
            (s.policy.route, s.policy.speculate),
            (Route::Adaptive, true)
        );
        let first = SubmitFlags {
            loop_options: LoopOptions {
                route: Some(Route::Static),
                speculate: Some(false),
                ..Default::default()
            },
            ..fresh.clone()
        };
        let s = SubmitSettings::resolve(&db, &first).unwrap();
        assert!(s.loop_options_changed(&db).unwrap());
        db.set_setting(LOOP_SETTING, &s.loop_options).unwrap();
        let again = SubmitSettings::resolve(&db, &fresh).unwrap();
        assert_eq!(
            (again.policy.route, again.policy.speculate),
            (Route::Static, false)
        );
        assert_eq!(again.kept, ["--route static", "--speculate false"]);
    }

    #[test]
    fn fp8_is_refused_for_cpu_jobs_and_kept_by_a_restart_on_gpus() {
        let (dir, db) = run();
        let on_cpus = SubmitFlags {
            run_dir: dir.path().into(),
            model_dir: Some("m".into()),
            devices: Some("cpu:2".into()),
            precision: Some(Precision::Fp8),
            ..Default::default()
        };
        let err = SubmitSettings::resolve(&db, &on_cpus)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--precision fp8 runs on a GPU") && err.contains("cpu:2"),
            "{err}"
        );
        let on_gpus = SubmitFlags {
            devices: Some("cuda".into()),
            ..on_cpus
        };
        let settings = SubmitSettings::resolve(&db, &on_gpus).unwrap();
        assert_eq!(settings.job.precision, Precision::Fp8);
        let args = settings.job.to_args();
        assert!(
            args.windows(2).any(|w| w == ["--precision", "fp8"]),
            "{args:?}"
        );
        settings.job.output_settings().pin(&db.layout()).unwrap();
        // A restart with the run directory alone (on GPUs) keeps FP8; native is refused.
        let restart = SubmitFlags {
            run_dir: dir.path().into(),
            devices: Some("cuda".into()),
            ..Default::default()
        };
        let again = SubmitSettings::resolve(&db, &restart).unwrap();
        assert_eq!(again.job.precision, Precision::Fp8);
        let native = SubmitFlags {
            precision: Some(Precision::Native),
            ..restart
        };
        let settings = SubmitSettings::resolve(&db, &native).unwrap();
        let err = settings
            .job
            .output_settings()
            .pin(&db.layout())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--precision: the run's fp8, here native"),
            "{err}"
        );
    }

    #[test]
    fn a_first_submit_without_a_model_is_told_to_give_one() {
        let (dir, db) = run();
        let flags = SubmitFlags {
            run_dir: dir.path().into(),
            ..Default::default()
        };
        let err = SubmitSettings::resolve(&db, &flags)
            .unwrap_err()
            .to_string();
        assert!(err.contains("give --model-dir"), "{err}");
    }

    #[test]
    fn defaults_follow_the_backend() {
        let (dir, db) = run();
        let flags = SubmitFlags {
            run_dir: dir.path().into(),
            model_dir: Some("m".into()),
            backend: Some(Backend::Slurm),
            ..Default::default()
        };
        let s = SubmitSettings::resolve(&db, &flags).unwrap();
        assert_eq!(s.devices.value, "cuda:0,1,2,3");
        assert_eq!(s.devices.source, Source::Default);
        assert_eq!(s.policy.poll_interval, Duration::from_secs(30));
        assert_eq!(s.policy.lost_after, Duration::from_secs(300));
        assert_eq!(s.policy.max_attempts, 3);
        assert!(
            s.queues.is_none(),
            "a cluster's queues are the user's to give"
        );
        let local = SubmitSettings::resolve(
            &db,
            &SubmitFlags {
                backend: None,
                ..flags
            },
        )
        .unwrap();
        assert_eq!(local.devices.value, "cpu");
        assert_eq!(local.policy.poll_interval, Duration::from_secs(1));
        assert_eq!(
            local.queues,
            Some(BTreeMap::from([("local".to_string(), 2)]))
        );
    }
}
