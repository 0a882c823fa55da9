# The PyTorch peer of `embedfleet bench-gpu` (the project's copy of the team's
# shared/bench/torch_baseline.py; benches/gpu-check.sh runs both in one script).
# Anchor: HF transformers Qwen3 (Qwen3-Embedding-4B shape, random bf16 weights, seed 0) on one
# GPU. Measures forward tokens/s for (a) uniform shapes, (b) a paper-like length mix batched the
# way the HPC study did (<=8 papers, <=150k chars, padded) versus length-sorted token budgets,
# and (c) the same mix one paper per forward with no padding. Prints one JSON line per run.
#
# With MODEL_OUT, the same process first writes the model it measures (HF layout, bf16,
# save_pretrained) for embedfleet to load, and the fidelity cases: transformers' float32
# embeddings (last token, L2-normalised) of random ids at FIDELITY_LENGTHS tokens. One process,
# one set of weights: no second load of 8 GB.
#
# env: MODEL_OUT=dir (TOKENIZER=tokenizer.json copied in; FIDELITY_OUT, FIDELITY_LENGTHS="1 16 512
#      2048 8192 32768", FIDELITY_CU12_OUT + CU12_LEN: the one case for the CUDA 12 binary)
#      SHAPE=4b|tiny  LAYERS=N (that shape's width, N layers)  DEVICE=cuda|cpu  BENCH=1 (0: model and cases only)
#      PROFILE_SHAPES="16x2048 ...": PyTorch's profiler, op by op, on those uniform shapes (before BENCH)
#      UNIFORM_SHAPES=64x512,16x2048,4x8192,1x32768  UNIFORM_FORWARDS=4 (two warm up first; all timed)
#      DECODE_SHAPES=64x1,64x16,64x64,1x64: (e) query-time shapes, last of all, DECODE_FORWARDS
#      (10) each eager (`decode_bB_tT`) and, on CUDA, replayed from one CUDA graph captured with
#      static inputs (`decode_bB_tT_graphs`; its vectors checked against the eager forward's)
#      PEER_MIX=0: stop after the uniform shapes (no mix, no study batches)
#      MIX_PAPERS=240  MIX_OUT=file (the mix's token lengths, for `bench-gpu --mix`)
#      MIX_IN=file (a JSON list of token lengths instead of the seeded mix; characters ~4.2 a token)
#      STUDY_PAPERS (default: all): the study's padded batches on the first N papers only
#      MIX_MAX_TOKENS=32768: the mix's longest paper (a tiny model's context is shorter)
#      PACKED=1: (d) the papers packed into one forward per token budget, attention per paper
#      (flash_attn_varlen_func where flash-attn is installed, else SDPA's causal kernel per
#      paper); COMPILE=1 (default on CUDA) also times it under torch.compile; PACK_CHECK=1 first
#      compares packed and one-paper-per-forward embeddings in float32 (the `packed_check` line)
import json, math, os, random, shutil, sys, time
import torch
from transformers import AttentionInterface, Qwen3Config, Qwen3Model

def log(**kw):
    print(json.dumps(kw), flush=True)

env = os.environ.get
device = env("DEVICE", "cuda")
dims = dict(vocab_size=151665, hidden_size=2560, intermediate_size=9728, num_hidden_layers=36,
            num_attention_heads=32, num_key_value_heads=8, head_dim=128,
            max_position_embeddings=40960)
if env("SHAPE", "4b") == "tiny":
    dims = dict(vocab_size=4096, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                max_position_embeddings=2048)
if env("LAYERS"):  # fewer layers of the same width: a fidelity check that fits a CPU
    dims["num_hidden_layers"] = int(env("LAYERS"))
cfg = Qwen3Config(**dims, rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True)
cfg._attn_implementation = "sdpa"

