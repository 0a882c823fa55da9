//! clap's parsed types onto the pipeline's flags (`embedfleet_pipeline::flags`), one to one:
//! no decision here, every default and every resolution is the pipeline's.

use crate::cli::*;
use embedfleet_core::rundb::StallRule;
use embedfleet_pipeline::flags::*;
use embedfleet_pipeline::settings::{LoopOptions, SessionOptions, SubmitFlags};

pub(crate) fn target_flags(a: &TargetArgs) -> TargetFlags {
    TargetFlags {
        qdrant: a.qdrant.clone(),
        edge: a.edge.clone(),
        api_key_env: a.api_key_env.clone(),
        api_key_file: a.api_key_file.clone(),
        allow_insecure: a.allow_insecure,
        postgres: a.postgres.clone(),
        pg_index: match a.pg_index {
            PgIndexArg::Hnsw => PgIndex::Hnsw,
            PgIndexArg::Ivfflat => PgIndex::IvfFlat,
        },
        pg_iterative_scan: match a.pg_iterative_scan {
            PgScanArg::Relaxed => IterativeScan::Relaxed,
            PgScanArg::Strict => IterativeScan::Strict,
            PgScanArg::Off => IterativeScan::Off,
        },
        pg_maintenance_mem: a.pg_maintenance_mem,
    }
}

fn upload_mode(mode: crate::cli::UploadMode) -> embedfleet_pipeline::flags::UploadMode {
    match mode {
        crate::cli::UploadMode::Upsert => embedfleet_pipeline::flags::UploadMode::Upsert,
        crate::cli::UploadMode::Snapshot => embedfleet_pipeline::flags::UploadMode::Snapshot,
    }
}

fn batching(b: crate::cli::Batching) -> embedfleet_pipeline::flags::Batching {
    match b {
        crate::cli::Batching::Tokens => embedfleet_pipeline::flags::Batching::Tokens,
        crate::cli::Batching::Chars => embedfleet_pipeline::flags::Batching::Chars,
    }
}

pub(crate) fn queues_flags(a: &QueuesArgs) -> QueuesFlags {
    match &a.command {
        Some(QueuesCommand::Show(r)) => QueuesFlags::Show {
            run_dir: Some(r.run_dir.clone()),
        },
        Some(QueuesCommand::Set { run_dir, caps }) => QueuesFlags::Set {
            run_dir: run_dir.clone(),
            caps: caps.clone(),
        },
        Some(QueuesCommand::Remove { run_dir, names }) => QueuesFlags::Remove {
            run_dir: run_dir.clone(),
            names: names.clone(),
        },
        None => QueuesFlags::Show {
            run_dir: a.run_dir.clone(),
        },
    }
}

pub(crate) fn embed_job_flags(a: &EmbedJobArgs) -> EmbedJobFlags {
    EmbedJobFlags {
        run: run_dir_flags(&a.run),
        batch: a.batch,
        settings: a.settings.job_settings(),
    }
}

pub(crate) fn embed_flags(a: &EmbedArgs) -> EmbedFlags {
    EmbedFlags {
        model: model_flags(&a.model),
        input: a.input.clone(),
        output: a.output.clone(),
        devices: a.devices.clone(),
        lines: a.lines,
        query: a.query,
        instruction: a.instruction.clone(),
        batch_tokens: a.batch_tokens,
    }
}

pub(crate) fn bench_gpu_flags(a: &BenchGpuArgs) -> BenchGpuFlags {
    BenchGpuFlags {
        model_dir: a.model_dir.clone(),
        devices: a.devices.clone(),
        shapes: a.shapes.clone(),
        forwards: a.forwards,
        mix: a.mix.clone(),
        mix_papers: a.mix_papers,
        batch_tokens: a.batch_tokens,
        no_memory_plan: a.no_memory_plan,
        fidelity: a.fidelity.clone(),
        save_vectors: a.save_vectors.clone(),
        compare_vectors: a.compare_vectors.clone(),
        skip_uniform: a.skip_uniform,
        skip_mix: a.skip_mix,
        skip_study: a.skip_study,
        seed: a.seed,
        dtype: a.dtype.map(|v| v.dtype()),
        precision: a.precision.precision(),
    }
}

pub(crate) fn doctor_flags(a: &DoctorArgs) -> DoctorFlags {
    DoctorFlags {
        model_dir: a.model_dir.clone(),
        devices: a.devices.clone(),
        run_dir: a.run_dir.clone(),
        config: a.config.clone(),
        tokens: a.tokens,
        attention: a.attention,
        precision: a.precision.map(PrecisionArg::precision),
    }
}

pub(crate) fn make_tiny_model_flags(a: &MakeTinyModelArgs) -> MakeTinyModelFlags {
    MakeTinyModelFlags {
        out: a.out.clone(),
        seed: a.seed,
        hidden_size: a.hidden_size,
        family: a.family.clone(),
    }
}

