"""Generation throughput of slipstream's engine: against `transformers`, and continuous
batching against static batches on the heavy-tailed built-in task.

Run: python bench/engine.py [--device auto|cpu|cuda] [--model tiny|qwen2.5-0.5b] [--vocab N]
[--part all|sampling] [--dtype float32|bfloat16] [--batch 64] [--max-new-tokens 128] [--repeats 3]
[--eager] [--quick]. Prints four tables, then one JSON line of the headline figures. `--device
auto` (the default) runs on a GPU when there is one, where the engine replays its decode steps as
CUDA graphs (`--eager`: it does not).

1. Engine vs `transformers.generate`. A random model (`--model`: `tiny`, a Llama of hidden 256,
   4 layers, vocab 512, the default; or `qwen2.5-0.5b`, Qwen2.5-0.5B's shape, 494M parameters)
   is built with `transformers`, saved as an ordinary Hugging Face folder and loaded by both.
   Same prompts (batch of `--batch`, 16 tokens each), greedy, exactly `--max-new-tokens` new
   tokens per sequence on both sides (no stop token: `eos_token_id=None` for `generate`, an
   unreachable stop id for the engine), so both count the same tokens. Median of repeats after
   one warm-up; the contenders' runs alternate, and CPU time is shown next to wall time (on a
   shared machine the CPU-time ratio is the steadier one). The greedy tokens are compared as a
   correctness check. `generate` runs with its defaults for this case: `use_cache=True` with
   the dynamic cache, float32 like the engine, a static batch with no padding (all prompts are
   16 tokens), eager PyTorch. On a GPU the engine without graphs is timed too. On a CPU the
   part also times the *kernel floor*: the step's matrix products and attention alone, back to
   back with each layer's own weights and caches, as a step runs them.
2. Continuous vs static batching on the built-in task (running sums, heavy-tailed lengths), on
   the built-in model's shape (random init). A random model's lengths are not the task's, so
   the lengths are driven by the task instead: each request's `max_new_tokens` is the token
   length of its prompt's correct completion plus the end-of-sequence token, and no stop token
   is honoured, so every request generates exactly that many tokens (the length distribution
   a model that solves the task produces: p99 about 6x the median). Static: batches of
   `--batch` requests, each waiting for its longest (finished rows stop computing, so this is
   the best static baseline, not a padded one). Continuous: the same requests through one pool
   of `--batch` slots, each slot refilled as soon as it frees (with CUDA graphs, as soon as the
   deferred-prefill rule says); and once more with prefill as a separate forward between decode
   steps. Same engine, same tokens.
3. The in-flight weight update pause (copy into the parameters, plus re-prefill in
   `recompute` mode) for the model of part 1 with a full pool of sequences in flight.
4. Sampling at temperature: the engine at temperature 0, 0.6 and 1.0 on part 1's model
   (`--vocab 151936` gives it Qwen2.5's vocabulary), each of its `sample()` calls timed during
   the runs; `sampling_share_of_step` is sampling time over generation time at T = 0.6 (`_t1`:
   at T = 1.0), both measured together (`--part sampling` runs this part alone). Where the
   engine samples through the fused kernel (a GPU with Triton), the same without it beside it.

Measured (defaults, 2026-11-30):

- one NVIDIA H200 (five runs on four machines, the last on the final code, quoted): engine
  68,277 tokens/s (0.94 ms a decode step) against transformers 11,737 (5.45 ms):
  `ratio_vs_transformers` 5.82 (4.95 to 6.20 over the five runs, median 5.90); the same engine
  without graphs 18,364 (1.56x); greedy sequences identical 64/64. `--model qwen2.5-0.5b`:
  11,703 against 2,830 tokens/s, 4.14x (4.11 in an earlier run; eager 1.77x), 63/64 greedy
  sequences identical (float differences flip one argmax in 128 tokens of a random 24-layer
  model). Continuous vs static 1.71x (1.60 to 1.88 over seven runs; 0.89x before prefill was
  deferred, when every step paid an eager prefill forward). Weight-update pause 1.03 ms
  (`keep`), 5.95 ms (`recompute`); for the 494M-parameter model 6.9 and 66.1 ms.
  `--model qwen2.5-0.5b --dtype bfloat16`: 17,690 against 3,000 tokens/s, 5.90x (graph and
  eager engine identical 64/64; against transformers 0/64 over 128 tokens: in bfloat16 greedy
  chains part early whoever computes them; on the CPU, with the tiny model and 32 tokens,
  transformers in bfloat16 parts from itself in float32 at a median token 14.5, the engine in
  bfloat16 from transformers in bfloat16 at 18). Without graphs the engine is no faster than
  `generate` in bfloat16 (the RMS norms' unfused path outside float32).
- this 2-core CPU, one thread (final code): engine 5,855 tokens/s (10.93 ms a step) against
  transformers 3,810 (16.80 ms): 1.54x (1.46 to 1.82 over earlier runs, 1.50 earlier the same
  day); continuous vs static 1.70x; weight-update pause 12.3 ms (`keep`), 301 ms
  (`recompute`). The kernel floor is 5.91 ms a step (5.26 in the earlier run): an engine with
  no overhead at all would reach 16.80 / 5.91 = 2.8x (2.9x), so 3x is out of reach of float32
  MKL and SDPA kernels here; the rest of the engine's step is norms, rotary embeddings, cache
  writes, sampling, and a cost of this machine (an operation that follows a large one runs
  several times slower than alone: a 64 x 128 multiply takes 3 us alone, 28 us right after an
  attention call).

Threads: `--threads 1` by default (stable CPU figures on a shared machine), the same on both sides.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from slipstream.engine import Engine, Request, SamplingParams
from slipstream.engine.sampling import Sampled
from slipstream.engine.stats import EngineStats
from slipstream.model import load_pretrained
from slipstream.model.builtin import init_builtin
from slipstream.model.llama import ModelConfig
from slipstream.tasks import RunningSums

NO_STOP = -1  # a stop id no token can equal: every request runs to its max_new_tokens
PROMPT_LEN = 16


@dataclass
class Timing:
    wall_s: float  # median wall time of the timed runs
    cpu_s: float  # median CPU time of this process over the same runs
    result: object  # what the last run returned
    results: tuple[object, ...] = ()  # what each timed run returned, in order


def graph_setting(args: argparse.Namespace) -> bool | None:
    """The engines' `decode_graph`: their default (graphs on a GPU) unless `--eager`."""
    return False if args.eager else None