def with_rope_in_f32(m):
    # `.to(dtype)` casts every floating buffer, the rotary frequencies too: in bf16 they are off
    # by up to 2^-9, so the angle at position p is off by p times that (52 rad at 32,768 on the
    # 4B shape). `from_pretrained` keeps them in f32, as the real model runs; so do we, after
    # every cast (it made the reference, and PyTorch's bf16 with it, fall to 0.47 at 32,768).
    rot = m.rotary_emb
    theta = cfg.rope_parameters["rope_theta"] if getattr(cfg, "rope_parameters", None) else cfg.rope_theta
    hd = cfg.head_dim
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float) / hd))
    rot.inv_freq = inv.to(rot.inv_freq.device)
    if hasattr(rot, "original_inv_freq"):
        rot.original_inv_freq = inv.clone().to(rot.inv_freq.device)
    return m

def sync():
    if device == "cuda":
        torch.cuda.synchronize()

def peak_gb():
    return round(torch.cuda.max_memory_allocated() / 2**30, 1) if device == "cuda" else None

t0 = time.time()
torch.manual_seed(0)
with torch.device(device):
    model = with_rope_in_f32(Qwen3Model(cfg).to(torch.bfloat16).eval())
sync()
nparams = sum(p.numel() for p in model.parameters())
nonemb = nparams - cfg.vocab_size * cfg.hidden_size
log(event="loaded", secs=round(time.time() - t0, 1), params=nparams, non_embedding=nonemb,
    torch=torch.__version__, gpu=torch.cuda.get_device_name(0) if device == "cuda" else "cpu")

def exact_attention_by_blocks(module, query, key, value, attention_mask, scaling=None,
                              dropout=0.0, **kwargs):
    # The float32 reference's attention: exact causal softmax, 2,048 queries at a time. SDPA has
    # no fused float32 kernel for grouped-query attention, so its math path builds the whole
    # score matrix: 128 GiB at 32,768 tokens (the first GPU run ran out of memory there).
    # One sequence per forward, no padding: the causal mask is the only mask.
    _, heads, q_len, dim = query.shape
    group = heads // key.shape[1]
    key = key.repeat_interleave(group, dim=1)
    value = value.repeat_interleave(group, dim=1)
    scale = scaling if scaling is not None else dim ** -0.5
    offset = key.shape[2] - q_len
    out = torch.empty_like(query)
    for s in range(0, q_len, 2048):
        e = min(q_len, s + 2048)
        scores = torch.matmul(query[:, :, s:e], key[:, :, :offset + e].transpose(-1, -2)) * scale
        rows = torch.arange(s, e, device=query.device)[:, None] + offset
        cols = torch.arange(offset + e, device=query.device)[None, :]
        scores.masked_fill_(cols > rows, float("-inf"))
        out[:, :, s:e] = torch.matmul(scores.softmax(-1), value[:, :, :offset + e])
    return out.transpose(1, 2).contiguous(), None

AttentionInterface.register("exact_by_blocks", exact_attention_by_blocks)

def last_token_embedding(ids):
    # One text per forward, its last token, L2-normalised in float64.
    with torch.inference_mode():
        h = model(input_ids=torch.tensor([ids], device=device)).last_hidden_state[0, -1]
    return torch.nn.functional.normalize(h.double(), dim=0)

def embed_cosine(ids, ref, attn):
    # Cosine of the model's last-token embedding (attention `attn`, the model's dtype) with `ref`.
    saved = model.config._attn_implementation
    model.config._attn_implementation = attn
    got = last_token_embedding(ids)
    model.config._attn_implementation = saved
    return float(torch.dot(got, ref.to(got.device)))

