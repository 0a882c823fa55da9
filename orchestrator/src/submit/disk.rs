//! A full disk in the submit loop: the run directory's filesystem (or the user's quota on it)
//! is the environment, not the batch. With less free than one job's shards, no job is sent and
//! the run is paused with the numbers and the path (`status` shows it); the jobs running go on.
//! A job that ended for want of room (embed-job's exit code 6, or any failure while the disk is
//! full) uses none of its batch's attempts, feeds no breaker, and its batch waits for room. When
//! run.db itself cannot be written (SQLite: "database or disk is full"), the round is given up
//! whole (nothing half taken in: each ingest is a transaction) and tried again next poll. Once
//! there is room the loop goes on by itself; `embedfleet resume` is not needed.

use embedfleet_core::rundb::PauseReason;
use embedfleet_core::space::{self, Room, Space};

use super::error::{Result, SubmitError};
use super::submit_loop::SubmitLoop;

/// [`PauseReason::by`] of a pause for room.
pub const BY_DISK: &str = "disk";

/// Free bytes kept beyond a job's shards: its log, its result manifest, run.db's growth.
const MARGIN_BYTES: u64 = 256 << 10;

/// What the loop knows of the room it needs.
#[derive(Debug, Default)]
pub(super) struct DiskWatch {
    /// Bytes one paper's row takes in the shards (`SubmitOptions::bytes_per_paper`); 0: not
    /// watched.
    bytes_per_paper: u64,
    /// Bytes the largest batch's shards take: with less free, its job cannot finish.
    per_job: u64,
    /// Jobs are held for room now (said when it starts and when it ends).
    holding: bool,
    /// Rounds given up because run.db could not be written, in a row (said at the first).
    unwritable_rounds: u32,
}

impl DiskWatch {
    /// A watch of `bytes_per_paper` per row, for batches of at most `largest_batch` papers.
    pub(super) fn new(bytes_per_paper: u64, largest_batch: u64) -> Self {
        Self {
            bytes_per_paper,
            per_job: largest_batch.saturating_mul(bytes_per_paper),
            ..Self::default()
        }
    }

    /// Whether `space` has room for one more job.
    fn room_for_a_job(&self, space: &Space) -> bool {
        space.free >= self.per_job.saturating_add(MARGIN_BYTES)
    }
}

impl SubmitLoop<'_> {
    /// The run directory's room, or `None` when it is not watched or cannot be read (a
    /// filesystem that does not answer statvfs is not called full).
    fn space(&self) -> Option<Space> {
        if self.disk.bytes_per_paper == 0 {
            return None;
        }
        match space::space_of(&self.run_dir) {
            Ok(space) => Some(space),
            Err(e) => {
                tracing::info!("free space of {} not read: {e}", self.run_dir.display());
                None
            }
        }
    }

    /// Whether the run directory is too full for one more job right now.
    pub(super) fn disk_full_now(&self) -> bool {
        self.space()
            .is_some_and(|space| !self.disk.room_for_a_job(&space))
    }

    /// The room of the run: what is free, what the rest writes, what a job writes.
    fn room(&self, space: Space) -> Room {
        let remaining = self
            .db
            .status()
            .map(|s| s.papers_planned.saturating_sub(s.rows_in_shards))
            .unwrap_or(0);
        Room {
            dir: self.run_dir.clone(),
            space,
            needed: remaining.saturating_mul(self.disk.bytes_per_paper),
            per_job: self.disk.per_job,
        }
    }

    /// Whether this round's jobs are held for room: with less free than one job's shards the
    /// run is paused for it (said once, recorded where run.db can still be written), and the
    /// pause is lifted by itself once there is room again.
    pub(super) fn hold_for_room(&mut self) -> Result<bool> {
        let Some(mut space) = self.space() else {
            return Ok(false);
        };
        if !self.disk.room_for_a_job(&space) {
            // run.db's write-ahead log keeps its largest size: what it holds beyond run.db's
            // own pages is room a job can use.
            if let Err(e) = self.db.shrink_wal() {
                tracing::info!("run.db's log not shrunk: {e}");
            }
            space = self.space().unwrap_or(space);
        }
        let short = !self.disk.room_for_a_job(&space);
        if short {
            let room = self.room(space);
            if !self.disk.holding {
                self.disk.holding = true;
                self.console.say(format!(
                    "no room for another job: {}. No new job is sent until there is room \
                     (the jobs running go on); free space there or raise the quota, and the \
                     loop goes on by itself",
                    room.describe()
                ));
            }
            if !self.db.paused().unwrap_or(true) {
                // Recorded for `status` where run.db can still be written; said above either way.
                if let Err(e) = self.db.pause_for(&pause_reason(&room)) {
                    tracing::info!("the pause for room not recorded: {e}");
                }
            }
        } else if self.disk.holding {
            self.disk.holding = false;
            self.db.lift_pause_by(BY_DISK)?;
            self.console.say(format!(
                "room again: {} free at {}; jobs are sent again",
                space::size(space.free),
                self.run_dir.display()
            ));
        }
        Ok(short)
    }

    /// A round that failed: given up and tried again next poll when it was run.db or a file
    /// that could not be written for want of room (said at the first such round); else the
    /// loop's error.
    pub(super) fn round_failed(&mut self, e: SubmitError) -> Result<()> {
        if !e.is_disk_full() {
            return Err(e);
        }
        self.disk.unwritable_rounds += 1;
        if self.disk.unwritable_rounds == 1 {
            let room = space::space_of(&self.run_dir)
                .map(|space| format!(" ({})", self.room(space).describe()))
                .unwrap_or_default();
            self.console.say(format!(
                "the run directory is full{room}: {e}. Nothing is lost (what was taken in \
                 stays, nothing is half taken in); the loop tries again each poll and goes on \
                 by itself once there is room: free space there or raise the quota"
            ));
        }
        Ok(())
    }

    /// A round went through: a stretch of rounds given up for room has ended.
    pub(super) fn round_went_through(&mut self) {
        if self.disk.unwritable_rounds > 0 {
            self.console.say(format!(
                "run.db written again after {} polls without room; the loop goes on",
                self.disk.unwritable_rounds
            ));
            self.disk.unwritable_rounds = 0;
        }
    }
}

/// The pause's record: what `status` shows.
fn pause_reason(room: &Room) -> PauseReason {
    PauseReason {
        by: BY_DISK.to_string(),
        message: format!("no room for another job: {}", room.describe()),
        signature: "the run directory's filesystem is full (or the quota on it exceeded)".into(),
        jobs: Vec::new(),
        logs: Vec::new(),
        check: vec![
            format!(
                "free space at {} or raise the quota (`df -h`, or the site's quota tool)",
                room.dir.display()
            ),
            "the submit loop goes on by itself once there is room; `embedfleet resume` is not \
             needed"
                .into(),
        ],
        at_unix_s: embedfleet_core::owner::unix_now() as u64,
    }
}

impl SubmitError {
    /// Whether this is a full disk or an exceeded quota (the loop waits for room instead of
    /// ending).
    pub fn is_disk_full(&self) -> bool {
        match self {
            SubmitError::Io { cause, .. } => space::is_disk_full(cause),
            other => space::says_disk_full(&other.to_string()),
        }
    }
}
