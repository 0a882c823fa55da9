"""The report of benches/gpu-check.sh: what $WORK holds now -> $OUT/gpu-report.{json,md}.

Run after every step and on exit, so a run cut short still leaves its figures. Never raises on
missing or partial files: a step that wrote half its output is reported with what it wrote.

  usage: python3 benches/gpu_report.py WORK OUT START TIME_LIMIT DRY_RUN FINISHED
"""
import json
import os
import sys
import time

# Steps whose GPU the filler holds: their peak (total less the lowest free) counts its memory.
FILLED_STEPS = ("oom_unplanned", "oom_planned")


def read(path, default=None):
    try:
        with open(path, errors="replace") as f:
            return f.read().strip()
    except OSError:
        return default


def jsonl(path):
    rows = []
    for line in (read(path, "") or "").splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except ValueError:
                pass
    return rows


def load_steps(work):
    plan = []
    for line in (read(os.path.join(work, "plan.tsv"), "") or "").splitlines():
        name, est, lim = line.split("\t")
        plan.append({"step": name, "estimate_s": int(est), "limit_s": int(lim)})
    records = {r["step"]: r for r in jsonl(os.path.join(work, "steps.jsonl"))}  # the last wins
    current = (read(os.path.join(work, "current"), "") or "").split()
    steps = []
    for p in plan:
        r = dict(p)
        if p["step"] in records:
            r.update(records[p["step"]])
        elif current and current[0] == p["step"]:
            r.update(status="running", secs=round(time.time() - float(current[1]), 1))
        else:
            r.update(status="not run")
        steps.append(r)
    planned = {p["step"] for p in plan}
    steps += [r for name, r in records.items() if name not in planned]  # e.g. fidelity skipped
    return plan, steps


def why(work, name):
    """The reason a step failed or was cut, from its own output: a `problem:` line, else the
    last line of stderr (a timed-out step's last progress), else of stdout."""
    err = (read(os.path.join(work, name + ".err"), "") or "").splitlines()
    out = (read(os.path.join(work, name + ".out"), "") or "").splitlines()
    problems = [l for l in out + err if l.startswith("problem:")]
    tail = [l for l in err if l.strip()] or [l for l in out if l.strip() and not l.startswith("{")]
    return (problems[0] if problems else tail[-1] if tail else "")[:300]


def mix_line(ls):
    return next((r for r in ls if r.get("event") == "bench"
                 and r.get("label") == "mix_packed_token_budget"), None)


def fallbacks(r):
    f = (r or {}).get("fallbacks") or {}
    return sum(int(f.get(k, 0)) for k in ("split", "sequential", "chunked")), f


def distinct_plans(ls):
    keys = set()  # each bench line names its attention plans, (sequences, longest length) each
    for r in ls:
        if r.get("event") == "bench":
            keys.update(tuple(p) for p in r.get("plans") or [])
    return sorted(keys)


def num(v, fmt):
    return format(v, fmt) if isinstance(v, (int, float)) else "-"


def check_oom(steps, lines):
    """An out-of-memory run that exits 0 must still have fallen back; its peak counts the
    filler, so the report also gives the peak less what the filler held."""
    fill = next((r for r in lines.get("oom_unplanned", []) + lines.get("oom_planned", [])
                 if r.get("event") == "fill"), None)
    held = (fill or {}).get("held_gib")
    for name in FILLED_STEPS:
        for r in lines.get(name, []):
            if r.get("event") == "bench" and isinstance(r.get("peak_mem_gb"), (int, float)) and held:
                r["peak_mem_gb_with_filler"] = r["peak_mem_gb"]
                r["peak_mem_gb"] = round(r["peak_mem_gb"] - held, 2)
    for s in steps:
        if s["step"] == "oom_unplanned" and s.get("status") == "ok":
            m = mix_line(lines["oom_unplanned"])
            if m is None:
                s["status"], s["check"] = "failed", "no mix_packed_token_budget line"
            elif fallbacks(m)[0] == 0:
                s["status"], s["check"] = "failed", "no fallback taken: the fill left too much memory"


def status_text(s):
    st = s.get("status", "?")
    if st == "failed":
        return f"FAILED: {s['check']}" if s.get("check") else f"FAILED (rc {s.get('rc')})"
    if st == "timed out":
        return f"TIMED OUT at {s.get('limit_s')} s"
    return st


