//! `report`'s settings, resolved once: the page and the trace to write, and whether the table
//! is wanted too (it is, unless only the page or the trace was asked for).

use crate::flags::ReportFlags;
use std::path::PathBuf;

/// What one `report` writes and prints.
#[derive(Debug, Clone, PartialEq)]
pub struct ReportSettings {
    /// The HTML page (`--html FILE`).
    pub html: Option<PathBuf>,
    /// The Chrome trace (`--trace FILE`).
    pub trace: Option<PathBuf>,
    /// The study's table; `None` when only the page or the trace was asked for (then a run
    /// with no finished batch is no error).
    pub table: Option<TableOutput>,
}

/// How the table comes out.
#[derive(Debug, Clone, PartialEq)]
pub struct TableOutput {
    /// JSON on stdout instead of markdown.
    pub json: bool,
    /// The plots, written into this folder.
    pub plots: Option<PathBuf>,
}

impl ReportSettings {
    pub fn resolve(flags: &ReportFlags) -> Self {
        let file_only = flags.html.is_some() || flags.trace.is_some();
        let table_asked = flags.json || flags.plots.is_some();
        Self {
            html: flags.html.clone(),
            trace: flags.trace.clone(),
            table: (!file_only || table_asked).then(|| TableOutput {
                json: flags.json,
                plots: flags.plots.clone(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags() -> ReportFlags {
        ReportFlags {
            run_dir: "run".into(),
            plots: None,
            json: false,
            html: None,
            trace: None,
        }
    }

    #[test]
    fn the_table_is_left_out_only_when_the_page_or_trace_alone_was_asked_for() {
        let table = |f: &ReportFlags| ReportSettings::resolve(f).table;
        assert!(
            table(&flags()).is_some(),
            "a bare `report` prints the table"
        );
        let page = ReportFlags {
            html: Some("r.html".into()),
            ..flags()
        };
        assert_eq!(table(&page), None);
        let trace = ReportFlags {
            trace: Some("t.json".into()),
            ..flags()
        };
        assert_eq!(table(&trace), None);
        let page_and_json = ReportFlags {
            json: true,
            ..page.clone()
        };
        assert_eq!(
            table(&page_and_json),
            Some(TableOutput {
                json: true,
                plots: None
            })
        );
        let page_and_plots = ReportFlags {
            plots: Some("p".into()),
            ..page
        };
        assert!(table(&page_and_plots).is_some_and(|t| t.plots.is_some() && !t.json));
    }
}