def side_by_side(contenders: dict[str, Callable[[], object]], repeats: int) -> dict[str, Timing]:
    """Median wall and CPU time of each contender, after one warm-up call of each.

    Runs alternate (a, b, a, b, ...), so that a change of load on a shared machine falls on all
    contenders alike instead of on whichever ran during it.
    """
    for fn in contenders.values():
        fn()
    wall: dict[str, list[float]] = {k: [] for k in contenders}
    cpu: dict[str, list[float]] = {k: [] for k in contenders}
    got: dict[str, list[object]] = {k: [] for k in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            w0, c0 = time.perf_counter(), time.process_time()
            got[name].append(fn())
            wall[name].append(time.perf_counter() - w0)
            cpu[name].append(time.process_time() - c0)
    med = statistics.median
    return {k: Timing(med(wall[k]), med(cpu[k]), got[k][-1], tuple(got[k])) for k in contenders}


def median_result(t: Timing) -> float:
    """The median of the numbers the timed runs returned (not the warm-up's, not the last's):
    the figure beside a median time."""
    return statistics.median(float(v) for v in t.results)  # type: ignore[arg-type]


# ---- 1. engine vs transformers -------------------------------------------------------------
# Part 1's model shapes: random weights, saved as ordinary Hugging Face folders.
MODELS = {
    "tiny": dict(  # the default: small enough for a CPU
        model_type="llama",
        vocab_size=512,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    ),
    "qwen2.5-0.5b": dict(  # Qwen2.5-0.5B's shape (494M parameters): for a GPU
        model_type="qwen2",
        vocab_size=151936,
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    ),
}


def describe(name: str, vocab: int | None = None) -> str:
    m = MODELS[name]
    return (
        f"{name}: {m['model_type']} hidden {m['hidden_size']}, {m['num_hidden_layers']} layers, "
        f"vocab {vocab or m['vocab_size']}"
    )


def hf_model_folder(path: Path, seed: int, name: str = "tiny", vocab: int | None = None) -> Path:
    import transformers

    torch.manual_seed(seed)
    kw = dict(MODELS[name])
    if vocab is not None:
        kw["vocab_size"] = vocab
    cfg = transformers.AutoConfig.for_model(
        kw.pop("model_type"),
        **kw,
        max_position_embeddings=1024,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=0,
    )
    model = transformers.AutoModelForCausalLM.from_config(cfg).float()
    with torch.no_grad():  # 0.02 init gives near-uniform logits; a wider one gives real argmaxes
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.1)
    model.save_pretrained(path)
    return path


