"""Checkpoints: an HF-format model folder plus optimizer and run state, written atomically.

Written to a temporary folder, fsynced, then renamed into place, so a crash at any moment leaves
the previous checkpoint readable. Optimizer state loads with `torch.load(weights_only=True)`;
weights only through safetensors.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Collection
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from slipstream.model import CausalLM, Tokenizer, load_pretrained, save_pretrained

PREFIX = "step_"
MASTER = "master.safetensors"  # float32 master weights, when the model folder is narrower


def _fsync_dir(path: Path) -> None:
    """Make the entries of the folder `path` (files created or renamed in it) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    """Make every file under `path` and every folder's entries (`model/` too) durable."""
    for p in sorted(path.rglob("*")):
        if p.is_file():
            with p.open("rb") as f:
                os.fsync(f.fileno())
        elif p.is_dir():
            _fsync_dir(p)
    _fsync_dir(path)


def _delete(ckpt: Path) -> None:
    """Delete a checkpoint folder, first renamed (atomically) into a temporary folder, so that
    a process stopped in the middle of the deletion (SIGTERM, Ctrl-C) leaves no folder that
    `list_checkpoints` takes for a complete checkpoint; the next write removes the rest."""
    aside = Path(tempfile.mkdtemp(dir=ckpt.parent, prefix=".tmp-"))
    os.replace(ckpt, aside / ckpt.name)
    shutil.rmtree(aside, ignore_errors=True)


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    model: CausalLM,
    tokenizer: Tokenizer,
    trainer_state: dict[str, Any],
    state: dict[str, Any],
    keep: int = 2,
    dtype: torch.dtype | None = None,
    protect: Collection[int] = (),
) -> Path:
    """Write `checkpoints/step_NNNNNN` atomically and delete all but the newest `keep`.

    The model folder holds the weights in `dtype` (the dtype trained; None: the model's own),
    loadable in `transformers` as it is. When that is narrower than the model's float32
    master weights, these go beside it (`master.safetensors`), so a resumed run continues
    from exactly the weights it stopped at, not from their bfloat16 rounding. Steps in
    `protect` are never deleted (the watchdog's rollback target)."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):  # a write that a crash interrupted (one writer per run)
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"{PREFIX}{step:06d}"
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=".tmp-"))
    try:
        save_pretrained(model, tmp / "model", dtype=dtype)
        if dtype is not None and dtype != model.lm_head.weight.dtype:
            master = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
            if model.config.tie_word_embeddings:
                master.pop("lm_head.weight", None)
            save_file(master, str(tmp / MASTER), metadata={"format": "pt"})
        tokenizer.save(tmp / "model")
        torch.save(trainer_state, tmp / "trainer.pt")
        (tmp / "state.json").write_text(json.dumps(state, indent=1))
        _fsync_tree(tmp)
        if final.exists():
            _delete(final)
        os.replace(tmp, final)
        _fsync_dir(root)  # the rename itself, before any older checkpoint is deleted
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(run_dir)[:-keep]:
        if checkpoint_step(old) not in protect:
            with contextlib.suppress(OSError):  # as before: a folder left is pruned next time
                _delete(old)
    return final


def checkpoint_step(ckpt: str | Path) -> int:
    """The step of a checkpoint folder (`step_NNNNNN`): the trainer's version it holds."""
    return int(Path(ckpt).name.removeprefix(PREFIX))


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first by step (temporary folders of interrupted writes
    excluded; `step_1000000` after `step_999999`, which their names sort before)."""
    root = Path(run_dir) / "checkpoints"
    if not root.exists():
        return []
    found = [
        p
        for p in root.iterdir()
        if p.name.removeprefix(PREFIX).isdigit() and p.name.startswith(PREFIX)
        and (p / "state.json").exists()
    ]  # fmt: skip
    return sorted(found, key=checkpoint_step)


def load_trainer_state(ckpt: str | Path) -> dict[str, Any]:
    """trainer.pt of a checkpoint, its tensors on the CPU whatever device wrote them (a
    resume on another machine or GPU placement); `Optimizer.load_state_dict` moves the
    optimizer's state to its parameters' device."""
    return torch.load(Path(ckpt) / "trainer.pt", weights_only=True, map_location="cpu")


def load_weights(model: CausalLM, folder: str | Path) -> None:
    """Copy a checkpoint's safetensors weights into `model` in place, so that everything that
    holds its parameters (the optimizer, the engines) sees them: the float32 master weights
    when the checkpoint has them (`master.safetensors` beside the model folder)."""
    master = Path(folder).parent / MASTER
    dev = model.lm_head.weight.device
    with torch.no_grad():
        if master.exists():
            model.load_state_dict(load_file(str(master), device=str(dev)), strict=False)
        else:
            model.load_state_dict(load_pretrained(folder, device=dev).state_dict())
