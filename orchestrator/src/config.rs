//! The run config file (TOML) that `submit --config` reads: how jobs reach the scheduler.
//!
//! ```toml
//! [scheduler]
//! backend = "pbs"                      # local (default), slurm, pbs
//! [scheduler.pbs]
//! flavor = "pro"
//! [scheduler.script]
//! account = "MyProject"
//! walltime = "01:05:00"                # the trial's time per batch x 1.5 + 60 s
//! gpus_per_node = 4
//! select_extra = "system=polaris"
//! extra_directives = ["#PBS -l filesystems=home:eagle"]
//! modules = ["cuda/13.0"]
//! ```
//!
//! Every key is optional; `[scheduler.script] template` replaces the built-in job script
//! (placeholders: docs/cluster.md, "Job scripts").

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::notify::NotifyConfig;
use crate::scheduler::{seconds_problem, SchedulerConfig};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunConfig {
    pub scheduler: SchedulerConfig,
    /// The notify hook (docs/notify.md).
    pub notify: NotifyConfig,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("failed to read the run config {}: {cause}", path.display())]
    Read {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("the run config {} is not valid: {cause}", path.display())]
    Parse {
        path: PathBuf,
        cause: toml::de::Error,
    },
    #[error("the run config {} is not valid: {}", path.display(), problems.join("; "))]
    Values {
        path: PathBuf,
        problems: Vec<String>,
    },
}

impl RunConfig {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            cause: source,
        })?;
        let config: RunConfig = toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.into(),
            cause: source,
        })?;
        let problems = config.problems();
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError::Values {
                path: path.into(),
                problems,
            })
        }
    }

    /// Values that parse but cannot work: a time that is not a finite number of seconds
    /// (TOML allows `inf` and `nan`), a negative one, a zero timeout.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = self.scheduler.problems();
        let notify_timeout = self.notify.timeout_secs;
        problems.extend(seconds_problem(
            "[notify] timeout_secs",
            notify_timeout,
            false,
        ));
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::Backend;

    #[test]
    fn the_cluster_guide_example_is_a_valid_run_config() {
        let guide = include_str!("../../docs/cluster.md");
        let start = guide
            .find("```toml\n[scheduler]")
            .expect("docs/cluster.md has the run.toml example");
        let body = &guide[start + "```toml\n".len()..];
        let text = &body[..body.find("```").unwrap()];
        let cfg: RunConfig = toml::from_str(text).unwrap();
        assert_eq!(cfg.scheduler.backend, Backend::Pbs);
        assert_eq!(cfg.scheduler.script.gpus_per_node, Some(4));
        assert_eq!(
            cfg.scheduler.pbs.qsub.extra_args,
            vec!["-l", "filesystems=home:eagle"]
        );
        assert_eq!(cfg.scheduler.script.setup.len(), 1);
    }

    #[test]
    fn the_notify_example_in_docs_is_a_valid_run_config() {
        let doc = include_str!("../../docs/notify.md");
        let start = doc
            .find("```toml\n[notify]")
            .expect("docs/notify.md has the [notify] example");
        let body = &doc[start + "```toml\n".len()..];
        let text = &body[..body.find("```").unwrap()];
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.toml");
        std::fs::write(&path, text).unwrap();
        let cfg = RunConfig::load(&path).unwrap();
        assert!(cfg.notify.command.as_deref().unwrap().contains("mail"));
        assert_eq!(cfg.notify.timeout_secs, 60.0);
        assert_eq!(cfg.scheduler.backend, Backend::Slurm);
        assert!(cfg
            .scheduler
            .script
            .extra_directives
            .iter()
            .any(|d| d.contains("--mail-type=END,FAIL")));
        // Without the table: no command, the default timeout.
        assert_eq!(RunConfig::default().notify.command, None);
        assert_eq!(RunConfig::default().notify.timeout_secs, 60.0);
    }

    #[test]
    fn the_ready_made_run_configs_parse() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let pbs = RunConfig::load(&root.join("examples/run-pbs-polaris.toml")).unwrap();
        assert_eq!(pbs.scheduler.backend, Backend::Pbs);
        assert_eq!(pbs.scheduler.script.gpus_per_node, Some(4));
        assert!(pbs.scheduler.script.embedfleet.is_some());
        let slurm = RunConfig::load(&root.join("examples/run-slurm-gpu.toml")).unwrap();
        assert_eq!(slurm.scheduler.backend, Backend::Slurm);
        assert_eq!(slurm.scheduler.script.gpus_per_node, Some(4));
        assert_eq!(
            slurm.scheduler.slurm.sbatch.extra_args,
            vec!["--constraint=a100"]
        );
    }

    #[test]
    fn times_that_cannot_work_are_refused_naming_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.toml");
        for (text, key) in [
            (
                "[scheduler.command]\ntimeout_secs = inf\n",
                "timeout_secs = inf",
            ),
            (
                "[scheduler.command]\ntimeout_secs = 0.0\n",
                "timeout_secs = 0",
            ),
            (
                "[scheduler.command]\nbackoff_initial_secs = nan\n",
                "backoff_initial_secs = NaN",
            ),
            (
                "[scheduler.command]\nbackoff_max_secs = -1.0\n",
                "backoff_max_secs = -1",
            ),
            (
                "[scheduler.local]\ngrace_secs = -inf\n",
                "grace_secs = -inf",
            ),
            ("[notify]\ntimeout_secs = 0.0\n", "timeout_secs = 0"),
        ] {
            std::fs::write(&path, text).unwrap();
            let err = RunConfig::load(&path).unwrap_err().to_string();
            assert!(err.contains(key), "{text}: {err}");
        }
        std::fs::write(&path, "[scheduler.local]\ngrace_secs = 0.0\n").unwrap();
        assert!(RunConfig::load(&path).is_ok(), "no grace is a valid choice");
    }

    #[test]
    fn reads_the_documented_example_and_rejects_typos() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.toml");
        std::fs::write(
            &path,
            "[scheduler]\nbackend = \"pbs\"\n[scheduler.script]\naccount = \"P\"\ngpus_per_node = 4\n",
        )
        .unwrap();
        let cfg = RunConfig::load(&path).unwrap();
        assert_eq!(cfg.scheduler.backend, Backend::Pbs);
        assert_eq!(cfg.scheduler.script.account.as_deref(), Some("P"));
        assert_eq!(cfg.scheduler.script.gpus_per_node, Some(4));
        std::fs::write(&path, "[schedular]\nbackend = \"pbs\"\n").unwrap();
        let err = RunConfig::load(&path).unwrap_err().to_string();
        assert!(err.contains("schedular"), "{err}");
        std::fs::write(&path, "[scheduler.script]\nacount = \"P\"\n").unwrap();
        let err = RunConfig::load(&path).unwrap_err().to_string();
        assert!(err.contains("acount"), "{err}");
        std::fs::write(&path, "[notify]\ncomand = \"mail\"\n").unwrap();
        let err = RunConfig::load(&path).unwrap_err().to_string();
        assert!(err.contains("comand"), "{err}");
        let err = RunConfig::load(&dir.path().join("missing.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing.toml"), "{err}");
    }
}