def notes(report, lines, name, s):
    ls = lines.get(name, [])
    n = []
    errs = [r for r in ls if r.get("event") in ("fidelity_error", "error")]
    if errs:
        n.append(f"{len(errs)} errors: " + ", ".join(
            f"{r.get('label') or r.get('name')}: {str(r.get('error') or r.get('err'))[:120]}" for r in errs))
    berrs = [r for r in ls if r.get("event") == "bench_error"]
    if berrs:
        n.append(f"{len(berrs)} bench errors: " + ", ".join(
            f"{r.get('label')}: {str(r.get('error'))[:120]}" for r in berrs))
    fid = [r for r in ls if r.get("event") == "fidelity"]
    if fid:
        n.append(f"fidelity min cos {min(r.get('cosine', 0) for r in fid):.6f}")
    plans = distinct_plans(ls)
    if plans:
        shown = ", ".join(f"{b}x{t}" for b, t in plans[:6]) + (" ..." if len(plans) > 6 else "")
        n.append(f"{len(plans)} attention plans ({shown})")
    build_s = sum(r.get("plan_build_s") or 0 for r in ls if r.get("event") == "bench")
    if build_s and plans:
        n.append(f"plans built in {build_s:.1f} s before timing ({build_s / len(plans):.2f} s a plan)")
    m = mix_line(ls)
    if m:
        _, f = fallbacks(m)
        n.append(f"fallbacks {f.get('split', 0)}/{f.get('sequential', 0)}/{f.get('chunked', 0)}")
    cmp_ = next((r for r in ls if r.get("event") == "compare"), None)
    if cmp_:
        median = cmp_.get("median_cosine")
        n.append(f"min cos vs ours {cmp_.get('min_cosine')}" + (f", median {median}" if median else ""))
    fill = next((r for r in ls if r.get("event") == "fill"), None)
    if fill:
        n.append(f"filler held {fill.get('held_gib')} GiB (subtracted from the peak), left {fill.get('left_gib')} GiB")
    for key in ("note", "why"):
        if s.get(key):
            n.append(s[key])
    extra = {"doctor": "attention", "cu12": "attention_cu12", "peer": "model_note"}.get(name)
    if extra and report.get(extra):
        n.append(f"{extra.replace('_', ' ')}: {report[extra]}")
    return "; ".join(n).replace("|", "/")


def throughput_rows(lines):
    peer = {r["label"]: r for r in lines.get("peer", [])
            if r.get("event") == "bench" and not r.get("label", "").startswith("decode_")}
    ours = {r["label"]: r for r in lines.get("ours", []) if r.get("event") == "bench"}
    if not (ours or peer):
        return []
    rows = ["", "| run | embedfleet tokens/s | PyTorch tokens/s | ratio | our peak GB | est. GB | PyTorch peak GB |",
            "|---|---|---|---|---|---|---|"]
    best_mix = max((r.get("real_tok_per_s", 0) for k, r in peer.items() if not k.startswith("uniform")),
                   default=None)
    for label, r in ours.items():
        p = peer.get(label)
        if label.startswith("mix") and best_mix:
            p = {"real_tok_per_s": best_mix, "peak_mem_gb": None}
        theirs, mine = (p or {}).get("real_tok_per_s"), r.get("real_tok_per_s")
        ratio = f"{mine / theirs:.2f}" if theirs and mine else "-"
        rows.append(f"| {label} | {num(mine, '.0f')} | {num(theirs, '.0f')} | {ratio} | {num(r.get('peak_mem_gb'), '.1f')} "
                    f"| {num(r.get('estimate_gb'), '.2f')} | {num((p or {}).get('peak_mem_gb'), '.1f')} |")
    for label, r in peer.items():
        if label not in ours:
            rows.append(f"| (PyTorch) {label} | - | {num(r.get('real_tok_per_s'), '.0f')} | - | - | - "
                        f"| {num(r.get('peak_mem_gb'), '.1f')} |")
    rows += ["", "mix rows compare with PyTorch's best approach on the mix (max of its mix runs; its "
             "study-padded run uses the first papers only)."]
    return rows


def decode_rows(lines):
    """Query-time shapes: ours (no CUDA graphs) beside PyTorch eager and PyTorch replaying one
    CUDA graph, in the same run (#63)."""
    ours = {r["label"].replace("uniform_", "decode_"): r for r in lines.get("decode", [])
            if r.get("event") == "bench" and r.get("label", "").startswith("uniform_")}
    peer = {r["label"]: r for r in lines.get("peer", [])
            if r.get("event") == "bench" and r.get("label", "").startswith("decode_")}
    if not ours and not peer:
        return []
    rows = ["", "| query shape | embedfleet tokens/s | PyTorch eager | PyTorch CUDA graph | ours / eager "
            "| ours / graph | graph's lowest cosine vs eager |", "|---|---|---|---|---|---|---|"]
    shapes = sorted({k for k in ours} | {k for k in peer if not k.endswith("_graphs")})
    for label in shapes:
        mine = ours.get(label, {}).get("real_tok_per_s")
        eager = peer.get(label, {}).get("real_tok_per_s")
        graph = peer.get(label + "_graphs", {})
        ratio = lambda theirs: f"{mine / theirs:.2f}" if theirs and mine else "-"
        rows.append(f"| {label[len('decode_'):]} | {num(mine, '.0f')} | {num(eager, '.0f')} "
                    f"| {num(graph.get('real_tok_per_s'), '.0f')} | {ratio(eager)} "
                    f"| {ratio(graph.get('real_tok_per_s'))} | {num(graph.get('min_cosine_vs_eager'), '.6f')} |")
    return rows


