"""slipstream on one GPU node: trainer MFU, sampler roofline share, weight publish and pause,
and sync against pipeline end to end, for Qwen2.5-0.5B and 1.5B shapes in bfloat16.

Run (on a GPU machine): python bench/gpu.py [--shapes qwen2.5-0.5b,qwen2.5-1.5b]
[--peak-tflops 989] [--bandwidth-gbs 4800] [--steps 5] [--parts trainer,sampler,weights,e2e]
[--parts profile]. Smoke run on a CPU:
python bench/gpu.py --device cpu --tiny. Prints a table per part, then one JSON line with
`trainer_mfu`, `sampler_roofline_share`, `publish_s`, `pause_s`, `pipeline_over_sync` (the
headline figures at the largest shape measured; every figure per shape is in the line too).

Random weights of the real shapes (normal(0, 0.02), made on the device: nothing is loaded).

1. Trainer: `Trainer.step` on synthetic groups (B prompts x G samples, prompt `--prompt-len`,
   completion `--completion-len` tokens), `model.dtype = bfloat16` (float32 master weights,
   fused AdamW), chunked log-probs, `--micro-batch-tokens` per micro-batch. Tokens/s counts
   prompt + completion tokens through the model. MFU = model FLOPs / (time x peak), model
   FLOPs per token = 6 N (N: parameters in products, i.e. all but the input embedding) +
   6 L d T_mean for causal attention (forward 2, backward 4; T_mean = half the sequence);
   recompute of activation checkpointing is not counted (it is overhead, not model work).
   Target on an H200: 0.30 at the 1.5B shape.
2. Sampler: the engine in bfloat16 with CUDA graphs, temperature 0.6, `--slots` sequences
   (64 and 256) decoding `--sampler-new` tokens each from 64-token prompts, no stop token.
   Roofline share = (bytes a decode step must read / bandwidth) / measured decode step time,
   bytes = the weights in products + the KV cache of every live sequence at its mean length.
   Target: 0.25 at 256 slots.
3. Weights: one publish of the bfloat16 weights into the channel a sampler on this GPU uses
   (CUDA IPC buffers; shared memory on the CPU) and the engine's pause to take them in with
   its pool full (`Engine.load_weights` then one step). Target: pause <= 1 % of a sampler's
   time between publishes.
4. End to end: `slipstream train` on the built-in task (rewards near 0 for a random model, so
   zero-variance filtering is off and every group trains), `sync` in one process against
   `pipeline` with one sampler process on the same GPU (colocated; on a second GPU where there
   is one), `--steps` steps each (at least 2); steps/s between the first and last step records.
5. Profile (`--parts profile`, not in the default set): parts 1 and 2 (at the largest slot
   count) under torch.profiler, the `--profile-top` operators by self device time each, as a
   table and in the JSON line: where a trainer step's and a decode run's time goes.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch.autograd.profiler_util import FunctionEventAvg

from slipstream.config import TrainerConfig, load_config
from slipstream.engine import Engine, Request, SamplingParams
from slipstream.files import read_jsonl
from slipstream.model.builtin import builtin_tokenizer
from slipstream.model.hf import save_pretrained
from slipstream.model.llama import CausalLM, ModelConfig
from slipstream.model.meta import empty_model
from slipstream.train.trainer import Trainer
from slipstream.types import FinishReason, Group, Prompt, Sample

SHAPES = {
    "tiny": dict(
        model_type="qwen2", vocab_size=512, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
    ),
    "qwen2.5-0.5b": dict(
        model_type="qwen2", vocab_size=151936, hidden_size=896, intermediate_size=4864,
        num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True,
    ),
    "qwen2.5-1.5b": dict(
        model_type="qwen2", vocab_size=151936, hidden_size=1536, intermediate_size=8960,
        num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2, tie_word_embeddings=True,
    ),
}  # fmt: skip


PARTS = ("trainer", "sampler", "weights", "e2e", "profile")
DEFAULT_PARTS = PARTS[:4]  # `profile` on request: its tracing slows the parts it watches


def random_model(name: str, device: torch.device, dtype: torch.dtype) -> CausalLM:
    """A model of shape `name` with normal(0, 0.02) weights made on `device` (norms at 1)."""
    cfg = ModelConfig(**SHAPES[name], max_position_embeddings=4096)  # type: ignore[arg-type]
    model = empty_model(cfg, device, dtype)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.02, generator=gen)
            else:
                p.fill_(1.0 if "norm" in n else 0.0)
    return model


def product_params(cfg: ModelConfig) -> int:
    """Parameters that take part in matrix products: all but the input embedding (a lookup);
    a tied LM head counts once, as the product it is."""
    return cfg.num_params() - (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size)


def train_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """6 N + 12 L d T_mean with T_mean = seq_len / 2: weights (forward 2, backward 4 FLOPs per
    parameter) and causal attention (scores and values: 4 L d T_ctx forward, x 3 with the
    backward), = 6 N + 6 L d seq_len."""
    assert cfg.head_dim is not None
    d_attn = cfg.num_attention_heads * cfg.head_dim
    return 6 * product_params(cfg) + 6 * cfg.num_hidden_layers * d_attn * seq_len


def _groups(args: argparse.Namespace, vocab: int) -> list[Group]:
    g = torch.Generator().manual_seed(0)
    out = []
    for b in range(args.prompts):
        prompt = Prompt(f"p{b}", "", "")
        ids = torch.randint(2, vocab, (args.prompt_len,), generator=g).tolist()
        samples = []
        for _ in range(args.group):
            c = args.completion_len
            toks = torch.randint(2, vocab, (c,), generator=g).tolist()
            samples.append(Sample(prompt.id, ids, toks, [-5.0] * c, [0] * c, FinishReason.LENGTH))
        adv = [float(i % 2) * 2 - 1 for i in range(args.group)]
        out.append(Group(prompt, samples, advantages_G=adv))
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def trainer_part(args: argparse.Namespace, name: str, device: torch.device) -> dict[str, float]:
    """Median step time of `Trainer.step` (after one warm-up), tokens/s and MFU."""
    model = random_model(name, device, torch.float32)
    cfg = TrainerConfig(
        micro_batch_size=10**6,
        micro_batch_tokens=args.micro_batch_tokens,
        activation_checkpointing=args.checkpointing,
        lr=1e-5,
        warmup_steps=0,
    )
    trainer = Trainer(model, cfg, 0.6, pad_id=0, compute_dtype=torch.bfloat16)
    groups = _groups(args, model.config.vocab_size)
    tokens = args.prompts * args.group * (args.prompt_len + args.completion_len)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for i in range(args.repeats + 1):
        _sync(device)
        t0 = time.perf_counter()
        trainer.step(groups)
        _sync(device)
        if i:
            times.append(time.perf_counter() - t0)
    step_s = statistics.median(times)
    flops = train_flops_per_token(model.config, args.prompt_len + args.completion_len) * tokens
    out = {
        "tokens_per_s": tokens / step_s,
        "step_s": step_s,
        "mfu": flops / step_s / (args.peak_tflops * 1e12),
    }
    if device.type == "cuda":
        out["peak_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    print(
        f"  trainer  {name:14s} {tokens:8d} tok/step  {out['tokens_per_s']:12,.0f} tok/s  MFU {out['mfu']:.3f}"
    )
    return out


def _fill(engine: Engine, slots: int, new: int, vocab: int) -> None:
    for i in range(slots):
        ids = [2 + (i * 7 + j) % (vocab - 2) for j in range(64)]
        engine.add(Request(ids, SamplingParams(0.6, max_new_tokens=new), seed=i))


def sampler_part(
    args: argparse.Namespace, name: str, device: torch.device, slots: int
) -> dict[str, float]:
    """Decode tokens/s with `slots` sequences and the share of the bandwidth roofline."""
    from slipstream.engine.capacity import kv_bytes_per_token

    model = random_model(name, device, torch.bfloat16)
    cfg = model.config
    new = args.sampler_new
    stop = cfg.vocab_size  # never sampled: every sequence runs to max_new_tokens
    engine = Engine(model, stop, slots, 64 + new)
    # warm-up to the full length: every bucket's graphs captured, kernels loaded
    _fill(engine, min(slots, 8), new, cfg.vocab_size)
    while not engine.idle():
        engine.step()
    engine.stats = type(engine.stats)()
    _fill(engine, slots, new, cfg.vocab_size)
    _sync(device)
    t0 = time.perf_counter()
    while not engine.idle():
        engine.step()
    _sync(device)
    wall = time.perf_counter() - t0
    st = engine.stats
    assert st.tokens_generated == slots * new, (st.tokens_generated, slots * new)
    step_s = st.decode_s / max(st.decode_steps, 1)
    weights = product_params(cfg) * 2  # bf16 bytes of every matrix a step multiplies with
    kv = slots * (64 + new / 2) * kv_bytes_per_token(cfg, torch.bfloat16)
    floor_s = (weights + kv) / (args.bandwidth_gbs * 1e9)
    out = {
        "tokens_per_s": st.tokens_generated / wall,
        "decode_step_s": step_s,
        "roofline_share": floor_s / step_s if step_s > 0 else 0.0,
    }
    print(
        f"  sampler  {name:14s} {slots:4d} slots  {out['tokens_per_s']:12,.0f} tok/s  "
        f"step {step_s * 1e3:7.2f} ms  roofline share {out['roofline_share']:.3f}"
    )
    return out


def top_ops(events: list[FunctionEventAvg], device: torch.device, n: int) -> list[dict[str, Any]]:
    """The `n` operators with the most self time on `device` (CPU time on a CPU) from a
    profiler's `key_averages()`: name, calls, milliseconds, share of all operators' time."""

    def own(e: FunctionEventAvg) -> float:
        if device.type != "cuda":
            return float(e.self_cpu_time_total)
        return float(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)))

    total = sum(own(e) for e in events) or 1.0
    ranked = sorted(events, key=own, reverse=True)[:n]
    return [
        {"op": e.key, "calls": int(e.count), "ms": own(e) / 1e3, "share": own(e) / total}
        for e in ranked
    ]


def profile_part(args: argparse.Namespace, name: str, device: torch.device) -> dict[str, Any]:
    """The trainer part and the sampler part (at the largest slot count) under torch.profiler:
    where their device time goes (`--profile-top` operators each), to find what holds MFU and
    the roofline share down. Their figures under the profiler are not the parts' figures."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    runs = {
        "trainer": lambda: trainer_part(args, name, device),
        "sampler": lambda: sampler_part(args, name, device, args.slots_list[-1]),
    }
    out: dict[str, Any] = {}
    for what, fn in runs.items():
        with profile(activities=acts) as prof:
            fn()
        out[what] = top_ops(prof.key_averages(), device, args.profile_top)
        print(f"  profile  {name:14s} {what}: top {args.profile_top} operators by self time")
        for row in out[what]:
            print(
                f"    {row['share']:6.1%} {row['ms']:10.1f} ms {row['calls']:7d}x  {row['op'][:70]}"
            )
    return out