def vs_transformers(args: argparse.Namespace, folder: Path) -> dict[str, float]:
    import transformers

    B, N = args.batch, args.max_new_tokens
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(2, 512, (B, PROMPT_LEN), generator=g)
    dev = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    hf = hf.eval().to(dev)
    hf.generation_config.eos_token_id = None
    ours = load_pretrained(folder, dtype=dtype, device=dev)
    engine = Engine(ours, NO_STOP, B, PROMPT_LEN + N, decode_graph=graph_setting(args))
    greedy = SamplingParams(temperature=0.0, max_new_tokens=N)
    hf_prompts = prompts.to(dev)

    def run_hf() -> torch.Tensor:
        with torch.no_grad():
            out = hf.generate(
                hf_prompts,
                attention_mask=torch.ones_like(hf_prompts),
                max_new_tokens=N,
                do_sample=False,
                pad_token_id=0,
            )
        return out[:, PROMPT_LEN:].cpu()  # waits for the device: timed like the engine's lists

    def ours_with(e: Engine) -> Callable[[], list[list[int]]]:
        return lambda: [c.tokens for c in e.generate(Request(p, greedy) for p in prompts.tolist())]

    contenders = {"hf": run_hf, "ours": ours_with(engine)}
    if engine.decode_graph:  # on a GPU: what the CUDA graph of the decode step is worth
        eager = Engine(ours, NO_STOP, num_slots=B, max_len=PROMPT_LEN + N, decode_graph=False)
        contenders["eager"] = ours_with(eager)
    t = side_by_side(contenders, args.repeats)
    hf_tokens, our_tokens = t["hf"].result, t["ours"].result
    assert isinstance(hf_tokens, torch.Tensor) and isinstance(our_tokens, list)
    n_hf, n_ours = hf_tokens.numel(), sum(map(len, our_tokens))
    assert n_hf == n_ours == B * N, (n_hf, n_ours)
    same = sum(a == b for a, b in zip(hf_tokens.tolist(), our_tokens))
    res = {
        "engine_tokens_per_s": n_ours / t["ours"].wall_s,
        "transformers_tokens_per_s": n_hf / t["hf"].wall_s,
        "ratio_vs_transformers": t["hf"].wall_s / t["ours"].wall_s,
        "ratio_vs_transformers_cpu_time": t["hf"].cpu_s / t["ours"].cpu_s,
        "greedy_sequences_identical": same,
    }
    where = f"{args.threads} CPU thread(s)" if dev.type == "cpu" else str(dev)
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else where
    print(
        f"1. Generation, batch {B}, {PROMPT_LEN}-token prompts, {N} new tokens each, greedy "
        f"({describe(args.model)}, {args.dtype}; {where}; median of {args.repeats})"
    )
    print(f"   {'':30s}{'tokens/s':>10s}{'wall s':>9s}{'CPU s':>8s}{'ms/step':>9s}")
    rows = [("transformers generate", "hf"), ("slipstream engine", "ours")]
    if "eager" in t:
        rows[1] = ("slipstream engine (graph)", "ours")
        rows.append(("slipstream engine, eager", "eager"))
        res["engine_eager_tokens_per_s"] = B * N / t["eager"].wall_s
    for name, key in rows:
        w, c = t[key].wall_s, t[key].cpu_s
        print(f"   {name:30s}{B * N / w:10,.0f}{w:9.2f}{c:8.2f}{w / N * 1e3:9.2f}")
    print(
        f"   {'ratio':30s}{res['ratio_vs_transformers']:9.2f}x  "
        f"(CPU time: {res['ratio_vs_transformers_cpu_time']:.2f}x)"
    )
    print(f"   greedy sequences identical to transformers: {same}/{B}")
    if "eager" in t:
        same_eager = sum(a == b for a, b in zip(t["eager"].result, our_tokens))  # type: ignore[call-overload]
        print(f"   greedy sequences identical, graph vs eager engine: {same_eager}/{B}")
        res["graph_vs_eager_identical"] = same_eager
    if dev.type == "cpu" and args.dtype == "float32":
        floor = kernel_floor(ours.config, B, PROMPT_LEN, N)
        res["kernel_floor_ms_per_step"] = floor * 1e3
        print(
            f"   the engine's matrix products and attention alone, back to back as in a step: "
            f"{floor * 1e3:.2f} ms/step (transformers' step takes {t['hf'].wall_s / N / floor:.1f}x that)"
        )
    print()
    return res


