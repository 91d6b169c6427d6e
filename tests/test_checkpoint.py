"""Atomic checkpoints: a crash at any moment of a write leaves the previous checkpoint whole."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from slipstream.model.builtin import init_builtin
from slipstream.train import checkpoint as ck


def _save(run_dir: Path, step: int, model) -> Path:
    model_, tok = model
    return ck.save_checkpoint(
        run_dir, step, model_, tok, {"version": step, "t": torch.ones(3) * step}, {"version": step}
    )


@pytest.fixture(scope="module")
def model():
    return init_builtin(seed=1)


def _assert_loadable(ckpt: Path, step: int, model) -> None:
    m, _ = model
    fresh, _ = init_builtin(seed=2)
    ck.load_weights(fresh, ckpt / "model")
    assert all(
        torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), m.state_dict().values())
    )
    state = ck.load_trainer_state(ckpt)  # weights_only=True
    assert state["version"] == step and torch.equal(state["t"], torch.ones(3) * step)


@pytest.mark.parametrize("fail_in", ["save_pretrained", "torch.save", "_fsync_tree", "os.replace"])
def test_an_exception_during_a_write_leaves_the_previous_checkpoint(
    tmp_path, model, monkeypatch, fail_in
):
    first = _save(tmp_path, 1, model)

    def boom(*a, **k):
        raise OSError(f"injected failure in {fail_in}")

    target = {
        "save_pretrained": (ck, "save_pretrained"),
        "torch.save": (ck.torch, "save"),
        "_fsync_tree": (ck, "_fsync_tree"),
        "os.replace": (ck.os, "replace"),
    }[fail_in]
    monkeypatch.setattr(*target, boom)
    with pytest.raises(OSError, match="injected"):
        _save(tmp_path, 2, model)
    monkeypatch.undo()
    assert ck.list_checkpoints(tmp_path) == [first]
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))  # cleaned up
    _assert_loadable(first, 1, model)


@pytest.mark.slow
def test_a_process_killed_during_a_write_leaves_the_previous_checkpoint(tmp_path, model):
    """SIGKILL in the middle of the second write (after the model, before the rename): the
    torn temporary folder is ignored by readers and removed by the next write."""
    first = _save(tmp_path, 1, model)
    script = textwrap.dedent(f"""
        import os, signal
        import torch
        from slipstream.model.builtin import init_builtin
        from slipstream.train import checkpoint as ck

        def die(path):
            os.kill(os.getpid(), signal.SIGKILL)

        ck._fsync_tree = die  # everything is written, nothing renamed yet
        m, tok = init_builtin(seed=1)
        ck.save_checkpoint({str(tmp_path)!r}, 2, m, tok, {{"version": 2}}, {{"version": 2}})
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    assert list((tmp_path / "checkpoints").glob(".tmp-*"))  # the torn write is there...
    assert ck.list_checkpoints(tmp_path) == [first]  # ...and not taken for a checkpoint
    _assert_loadable(first, 1, model)
    third = _save(tmp_path, 3, model)
    assert ck.list_checkpoints(tmp_path) == [first, third]
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))
    assert os.path.isdir(third / "model")


def test_trainer_state_written_on_a_gpu_loads_onto_the_cpu(tmp_path, monkeypatch):
    """A trainer.pt whose optimizer lived on cuda:1 (a run resumed on another machine, or
    under another GPU placement) loads with its tensors on the CPU, and into an optimizer."""
    (tmp_path / "ckpt").mkdir()
    param = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.AdamW([param])
    param.grad = torch.ones(2)
    opt.step()
    state = {"optimizer": opt.state_dict(), "version": 1}
    monkeypatch.setattr(torch.serialization, "location_tag", lambda storage: "cuda:1")
    torch.save(state, tmp_path / "ckpt" / "trainer.pt")  # as a trainer on cuda:1 writes it
    monkeypatch.undo()
    loaded = ck.load_trainer_state(tmp_path / "ckpt")
    assert loaded["optimizer"]["state"][0]["exp_avg"].device == torch.device("cpu")
    torch.optim.AdamW([param]).load_state_dict(loaded["optimizer"])


@pytest.mark.parametrize("deleting", ["pruned", "overwritten"])
def test_a_process_stopped_while_deleting_a_checkpoint_leaves_none_partial(
    tmp_path, model, monkeypatch, deleting
):
    """SIGTERM (KeyboardInterrupt) in the middle of deleting a checkpoint folder, after its
    weights are gone: no folder without weights is listed as a checkpoint."""
    for step in (1, 2):
        _save(tmp_path, step, model)

    def stopped(path, *args, **kwargs):
        for f in Path(path).rglob("*.safetensors"):
            f.unlink()
        raise KeyboardInterrupt

    monkeypatch.setattr(ck.shutil, "rmtree", stopped)
    with pytest.raises(KeyboardInterrupt):  # keep = 2: step 1 is pruned, or step 2 rewritten
        _save(tmp_path, 3 if deleting == "pruned" else 2, model)
    monkeypatch.undo()
    listed = ck.list_checkpoints(tmp_path)
    assert listed
    for ckpt in listed:
        _assert_loadable(ckpt, ck.checkpoint_step(ckpt), model)
    _save(tmp_path, 4, model)  # the next write removes what was left
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="reads /proc/self/fd")
def test_a_checkpoint_makes_its_folders_and_its_rename_durable(tmp_path, model, monkeypatch):
    """fsync reaches the `model/` folder's entries and, after the rename, the checkpoints
    folder's, so that a power loss leaves neither an empty model folder nor a lost rename."""
    synced: list[Path] = []
    fsync = os.fsync

    def record(fd: int) -> None:
        synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    monkeypatch.setattr(ck.os, "fsync", record)
    _save(tmp_path, 1, model)
    monkeypatch.undo()
    assert any(p.name == "model" and p.parent.name.startswith(".tmp-") for p in synced)
    assert synced[-1] == (tmp_path / "checkpoints").resolve()


def test_checkpoints_are_listed_by_step_past_a_million(tmp_path):
    """`step_1000000` is newer than `step_999999` though its name sorts first: resume takes
    the newest by step, and pruning deletes the oldest by step. Folders are made by hand (a
    `state.json` is what makes one complete)."""
    root = tmp_path / "checkpoints"
    for step in (999_998, 999_999, 1_000_000, 1_000_001):
        (root / f"{ck.PREFIX}{step:06d}").mkdir(parents=True)
        (root / f"{ck.PREFIX}{step:06d}" / "state.json").write_text("{}")
    (root / f"{ck.PREFIX}notes").mkdir()  # not a step: never listed
    (root / f"{ck.PREFIX}notes" / "state.json").write_text("{}")
    steps = [ck.checkpoint_step(p) for p in ck.list_checkpoints(tmp_path)]
    assert steps == [999_998, 999_999, 1_000_000, 1_000_001]
