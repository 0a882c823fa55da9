//! How a command that failed ends: one error type at the top, [`CommandError`], which knows its
//! exit code (docs/commands.md, "Exit codes"), as nextest's `ExpectedError` does, and the lines
//! it prints.

use crate::PipelineError;
use embedfleet_core::exit;
use embedfleet_orchestrator::plan::PlanError;

/// A command's failure: the error, and the exit code it was given once, where it was made.
#[derive(Debug)]
pub struct CommandError {
    error: anyhow::Error,
    code: i32,
}

impl<E: Into<anyhow::Error>> From<E> for CommandError {
    fn from(error: E) -> Self {
        let error = error.into();
        let code = if is_broken_pipe(&error) {
            // The reader of our output went away (`status | head -1`): nothing failed.
            exit::SUCCESS
        } else {
            exit_code(&error)
        };
        Self { error, code }
    }
}

impl CommandError {
    /// The process's exit code.
    pub fn process_exit_code(&self) -> i32 {
        self.code
    }

    /// What the user is told on stderr: `error: ...`, then each cause once, with any password
    /// typed into a URL redacted (core::secret). Nothing when the reader of the output left.
    pub fn lines(&self) -> Vec<String> {
        if is_broken_pipe(&self.error) {
            return Vec::new();
        }
        let redact = embedfleet_core::secret::redact;
        // Each error of the chain says only what it adds: one that says its cause in its
        // message returns none (`embedfleet_core::cause`), so each is said once as it is.
        let mut chain = self.error.chain().map(|e| redact(&e.to_string()));
        let mut lines = vec![format!("error: {}", chain.next().unwrap_or_default())];
        lines.extend(chain.map(|cause| format!("  caused by: {cause}")));
        if self.code == exit::DISK_FULL {
            lines.push(
                "no room: that filesystem is full, or your quota on it exceeded (`df -h`, or the \
                 site's quota tool). Free space or raise the quota, then run the same command \
                 again: what was done stays done, nothing half-written was kept"
                    .to_string(),
            );
        }
        lines
    }
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain()
        .filter_map(|e| e.downcast_ref::<std::io::Error>())
        .any(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
}

/// The exit code of an error (docs/commands.md, "Exit codes"): [`exit::DISK_FULL`] when any
/// error of its chain says a full disk or an exceeded quota (by the system's words: whatever
/// error type carries the cause, it says it), [`exit::REFUSED`] when any is a refusal, else
/// [`exit::FAILURE`].
fn exit_code(err: &anyhow::Error) -> i32 {
    use embedfleet_orchestrator::submit::SubmitError;
    let interrupted = err.chain().find_map(|e| {
        if let Some(SubmitError::Interrupted { code, .. }) = e.downcast_ref() {
            return Some(*code);
        }
        e.downcast_ref::<PipelineError>()
            .and_then(PipelineError::interrupted_code)
    });
    if let Some(code) = interrupted {
        code
    } else if err
        .chain()
        .any(|e| embedfleet_core::space::says_disk_full(&e.to_string()))
    {
        exit::DISK_FULL
    } else if err.chain().any(is_device_refusal) {
        exit::DEVICE_REFUSED
    } else if err.chain().any(is_refusal) {
        exit::REFUSED
    } else if err.chain().any(is_unusable_input) {
        exit::PARTIAL
    } else {
        exit::FAILURE
    }
}

/// Whether `e` says some input could not be used (exit code 3, as a corrupt corpus file is).
fn is_unusable_input(e: &(dyn std::error::Error + 'static)) -> bool {
    e.downcast_ref::<PlanError>()
        .is_some_and(|e| matches!(e, PlanError::Unusable { .. }))
        || e.downcast_ref::<PipelineError>()
            .is_some_and(PipelineError::is_unusable_input)
}

/// Whether `e` is this node's device refusing what the run asks (exit code 5), where another
/// node may not: the embed job's model load on a GPU without FP8 tensor cores, or without a
/// cuDNN its fused attention can use.
fn is_device_refusal(e: &(dyn std::error::Error + 'static)) -> bool {
    macro_rules! device_refusals {
        ($($ty:ty),* $(,)?) => {
            false $(|| e.downcast_ref::<$ty>().is_some_and(<$ty>::is_device_refusal))*
        };
    }
    // The query errors forward their source transparently: the one at the top of the chain
    // is whichever wraps the model's refusal.
    device_refusals!(
        embedfleet_embed::job::EmbedJobError,
        embedfleet_models::ModelError,
        embedfleet_embed::QueryEmbedError,
        embedfleet_query::QueryError,
        embedfleet_query::VectorsError,
    )
}

/// Whether `e` is a refusal: an error type of the libraries, and its own word on which of its
/// cases refuse (a run directory that holds another plan, settings that differ, another host's
/// run, ...). A library error type that can refuse gets one line here.
fn is_refusal(e: &(dyn std::error::Error + 'static)) -> bool {
    use embedfleet_core::owner::OwnerError;
    use embedfleet_orchestrator::submit::SubmitError;
    macro_rules! refusals {
        ($($ty:ty => $check:expr),* $(,)?) => {
            false $(|| e.downcast_ref::<$ty>().is_some_and($check))*
        };
    }
    refusals!(
        crate::preflight::Refused => |_| true,
        PipelineError => PipelineError::is_refusal,
        OwnerError => |e| matches!(e, OwnerError::OtherHost { .. } | OwnerError::OwnerAlive { .. }),
        SubmitError => crate::error::submit_refuses,
        embedfleet_orchestrator::stored_config::StoredConfigError => |e| e.is_refusal(),
        PlanError => PlanError::is_refusal,
        embedfleet_vectordb::UploadRunError => embedfleet_vectordb::UploadRunError::is_refusal,
        embedfleet_snapshot::SnapshotError => embedfleet_snapshot::SnapshotError::is_refusal,
        embedfleet_embed::job::EmbedJobError => embedfleet_embed::job::EmbedJobError::is_refusal,
        embedfleet_query::QueryError => embedfleet_query::QueryError::is_refusal,
        embedfleet_publish::PublishError => embedfleet_publish::PublishError::is_refusal,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_anywhere_in_the_chain_exits_4_and_each_cause_is_said_once() {
        let refused = PipelineError::Refused(crate::error::Refused {
            problems: vec!["no queue".into()],
        });
        let err = CommandError::from(anyhow::Error::new(refused).context("submit failed"));
        assert_eq!(err.process_exit_code(), exit::REFUSED);
        let lines = err.lines();
        assert_eq!(lines[0], "error: submit failed");
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(
            lines[1].starts_with("  caused by: nothing was submitted"),
            "{lines:?}"
        );
        // A library error says its cause and returns none: said once, with no text compared.
        let io = embedfleet_core::rundb::RunDbError::Io {
            action: "write",
            path: "run/run.db".into(),
            cause: std::io::Error::from(std::io::ErrorKind::StorageFull),
        };
        let said = io.to_string();
        let err = CommandError::from(anyhow::Error::new(io).context("failed to record the job"));
        assert_eq!(err.process_exit_code(), exit::FAILURE);
        assert_eq!(
            err.lines(),
            vec![
                "error: failed to record the job".to_string(),
                format!("  caused by: {said}")
            ]
        );
        assert!(said.ends_with("no storage space"), "{said}");
    }

    /// An embed job refused by its node's device exits 5 (the submit loop sets that queue
    /// aside); refused by the run's own settings, 4 (the loop pauses the run).
    #[test]
    fn a_device_that_refuses_exits_5_and_settings_that_refuse_exit_4() {
        use embedfleet_embed::job::EmbedJobError;
        use embedfleet_models::ModelError;
        let exit_of = |e: ModelError| {
            CommandError::from(anyhow::Error::new(EmbedJobError::Model(e)).context("batch 7"))
                .process_exit_code()
        };
        let a100 = ModelError::DeviceRefused {
            reason: "--precision fp8 needs compute capability 8.9; this GPU has 8.0".into(),
        };
        assert_eq!(exit_of(a100), exit::DEVICE_REFUSED);
        let no_cudnn = ModelError::AttentionKernel {
            device: "cuda:0".into(),
            reason: "libcudnn.so.9: cannot open shared object file".into(),
        };
        assert_eq!(exit_of(no_cudnn), exit::DEVICE_REFUSED);
        let encoder = ModelError::PrecisionRefused {
            reason: "--precision fp8 is Qwen3-Embedding's".into(),
        };
        assert_eq!(exit_of(encoder), exit::REFUSED);
        // A query job's model refused by its GPU, under the query errors that forward their
        // source: 5 as well.
        let a100 = ModelError::DeviceRefused {
            reason: "compute capability 8.0".into(),
        };
        let query = embedfleet_query::VectorsError::Query(embedfleet_query::QueryError::Embed(
            embedfleet_embed::QueryEmbedError::Model(a100),
        ));
        let err = CommandError::from(anyhow::Error::new(query).context("query-job"));
        assert_eq!(err.process_exit_code(), exit::DEVICE_REFUSED);
    }

    #[test]
    fn a_reader_gone_is_no_failure_and_secrets_are_not_printed() {
        let gone = std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        let err = CommandError::from(anyhow::Error::new(gone).context("printing the status"));
        assert_eq!(err.process_exit_code(), exit::SUCCESS);
        assert!(err.lines().is_empty());
        let err = CommandError::from(anyhow::anyhow!(
            "cannot reach postgresql://embedfleet:hunter2@db:5432/runs"
        ));
        assert!(!err.lines()[0].contains("hunter2"), "{:?}", err.lines());
    }
}
