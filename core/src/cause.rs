//! How an error says what caused it. An error either says its source in its message or
//! returns it from `source()`, never both (the rule of the Rust API guidelines), so that
//! whoever prints an error and its chain says each cause once, by the chain's structure
//! rather than by comparing text.
//!
//! The library errors say theirs: a line of theirs is whole wherever only a line is kept (a
//! job's failure in run.db, a notify event, a log line, a queue's refusal). Such a variant
//! holds its cause in a field named `cause` (not `source`, which `thiserror` would also
//! return; a tuple variant gets its `From` by hand rather than `#[from]`, which returns it too)
//! and says it with `{cause}`. `anyhow`'s contexts, `#[error(transparent)]` wrappers and the
//! few errors that say only what they tried (`SchedulerError::CommandSpawn`) return theirs.
//! [`chain_line`] and the command's error printer say each error of the chain.

use std::error::Error;

/// `e` and each error under it, `: ` between them: what a log line or a recorded failure
/// keeps.
pub fn chain_line(e: &(dyn Error + 'static)) -> String {
    let mut line = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        line.push_str(": ");
        line.push_str(&cause.to_string());
        source = cause.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum Saying {
        /// Says its cause, so returns none.
        #[error("failed to read {path}: {cause}")]
        Read { path: String, cause: Returning },
    }

    #[derive(Debug, thiserror::Error)]
    #[error("the file is locked")]
    struct Returning {
        #[source]
        source: std::io::Error,
    }

    #[test]
    fn each_cause_is_said_once_whether_said_in_the_message_or_returned() {
        let returning = || Returning {
            source: std::io::Error::other("NFS server not responding"),
        };
        assert_eq!(
            chain_line(&returning()),
            "the file is locked: NFS server not responding"
        );
        let saying = Saying::Read {
            path: "a.parquet".into(),
            cause: returning(),
        };
        assert!(saying.source().is_none(), "said, so not returned");
        assert_eq!(
            chain_line(&saying),
            "failed to read a.parquet: the file is locked"
        );
    }
}