pub(crate) fn model_flags(a: &ModelArgs) -> ModelFlags {
    ModelFlags {
        model_dir: a.model_dir.clone(),
        dim: a.dim,
        vector_dtype: a.vector_dtype.dtype(),
        precision: a.precision.precision(),
        max_tokens: a.max_tokens,
        text_rule: a.text_rule.map(TextRuleArg::rule),
    }
}

pub(crate) fn run_dir_flags(a: &RunDirArgs) -> RunDirFlags {
    RunDirFlags {
        run_dir: a.run_dir.clone(),
    }
}

pub(crate) fn corpus_flags(a: &CorpusArgs) -> CorpusFlags {
    CorpusFlags {
        corpus: a.corpus.clone(),
        run_dir: a.run_dir.clone(),
    }
}

pub(crate) fn plan_flags(a: &PlanArgs) -> PlanFlags {
    PlanFlags {
        corpus: a.corpus.clone(),
        update: a.update.clone(),
        only_adds: a.only_adds,
        run_dir: a.run_dir.clone(),
        plan: plan_settings_flags(&a.plan),
    }
}

pub(crate) fn plan_settings_flags(a: &PlanSettingsArgs) -> PlanSettingsFlags {
    PlanSettingsFlags {
        papers_per_job: a.papers_per_job,
        max_job_chars: a.max_job_chars,
        sources: a.sources.clone(),
        keep_fields: a.keep_fields.clone(),
        batching: batching(a.batching),
        batch_tokens: a.batch_tokens,
        batch_chars: a.batch_chars,
        batch_max: a.batch_max,
        threads: a.threads,
    }
}

pub(crate) fn run_flags(a: &RunArgs) -> RunFlags {
    RunFlags {
        corpus: corpus_flags(&a.corpus),
        model_dir: a.model_dir.clone(),
        local_jobs: a.local_jobs,
        devices: a.devices.clone(),
        dim: a.dim,
        shard_papers: a.shard_papers,
        query: a.query.clone(),
        plan: plan_settings_flags(&a.plan),
    }
}

pub(crate) fn sample_corpus_flags(a: &SampleCorpusArgs) -> SampleCorpusFlags {
    SampleCorpusFlags {
        papers: a.papers,
        out: a.out.clone(),
        seed: a.seed,
        mean_chars: a.mean_chars,
        files: a.files,
    }
}

pub(crate) fn query_model_flags(a: &QueryModelArgs) -> QueryModelFlags {
    QueryModelFlags {
        model_dir: a.model_dir.clone(),
        dim: a.dim,
        devices: a.devices.clone(),
        instruction: a.instruction.clone(),
        field: a.field.clone(),
    }
}

pub(crate) fn query_flags(a: &QueryArgs) -> QueryFlags {
    QueryFlags {
        run_dir: a.run_dir.clone(),
        term_args: a.term_args.clone(),
        terms: a.terms.clone(),
        target: target_flags(&a.target),
        collection: a.collection.clone(),
        top_k: a.top_k,
        filters: a.filters.clone(),
        model: query_model_flags(&a.model),
        batch_size: a.batch_size,
        in_flight: a.in_flight,
        output: a.output.clone(),
        replace: a.replace,
        part_queries: a.part_queries,
        submit: a.submit,
        queue: a.queue.clone(),
        part_terms: a.part_terms,
        poll_interval: a.poll_interval,
    }
}

pub(crate) fn query_job_flags(a: &QueryJobArgs) -> QueryJobFlags {
    QueryJobFlags {
        work: a.work.clone(),
        devices: a.devices.clone(),
    }
}

pub(crate) fn eval_flags(a: &EvalArgs) -> EvalFlags {
    EvalFlags {
        run_dir: a.run_dir.clone(),
        target: target_flags(&a.target),
        collection: a.collection.clone(),
        queries: a.queries.clone(),
        sample: a.sample,
        seed: a.seed,
        filters: a.filters.clone(),
        ef: a.ef.clone(),
        top_k: a.top_k,
        batch_size: a.batch_size,
        in_flight: a.in_flight,
        json: a.json,
        compare_postgres: a.compare_postgres.clone(),
        compare_table: a.compare_table.clone(),
        recall_floor: a.recall_floor,
        plot: a.plot.clone(),
        model: query_model_flags(&a.model),
    }
}

pub(crate) fn publish_flags(a: &PublishArgs) -> PublishFlags {
    PublishFlags {
        run_dir: a.run_dir.clone(),
        out: a.out.clone(),
        target_shard_mb: a.target_shard_mb,
        allow_partial: a.allow_partial,
        with_text: a.with_text,
        license: a.license.clone(),
        query_results: a.query_results.clone(),
    }
}