def write_model_and_cases(out):
    global model
    t = time.time()
    model.save_pretrained(out, safe_serialization=True)
    if env("TOKENIZER"):
        shutil.copy(env("TOKENIZER"), os.path.join(out, "tokenizer.json"))
    log(event="model_written", secs=round(time.time() - t, 1), dir=out)
    if not env("FIDELITY_OUT"):
        return
    # The reference: the same weights in float32 (bf16 values are exact in it), one text per
    # forward, last token, L2-normalised; then back to bf16, bit for bit, for the benches.
    t = time.time()
    model = with_rope_in_f32(model.float())
    model.config._attn_implementation = "exact_by_blocks"
    g = torch.Generator().manual_seed(1)
    cases = []
    for n in map(int, env("FIDELITY_LENGTHS", "1 16 512 2048 8192 32768").split()):
        ids = torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist()
        emb = last_token_embedding(ids)
        cases.append({"name": f"random_{n}", "ids": ids, "embedding": [float(x) for x in emb]})
        if n <= int(env("REF_CHECK_MAX", "8192")):
            # The reference's own check: float32 SDPA (its math path) where it fits.
            log(event="reference_check", name=f"random_{n}", tokens=n,
                cosine_fp32_sdpa=embed_cosine(ids, emb, "sdpa"))
    model = with_rope_in_f32(model.to(torch.bfloat16))
    model.config._attn_implementation = "sdpa"
    # PyTorch's own bf16 forward (SDPA) against the same reference: what bf16 arithmetic on
    # these random weights allows, beside which embedfleet's cosines are read.
    for c in cases:
        log(event="peer_fidelity", name=c["name"], tokens=len(c["ids"]),
            cosine=embed_cosine(c["ids"], torch.tensor(c["embedding"], dtype=torch.float64), "sdpa"))
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    ref = f"transformers Qwen3Model, float32, exact attention by blocks, torch {torch.__version__}"
    json.dump({"reference": ref, "cases": cases}, open(env("FIDELITY_OUT"), "w"))
    if env("FIDELITY_CU12_OUT"):
        cu12 = [c for c in cases if len(c["ids"]) == int(env("CU12_LEN", "2048"))]
        json.dump({"reference": ref, "cases": cu12}, open(env("FIDELITY_CU12_OUT"), "w"))
    log(event="fidelity_cases", cases=len(cases), secs=round(time.time() - t, 1))

if env("MODEL_OUT"):
    write_model_and_cases(env("MODEL_OUT"))

def flops(lengths):
    # 2*nonemb per token + causal attention (QK^T and PV): 2*2*layers*heads*hd*L^2/2 per seq
    f = 2 * nonemb * sum(lengths)
    for L in lengths:
        f += 2 * cfg.num_hidden_layers * cfg.num_attention_heads * cfg.head_dim * L * L
    return f

@torch.inference_mode()
def run_batch(lengths, pad=True):
    B, T = len(lengths), max(lengths)
    ids = torch.randint(0, cfg.vocab_size, (B, T), device=device)
    mask = torch.zeros((B, T), dtype=torch.long, device=device)
    for i, L in enumerate(lengths):
        mask[i, T - L:] = 1  # left padding, as Qwen3-Embedding uses
    out = model(input_ids=ids, attention_mask=mask).last_hidden_state
    emb = torch.nn.functional.normalize(out[:, -1].float(), dim=-1)
    return emb

def profile(shape):
    # Where PyTorch's forward spends the device's time, op by op: self time over 2 forwards
    # after a warm-up, beside embedfleet's stages of the same shape (EF_PROFILE_STAGES=1).
    from torch.profiler import ProfilerActivity, profile as torch_profile
    B, T = map(int, shape.split("x"))
    run_batch([T] * B)
    sync()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    t = time.time()
    with torch_profile(activities=acts) as prof:
        for _ in range(2):
            run_batch([T] * B)
        sync()
    secs = time.time() - t
    if device == "cuda":  # self_cuda_time_total before torch 2.4
        own = lambda e: getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
    else:
        own = lambda e: e.self_cpu_time_total
    rows = sorted(prof.key_averages(), key=lambda e: -own(e))[:25]
    log(event="torch_profile", label=f"uniform_b{B}_t{T}", forwards=2, secs=round(secs, 3),
        ops=[{"op": e.key, "calls": e.count, "self_ms": round(own(e) / 1e3, 2)} for e in rows])

