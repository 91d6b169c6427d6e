"""Continue a cached warm start of the built-in agentic task (`task.kind=builtin_tools`) on its
scripted tool-using traces, measuring held-out accuracy of greedy episodes (no tool latency).

Run: python bench/agentic_warmstart.py SRC_FOLDER OUT_FOLDER LR STEPS [BATCH] [HELDOUT]
     (SRC_FOLDER: a warm-started model folder, e.g. ~/.cache/slipstream/builtin-tools2-...)

Prints one line per 50 steps and ends with one JSON line: `acc_by_step` ({step: accuracy}),
`heldout`, `lr`, `batch`. OUT_FOLDER is a model folder for `model.path=`.
"""

from __future__ import annotations

import json
import random
import sys
import time

import torch

from slipstream.config.load import load_config
from slipstream.engine import Engine
from slipstream.envs.builtin import Latency, scripted_trace, tool_sums_task
from slipstream.envs.workers import ThreadWorkers
from slipstream.model import CausalLM, Tokenizer, load_pretrained, load_tokenizer, save_pretrained
from slipstream.run.agentic import calculator_factory, env_max_len, episode_accuracy
from slipstream.train.warmstart import supervised_step


def heldout_acc(model: CausalLM, tok: Tokenizer, n: int) -> float:
    cfg = load_config(None, ["task.kind=builtin_tools"])
    held = tool_sums_task().heldout_prompts()[:n]
    factory = calculator_factory(cfg, tok, Latency(0.0, 0.0))
    max_len = min(env_max_len(cfg, factory, held, tok), model.config.max_position_embeddings)
    engine = Engine(model.eval(), tok.eos_id, num_slots=len(held), max_len=max_len)
    workers = ThreadWorkers(factory, cfg.env.workers)
    try:
        return episode_accuracy(cfg, factory, engine, held, workers)
    finally:
        workers.close()


def main(argv: list[str]) -> None:
    src, out, lr, steps = argv[0], argv[1], float(argv[2]), int(argv[3])
    batch = int(argv[4]) if len(argv) > 4 else 64
    n = int(argv[5]) if len(argv) > 5 else 128
    model, tok = load_pretrained(src), load_tokenizer(src)
    train = tool_sums_task().train_prompts()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99))
    rng, t0 = random.Random(7), time.perf_counter()
    accs = {0: heldout_acc(model, tok, n)}
    print(f"step 0 acc {accs[0]:.3f}", flush=True)
    for step in range(1, steps + 1):
        samples = [scripted_trace(rng.choice(train), tok, tok.eos_id) for _ in range(batch)]
        loss = supervised_step(model, opt, samples, tok.pad_id)
        if step % 50 == 0:
            accs[step] = heldout_acc(model, tok, n)
            print(f"step {step} loss {loss:.3f} acc {accs[step]:.3f} "
                  f"t {time.perf_counter() - t0:.0f}s", flush=True)  # fmt: skip
    save_pretrained(model, out)
    tok.save(out)
    print(json.dumps({"acc_by_step": accs, "heldout": n, "lr": lr, "batch": batch}))


if __name__ == "__main__":
    asked = {"-h", "--help"} & set(sys.argv[1:])
    if asked or len(sys.argv) < 5:  # the usage above; exit 2 when arguments are missing
        sys.exit(print(__doc__) or (0 if asked else 2))
    main(sys.argv[1:])
