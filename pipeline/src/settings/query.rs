//! `query`'s settings, and the query model's that `eval` and the query job share: the model
//! that embeds query terms, the terms, the search, and the workload's batching (as given, else
//! what `tune` saved for the same kind of sink, else the study's best).

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use embedfleet_core::handoff::OutputSettings;
use embedfleet_core::rundb::RunDb;
use embedfleet_core::RunLayout;
use embedfleet_models::{ModelFamily, TextRule};
use embedfleet_query::QueryOptions;
use embedfleet_vectordb::{SearchOptions, Sink};

use crate::flags::{QueryFlags, QueryModelFlags};

use crate::error::{PipelineError, Result};

/// The model that embeds query terms, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryModelSettings {
    /// The given directory, else the tiny model `run` wrote into the run directory.
    pub model_dir: PathBuf,
    pub dim: Option<usize>,
    /// As given; each step has its own default (this host: `cpu`; a query job: its node's).
    pub devices: Option<String>,
    /// The given instruction, else the model's retrieval instruction.
    pub instruction: String,
    /// The run's pinned precision: an FP8 run's queries are embedded with FP8 projections too.
    pub precision: embedfleet_core::Precision,
    /// The run's text rule: a query's text is prepared as its papers' were (`None`: a run
    /// fixed before embedfleet recorded it; today's rule where the run has no settings yet).
    pub text_rule: Option<TextRule>,
}

impl QueryModelSettings {
    /// As given, else as the run's shards were made (`output-settings.json`: the model and
    /// its dimension), else the tiny model `run` wrote.
    pub fn resolve(run_dir: &Path, flags: &QueryModelFlags) -> Result<Self> {
        let layout = RunLayout::new(run_dir);
        let made_with = OutputSettings::read(&layout)?;
        let recorded = made_with
            .as_ref()
            .map(|s| PathBuf::from(&s.model_dir))
            .filter(|dir| dir.is_dir());
        let tiny = Some(layout.tiny_model_dir()).filter(|dir| dir.is_dir());
        let Some(model_dir) = flags.model_dir.clone().or(recorded).or(tiny) else {
            return Err(PipelineError::NoQueryModel {
                recorded: made_with.map(|s| s.model_dir),
            });
        };
        let text_rule = match &made_with {
            Some(s) => TextRule::recorded(s.text_rule.as_deref()).map_err(|problem| {
                crate::error::Refused {
                    problems: vec![problem],
                }
            })?,
            None => Some(TextRule::default()),
        };
        Ok(Self {
            text_rule,
            precision: made_with.as_ref().map(|s| s.precision).unwrap_or_default(),
            dim: flags.dim.or(made_with.and_then(|s| s.dim)),
            devices: flags.devices.clone(),
            instruction: instruction(&model_dir, flags.instruction.as_deref())?,
            model_dir,
        })
    }
}

/// What one `query` runs with: its terms, the model that embeds them, and what becomes of
/// them.
pub struct QuerySettings {
    pub model: QueryModelSettings,
    pub run: QueryRun,
}

/// What becomes of a query's terms.
pub enum QueryRun {
    /// No `--output`: each term's top hits printed, nothing written.
    Print {
        terms: Vec<String>,
        search: SearchOptions,
    },
    /// `--output FILE`: the query workload, its batching as given, else as `tune --queries`
    /// measured it for this kind of database, else the study's best.
    Workload(Box<QueryOptions>),
}

impl QuerySettings {
    /// `flags` resolved against the run in `db`, for a query of `sink`. A collection that was
    /// never uploaded is refused here, before anything is embedded or written.
    pub fn resolve(db: &RunDb, sink: &dyn Sink, flags: &QueryFlags) -> anyhow::Result<Self> {
        let terms = match &flags.terms {
            Some(path) => embedfleet_query::read_terms(path, flags.model.field.as_deref())?,
            None => flags.term_args.clone(),
        };
        let model = QueryModelSettings::resolve(&flags.run_dir, &flags.model)?;
        let filter =
            embedfleet_query::run_filters(db, &flags.filters).map_err(anyhow::Error::msg)?;
        let search = SearchOptions {
            filter,
            ..SearchOptions::new(flags.top_k.max(1))
        };
        // What the results answer: the collection as it is now, and the model.
        let searched =
            crate::searched::searched(db, sink, &flags.collection, &model.model_dir, model.dim)?;
        let Some(output) = &flags.output else {
            return Ok(Self {
                model,
                run: QueryRun::Print { terms, search },
            });
        };
        let batching =
            crate::tuned::query_batching(db, sink.kind(), (flags.batch_size, flags.in_flight))?;
        let options = QueryOptions {
            collection: flags.collection.clone(),
            terms,
            instruction: model.instruction.clone(),
            search,
            batch_size: batching.batch_size.value,
            in_flight: batching.in_flight.value,
            output: output.clone(),
            part_queries: flags.part_queries.max(1),
            progress: std::io::stderr().is_terminal(),
            searched,
            replace: flags.replace,
        };
        Ok(Self {
            model,
            run: QueryRun::Workload(Box::new(options)),
        })
    }
}

