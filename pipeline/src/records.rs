//! What the run records of the commands run on it, for `publish`: the command lines that
//! changed it (the dataset card's history) and the files `query` wrote (the query results the
//! dataset ships). Both live in run.db's settings under keys only this module names.

use std::path::{Path, PathBuf};

use embedfleet_core::rundb::RunDb;

use crate::error::{io, Result};

/// The run.db setting listing the command lines that changed the run.
const HISTORY_SETTING: &str = "history";
/// The run.db setting listing the outputs of the run's `query` commands.
const QUERY_OUTPUTS_SETTING: &str = "query.outputs";

/// Appends `line` to the run's history, unless it is the last line there already (a command
/// run again in a row is one step).
pub fn record_command(db: &RunDb, line: &str) -> Result<()> {
    let mut history = history(db)?;
    if history.last().map(String::as_str) != Some(line) {
        history.push(line.to_string());
        db.set_setting(HISTORY_SETTING, &history)?;
    }
    Ok(())
}

/// The command lines that changed the run, oldest first.
pub fn history(db: &RunDb) -> Result<Vec<String>> {
    Ok(db.setting(HISTORY_SETTING)?.unwrap_or_default())
}

/// Remembers a query output for `publish` (by its absolute path, once).
pub fn record_query_output(db: &RunDb, output: &Path) -> Result<()> {
    let path = std::path::absolute(output).map_err(io("find the absolute path of", output))?;
    let mut outputs: Vec<PathBuf> = db.setting(QUERY_OUTPUTS_SETTING)?.unwrap_or_default();
    if !outputs.contains(&path) {
        outputs.push(path);
        db.set_setting(QUERY_OUTPUTS_SETTING, &outputs)?;
    }
    Ok(())
}

/// The query results `publish` ships: the files given, else the run's recorded query outputs
/// that are still there.
pub fn query_results(db: &RunDb, given: &[PathBuf]) -> Result<Vec<PathBuf>> {
    if !given.is_empty() {
        return Ok(given.to_vec());
    }
    let recorded: Vec<PathBuf> = db.setting(QUERY_OUTPUTS_SETTING)?.unwrap_or_default();
    Ok(recorded.into_iter().filter(|p| p.is_file()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_run_again_in_a_row_is_one_step_of_the_history() {
        let dir = tempfile::tempdir().unwrap();
        let db = RunDb::create(dir.path()).unwrap();
        for line in [
            "embedfleet plan",
            "embedfleet run",
            "embedfleet run",
            "embedfleet plan",
        ] {
            record_command(&db, line).unwrap();
        }
        assert_eq!(
            history(&db).unwrap(),
            ["embedfleet plan", "embedfleet run", "embedfleet plan"]
        );
    }

    #[test]
    fn publish_ships_the_given_results_else_the_recorded_ones_still_there() {
        let dir = tempfile::tempdir().unwrap();
        let db = RunDb::create(dir.path()).unwrap();
        let (kept, gone) = (dir.path().join("a.parquet"), dir.path().join("b.parquet"));
        std::fs::write(&kept, b"x").unwrap();
        for path in [&kept, &gone, &kept] {
            record_query_output(&db, path).unwrap();
        }
        assert_eq!(query_results(&db, &[]).unwrap(), [kept]);
        let given = [dir.path().join("c.parquet")];
        assert_eq!(query_results(&db, &given).unwrap(), given);
    }
}