pub(crate) fn report_flags(a: &ReportArgs) -> ReportFlags {
    ReportFlags {
        run_dir: a.run_dir.clone(),
        plots: a.plots.clone(),
        json: a.json,
        html: a.html.clone(),
        trace: a.trace.clone(),
    }
}

pub(crate) fn take_over_flags(a: &TakeOverArgs) -> TakeOverFlags {
    TakeOverFlags {
        run_dir: a.run_dir.clone(),
        stale_after: a.stale_after,
    }
}

pub(crate) fn status_flags(a: &StatusArgs) -> StatusFlags {
    StatusFlags {
        run_dir: a.run_dir.clone(),
        json: a.json,
    }
}

pub(crate) fn collection_flags(a: &CollectionArgs) -> CollectionFlags {
    CollectionFlags {
        hnsw_m: a.hnsw_m,
        hnsw_ef_construct: a.hnsw_ef_construct,
        on_disk_vectors: a.on_disk_vectors,
        int8: a.int8,
    }
}

pub(crate) fn upload_flags(a: &UploadArgs) -> UploadFlags {
    UploadFlags {
        run_dir: a.run_dir.clone(),
        target: target_flags(&a.target),
        collection: a.collection.clone(),
        batch_size: a.batch_size,
        in_flight: a.in_flight,
        workers: a.workers,
        checkpoint_every: a.checkpoint_every,
        collection_settings: collection_flags(&a.collection_settings),
        mode: upload_mode(a.mode),
        qdrant_rest: a.qdrant_rest.clone(),
        recoveries: a.recoveries,
        no_build: a.no_build,
        group_count: a.group_count,
        replace_keys: a.replace_keys,
        shard_number: a.shard_number,
        replication_factor: a.replication_factor,
        no_bulk_load: a.no_bulk_load,
        worker: a.worker.clone(),
    }
}

pub(crate) fn build_shard_flags(a: &BuildShardArgs) -> BuildShardFlags {
    BuildShardFlags {
        run_dir: a.run_dir.clone(),
        batches: a.batches.clone(),
        groups: a.groups.clone(),
        group_count: a.group_count,
        attempt: a.attempt.clone(),
        accepted: a.accepted,
        request: a.request.clone(),
        collection_settings: collection_flags(&a.collection_settings),
    }
}

pub(crate) fn delete_flags(a: &DeleteArgs) -> DeleteFlags {
    DeleteFlags {
        run_dir: a.run_dir.clone(),
        target: target_flags(&a.target),
        collection: a.collection.clone(),
        papers: a.papers.clone(),
    }
}

pub(crate) fn tune_flags(a: &TuneArgs) -> TuneFlags {
    TuneFlags {
        run_dir: a.run_dir.clone(),
        target: target_flags(&a.target),
        sample: a.sample,
        scratch: a.scratch.clone(),
        max_batch: a.max_batch,
        out: a.out.clone(),
        queries: a.queries,
        collection: a.collection.clone(),
    }
}

/// `submit`'s flags as the pipeline takes them.
pub(crate) fn submit_flags(args: &SubmitArgs) -> anyhow::Result<SubmitFlags> {
    Ok(SubmitFlags {
        run_dir: args.run_dir.clone(),
        config: args.config.clone(),
        backend: args.backend,
        replace_config: args.replace_config,
        queues: args.queues.clone(),
        devices: args.devices.clone(),
        model_dir: args.model_dir.clone(),
        dim: args.dim,
        vector_dtype: args.vector_dtype.map(VectorDtypeArg::dtype),
        precision: args.precision.map(PrecisionArg::precision),
        max_tokens: args.max_tokens,
        text_rule: args.text_rule.map(TextRuleArg::rule),
        shard_papers: args.shard_papers,
        build_shard: args.build_shard,
        group_builds: args.group_builds.clone(),
        group_count: args.group_count,
        build_cpus: args.build_cpus,
        loop_options: loop_options(args)?,
        session: SessionOptions {
            watch: args.watch,
            trial: args.trial.clone(),
            stall: StallRule {
                shard_times: args.stalled_after_shards,
                min_idle_s: args.stalled_min,
            },
            kill_stalled: args.kill_stalled,
            metrics_listen: args.metrics_listen,
        },
        dry_run: args.dry_run,
        preset: false,
    })
}

/// `submit`'s loop flags.
fn loop_options(args: &SubmitArgs) -> anyhow::Result<LoopOptions> {
    Ok(LoopOptions {
        max_attempts: args.max_attempts,
        breaker_after: args.breaker_after,
        poll_interval_s: args.poll_interval,
        lost_after_s: args.lost_after,
        route: args
            .route
            .as_deref()
            .map(str::parse)
            .transpose()
            .map_err(anyhow::Error::msg)?,
        speculate: args.speculate,
        max_jobs: args.max_jobs,
    })
}