def weights_part(args: argparse.Namespace, name: str, device: torch.device) -> dict[str, float]:
    """Median publish time into the channel and the engine's pause to take the weights in."""
    import torch.multiprocessing as mp

    from slipstream.runtime.cuda_weights import CudaIpcWeights
    from slipstream.runtime.weights import SharedWeights
    from slipstream.train.precision import channel_layout

    master = random_model(name, device, torch.float32)
    layout = channel_layout(master, torch.bfloat16)
    ctx = mp.get_context("spawn")
    ch: Any = (
        CudaIpcWeights(layout, ctx, [str(device)])
        if device.type == "cuda"
        else SharedWeights(layout, ctx)
    )
    params = dict(master.named_parameters())
    sampler = random_model(name, device, torch.bfloat16)
    engine = Engine(sampler, sampler.config.vocab_size, args.slots_list[-1], 64 + 64)
    _fill(engine, args.slots_list[-1], 64, sampler.config.vocab_size)
    for _ in range(8):
        engine.step()
    publish, pause = [], []
    for v in range(1, args.repeats + 2):
        publish.append(ch.publish(params, v))
        state, version = ch.read(v - 1, timeout=60.0)
        before = engine.stats.weight_update_s
        engine.load_weights(state, version)
        engine.step()
        _sync(device)
        pause.append(engine.stats.weight_update_s - before)
    out = {"publish_s": statistics.median(publish[1:]), "pause_s": statistics.median(pause[1:])}
    print(
        f"  weights  {name:14s} publish {out['publish_s'] * 1e3:8.2f} ms  pause {out['pause_s'] * 1e3:8.2f} ms"
    )
    return out


