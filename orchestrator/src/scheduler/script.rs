/*!
Job scripts: a built-in template per backend, user overrides from the run config, and the
values that fill them.

The built-in templates put the scheduler directives first, then `module load` lines, exported
environment, setup lines, the `embedfleet embed-job` command (one per node through `srun` or
`mpiexec` when a job has several nodes), and finally the lines that write the job's exit code
to its completion marker, atomically (temporary name, then rename).
*/

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::command::shell_quote;
use super::template::{render, TemplateError};
use super::Backend;

/// How job scripts are written; the `[scheduler.script]` table of the run config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScriptConfig {
    /// Replaces the backend's built-in template
    /// ([`BackendKind::template`](super::BackendKind::template)).
    pub template: Option<String>,
    /// Account (Slurm) or project (PBS `-A`).
    pub account: Option<String>,
    /// Walltime limit, `HH:MM:SS`.
    pub walltime: Option<String>,
    /// Nodes per job, for the submit loop: it gives each job this many batches
    /// ([`ScriptJob::batches`]); the script requests one node per batch and runs one
    /// `embed-job` per node.
    pub nodes: u32,
    /// GPUs per node to request (Slurm `--gpus-per-node`, PBS `ngpus=` in the select).
    pub gpus_per_node: Option<u32>,
    /// Extra PBS select resources, e.g. `system=polaris` gives `select=1:system=polaris`.
    pub select_extra: Option<String>,
    /// Raw directive lines added after the built-in ones, e.g. `#PBS -l filesystems=home:eagle`.
    pub extra_directives: Vec<String>,
    /// Modules to load (`module load NAME` each).
    pub modules: Vec<String>,
    /// Environment variables to export in the job.
    pub env: BTreeMap<String, String>,
    /// Shell lines run before the command (e.g. `source /path/venv/bin/activate`).
    pub setup: Vec<String>,
    /// The embedfleet binary to run inside the job (default `embedfleet`).
    pub embedfleet: Option<String>,
    /// Launcher for multi-node jobs; default the backend's
    /// ([`BackendKind::launcher`](super::BackendKind::launcher): `srun` on Slurm, `mpiexec` on
    /// PBS).
    pub launcher: Option<String>,
}

impl Default for ScriptConfig {
    fn default() -> Self {
        Self {
            template: None,
            account: None,
            walltime: None,
            nodes: 1,
            gpus_per_node: None,
            select_extra: None,
            extra_directives: Vec::new(),
            modules: Vec::new(),
            env: BTreeMap::new(),
            setup: Vec::new(),
            embedfleet: None,
            launcher: None,
        }
    }
}

/// One job to write a script for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptJob {
    /// Job name (letters, digits, `-_.`).
    pub job_name: String,
    /// Queue or partition.
    pub queue: String,
    /// The run directory.
    pub run_dir: PathBuf,
    /// Batches, one per node; the script requests `batches.len()` nodes.
    pub batches: Vec<u64>,
    /// File for the job's stdout (and stderr unless `error` is set).
    pub output: PathBuf,
    /// File for the job's stderr.
    pub error: Option<PathBuf>,
    /// Completion marker the script writes its exit code to.
    pub marker: Option<PathBuf>,
    /// Arguments after `embed-job --run-dir DIR --batch N` (model directory, devices, ...).
    pub embed_args: Vec<String>,
}

/// The user's template, else the backend's built-in one.
fn template(backend: Backend, config: &ScriptConfig) -> &str {
    let builtin = backend.kind().template();
    config.template.as_deref().unwrap_or(builtin)
}

/// Renders the job script for `job` on `backend` with the user's `config`.
pub fn render_job_script(
    backend: Backend,
    config: &ScriptConfig,
    job: &ScriptJob,
) -> Result<String, TemplateError> {
    let template = template(backend, config);
    render(template, &script_vars(backend, config, job)?)
}

/// Renders a script like [`render_job_script`] — same template, directives, modules, env and
/// setup lines, the same completion marker — whose command is `embedfleet ARGS...` instead of
/// `embed-job` (the query job: `query-job --run-dir DIR ...`). `job.batches` only sets the
/// node count; `{batch}` and `{batches}` are empty in such a script.
pub fn render_command_script(
    backend: Backend,
    config: &ScriptConfig,
    job: &ScriptJob,
    args: &[String],
) -> Result<String, TemplateError> {
    let template = template(backend, config);
    let mut vars = script_vars(backend, config, job)?;
    let args: String = args
        .iter()
        .map(|a| format!(" {}", shell_quote(a)))
        .collect();
    vars.insert("command".into(), format!("{}{args}", embedfleet(config)));
    vars.insert("batch".into(), String::new());
    vars.insert("batches".into(), String::new());
    render(template, &vars)
}

