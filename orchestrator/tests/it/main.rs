//! The orchestrator's integration tests, in one binary (one link instead of five).

mod scheduler_bench;
mod scheduler_command;
mod scheduler_local;
mod scheduler_parse;
mod scheduler_pbs_fixtures;
mod scheduler_slurm;