def steady_steps_per_s(metrics: Path) -> float:
    """Steps per second between the first and the last step record (start-up, warm start and
    sampler spawn excluded: they are paid once per run)."""
    walls = [r["wall_s"] for r in read_jsonl(metrics) if "wall_s" in r]
    if len(walls) < 2 or walls[-1] <= walls[0]:
        return math.nan
    return (len(walls) - 1) / (walls[-1] - walls[0])


def e2e_part(args: argparse.Namespace, name: str, device: torch.device) -> dict[str, float]:
    """Steps per second of `sync` and `pipeline` on the same model folder."""
    from slipstream.run.launch import train_async
    from slipstream.run.sync import train_sync

    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        model = random_model(name, device, torch.float32)
        model.config.eos_token_id, model.config.pad_token_id = 1, 0
        save_pretrained(model, folder)
        builtin_tokenizer().save(folder)
        del model
        n_gpu = torch.cuda.device_count() if device.type == "cuda" else 0
        common = [
            f'model.path="{folder}"', "model.dtype=bfloat16", f'trainer.device="{device}"',
            f"run.steps={args.steps}", "run.quiet=true", "filters.zero_variance=false",
            f"trainer.batch_prompts={args.prompts}", f"sampling.group_size={args.group}",
            f"sampling.max_new_tokens={args.completion_len}", f"eval.every={10**6}",
            "eval.num_prompts=1", f"checkpoint.every={10**6}", "trainer.warmup_steps=0",
        ]  # fmt: skip
        for sched in ("sync", "pipeline"):
            extra = [f'schedule.name="{sched}"', f'run.dir="{Path(tmp) / sched}"']
            if sched == "pipeline":
                devs = '["cuda:1"]' if n_gpu > 1 else f'["{device}"]'
                extra += ['runtime.kind="local"', f"runtime.sampler_devices={devs}"]
            cfg = load_config(None, [*common, *extra])
            (train_sync if sched == "sync" else train_async)(cfg)
            out[f"{sched}_steps_per_s"] = steady_steps_per_s(Path(tmp) / sched / "metrics.jsonl")
            print(f"  e2e      {name:14s} {sched:9s} {out[f'{sched}_steps_per_s']:8.3f} steps/s")
    out["pipeline_over_sync"] = out["pipeline_steps_per_s"] / out["sync_steps_per_s"]
    return out