def kernel_floor(cfg: ModelConfig, B: int, prompt_len: int, new_tokens: int) -> float:
    """Seconds per decode step of the kernels no float32 engine can skip: every layer's
    projections and MLP products for `B` rows (fused as the engine packs them), its attention
    over its own key and value caches, and the LM head, run back to back as a step runs them
    (each layer with its own weights and caches, so they come from memory as in a real step,
    not from a warm cache), averaged over the spans the run goes through. A real step also runs
    norms, rotary embeddings, cache writes and sampling; this is what is left when all of that
    costs nothing."""
    import torch.nn.functional as F

    H, inter, hd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    nh, nkv = cfg.num_attention_heads, cfg.num_key_value_heads
    assert hd is not None
    L, nl = prompt_len + new_tokens, cfg.num_hidden_layers
    layers = [
        (
            torch.randn(H, (nh + 2 * nkv) * hd),  # qkv
            torch.randn(nh * hd, H),  # o
            torch.randn(H, 2 * inter),  # gate_up
            torch.randn(inter, H),  # down
            torch.randn(B + 1, nkv, L, hd),  # keys
            torch.randn(B + 1, nkv, L, hd),  # values
        )
        for _ in range(nl)
    ]
    head = torch.randn(H, cfg.vocab_size)
    x, act = torch.randn(B, H), torch.randn(B, inter)
    q = torch.randn(B, nkv, nh // nkv, hd)

    def step(span: int) -> None:
        mask = torch.ones(B, 1, 1, span, dtype=torch.bool)
        for qkv, o, gate_up, down, k, v in layers:
            torch.mm(x, qkv)
            F.scaled_dot_product_attention(q, k[:B, :, :span], v[:B, :, :span], attn_mask=mask)
            torch.addmm(x, x, o)
            torch.mm(x, gate_up)
            torch.addmm(x, act, down)
        torch.mm(x, head)

    def med(span: int, n: int = 30) -> float:
        for _ in range(3):
            step(span)
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            step(span)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    return statistics.mean(med(prompt_len + 1 + (new_tokens - 1) * i // 4) for i in range(5))


# ---- 2. continuous vs static ---------------------------------------------------------------
def task_requests(n: int) -> list[Request]:
    """`n` built-in-task requests whose lengths are the task's correct completion lengths."""
    model, tok = init_builtin(seed=0)
    del model
    task = RunningSums(num_train=n, num_heldout=1)
    reqs = []
    for i, p in enumerate(task.train_prompts()[:n]):
        length = len(tok.encode(p.answer)) + 1  # the answer, then end-of-sequence
        reqs.append(Request(tok.encode(p.text), SamplingParams(1.0, max_new_tokens=length), seed=i))
    return reqs


def continuous_vs_static(args: argparse.Namespace) -> dict[str, float]:
    B = args.batch
    reqs = task_requests(args.task_requests)
    model, _ = init_builtin(seed=0)
    model = model.to(args.device)
    max_len = max(len(r.prompt_tokens) + r.params.max_new_tokens for r in reqs)
    lens = sorted(r.params.max_new_tokens for r in reqs)
    med, p99 = lens[len(lens) // 2], lens[int(0.99 * (len(lens) - 1))]
    total = sum(lens)
    graphs = graph_setting(args)
    engines = {
        name: Engine(model, NO_STOP, B, max_len, mixed_prefill=mixed, decode_graph=graphs)
        for name, mixed in (("static", True), ("mixed=True", True), ("mixed=False", False))
    }

    # one engine per contender, its counters reset for each run: on a GPU the warm-up run
    # captures the decode step's graphs, and the timed runs replay them
    def static() -> Engine:
        engine = engines["static"]
        engine.stats = EngineStats()
        for i in range(0, len(reqs), B):
            engine.generate(reqs[i : i + B])  # waits for the batch's longest request
        return engine

    def continuous(mixed: bool) -> Callable[[], Engine]:
        def run() -> Engine:
            engine = engines[f"mixed={mixed}"]
            engine.stats = EngineStats()
            for r in reqs:
                engine.add(r)
            while not engine.idle():
                engine.step()
            return engine

        return run

    t = side_by_side(
        {
            "static batches": static,
            "continuous": continuous(mixed=True),
            "  prefill apart": continuous(mixed=False),
        },
        args.repeats,
    )
    rows = []
    for name, tm in t.items():
        e = tm.result
        assert isinstance(e, Engine) and e.stats.tokens_generated == total
        s = e.stats
        live = s.active_slot_steps / s.decode_steps
        pre = s.prefill_s / (s.prefill_s + s.decode_s)
        rows.append((name, total / tm.wall_s, tm.wall_s, tm.cpu_s, s.decode_steps, live, pre))
    print(
        f"2. Built-in task, {len(reqs)} requests, {B} slots, built-in model shape "
        f"(hidden 128, 4 layers); completion tokens: median {med}, p99 {p99}, max {lens[-1]}"
    )
    print(
        f"   {'':18s}{'tokens/s':>10s}{'wall s':>8s}{'CPU s':>7s}{'decode steps':>14s}"
        f"{'live slots':>12s}{'prefill':>9s}"
    )
    for name, tps, w, c, steps, live, pre in rows:
        print(f"   {name:18s}{tps:10,.0f}{w:8.2f}{c:7.2f}{steps:14d}{live:12.1f}{pre:9.1%}")
    ratio = t["static batches"].wall_s / t["continuous"].wall_s
    ratio_cpu = t["static batches"].cpu_s / t["continuous"].cpu_s
    print(
        f"   {'ratio':18s}{ratio:9.2f}x  (continuous / static tokens/s; CPU time: {ratio_cpu:.2f}x)"
    )
    print("   'prefill apart': the same continuous run with prefill as its own forward between")
    print("   decode steps (exact prefill share; a mixed step's share is split by token count)")
    if engines["static"].decode_graph:
        print("   (decode steps are CUDA graphs here, so prefill always runs apart from them)")
    print()
    return {
        "continuous_vs_static_ratio": ratio,
        "continuous_vs_static_ratio_cpu_time": ratio_cpu,
        "continuous_tokens_per_s": total / t["continuous"].wall_s,
        "static_tokens_per_s": total / t["static batches"].wall_s,
        "continuous_prefill_apart_tokens_per_s": total / t["  prefill apart"].wall_s,
    }


# ---- 3. weight update pause ------------------------------------------------------------------
def weight_pause(args: argparse.Namespace, folder: Path) -> dict[str, float]:
    B = args.batch
    dtype = getattr(torch, args.dtype)
    ours = load_pretrained(folder, dtype=dtype, device=args.device)
    new = load_pretrained(folder, dtype=dtype, device=args.device)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.01)
    state = new.state_dict()
    out = {}
    print(
        f"3. In-flight weight update, {B} sequences in flight at position ~{PROMPT_LEN + 32} "
        f"({sum(p.numel() for p in ours.parameters()) / 1e6:.1f}M parameters)"
    )
    for mode in ("keep", "recompute"):
        graphs = graph_setting(args)
        engine = Engine(ours, NO_STOP, B, PROMPT_LEN + 64, kv_mode=mode, decode_graph=graphs)  # type: ignore[arg-type]
        params = SamplingParams(1.0, max_new_tokens=64)
        for i in range(B):
            engine.add(Request([2 + (i + j) % 500 for j in range(PROMPT_LEN)], params, seed=i))
        for _ in range(32):
            engine.step()
        pauses = []
        for v in range(1, 4):
            engine.load_weights(state, v)
            before = engine.stats.weight_update_s
            engine.step()
            pauses.append(engine.stats.weight_update_s - before)
        out[f"weight_pause_{mode}_ms"] = statistics.median(pauses) * 1e3
        step_ms = engine.stats.decode_s / engine.stats.decode_steps * 1e3
        print(
            f"   {mode:10s} pause {out[f'weight_pause_{mode}_ms']:8.2f} ms   (one decode step: {step_ms:.2f} ms)"
        )
    print()
    return out


# ---- 4. sampling at temperature ---------------------------------------------------------------
def sampling_cost(args: argparse.Namespace, folder: Path) -> dict[str, float]:
    """Generation at T = 0, 0.6 and 1.0 and the sampler's share of it (`Engine._sample`, eager or
    the sampling graph, timed in the same runs): `sampling_share_of_step` (T = 0.6) and `_t1`
    (T = 1.0) are sampling over generation time measured together (fair on a shared machine).
    Where the engine samples through the fused kernel (engine.fused: CUDA with Triton), an
    engine without it runs beside it, interleaved (`_unfused` keys)."""
    B, N = args.batch, args.max_new_tokens
    model = load_pretrained(folder, dtype=getattr(torch, args.dtype), device=args.device)
    V = model.config.vocab_size
    engines = {"": Engine(model, NO_STOP, B, PROMPT_LEN + N, decode_graph=graph_setting(args))}
    if engines[""].fused_sampling:
        engines["_unfused"] = Engine(
            model,
            NO_STOP,
            B,
            PROMPT_LEN + N,
            decode_graph=graph_setting(args),
            fused_sampling=False,
        )
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(2, min(V, 512), (B, PROMPT_LEN), generator=g).tolist()
    runs = [(x, mode) for mode in engines for x in (0.0, 0.6, 1.0)]
    spent = {f"{x:g}{m}": 0.0 for x, m in runs}
    plain = Engine._sample  # both ways a step samples: eagerly, or the sampling graph

    def run(temp: float, mode: str) -> Callable[[], float]:
        params = SamplingParams(temperature=temp, max_new_tokens=N)
        reqs = [Request(p, params, seed=i) for i, p in enumerate(prompts)]
        key = f"{temp:g}{mode}"

        def timed(
            self: Engine, logits: torch.Tensor, rows: slice | torch.Tensor, graph_step: bool
        ) -> Sampled:
            if logits.is_cuda:  # the step's forward is queued, not done: wait for it outside
                torch.cuda.synchronize(logits.device)
            t0 = time.perf_counter()
            out = plain(self, logits, rows, graph_step)
            out.tokens.tolist()  # waits for the device
            spent[key] += time.perf_counter() - t0
            return out

        def go() -> float:
            spent[key] = 0.0
            Engine._sample = timed  # type: ignore[method-assign]
            w0 = time.perf_counter()
            try:
                assert sum(len(c.tokens) for c in engines[mode].generate(reqs)) == B * N
            finally:
                Engine._sample = plain  # type: ignore[method-assign]
            return spent[key] / (time.perf_counter() - w0)

        return go

    t = side_by_side({f"{x:g}{m}": run(x, m) for x, m in runs}, args.repeats)
    print(
        f"4. Sampling cost, {B} slots, vocab {V:,}, {N} new tokens "
        f"({describe(args.model, V)}; median of {args.repeats}; fused kernel: "
        f"{'on, and off beside it' if len(engines) > 1 else 'off'})"
    )
    print(f"   {'temperature':22s}{'tokens/s':>10s}{'ms/step':>9s}{'sampling share':>16s}")
    res: dict[str, float] = {"vocab": V}
    for x, m in runs:
        k = f"{x:g}{m}"
        share, wall = median_result(t[k]), t[k].wall_s
        print(f"   {x:<5g}{m:17s}{B * N / wall:10,.0f}{wall / N * 1e3:9.1f}{share:16.1%}")
        res[f"sampled_tokens_per_s_t{k}"] = B * N / wall
        res[f"sampling_share_t{k}"] = share
    for m in engines:
        res[f"sampling_share_of_step{m}"] = res[f"sampling_share_t0.6{m}"]
        res[f"sampling_share_of_step_t1{m}"] = res[f"sampling_share_t1{m}"]
    print()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=64, help="sequences per batch / engine slots")
    ap.add_argument(
        "--max-new-tokens", type=int, default=128, help="new tokens per sequence (part 1)"
    )
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per measurement (median)")
    ap.add_argument(
        "--task-requests", type=int, default=1024, help="requests of the built-in task (part 2)"
    )
    ap.add_argument("--threads", type=int, default=1, help="torch threads for both sides")
    ap.add_argument(
        "--device", default="auto", help="where both sides run: cpu, cuda or auto (cuda if present)"
    )
    ap.add_argument(
        "--model",
        default="tiny",
        choices=sorted(MODELS),
        help="part 1's model shape (random weights)",
    )
    ap.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="parts 1 and 3: the model's dtype, both sides",
    )
    ap.add_argument(
        "--eager", action="store_true", help="no CUDA graphs for the engine's decode steps"
    )
    ap.add_argument(
        "--vocab", type=int, default=None, help="the model shape's vocabulary (e.g. 151936)"
    )
    ap.add_argument(
        "--part",
        default="all",
        choices=["all", "sampling"],
        help="`sampling`: part 4 only (sampling at temperature 0, 0.6 and 1.0)",
    )
    ap.add_argument("--quick", action="store_true", help="a fast smoke run: small sizes, 1 repeat")
    args = ap.parse_args()
    if args.quick:
        args.max_new_tokens, args.repeats, args.task_requests = 32, 1, 256
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        folder = hf_model_folder(Path(tmp) / "model", seed=0, name=args.model, vocab=args.vocab)
        res: dict[str, object] = {}
        if args.part == "all":
            res |= vs_transformers(args, folder)
            res |= continuous_vs_static(args)
            res |= weight_pause(args, folder)
        res |= sampling_cost(args, folder)
    res |= {"batch": args.batch, "max_new_tokens": args.max_new_tokens, "threads": args.threads}
    res["device"], res["model"], res["dtype"] = args.device, args.model, args.dtype
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in res.items()}))


if __name__ == "__main__":
    main()