def fp8_rows(lines):
    """FP8 projections against ours (bf16) on the same shapes, in the same run."""
    fp8 = {r["label"]: r for r in lines.get("fp8", []) if r.get("event") == "bench"}
    if not fp8:
        return []
    ours = {r["label"]: r for r in lines.get("ours", []) if r.get("event") == "bench"}
    rows = ["", "| run | fp8 tokens/s | bf16 tokens/s | fp8 / bf16 | fp8 peak GB | bf16 peak GB |",
            "|---|---|---|---|---|---|"]
    for label, r in fp8.items():
        b = ours.get(label, {})
        mine, theirs = r.get("real_tok_per_s"), b.get("real_tok_per_s")
        ratio = f"{mine / theirs:.2f}" if theirs and mine else "-"
        rows.append(f"| {label} | {num(mine, '.0f')} | {num(theirs, '.0f')} | {ratio} "
                    f"| {num(r.get('peak_mem_gb'), '.1f')} | {num(b.get('peak_mem_gb'), '.1f')} |")
    return rows


def fidelity_rows(lines):
    fid = [(name, r) for name, ls in lines.items() for r in ls
           if r.get("event") in ("fidelity", "fidelity_error")]
    if not fid:
        return []
    rows = ["", "| binary | fidelity case | tokens | attention | cosine vs transformers fp32 |",
            "|---|---|---|---|---|"]
    for name, r in fid:
        cos = num(r.get("cosine"), ".6f") if r["event"] == "fidelity" else \
            "ERROR: " + str(r.get("error") or r.get("err") or r)[:200]
        rows.append(f"| {'cu12' if name == 'cu12' else 'cu13'} ({name}) | {r.get('name')} | "
                    f"{r.get('tokens', '-')} | {r.get('attention') or '-'} | {cos} |")
    return rows


def main(work, out, start, time_limit, dry_run, finished):
    plan, steps = load_steps(work)
    build = None
    try:
        build = json.loads(read(os.path.join(work, "build.json"), "null") or "null")
    except ValueError:
        build = {"error": "build.json unreadable"}
    report = {"finished": finished, "dry_run": dry_run, "elapsed_s": int(time.time()) - start,
              "time_limit_s": time_limit, "estimate_total_s": sum(p["estimate_s"] for p in plan),
              "order": [p["step"] for p in plan],
              "build": build,
              "gpu": read(os.path.join(work, "gpu.txt")),
              "attention": read(os.path.join(work, "attention.txt"), "not probed"),
              "attention_cu12": read(os.path.join(work, "attention-cu12.txt")),
              "model_note": read(os.path.join(work, "model-note.txt")),
              "steps": steps}
    lines = {}
    for s in steps:
        ls = jsonl(os.path.join(work, s["step"] + ".out"))
        lines[s["step"]] = ls
        report[s["step"]] = ls
    doctor = read(os.path.join(work, "doctor.out"))
    report["doctor_text"] = doctor.splitlines()[-40:] if doctor else None
    mix, mix_peer = read(os.path.join(work, "mix.json")), read(os.path.join(work, "mix-peer.json"))
    if mix and mix_peer:
        report["mix_same_as_peer"] = json.loads(mix) == json.loads(mix_peer)
    report["attention_used"] = sorted({r["attention"] for ls in lines.values() for r in ls
                                       if r.get("event") == "bench" and r.get("attention")})
    check_oom(steps, lines)
    for s in steps:
        if s.get("status") in ("failed", "timed out", "interrupted") and not s.get("check"):
            s["why"] = why(work, s["step"])

    identity = ""
    if build:
        identity = f"; build {str(build.get('git_commit', '?'))[:12]}" + \
            (" (dirty)" if build.get("git_dirty") else "") + \
            ("" if build.get("sha256_matches", True) else " SHA256 MISMATCH")
    rows = [f"# GPU check ({'dry run, CPU' if dry_run else report['gpu'] or 'GPU'})", "",
            f"{'finished' if finished else 'NOT FINISHED'} after {report['elapsed_s']} s "
            f"(no step starts after {time_limit} s; estimates sum to {report['estimate_total_s']} s){identity}; "
            f"attention: {report['attention']}"
            + (f"; used: {', '.join(report['attention_used'])}" if report["attention_used"] else ""), "",
            "| step | status | secs | est. s | limit s | JSON lines | notes |", "|---|---|---|---|---|---|---|"]
    dash = lambda v: "-" if v is None else v
    for s in steps:
        rows.append(f"| {s['step']} | {status_text(s)} | {dash(s.get('secs'))} | {dash(s.get('estimate_s'))} "
                    f"| {dash(s.get('limit_s'))} | {len(lines.get(s['step'], []))} | {notes(report, lines, s['step'], s)} |")
    rows += throughput_rows(lines) + decode_rows(lines) + fp8_rows(lines) + fidelity_rows(lines)
    table = "\n".join(rows) + "\n"
    for path, text in ((os.path.join(out, "gpu-report.json"), json.dumps(report, indent=1)),
                       (os.path.join(out, "gpu-report.md"), table)):
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
    if finished:
        print(table)


if __name__ == "__main__":
    w, o, st, tl, dr, fin = sys.argv[1:7]
    main(w, o, int(st), int(tl), dr == "1", fin == "1")