def timed(batches, label, iters=1):
    for b in batches[:2]:
        run_batch(b)
    sync()
    t = time.time()
    real = padded = 0
    for _ in range(iters):
        for b in batches:
            run_batch(b)
            real += sum(b); padded += len(b) * max(b)
    sync()
    dt = time.time() - t
    f = sum(flops(b) for b in batches) * iters
    log(event="bench", label=label, secs=round(dt, 3), real_tokens=real, padded_tokens=padded,
        real_tok_per_s=round(real / dt), tflops_useful=round(f / dt / 1e12, 1),
        peak_mem_gb=peak_gb())

def free():
    if device == "cuda":
        torch.cuda.empty_cache()

for shape in env("PROFILE_SHAPES", "").split():
    try:
        profile(shape)
    except Exception as e:  # the profile is extra: the model, the cases and the benches go on
        log(event="error", label=f"torch_profile {shape}", err=str(e)[:300])
    free()
if env("BENCH", "1") != "1":
    sys.exit(0)

# (a) uniform shapes, 32k tokens per forward
UNIFORM_FORWARDS = int(env("UNIFORM_FORWARDS", "4"))
for shape in env("UNIFORM_SHAPES", "64x512,16x2048,4x8192,1x32768").split(","):
    B, T = map(int, shape.split("x"))
    try:
        timed([[T] * B] * UNIFORM_FORWARDS, f"uniform_b{B}_t{T}")
    except Exception as e:
        log(event="error", label=f"uniform_b{B}_t{T}", err=str(e)[:300])
    free()

@torch.inference_mode()
def decode_graphs(B, T, forwards):
    # One CUDA graph of the whole forward at a query's shape, inputs in static buffers (as a
    # server replays it), warmed up on a side stream as torch.cuda.graphs asks. No attention
    # mask: a mask's checks read values back, which capture forbids; the shape has no padding.
    ids = torch.randint(0, cfg.vocab_size, (B, T), device=device)
    def step():
        out = model(input_ids=ids, use_cache=False).last_hidden_state
        return torch.nn.functional.normalize(out[:, -1].float(), dim=-1)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    graph.replay()
    sync()
    worst = (captured * step()).sum(-1).min().item()  # the replay's vectors are the eager ones
    t = time.time()
    for _ in range(forwards):
        graph.replay()
    sync()
    dt = time.time() - t
    real = B * T * forwards
    log(event="bench", label=f"decode_b{B}_t{T}_graphs", secs=round(dt, 4), real_tokens=real,
        padded_tokens=real, real_tok_per_s=round(real / dt), graphs=True,
        min_cosine_vs_eager=round(worst, 6), tflops_useful=round(flops([T] * B) * forwards / dt / 1e12, 2),
        peak_mem_gb=peak_gb())

def decode_section():
    # (e) query-time shapes: eager, then one CUDA graph replayed (GPU only). Last, whichever
    # sections ran: a capture that fails must not spoil the mix's figures before it.
    forwards = int(env("DECODE_FORWARDS", "10"))
    for shape in [s for s in env("DECODE_SHAPES", "").split(",") if s]:
        B, T = map(int, shape.split("x"))
        try:
            timed([[T] * B] * forwards, f"decode_b{B}_t{T}")
        except Exception as e:
            log(event="error", label=f"decode_b{B}_t{T}", err=str(e)[:300])
        if device != "cuda":
            log(event="decode_graphs_skipped", label=f"decode_b{B}_t{T}_graphs",
                why="CUDA graphs need a GPU")
            continue
        try:
            decode_graphs(B, T, forwards)
        except Exception as e:  # a capture the model's code forbids: said, and the peer ends
            log(event="error", label=f"decode_b{B}_t{T}_graphs", err=str(e)[:300])
        free()

if env("PEER_MIX", "1") != "1":  # the uniform shapes only (gpu-diagnose.sh's same-run peer)
    decode_section()
    sys.exit(0)

