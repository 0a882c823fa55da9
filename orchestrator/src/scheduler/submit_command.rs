/*!
Running a backend's submit command (`sbatch`, `qsub`): the one place that says what its
failures mean, from the words the backend lists in its [`Refusals`].

- A call that timed out may have queued the job: it is never repeated, and the error is
  [`SchedulerError::SubmitUncertain`], so that the submit loop looks for the job by name.
- An answer that the queue does not exist is [`SchedulerError::InvalidJob`] naming the queue
  and how to list the ones there are: the loop sends no more jobs there.
- Such an answer, or another the backend lists as permanent (an invalid account, a missing
  script), is not repeated; any other failure is retried by the command policy.
*/

use super::{
    Call, CommandOutput, CommandRunner, JobSubmission, ProgramConfig, RetryOn, SchedulerError,
    SchedulerResult,
};

/// What a backend's submit command answers when repeating cannot help: fragments of its
/// stderr, matched without regard to case.
#[derive(Debug, Clone, Copy)]
pub struct Refusals {
    /// The queue does not exist (`invalid partition`).
    pub unknown_queue: &'static [&'static str],
    /// Other answers that repeating cannot fix (`invalid account`).
    pub permanent: &'static [&'static str],
    /// The command that lists the queues there are (`sinfo -s`), for the message.
    pub list_queues: &'static str,
}

impl Refusals {
    fn says_unknown_queue(&self, stderr: &str) -> bool {
        contains_any(stderr, self.unknown_queue)
    }

    fn is_permanent(&self, output: &CommandOutput) -> bool {
        self.says_unknown_queue(&output.stderr) || contains_any(&output.stderr, self.permanent)
    }
}

fn contains_any(text: &str, fragments: &[&str]) -> bool {
    let text = text.to_lowercase();
    fragments.iter().any(|f| text.contains(f))
}

/// Runs the submit command `program` (default name `default_name`) with `call` for `job`;
/// its output when it was accepted (see the module's doc for the failures).
pub fn submit_command(
    runner: &CommandRunner,
    program: &ProgramConfig,
    default_name: &str,
    call: Call<'_>,
    job: &JobSubmission,
    refusals: &Refusals,
) -> SchedulerResult<CommandOutput> {
    let permanent = |o: &CommandOutput| refusals.is_permanent(o);
    let call = call.retry(RetryOn::FailureNotTimeout).permanent(&permanent);
    match runner.run(program, default_name, call) {
        Ok(out) => Ok(out),
        Err(e @ SchedulerError::CommandTimedOut { .. }) => Err(SchedulerError::SubmitUncertain {
            name: job.name.clone(),
            source: Box::new(e),
        }),
        Err(SchedulerError::CommandFailed { stderr_tail, .. })
            if refusals.says_unknown_queue(&stderr_tail) =>
        {
            Err(SchedulerError::InvalidJob {
                name: job.name.clone(),
                reason: format!(
                    "queue `{}` does not exist on this scheduler (list queues with `{}`); \
                     scheduler said: {}",
                    job.queue,
                    refusals.list_queues,
                    stderr_tail.trim()
                ),
            })
        }
        Err(e) => Err(e),
    }
}