/// A query's instruction: as given, else the default of the model family that `model_dir`'s
/// `config.json` names (each family has its own retrieval task).
pub fn instruction(model_dir: &Path, given: Option<&str>) -> Result<String> {
    Ok(match given {
        Some(text) => text.to_string(),
        None => embedfleet_models::query_instruction(model_dir)?,
    })
}

/// The family of the model the run's shards were made with (`output-settings.json`), else of
/// the tiny model `run` wrote; `None` when neither directory can be read (a card then names no
/// query format).
pub fn run_model_family(run_dir: &Path) -> Option<&'static dyn ModelFamily> {
    run_model(run_dir).map(|(_, family)| family)
}

/// The directory and family of [`run_model_family`].
pub fn run_model(run_dir: &Path) -> Option<(PathBuf, &'static dyn ModelFamily)> {
    let layout = RunLayout::new(run_dir);
    let made_with = OutputSettings::read(&layout).ok().flatten();
    made_with
        .map(|s| PathBuf::from(s.model_dir))
        .into_iter()
        .chain([layout.tiny_model_dir()])
        .find_map(|dir| {
            let family = embedfleet_models::family_of(&dir).ok()?;
            Some((dir, family))
        })
}

/// How the run's model writes a query, as its dataset card says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueryConvention {
    /// The family's name (`Qwen3`, `XLM-RoBERTa`).
    pub family: String,
    /// A query with placeholders (`Instruct: <query instruction>\nQuery:<query>`,
    /// `query: <query>`).
    pub example: String,
    /// What a query is embedded with when none is given: the family's task, or the
    /// directory's query prompt.
    pub instruction: String,
}

/// The [`QueryConvention`] of the run's model (see [`run_model_family`]).
pub fn run_query_convention(run_dir: &Path) -> Option<QueryConvention> {
    let (dir, family) = run_model(run_dir)?;
    let instruction = family.query_instruction(&dir).ok()?;
    let example = match family.text_format().query {
        embedfleet_models::QueryFormat::Instructed(_) => family.query_example(),
        embedfleet_models::QueryFormat::Prompt => format!("{instruction}<query>"),
    };
    Some(QueryConvention {
        family: family.name().into(),
        example,
        instruction,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_model_is_the_runs_tiny_model_when_none_is_given() {
        let dir = tempfile::tempdir().unwrap();
        let err = QueryModelSettings::resolve(dir.path(), &QueryModelFlags::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("give --model-dir"), "{err}");
        let tiny = RunLayout::new(dir.path()).tiny_model_dir();
        embedfleet_models::write_tiny_model(&tiny, 0).unwrap();
        let s = QueryModelSettings::resolve(dir.path(), &QueryModelFlags::default()).unwrap();
        assert_eq!(s.model_dir, tiny);
        assert_eq!(
            s.instruction,
            embedfleet_models::default_family().default_instruction(),
            "the instruction is the model family's"
        );
        assert_eq!(
            run_model_family(dir.path()).map(|f| f.model_type()),
            Some(embedfleet_models::default_family().model_type())
        );
        assert_eq!(
            s.precision,
            embedfleet_core::Precision::Native,
            "none pinned"
        );
        // A run pinned at FP8: its queries are embedded at FP8 too.
        let settings = OutputSettings {
            model: "0123456789abcdef".into(),
            model_dir: tiny.display().to_string(),
            dim: None,
            vector_dtype: embedfleet_core::shardfile::VectorDtype::F32,
            precision: embedfleet_core::Precision::Fp8,
            max_tokens: None,
            shard_papers: 500,
            pooling: "last_token".into(),
            normalized: true,
            instruction: None,
            text_rule: None,
        };
        settings.pin(&RunLayout::new(dir.path())).unwrap();
        let s = QueryModelSettings::resolve(dir.path(), &QueryModelFlags::default()).unwrap();
        assert_eq!(s.precision, embedfleet_core::Precision::Fp8);
    }
}
