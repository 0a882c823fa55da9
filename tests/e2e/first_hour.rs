//! A new user's first hour (#50, items 1–11): results that say what made them, settings and
//! inputs checked before anything is pinned or sent, a run directory never left bricked, and
//! errors that name the fix once. Each test is one thing a user did, as they do it.

use crate::query::read_results;
use crate::update::{make_releases, Shape};
use crate::util::{python, wait_until, TestDir};
use embedfleet_core::rundb::RunDb;
use std::process::Stdio;

fn write_terms(t: &TestDir, name: &str, terms: &[&str]) {
    std::fs::write(t.join(name), terms.join("\n") + "\n").unwrap();
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The command lines the run keeps for the dataset card's "How it was made".
fn history(t: &TestDir, run: &str) -> Vec<String> {
    let db = RunDb::open(&t.join(run)).unwrap();
    db.setting("history").unwrap().unwrap_or_default()
}

#[test]
fn issue50_a_results_file_answers_only_the_request_that_made_it() {
    let t = TestDir::new();
    t.small_run("run", 30, 15, &[]);
    write_terms(&t, "t1.txt", &["protein folding", "dark matter"]);
    write_terms(
        &t,
        "t2.txt",
        &["soil microbiome", "graph networks", "CRISPR"],
    );
    let query = |terms: &str, k: &str, extra: &[&str], code| {
        let args = [
            "query",
            "--run-dir",
            "run",
            "--terms",
            terms,
            "--top-k",
            k,
            "--output",
            "hits.parquet",
        ];
        t.run(&[&args[..], extra].concat(), code)
    };
    query("t1.txt", "5", &[], 0);
    let first = read_results(&t.join("hits.parquet"));
    assert_eq!(first.len(), 2 * 5);

    // Other terms into the same file: refused, naming the difference and the ways out; the
    // file is left as it was.
    let err = stderr(&query("t2.txt", "5", &[], 4));
    for said in [
        "hits.parquet holds the results of another query request",
        "terms: the file's 2 terms",
        "here 3 terms",
        "--replace",
        "another --output",
    ] {
        assert!(err.contains(said), "{said}: {err}");
    }
    assert_eq!(read_results(&t.join("hits.parquet")), first);
    // Another k: named too.
    let err = stderr(&query("t1.txt", "3", &[], 4));
    assert!(err.contains("--top-k: the file's 5, here 3"), "{err}");
    // The same request: nothing to do, and not a step of the card's "How it was made".
    let before = history(&t, "run");
    let err = stderr(&query("t1.txt", "5", &[], 0));
    assert!(
        err.contains("already holds the results of this request"),
        "{err}"
    );
    assert_eq!(history(&t, "run"), before, "a command that wrote nothing");
    // --replace: the new request's rows only.
    query("t2.txt", "5", &["--replace"], 0);
    let rows = read_results(&t.join("hits.parquet"));
    assert_eq!(rows.len(), 3 * 5);
    assert!(rows.iter().all(|r| r.0 != "protein folding"), "{rows:?}");

    // The file says what made it, in its footer, to any parquet reader.
    let request = python(
        &format!(
            "import pyarrow.parquet as pq, json; m = pq.read_metadata({:?}).metadata; \
             r = json.loads(m[b'embedfleet.query_request']); print(r['terms'], r['k'], r['collection'])",
            t.join("hits.parquet")
        ),
        "pyarrow",
        "EMBEDFLEET_REQUIRE_PYARROW",
    );
    if let Some(request) = request {
        assert_eq!(request, "3 5 papers");
    }

    // A FIFO where the output goes (another user's, say) is never opened, which would block,
    // nor replaced.
    let fifo = t.join("pipe.parquet");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let err = stderr(&t.run(
        &[
            "query",
            "--run-dir",
            "run",
            "--terms",
            "t1.txt",
            "--output",
            "pipe.parquet",
        ],
        4,
    ));
    assert!(
        err.contains("is not a results file this embedfleet wrote (not a regular file)"),
        "{err}"
    );
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());

    // Terms on the command line, no --output: the top hits on the terminal, nothing written.
    let out = t.run(
        &[
            "query",
            "--run-dir",
            "run",
            "protein folding",
            "--top-k",
            "3",
        ],
        0,
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        printed.starts_with("top 3 papers for \"protein folding\":"),
        "{printed}"
    );
    assert_eq!(printed.lines().filter(|l| l.starts_with(" 1. ")).count(), 1);
}

