//! `eval`'s settings, resolved once: where the queries come from (terms embedded by the query
//! model, or papers' own vectors sampled), and what is measured (recall against exact search
//! at each `ef`, or with `--compare-postgres` the run's collection beside a pgvector table).

use crate::flags::EvalFlags;
use crate::settings::query::QueryModelSettings;
use embedfleet_core::rundb::RunDb;
use embedfleet_query::compare::CompareOptions;
use embedfleet_query::EvalOptions;
use std::path::PathBuf;

/// Papers sampled as queries when neither `--queries` nor `--sample` is given.
pub const DEFAULT_EVAL_SAMPLE: usize = 100;

/// What one `eval` measures, with what.
#[derive(Debug, Clone)]
pub struct EvalSettings {
    pub queries: EvalQueries,
    pub measure: EvalMeasure,
    /// JSON on stdout instead of markdown.
    pub json: bool,
}

/// Where the query vectors come from.
#[derive(Debug, Clone, PartialEq)]
pub enum EvalQueries {
    /// `--queries FILE`'s terms, embedded with the query model.
    Terms {
        terms: Vec<String>,
        model: QueryModelSettings,
    },
    /// `papers` of the run's own vectors, slightly perturbed (`--sample N --seed S`).
    Sample { papers: usize, seed: u64 },
}

/// What is measured.
#[derive(Debug, Clone)]
pub enum EvalMeasure {
    /// Recall against exact search at each effort, plotted into `plot`.
    Recall { options: EvalOptions, plot: PathBuf },
    /// The run's collection beside a pgvector table (each at its least effort reaching the
    /// floor), and pgvector's defaults.
    Compare(Comparison),
}

/// `--compare-postgres`: the pgvector table `table` at `postgres`, compared with `options`.
#[derive(Debug, Clone)]
pub struct Comparison {
    pub postgres: String,
    pub table: String,
    pub options: CompareOptions,
}

impl EvalSettings {
    /// `flags` resolved against the run in `db`: the terms read (and the query model found)
    /// before anything is searched, and the filters checked against the run's payload.
    pub fn resolve(db: &RunDb, flags: &EvalFlags) -> anyhow::Result<Self> {
        let queries = match &flags.queries {
            Some(path) => EvalQueries::Terms {
                terms: embedfleet_query::read_terms(path, flags.model.field.as_deref())?,
                model: QueryModelSettings::resolve(&flags.run_dir, &flags.model)?,
            },
            None => EvalQueries::Sample {
                papers: flags.sample.unwrap_or(DEFAULT_EVAL_SAMPLE),
                seed: flags.seed,
            },
        };
        let (k, batch_size, in_flight) = (
            flags.top_k.max(1),
            flags.batch_size.max(1),
            flags.in_flight.max(1),
        );
        let measure = match &flags.compare_postgres {
            Some(url) => EvalMeasure::Compare(Comparison {
                postgres: url.clone(),
                table: (flags.compare_table.clone()).unwrap_or_else(|| flags.collection.clone()),
                options: CompareOptions {
                    k,
                    floor: flags.recall_floor,
                    batch_size,
                    in_flight,
                    extra_filter: embedfleet_query::run_filters(db, &flags.filters)
                        .map_err(anyhow::Error::msg)?
                        .map(|f| (flags.filters.join(" & "), f)),
                },
            }),
            None => EvalMeasure::Recall {
                options: EvalOptions {
                    collection: flags.collection.clone(),
                    k,
                    efs: flags.ef.clone(),
                    filters: flags.filters.clone(),
                    batch_size,
                    in_flight,
                },
                plot: (flags.plot.clone())
                    .unwrap_or_else(|| embedfleet_query::eval::default_plot_path(&flags.run_dir)),
            },
        };
        Ok(Self {
            queries,
            measure,
            json: flags.json,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::TargetFlags;

    fn flags(run_dir: &std::path::Path) -> EvalFlags {
        EvalFlags {
            run_dir: run_dir.into(),
            target: TargetFlags::default(),
            collection: "papers".into(),
            queries: None,
            sample: None,
            seed: 7,
            filters: Vec::new(),
            ef: vec![16, 64],
            top_k: 0,
            batch_size: 0,
            in_flight: 4,
            json: false,
            compare_postgres: None,
            compare_table: None,
            recall_floor: 0.95,
            plot: None,
            model: Default::default(),
        }
    }

    #[test]
    fn a_bare_eval_samples_the_runs_papers_and_plots_into_the_run() {
        let dir = tempfile::tempdir().unwrap();
        let db = RunDb::create(dir.path()).unwrap();
        let s = EvalSettings::resolve(&db, &flags(dir.path())).unwrap();
        assert_eq!(
            s.queries,
            EvalQueries::Sample {
                papers: DEFAULT_EVAL_SAMPLE,
                seed: 7
            }
        );
        let EvalMeasure::Recall { options, plot } = s.measure else {
            panic!("no --compare-postgres: recall")
        };
        assert_eq!(
            (options.k, options.batch_size, options.in_flight),
            (1, 1, 4)
        );
        assert_eq!(options.efs, [16, 64]);
        assert_eq!(plot, dir.path().join("eval").join("recall.png"));
    }

    #[test]
    fn a_comparison_reads_the_table_of_the_collections_name_unless_given_one() {
        let dir = tempfile::tempdir().unwrap();
        let db = RunDb::create(dir.path()).unwrap();
        let compare = EvalFlags {
            compare_postgres: Some("postgresql://u@127.0.0.1/db".into()),
            sample: Some(5),
            ..flags(dir.path())
        };
        let table_of = |f: &EvalFlags| match EvalSettings::resolve(&db, f).unwrap().measure {
            EvalMeasure::Compare(c) => (c.table, c.options.floor),
            EvalMeasure::Recall { .. } => panic!("--compare-postgres compares"),
        };
        assert_eq!(table_of(&compare), ("papers".to_string(), 0.95));
        let named = EvalFlags {
            compare_table: Some("papers_pg".into()),
            ..compare
        };
        assert_eq!(table_of(&named).0, "papers_pg");
    }

    #[test]
    fn terms_that_cannot_be_read_are_refused_before_anything_is_searched() {
        let dir = tempfile::tempdir().unwrap();
        let db = RunDb::create(dir.path()).unwrap();
        let missing = EvalFlags {
            queries: Some(dir.path().join("no-such-terms.txt")),
            ..flags(dir.path())
        };
        let err = EvalSettings::resolve(&db, &missing)
            .unwrap_err()
            .to_string();
        assert!(err.contains("no-such-terms.txt"), "{err}");
    }
}