# Datasheet figures, dense bfloat16 TFLOP/s and HBM GB/s, by a part of the device's name as
# torch reports it (first match: the PCIe and NVL H100s before the SXM one, "H100 80GB HBM3")
DATASHEETS = (
    ("H200", 989.0, 4800.0),
    ("H100 PCIe", 756.0, 2000.0),
    ("H100 NVL", 835.0, 3900.0),
    ("H100", 989.0, 3350.0),
)


def datasheet(device_name: str) -> tuple[float, float] | None:
    """(peak dense bf16 TFLOP/s, HBM GB/s) of the GPU named `device_name`; None if unknown."""
    return next(((t, b) for part, t, b in DATASHEETS if part in device_name), None)


def peaks(args: argparse.Namespace, device_name: str) -> tuple[float, float]:
    """The peak and bandwidth the MFU and roofline shares divide by: the flags where given,
    else the device's datasheet figures (an unknown device needs both flags)."""
    sheet = datasheet(device_name)
    if sheet is None and (args.peak_tflops is None or args.bandwidth_gbs is None):
        raise SystemExit(
            f"{device_name}: no datasheet figures; pass --peak-tflops and --bandwidth-gbs"
        )
    t, b = sheet or (0.0, 0.0)
    return args.peak_tflops or t, args.bandwidth_gbs or b


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every part for every shape; the headline keys from the last (largest) shape."""
    device = torch.device(args.device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    args.peak_tflops, args.bandwidth_gbs = peaks(args, gpu)
    result: dict[str, Any] = {
        "device": gpu,
        "peak_tflops": args.peak_tflops,
        "bandwidth_gbs": args.bandwidth_gbs,
        "checkpointing": args.checkpointing,
    }
    for name in args.shapes:
        print(f"{name} ({ModelConfig(**SHAPES[name]).num_params() / 1e6:.0f}M parameters)")  # type: ignore[arg-type]
        r: dict[str, Any] = {}
        if "trainer" in args.parts:
            r["trainer"] = trainer_part(args, name, device)
        if "sampler" in args.parts:
            r["sampler"] = {s: sampler_part(args, name, device, s) for s in args.slots_list}
        if "weights" in args.parts:
            r["weights"] = weights_part(args, name, device)
        if "e2e" in args.parts:
            r["e2e"] = e2e_part(args, name, device)
        if "profile" in args.parts:
            r["profile"] = profile_part(args, name, device)
        result[name] = r
    last = result[args.shapes[-1]]
    nan = math.nan
    result.update(
        trainer_mfu=last.get("trainer", {}).get("mfu", nan),
        sampler_roofline_share=last.get("sampler", {})
        .get(args.slots_list[-1], {})
        .get("roofline_share", nan),
        publish_s=last.get("weights", {}).get("publish_s", nan),
        pause_s=last.get("weights", {}).get("pause_s", nan),
        pipeline_over_sync=last.get("e2e", {}).get("pipeline_over_sync", nan),
    )
    return result


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tiny", action="store_true", help="smoke run: tiny shape, small sizes")
    ap.add_argument("--shapes", default="qwen2.5-0.5b,qwen2.5-1.5b")
    ap.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help="dense bf16 peak (default: the device's datasheet figure, DATASHEETS)",
    )
    ap.add_argument(
        "--bandwidth-gbs",
        type=float,
        default=None,
        help="HBM bandwidth in GB/s (default: the device's datasheet figure, DATASHEETS)",
    )
    ap.add_argument("--prompts", type=int, default=32, help="B of the trainer step")
    ap.add_argument("--group", type=int, default=8, help="G of the trainer step")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--completion-len", type=int, default=768)
    ap.add_argument("--micro-batch-tokens", type=int, default=16384)
    ap.add_argument("--checkpointing", action="store_true", help="activation checkpointing")
    ap.add_argument("--slots", default="64,256", help="sampler slot counts")
    ap.add_argument("--sampler-new", type=int, default=256, help="tokens each sequence decodes")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5, help="end-to-end steps per schedule")
    ap.add_argument(
        "--parts",
        default=",".join(DEFAULT_PARTS),
        help=f"which parts, comma-separated ({','.join(PARTS)}; default: all but profile)",
    )
    ap.add_argument("--profile-top", type=int, default=15, help="operators the profile lists")
    args = ap.parse_args(argv)
    if args.tiny:
        args.shapes, args.prompts, args.group, args.prompt_len = "tiny", 2, 2, 8
        args.completion_len, args.micro_batch_tokens, args.slots = 8, 32, "4,8"
        args.sampler_new, args.repeats, args.steps, args.peak_tflops = 8, 1, 2, 1.0
        args.bandwidth_gbs = 20.0
    args.shapes = args.shapes.split(",")
    args.parts = [p for p in args.parts.split(",") if p]
    if unknown := set(args.parts) - set(PARTS):
        ap.error(f"--parts: unknown {sorted(unknown)}; choose from {','.join(PARTS)}")
    args.slots_list = [int(s) for s in args.slots.split(",")]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    result = run(args)
    print(json.dumps(result, default=float))


if __name__ == "__main__":
    main()