/// The values every template can use, by placeholder name.
pub fn script_vars(
    backend: Backend,
    config: &ScriptConfig,
    job: &ScriptJob,
) -> Result<BTreeMap<String, String>, TemplateError> {
    check_word("job_name", &job.job_name)?;
    check_word("queue", &job.queue)?;
    if job.batches.is_empty() {
        return Err(bad("batch", "", "a job needs at least one batch"));
    }
    let nodes = job.batches.len();
    let path = |p: &PathBuf| p.display().to_string();
    let mut v = BTreeMap::new();
    let mut put = |k: &str, val: String| v.insert(k.to_string(), val);
    put("job_name", job.job_name.clone());
    put("queue", job.queue.clone());
    put(
        "account",
        one_line("account", config.account.clone().unwrap_or_default())?,
    );
    put(
        "walltime",
        one_line("walltime", config.walltime.clone().unwrap_or_default())?,
    );
    put("nodes", nodes.to_string());
    put(
        "gpus_per_node",
        config
            .gpus_per_node
            .map(|g| g.to_string())
            .unwrap_or_default(),
    );
    put("select", pbs_select(nodes, config));
    let log = |p: &PathBuf| backend.kind().log_path(&path(p));
    put("output", one_line("output", log(&job.output))?);
    put(
        "error",
        one_line("error", job.error.as_ref().map(log).unwrap_or_default())?,
    );
    put(
        "join",
        if job.error.is_none() {
            "oe".into()
        } else {
            String::new()
        },
    );
    // Paths go into custom templates as shell words: quoted when they need it (a space, a `$`).
    put("run_dir", shell_quote(&path(&job.run_dir)));
    put("batch", job.batches[0].to_string());
    put(
        "batches",
        job.batches
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(" "),
    );
    put(
        "marker",
        job.marker
            .as_ref()
            .map(|m| shell_quote(&path(m)))
            .unwrap_or_default(),
    );
    put("embedfleet", embedfleet(config));
    put("extra_directives", config.extra_directives.join("\n"));
    put(
        "module_lines",
        config
            .modules
            .iter()
            .map(|m| format!("module load {m}"))
            .collect::<Vec<_>>()
            .join("\n"),
    );
    put("env_lines", env_lines(&config.env)?);
    put("setup_lines", config.setup.join("\n"));
    put("command", command(backend, config, job));
    put("finish", finish(job));
    Ok(v)
}

fn embedfleet(config: &ScriptConfig) -> String {
    shell_quote(config.embedfleet.as_deref().unwrap_or("embedfleet"))
}

fn pbs_select(nodes: usize, config: &ScriptConfig) -> String {
    let mut s = nodes.to_string();
    if let Some(g) = config.gpus_per_node {
        s.push_str(&format!(":ngpus={g}"));
    }
    if let Some(extra) = config.select_extra.as_deref().filter(|e| !e.is_empty()) {
        s.push(':');
        s.push_str(extra);
    }
    s
}

fn env_lines(env: &BTreeMap<String, String>) -> Result<String, TemplateError> {
    let mut lines = Vec::new();
    for (k, val) in env {
        let ok = k
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok {
            return Err(bad(
                "env",
                k,
                "environment variable names are letters, digits and `_`",
            ));
        }
        lines.push(format!("export {k}={}", shell_quote(val)));
    }
    Ok(lines.join("\n"))
}