# (b) paper-like mix: lognormal chars, ~4.2 chars/token, capped at 32k tokens
if env("MIX_IN"):
    toks = json.load(open(env("MIX_IN")))
    chars = [t * 42 // 10 for t in toks]
else:
    random.seed(0)
    chars = [min(int(random.lognormvariate(math.log(20000), 0.8)), 130000)
             for _ in range(int(env("MIX_PAPERS", "240")))]
    toks = [max(16, min(int(env("MIX_MAX_TOKENS", "32768")), c * 10 // 42)) for c in chars]
if env("MIX_OUT"):
    with open(env("MIX_OUT"), "w") as f:
        json.dump(toks, f)
# study heuristic: consecutive papers, <=8 per batch, <=150k chars per batch (on the first
# STUDY_PAPERS papers when set)
study_n = int(env("STUDY_PAPERS") or len(toks))
study, cur, cc = [], [], 0
for c, t in zip(chars[:study_n], toks[:study_n]):
    if cur and (len(cur) == 8 or cc + c > 150000):
        study.append(cur); cur, cc = [], 0
    cur.append(t); cc += c
if cur: study.append(cur)
# length-sorted, token budget 64k padded tokens per batch
srt, cur = [], []
for t in sorted(toks):
    if cur and (len(cur) + 1) * max(cur + [t]) > 65536:
        srt.append(cur); cur = []
    cur.append(t)
if cur: srt.append(cur)
log(event="mix", papers=len(toks), total_tokens=sum(toks), mean_tokens=sum(toks) // len(toks),
    study_papers=min(study_n, len(toks)), study_batches=len(study), sorted_batches=len(srt))
for label, bs in [("study_heuristic_padded", study), ("sorted_token_budget_64k", srt)]:
    try:
        timed(bs, label)
    except Exception as e:
        log(event="error", label=label, err=str(e)[:300])
    free()

# (c) the best simple PyTorch approach on the same mix: one paper per forward, no padding,
# no mask, so sdpa takes its causal flash kernel.
@torch.inference_mode()
def one(L):
    ids = torch.randint(0, cfg.vocab_size, (1, L), device=device)
    h = model(input_ids=ids).last_hidden_state[:, -1]
    return torch.nn.functional.normalize(h.float(), dim=-1)

for L in toks[:3]:
    one(L)
sync()
t = time.time()
for L in toks:
    one(L)
sync()
dt = time.time() - t
log(event="bench", label="one_paper_per_forward_nopad", secs=round(dt, 3), real_tokens=sum(toks),
    padded_tokens=sum(toks), real_tok_per_s=round(sum(toks) / dt),
    tflops_useful=round(sum(flops([L]) for L in toks) / dt / 1e12, 1),
    peak_mem_gb=peak_gb())

# (d) the strongest PyTorch this image allows on the same mix, as embedfleet runs it: the papers
# length-sorted and packed end to end into one forward per token budget (no padding, no mask),
# position ids restarting at each paper, attention within each paper only. The projections and
# the MLP see the whole budget at once (big GEMMs); the attention is flash-attn's varlen kernel
# where it is installed, else SDPA's causal kernel paper by paper. Then the same under
# torch.compile where it works.
if env("PACKED", "1") != "1":
    decode_section()
    sys.exit(0)
import torch.nn.functional as F
try:
    from flash_attn import flash_attn_varlen_func
except Exception:  # not in every image: SDPA per paper instead
    flash_attn_varlen_func = None
PACK = {}

def packed_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                     **kwargs):
    # query (1, heads, total, dim), key and value (1, kv_heads, total, dim); the papers'
    # bounds in PACK["cu"]. Returns (1, total, heads, dim), as transformers' attentions do.
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if flash_attn_varlen_func is not None and query.is_cuda:
        cu = PACK["cu_dev"]
        out = flash_attn_varlen_func(query[0].transpose(0, 1), key[0].transpose(0, 1),
                                     value[0].transpose(0, 1), cu, cu, PACK["max"], PACK["max"],
                                     softmax_scale=scale, causal=True)
        return out.unsqueeze(0), None
    group = query.shape[1] // key.shape[1]
    key = key.repeat_interleave(group, dim=1)
    value = value.repeat_interleave(group, dim=1)
    out = torch.empty_like(query)
    bounds = PACK["cu"]
    for s, e in zip(bounds, bounds[1:]):
        out[:, :, s:e] = F.scaled_dot_product_attention(
            query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], is_causal=True, scale=scale)
    return out.transpose(1, 2).contiguous(), None

AttentionInterface.register("packed_varlen", packed_attention)
try:  # no mask at all: the attention keeps to each paper itself
    from transformers.masking_utils import AttentionMaskInterface
    AttentionMaskInterface.register("packed_varlen", lambda *args, **kwargs: None)
except Exception:
    pass

@torch.inference_mode()
def run_packed(ids_per_paper, forward):
    # One forward over the papers end to end; each paper's last token, L2-normalised.
    lengths = [len(x) for x in ids_per_paper]
    bounds = [0]
    for L in lengths:
        bounds.append(bounds[-1] + L)
    PACK["cu"], PACK["max"] = bounds, max(lengths)
    PACK["cu_dev"] = torch.tensor(bounds, dtype=torch.int32, device=device)
    ids = torch.tensor([[t for x in ids_per_paper for t in x]], device=device)
    pos = torch.tensor([[p for L in lengths for p in range(L)]], device=device)
    h = forward(input_ids=ids, position_ids=pos).last_hidden_state[0]
    last = torch.tensor(bounds[1:], device=device) - 1
    return torch.nn.functional.normalize(h[last].float(), dim=-1)

def packs(lengths, budget):
    # Length-sorted, up to `budget` real tokens a forward (a paper longer than it alone).
    out, cur = [], []
    for L in sorted(lengths):
        if cur and sum(cur) + L > budget:
            out.append(cur); cur = []
        cur.append(L)
    if cur: out.append(cur)
    return out

def random_ids(lengths, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, cfg.vocab_size, (L,), generator=g).tolist() for L in lengths]

saved_attn = model.config._attn_implementation
model.config._attn_implementation = "packed_varlen"
if env("PACK_CHECK") == "1":
    # Packing changes nothing but the batching: each paper's embedding, packed, is its
    # embedding alone (float32, so only the summation order differs).
    import copy
    m32 = with_rope_in_f32(copy.deepcopy(model).float())
    papers = random_ids(sorted(toks)[:6], 2)
    packed = run_packed(papers, m32)
    m32.config._attn_implementation = "sdpa"
    with torch.inference_mode():
        alone = [torch.nn.functional.normalize(
            m32(input_ids=torch.tensor([x], device=device)).last_hidden_state[0, -1].float(),
            dim=-1) for x in papers]
        cos = [float(torch.dot(packed[i], alone[i])) for i in range(len(papers))]
    log(event="packed_check", papers=len(papers), min_cosine=min(cos))
    del m32
budget = int(env("PACK_BUDGET", "65536"))
batches = packs(toks, budget)
log(event="packed_mix", batches=len(batches), budget=budget,
    attention="flash_attn_varlen_func" if flash_attn_varlen_func is not None and device == "cuda"
    else "sdpa per paper")
ways = [("packed_token_budget", model)]
if env("COMPILE", "1" if device == "cuda" else "0") == "1":
    try:
        ways.append(("packed_token_budget_compiled", torch.compile(model, dynamic=True)))
    except Exception as e:
        log(event="error", label="torch.compile", err=str(e)[:300])
for label, forward in ways:
    try:
        inputs = [random_ids(b, 3 + i) for i, b in enumerate(batches)]
        for papers in inputs[:2]:  # warm-up (and the compile, where there is one)
            run_packed(papers, forward)
        sync()
        t = time.time()
        for papers in inputs:
            run_packed(papers, forward)
        sync()
        dt = time.time() - t
        real = sum(toks)
        log(event="bench", label=label, secs=round(dt, 3), real_tokens=real, padded_tokens=real,
            real_tok_per_s=round(real / dt), tflops_useful=round(flops(toks) / dt / 1e12, 1),
            peak_mem_gb=peak_gb())
    except Exception as e:
        log(event="error", label=label, err=str(e)[:300])
    free()
model.config._attn_implementation = saved_attn

decode_section()