#[test]
fn issue50_the_readme_walk_through_over_two_releases_ends_with_release_2s_hits() {
    let t = TestDir::new();
    let shape = Shape {
        release_1: 60,
        withdrawn: 5,
        changed: 3,
        new: 10,
    };
    let (withdrawn, _changed, _new) = make_releases(&t, &shape);
    t.run_corpus("run", "r1.jsonl", 30, &[]);
    t.run(&["status", "--run-dir", "run"], 0);
    write_terms(
        &t,
        "terms.txt",
        &["protein folding", "galaxy climate", "soil enzyme"],
    );
    let query = ["query", "--run-dir", "run", "--terms", "terms.txt"];
    let into = ["--top-k", "20", "--output", "hits.parquet"];
    t.run(&[&query[..], &into].concat(), 0);
    // A collection this small has no HNSW graph: the table says every row is exact search.
    let eval: serde_json::Value =
        serde_json::from_slice(&t.run(&["eval", "--run-dir", "run", "--json"], 0).stdout).unwrap();
    assert_eq!(eval["index"]["exact_only"], true, "{eval}");
    assert_eq!(eval["index"]["indexed_vectors"], 0);
    let table =
        String::from_utf8_lossy(&t.run(&["eval", "--run-dir", "run"], 0).stdout).into_owned();
    assert!(
        table.starts_with("**exact search: the collection has no HNSW index (60 points"),
        "{table}"
    );
    t.run(&["publish", "--run-dir", "run", "--out", "v1"], 0);
    let card = std::fs::read_to_string(t.join("v1/README.md")).unwrap();
    assert!(
        card.contains("exact search: the collection has no HNSW index"),
        "{card}"
    );

    // Release 2 planned: the collection still holds release 1, and status says so.
    t.run(&["plan", "--update", "r2.jsonl", "--run-dir", "run"], 0);
    let status =
        String::from_utf8_lossy(&t.run(&["status", "--run-dir", "run"], 0).stdout).into_owned();
    assert!(
        status.contains(
            "(the collection holds release 1, not 2: 5 withdrawals not yet applied: `embedfleet upload`; 13 new or changed papers to embed, then upload)"
        ),
        "{status}"
    );
    let json = t.status("run");
    let upload = json["uploads_by_collection"].as_object().unwrap();
    assert_eq!(upload.values().next().unwrap()["release"], 1, "{json}");

    t.run_corpus("run", "r2.jsonl", 30, &[]);
    let status =
        String::from_utf8_lossy(&t.run(&["status", "--run-dir", "run"], 0).stdout).into_owned();
    assert!(
        status.contains("(the collection holds release 2: the 65 live papers"),
        "{status}"
    );
    // The same terms against release 2 are another request: refused, then replaced.
    let err = stderr(&t.run(&[&query[..], &into].concat(), 4));
    assert!(
        err.contains("collection contents: the file's release 1"),
        "{err}"
    );
    t.run(&[&query[..], &into, &["--replace"]].concat(), 0);
    t.run(&["publish", "--run-dir", "run", "--out", "v2"], 0);

    // The published version 2 holds release 2's hits: no withdrawn paper, the same rows a
    // query into a new file gives now.
    t.run(
        &[&query[..], &["--top-k", "20", "--output", "fresh.parquet"]].concat(),
        0,
    );
    let fresh = read_results(&t.join("fresh.parquet"));
    let published = read_results(&t.join("v2/queries/hits.parquet"));
    assert_eq!(published, fresh);
    assert!(published.iter().all(|r| !withdrawn.contains(&r.3)));
    assert_ne!(
        read_results(&t.join("v1/queries/hits.parquet")),
        published,
        "version 1 was searched against release 1"
    );

    // The report agrees with itself: the headline counts the live papers.
    t.run(&["report", "--run-dir", "run", "--html", "page.html"], 0);
    let page = std::fs::read_to_string(t.join("page.html")).unwrap();
    assert!(
        page.contains("65 / 65") && page.contains("live papers embedded"),
        "the headline counts release 2's live papers"
    );
    assert!(
        page.contains("id=\"eval-exact\""),
        "the eval table is marked exact"
    );
    let Some(r) = crate::browser::render(&t.join("page.html"), None) else {
        return;
    };
    // The progress chart draws the papers embedded (green) last, over the jobs running, and
    // its right scale says it is the most jobs that ran at once.
    let progress = &r.dom[r.dom.find("id=\"progress\"").unwrap()..];
    let progress = &progress[..progress.find("</svg>").unwrap()];
    let strokes: Vec<&str> = progress
        .split("<path")
        .skip(1)
        .filter_map(|p| p.split("stroke=\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(strokes.last(), Some(&"#3b8c4a"), "{strokes:?}");
    assert!(
        progress.contains("id=\"progress-peak\">peak "),
        "{progress}"
    );
    // The eval chart's labels never overlap: settings that land on one spot share one.
    let labels: Vec<(f64, f64, usize)> = r
        .dom
        .split("<text")
        .filter(|e| e.contains("class=\"eval-label\""))
        .map(|e| {
            let attr = |name: &str| -> f64 {
                let at = e.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
                e[at..].split('"').next().unwrap().parse().unwrap()
            };
            let text = e.split('>').nth(1).unwrap().split('<').next().unwrap();
            (attr("x"), attr("y"), text.chars().count())
        })
        .collect();
    assert!(!labels.is_empty(), "{}", r.dom);
    // The boxes the page itself keeps apart (6.5 px a character, 14 px high).
    for (i, a) in labels.iter().enumerate() {
        for b in &labels[i + 1..] {
            let apart_x = a.0 + 6.5 * a.2 as f64 <= b.0 || b.0 + 6.5 * b.2 as f64 <= a.0;
            let apart_y = a.1 + 3.0 <= b.1 - 11.0 || b.1 + 3.0 <= a.1 - 11.0;
            assert!(apart_x || apart_y, "labels overlap: {a:?} {b:?}");
        }
    }
}

#[test]
fn issue50_an_output_setting_the_model_cannot_take_is_refused_before_anything_is_pinned() {
    let t = TestDir::new();
    t.plan_with_model(30, 15);
    let settings = t.join("run/output-settings.json");
    let submit = ["submit", "--run-dir", "run", "--model-dir", "model"];
    for extra in [&["--dim", "5000", "--dry-run"][..], &["--dim", "5000"]] {
        let out = t.run(&[&submit[..], extra].concat(), 4);
        let err = stderr(&out);
        assert!(
            err.contains("--dim 5000: the model in")
                && err.contains("gives 128-dimensional vectors")
                && err.contains("give --dim from 1 to 128"),
            "{err}"
        );
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("embed-job"),
            "no job script"
        );
        assert!(!settings.exists(), "nothing pinned");
    }
    let err = stderr(&t.run(&[&submit[..], &["--max-tokens", "999999"]].concat(), 4));
    assert!(err.contains("--max-tokens 999999: the model in"), "{err}");
    // `run` goes through the same checks.
    t.sample("d.jsonl.gz", 10, 1);
    let err = stderr(&t.run(
        &[
            "run",
            "--corpus",
            "d.jsonl.gz",
            "--run-dir",
            "other",
            "--dim",
            "5000",
        ],
        4,
    ));
    assert!(err.contains("--dim 5000"), "{err}");

    // A setting pinned by a submit that sent no job (no queue given) is replaced, not held.
    let failed = [
        &submit[..],
        &["--dim", "64", "--backend", "slurm", "--devices", "cpu"],
    ];
    let err = stderr(&t.run(&failed.concat(), 1));
    assert!(err.contains("no queues to submit to"), "{err}");
    assert!(std::fs::read_to_string(&settings)
        .unwrap()
        .contains("\"dim\": 64"));
    // The failed submit asked for Slurm: a restart given no backend is refused (it would run
    // locally, issue 60); the user chooses local jobs, as the refusal says.
    let err = stderr(&t.run(&[&submit[..], &["--dim", "32"]].concat(), 4));
    assert!(err.contains("asked for the slurm backend"), "{err}");
    let out = t.run(
        &[&submit[..], &["--dim", "32", "--backend", "local"]].concat(),
        0,
    );
    let err = stderr(&out);
    assert!(
        err.contains("replaced the run's output settings (--dim: the run's 64, here 32)"),
        "{err}"
    );
    let db = RunDb::open(&t.join("run")).unwrap();
    let shard = db.all_shards().unwrap().remove(0);
    let rows = crate::util::read_shard(&t.join("run").join(shard.path));
    assert_eq!(rows[0].vector.len(), 32);
}

#[test]
fn issue50_a_failed_first_submit_keeps_no_settings() {
    let t = TestDir::new();
    t.plan_with_model(30, 15);
    let err = stderr(&t.run(
        &[
            "submit",
            "--run-dir",
            "run",
            "--model-dir",
            "model",
            "--backend",
            "slurm",
            "--devices",
            "cpu",
        ],
        1,
    ));
    assert!(err.contains("no queues to submit to"), "{err}");
    let db = RunDb::open(&t.join("run")).unwrap();
    for key in ["run_config", "submit.devices", "submit.loop"] {
        let kept: Option<serde_json::Value> = db.setting(key).unwrap();
        assert_eq!(kept, None, "{key} kept by a submit that sent no job");
    }
    drop(db);
    // The local backend afterwards, with no --replace-config; then `run` on the same run.
    let out = t.run(
        &[
            "submit",
            "--run-dir",
            "run",
            "--model-dir",
            "model",
            "--backend",
            "local",
        ],
        0,
    );
    assert!(!stderr(&out).contains("--replace-config"));
    let db = RunDb::open(&t.join("run")).unwrap();
    let kept: Option<serde_json::Value> = db.setting("run_config").unwrap();
    assert_eq!(
        kept.unwrap()["scheduler"]["backend"],
        "local",
        "kept with its first job"
    );
    drop(db);
    // The same submit again finds every batch done: not a step of "How it was made".
    let before = history(&t, "run");
    t.run(&["submit", "--run-dir", "run"], 0);
    assert_eq!(history(&t, "run"), before);
}

#[test]
fn issue50_a_corpus_without_id_stops_with_exit_3_and_the_fixed_file_plans_into_the_same_run() {
    let t = TestDir::new();
    t.sample("c.jsonl.gz", 20, 1);
    let lines = python(
        &format!(
            "import gzip, json\n\
             rows = [json.loads(l) for l in gzip.open({:?}, 'rt')]\n\
             with open({:?}, 'w') as out:\n    \
                 for r in rows:\n        r['paper_id'] = r.pop('id'); out.write(json.dumps(r) + '\\n')\n\
             import pyarrow as pa, pyarrow.parquet as pq\n\
             pq.write_table(pa.Table.from_pylist(rows), {:?})\n\
             print(len(rows))",
            t.join("c.jsonl.gz"),
            t.join("bad.jsonl"),
            t.join("bad.parquet")
        ),
        "pyarrow",
        "EMBEDFLEET_REQUIRE_PYARROW",
    );
    let Some(lines) = lines else { return };
    assert_eq!(lines, "20");
    let run = ["run", "--corpus", "bad.jsonl", "--run-dir", "run"];
    let err = stderr(&t.run(&run, 3));
    assert!(
        err.contains("bad.jsonl: no record could be used: no `id` field (its fields:")
            && err.contains("paper_id")
            && err.contains("nothing was planned"),
        "{err}"
    );
    assert!(!err.contains("nothing to upload"), "{err}");
    // A parquet file (pyarrow's defaults) names its columns.
    let err = stderr(&t.run(&["plan", "--corpus", "bad.parquet", "--run-dir", "pq"], 3));
    assert!(
        err.contains("no `id` column (its columns:") && err.contains("paper_id"),
        "{err}"
    );
    // The file fixed in place: the same run directory takes it.
    let fixed = std::fs::read_to_string(t.join("bad.jsonl"))
        .unwrap()
        .replace("\"paper_id\"", "\"id\"");
    std::fs::write(t.join("bad.jsonl"), fixed).unwrap();
    t.run(&run, 0);
    assert_eq!(t.status("run")["papers_planned"], 20);

    // A kept field no record has: the same, and the plan without it goes on.
    let plan = ["plan", "--corpus", "c.jsonl.gz", "--run-dir", "kept"];
    let err = stderr(&t.run(&[&plan[..], &["--keep-field", "licence"]].concat(), 3));
    assert!(
        err.contains("--keep-field licence: no record has a field `licence`"),
        "{err}"
    );
    t.run(&plan, 0);
}

#[test]
fn issue50_ctrl_c_stops_the_local_jobs_and_a_killed_loop_is_said_stopped() {
    let t = TestDir::new();
    t.sample("c.jsonl.gz", 200, 1);
    let run_dir = t.join("run");
    let start = || {
        t.cmd(&[
            "run",
            "--corpus",
            "c.jsonl.gz",
            "--run-dir",
            "run",
            "--papers-per-job",
            "100",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
    };
    // Before the plan made run.db there is nothing to ask.
    let running = |t: &TestDir| {
        t.join("run/run.db").exists()
            && t.status("run")["jobs_by_queue"]["local"]["running"]
                .as_u64()
                .unwrap_or(0)
                > 0
    };
    let embed_jobs = || {
        let out = std::process::Command::new("pgrep")
            .args(["-f", &format!("embed-job --run-dir {}", run_dir.display())])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).lines().count()
    };
    let child = start();
    wait_until("a job running", 120, || running(&t));
    // SAFETY: signalling the child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130));
    let err = stderr(&out);
    assert!(
        err.contains("stopped by SIGINT (Ctrl-C): stopped ")
            && err.contains("`embedfleet run` (or `submit`) again"),
        "{err}"
    );
    assert_eq!(embed_jobs(), 0, "no local job left running");
    let status =
        String::from_utf8_lossy(&t.run(&["status", "--run-dir", "run"], 0).stdout).into_owned();
    assert!(status.contains("loop       ended"), "{status}");

    // A loop killed outright: status on its host says it is stopped, not polling.
    let mut child = start();
    wait_until("a job running again", 120, || running(&t));
    child.kill().unwrap();
    child.wait().unwrap();
    let status =
        String::from_utf8_lossy(&t.run(&["status", "--run-dir", "run"], 0).stdout).into_owned();
    assert!(
        status.contains("loop       STOPPED: its process (pid"),
        "{status}"
    );
    // Its jobs were left behind (SIGKILL cannot be caught): the next run adopts or ends them.
    let _ = std::process::Command::new("pkill")
        .args(["-f", &format!("embed-job --run-dir {}", run_dir.display())])
        .status();
}

#[test]
fn issue50_query_before_any_upload_says_so_and_leaves_nothing_behind() {
    let t = TestDir::new();
    t.plan_with_model(20, 20);
    t.run(&["submit", "--run-dir", "run", "--model-dir", "model"], 0);
    write_terms(&t, "terms.txt", &["protein folding"]);
    let out = t.run(
        &[
            "query",
            "--run-dir",
            "run",
            "--terms",
            "terms.txt",
            "--output",
            "hits.parquet",
        ],
        4,
    );
    let err = stderr(&out);
    assert!(
        err.contains("nothing was uploaded into it yet (`embedfleet upload --run-dir run`)"),
        "{err}"
    );
    assert!(
        !err.contains("--model-dir"),
        "the model is the run's: {err}"
    );
    assert!(!err.contains("caused by"), "said once: {err}");
    assert!(!t.join("hits.parquet.parts").exists());
    assert!(!t.join("hits.parquet").exists());
}

#[test]
fn issue50_a_run_dir_that_is_a_file_is_said_to_be_one_once() {
    let t = TestDir::new();
    std::fs::write(t.join("afile"), "not a run").unwrap();
    for args in [
        &["status", "--run-dir", "afile"][..],
        &["submit", "--run-dir", "afile"],
        &["query", "--run-dir", "afile", "x"],
        &["plan", "--corpus", "afile", "--run-dir", "afile"],
    ] {
        let err = stderr(&t.run(args, 2));
        assert!(
            err.contains("--run-dir afile is a file, not a run directory"),
            "{args:?}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{args:?}: one line: {err}");
    }
}
