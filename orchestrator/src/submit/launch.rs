//! Sending jobs: each round fills the queues with room from the pending batches, and each job
//! gets the next attempt number of its batches, a name, a script and a row in run.db before the
//! scheduler sees it. A queue the scheduler refused gets no more jobs; one whose submission
//! failed for now cools off, longer after each failure in a row.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use embedfleet_core::rundb::NewJob;
use embedfleet_core::state::JobStatus;
use embedfleet_core::RunLayout;

use super::error::Result;
use super::job_files::{with_binary, JobFiles};
use super::naming::job_name;
use super::submit_loop::SubmitLoop;
use crate::route::PlannedJob;
use crate::scheduler::{render_job_script, SchedulerError};

/// What became of a submission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Sent {
    /// The scheduler took job NAME.
    Yes(String),
    /// It failed in a way worth waiting out (or may have queued it: the next round looks):
    /// the queue cools off.
    NotNow,
    /// The scheduler refused the queue for good: no more jobs go there.
    Refused,
}

impl SubmitLoop<'_> {
    /// What the backend finds wrong before the first job: a queue the server lacks, or a host
    /// that fails its checks, is refused as a scheduler's refusal would be; a server that did
    /// not answer (restarting) or a queue disabled for now only cools the queue off: it is
    /// tried again, and a loop started while the server was down does not stall for good.
    pub(super) fn preflight_queues(&mut self) {
        let now = embedfleet_core::owner::unix_now();
        let poll = self.opts.policy.poll_interval.as_secs_f64();
        for problem in self.scheduler.preflight(&self.run_dir) {
            if problem.lasting {
                self.console.say(format!(
                    "queue {}: {}; no jobs go there in this run",
                    problem.queue, problem.reason
                ));
                self.refused.insert(problem.queue, problem.reason);
            } else {
                let wait = self.routing.submission_failed(&problem.queue, now, poll);
                self.console.say(format!(
                    "queue {}: {}; tried again in {}",
                    problem.queue,
                    problem.reason,
                    crate::status::duration(wait)
                ));
                self.unusable_why.insert(problem.queue, problem.reason);
            }
        }
    }

    /// Why each unusable queue of this round's outlook is so, for `status`.
    fn say_why_unusable(&mut self, now: f64) {
        let cooling: BTreeSet<String> = self.routing.cooling(now).cloned().collect();
        let caps = self.caps().unwrap_or_default();
        for q in self.routing.outlook.iter_mut() {
            q.unusable_why = if q.state != "unusable" {
                None
            } else if let Some(why) = self.refused.get(&q.queue) {
                Some(format!("refused: {why}"))
            } else if cooling.contains(&q.queue) {
                let last = self
                    .unusable_why
                    .get(&q.queue)
                    .map(|w| format!(" ({w})"))
                    .unwrap_or_default();
                Some(format!(
                    "its last submissions failed{last}: tried again once it has cooled off"
                ))
            } else if caps.get(&q.queue) == Some(&0) {
                Some("cap 0 (`embedfleet queues set`)".to_string())
            } else {
                None
            };
        }
    }

    pub(super) fn submit_round(&mut self) -> Result<()> {
        let caps = self.caps()?;
        let open = self.db.open_jobs()?;
        let now = embedfleet_core::owner::unix_now();
        // A queue that is refused, or cooling after a failed submission, gets no job this
        // round: its batches go to the queues that take them.
        let disabled: BTreeSet<String> = self
            .refused
            .keys()
            .chain(self.routing.cooling(now))
            .cloned()
            .collect();
        let plan = self.plan_round(&caps, &open, &disabled)?;
        self.say_why_unusable(now);
        self.apply_moves(&plan, &open)?;
        let mut failed_now: BTreeSet<String> = BTreeSet::new();
        for (k, job) in plan.jobs.iter().chain(&plan.twins).enumerate() {
            let twin = k >= plan.jobs.len();
            if twin {
                self.console.say(format!(
                    "batch {}: its job waits far longer than {} starts jobs; a speculative twin \
                     goes there (the first to finish is kept, the other cancelled)",
                    job.batches[0], job.queue
                ));
            }
            if self.refused.contains_key(&job.queue) || failed_now.contains(&job.queue) {
                continue;
            }
            let sent = self.submit_job(job)?;
            if let Sent::Yes(name) = &sent {
                self.routing.sent(name, &job.queue, twin);
            }
            if sent == Sent::NotNow {
                // This queue is not taking jobs now (a drained partition, say): the others
                // still are. Its batches wait for the next round, when they go elsewhere.
                failed_now.insert(job.queue.clone());
                self.unusable_why
                    .insert(job.queue.clone(), "the scheduler did not take a job".into());
                let poll = self.opts.policy.poll_interval.as_secs_f64();
                let wait = self.routing.submission_failed(
                    &job.queue,
                    embedfleet_core::owner::unix_now(),
                    poll,
                );
                let when = if wait <= poll {
                    "at the next poll".to_string()
                } else {
                    format!("in {}", crate::status::duration(wait))
                };
                self.console.say(format!(
                    "queue {}: not taking jobs now; tried again {when}, its batches go to the \
                     other queues meanwhile",
                    job.queue
                ));
            }
        }
        Ok(())
    }

    /// Submits one job.
    pub(super) fn submit_job(&mut self, job: &PlannedJob) -> Result<Sent> {
        let attempt = self.next_attempt(&job.batches)?;
        let (files, text) = self.render(job, attempt)?;
        files.write_script(&text)?;
        let name = files.name.clone();
        let text = |p: &Path| p.display().to_string();
        self.db.insert_job(&NewJob {
            batches: &job.batches,
            attempt,
            backend: self.scheduler.backend().name(),
            queue: &job.queue,
            name: &name,
            script: &text(&files.script),
            log: &text(&files.log),
            marker: &text(&files.marker),
        })?;
        let submission = files.submission(&job.queue, &self.run_dir);
        match self.scheduler.submit(&submission) {
            Ok(id) => {
                self.db.set_job_submitted(&name, id.as_str())?;
                for b in &job.batches {
                    *self.following.attempts.entry(*b).or_default() += 1;
                }
                self.report.submitted += 1;
                if self.report.submitted == 1 {
                    for (key, value) in &self.opts.keep_on_first_job {
                        self.db.set_setting(key, value)?;
                    }
                }
                tracing::info!(job = %name, id = %id, queue = %job.queue, "submitted");
                Ok(Sent::Yes(name))
            }
            Err(SchedulerError::SubmitUncertain { .. }) => {
                // Maybe queued: `settle_submitting` looks it up by name next round.
                self.console.say(format!(
                    "submitting {name} timed out; looking for it in the queue next round"
                ));
                Ok(Sent::NotNow)
            }
            Err(SchedulerError::InvalidJob { reason, .. }) => {
                self.not_submitted(&name, &reason)?;
                self.console.say(format!(
                    "queue {}: the scheduler refused it ({reason}); no more jobs go there in this \
                     run (fix it with `embedfleet queues set`)",
                    job.queue
                ));
                // The queue's own remedy goes with its reason: the run's last line repeats it
                // when every queue ends up refused.
                let remedy = "fix the queue with `embedfleet queues set`";
                self.refused
                    .insert(job.queue.clone(), format!("{reason}; {remedy}"));
                Ok(Sent::Refused)
            }
            Err(e) if e.is_transient() => {
                self.not_submitted(&name, &e.to_string())?;
                self.console
                    .say(format!("submitting {name} failed ({e}); will try again"));
                Ok(Sent::NotNow)
            }
            Err(e @ SchedulerError::UnexpectedOutput { .. }) => {
                // The scheduler took the submission but its answer made no sense: the job may
                // be queued. It stays `submitting`, for the next `submit` to look up by name.
                Err(e.into())
            }
            Err(e) => {
                self.not_submitted(&name, &e.to_string())?;
                Err(e.into())
            }
        }
    }

    /// The scheduler refused job `name`. Its rows stay, as failed, so that their attempt number
    /// is never taken again (see [`Self::next_attempt`]).
    fn not_submitted(&self, name: &str, why: &str) -> Result<()> {
        let reason = format!("not submitted: {why}");
        Ok(self
            .db
            .set_job_state(name, JobStatus::Failed, Some(&reason))?)
    }

    /// The attempt number of a new job of `batches`: above every number a job of any of them
    /// was recorded under, whether it ran, was refused or its submission was uncertain (those
    /// rows are kept for this). Two submissions thus never share a name, and so never a script,
    /// a log or an exit marker that an untracked twin could write for the tracked job. Numbers
    /// whose script is already in `jobs/` are skipped too: run.db of runs submitted before
    /// this rule lost the rows of failed submissions, not their files.
    pub(super) fn next_attempt(&self, batches: &[i64]) -> Result<u32> {
        let mut attempt = 0;
        for b in batches {
            attempt = attempt.max(self.db.last_attempt(*b)?);
        }
        let layout = RunLayout::new(&self.run_dir);
        loop {
            attempt += 1;
            let name = self.job_name(batches[0], attempt);
            if !layout.job_script(&name).exists() {
                return Ok(attempt);
            }
        }
    }

    fn job_name(&self, first_batch: i64, attempt: u32) -> String {
        job_name(&self.tag, self.scheduler.backend(), first_batch, attempt)
    }

    /// The job's files and script text.
    pub(super) fn render(&self, job: &PlannedJob, attempt: u32) -> Result<(JobFiles, String)> {
        let name = self.job_name(job.batches[0], attempt);
        let files = JobFiles::new(&RunLayout::new(&self.run_dir), &name);
        let config = with_binary(&self.opts.config.scheduler, &job.queue, &self.opts.exe);
        let batches = job.batches.iter().map(|b| *b as u64).collect();
        let script_job = files.script_job(
            &job.queue,
            &self.run_dir,
            batches,
            self.opts.embed_args.clone(),
        );
        let text = render_job_script(self.scheduler.backend(), &config, &script_job)?;
        Ok((files, text))
    }

    /// The queues and caps this loop fills: the run's, or the trial's one queue of cap 1.
    pub(super) fn caps(&self) -> Result<BTreeMap<String, u32>> {
        match &self.opts.session.trial {
            Some(queue) => Ok(BTreeMap::from([(queue.clone(), 1)])),
            None => {
                let mut caps = self.db.queue_caps()?;
                // A queue's own stated limit (PBS's `max_queued` of a queue) lowers its cap.
                for (queue, n) in self.asked.job_limit.iter().flat_map(|l| &l.queues) {
                    if let Some(cap) = caps.get_mut(queue) {
                        *cap = (*cap).min(*n);
                    }
                }
                Ok(caps)
            }
        }
    }

    /// The batches this loop is about: all of them, or the trial's one.
    pub(super) fn in_scope(&self, mut batches: Vec<i64>) -> Vec<i64> {
        batches.retain(|&b| self.is_in_scope(b));
        batches
    }

    /// Whether a batch in scope waits for a job: asked without reading every such batch
    /// unless a trial narrows the scope to one.
    pub(super) fn any_pending_in_scope(&self) -> Result<bool> {
        Ok(match self.opts.session.trial {
            Some(_) => !self.in_scope(self.db.batches_without_job()?).is_empty(),
            None => self.db.any_batch_without_job()?,
        })
    }

    pub(super) fn is_in_scope(&self, batch: i64) -> bool {
        self.opts.session.trial.is_none() || self.trial_batch == Some(batch)
    }

    pub(super) fn all_refused(&self) -> Result<bool> {
        let caps = self.caps()?;
        Ok(caps
            .iter()
            .filter(|(_, cap)| **cap > 0)
            .all(|(q, _)| self.refused.contains_key(q)))
    }

    pub(super) fn refused_text(&self) -> String {
        let parts: Vec<String> = self
            .refused
            .iter()
            .map(|(q, why)| format!("{q}: {why}"))
            .collect();
        parts.join("; ")
    }
}