/// The embed-job line, or for N nodes a launcher line running one embed-job per node, each
/// picking its batch by its rank.
fn command(backend: Backend, config: &ScriptConfig, job: &ScriptJob) -> String {
    let bin = embedfleet(config);
    let run_dir = shell_quote(&job.run_dir.display().to_string());
    let args: String = job
        .embed_args
        .iter()
        .map(|a| format!(" {}", shell_quote(a)))
        .collect();
    if job.batches.len() == 1 {
        return format!(
            "{bin} embed-job --run-dir {run_dir} --batch {}{args}",
            job.batches[0]
        );
    }
    let n = job.batches.len();
    let launcher = config
        .launcher
        .clone()
        .or_else(|| backend.kind().launcher(n))
        .unwrap_or_default();
    let batches = job
        .batches
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(" ");
    if launcher.is_empty() {
        // No launcher: run the batches one after another on this machine.
        return format!(
            "for b in {batches}; do {bin} embed-job --run-dir {run_dir} --batch \"$b\"{args} || exit $?; done"
        );
    }
    // Each task takes the batch of its rank, from whichever variable its launcher sets. None
    // set is refused (exit 4, not retried) rather than guessed: every task would take the
    // first batch. The job script's own SLURM_PROCID (0 in a batch step) is unset first, so a
    // launcher that sets no rank of its own cannot inherit it.
    let inner = format!(
        "r=${{{RANK_VARS}}}; \
         if [[ ! $r =~ ^[0-9]+$ ]] || (( r >= $# )); then \
         echo \"embedfleet: this task of a {n}-node job has no rank (none of SLURM_PROCID, PMI_RANK, PMIX_RANK, OMPI_COMM_WORLD_RANK, PALS_RANKID is set, or it is not below {n}): set [scheduler.script] launcher to one that sets one\" >&2; exit 4; fi; \
         b=(\"$@\"); exec {bin} embed-job --run-dir {run_dir} --batch \"${{b[$r]}}\"{args}"
    );
    format!(
        "unset SLURM_PROCID PMI_RANK PMIX_RANK OMPI_COMM_WORLD_RANK PALS_RANKID\n{launcher} bash -c {} _ {batches}",
        shell_quote(&inner)
    )
}

/// The variables a launcher gives each task its rank in, as one shell expansion that is empty
/// when none is set.
const RANK_VARS: &str =
    "SLURM_PROCID:-${PMI_RANK:-${PMIX_RANK:-${OMPI_COMM_WORLD_RANK:-${PALS_RANKID:-}}}}";

/// Lines that record the exit code in the marker (temporary file, then rename). The temporary
/// name is predictable, so it is created fresh (`set -C`: `O_EXCL`, never through a link someone
/// planted there) after whatever was at it is removed; a marker that cannot be written (a full
/// disk) leaves no temporary file behind.
fn finish(job: &ScriptJob) -> String {
    match &job.marker {
        None => "exit $?".to_string(),
        Some(m) => {
            let tmp = shell_quote(&format!("{}.tmp", m.display()));
            let m = shell_quote(&m.display().to_string());
            format!(
                "rc=$?\nrm -f {tmp}; (set -C; printf '%s\\n' \"$rc\" > {tmp}) && mv -f {tmp} {m} || rm -f {tmp}\nexit $rc"
            )
        }
    }
}

fn bad(name: &str, value: &str, reason: &str) -> TemplateError {
    TemplateError::BadValue {
        name: name.to_string(),
        value: value.to_string(),
        reason: reason.to_string(),
    }
}

fn check_word(name: &str, value: &str) -> Result<(), TemplateError> {
    let ok = !value.is_empty()
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c));
    if ok {
        Ok(())
    } else {
        Err(bad(name, value, "use letters, digits and `-_.@` only"))
    }
}

fn one_line(name: &str, value: String) -> Result<String, TemplateError> {
    if value.contains(['\n', '\r']) {
        Err(bad(name, &value, "it must not contain a line break"))
    } else {
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_marker_is_never_written_through_a_link_planted_at_its_temporary_name() {
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("jobs/b 1.exit");
        std::fs::create_dir(dir.path().join("jobs")).unwrap();
        let victim = dir.path().join("authorized_keys");
        std::fs::write(&victim, "the victim's key\n").unwrap();
        std::os::unix::fs::symlink(&victim, marker.with_file_name("b 1.exit.tmp")).unwrap();
        let job = ScriptJob {
            job_name: "j".into(),
            queue: "q".into(),
            run_dir: dir.path().into(),
            batches: vec![1],
            output: dir.path().join("log"),
            error: None,
            marker: Some(marker.clone()),
            embed_args: Vec::new(),
        };
        let script = format!("(exit 3)\n{}", finish(&job));
        let status = std::process::Command::new("bash")
            .arg("-c")
            .arg(&script)
            .status()
            .unwrap();
        assert_eq!(status.code(), Some(3));
        assert_eq!(
            std::fs::read_to_string(&victim).unwrap(),
            "the victim's key\n"
        );
        assert_eq!(std::fs::read_to_string(&marker).unwrap(), "3\n");
    }
}
