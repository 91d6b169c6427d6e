"""Hostile rewards: one that raises, returns a non-number, hangs, spins or segfaults is scored
0 and counted (or fails the run, by setting); the samples around it score normally."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from slipstream.config import load_config
from slipstream.run.setup import build_task
from slipstream.tasks import RewardError, RewardGuard, TaskError, Verdict
from slipstream.tasks.guard import score_completions
from slipstream.types import Prompt

HOSTILE = """
import ctypes, math, time

def hostile(prompt, completion):
    c = completion.strip()
    if c == "raise":
        raise ValueError("bad input\\nmore detail")
    if c == "nan":
        return math.nan
    if c == "inf":
        return -math.inf
    if c == "str":
        return "1.0"
    if c == "none":
        return None
    if c == "sleep":
        time.sleep(1000)
    if c == "spin":
        while True:
            pass
    if c == "segv":
        ctypes.string_at(0)
    if c == "exit":
        raise SystemExit(3)
    return float(c == prompt.answer)

def pid(prompt, completion):
    import os
    return float(os.getpid())
"""

P = Prompt("p7", "2+2=", "4")
TIMEOUT_S = 0.3


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> Path:
    f = tmp_path_factory.mktemp("plugin") / "hostile.py"
    f.write_text(HOSTILE)
    return f


@pytest.fixture
def guard(plugin):
    g = RewardGuard(f"{plugin}:hostile", "process", timeout_s=TIMEOUT_S)
    yield g
    g.close()


def _hostile_inline(prompt: Prompt, completion: str) -> object:
    c = completion.strip()
    if c == "raise":
        raise ValueError("bad input")
    if c == "exit":
        sys.exit()
    return {"nan": math.nan, "inf": math.inf, "str": "1.0", "none": None}.get(
        c, float(c == prompt.answer)
    )


def test_inline_guard_scores_failures_zero_and_counts_them():
    g = RewardGuard(_hostile_inline)
    with pytest.warns(RuntimeWarning, match="reward '_hostile_inline' on prompt 'p7'"):
        out = g.score(P, ["4", "raise", "nan", "inf", "str", "none", "5", "exit", "4"])
    assert [v.reward for v in out] == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    assert [v.error for v in out] == [
        "",
        "raised",
        "invalid",
        "invalid",
        "invalid",
        "invalid",
        "",
        "raised",  # sys.exit() in the reward, which ended the run (status 0) before
        "",
    ]
    assert out[1].detail == "raised ValueError: bad input"
    assert out[7].detail == "raised SystemExit"
    assert g.errors == {"raised": 2, "invalid": 4}
    assert g(P, "4") == 1.0  # callable like the reward itself


def test_inline_fail_mode_raises_naming_reward_prompt_and_cause():
    g = RewardGuard(_hostile_inline, on_error="fail")
    assert g(P, "4") == 1.0
    with pytest.raises(RewardError) as e:
        g(P, "nan")
    assert str(e.value) == (
        "reward '_hostile_inline' on prompt 'p7': returned nan (float), not a finite number "
        "(task.reward_errors = 'fail')"
    )


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_process_guard_raised_and_invalid_keep_the_worker(guard):
    out = guard.score(P, ["raise", "4", "nan", "inf", "str", "none", "exit", "5", "4"])
    assert [v.reward for v in out] == [0.0, 1.0, 0, 0, 0, 0, 0, 0.0, 1.0]
    assert [v.error for v in out] == ["raised", "", *["invalid"] * 4, "raised", "", ""]
    assert out[0].detail == "raised ValueError: bad input"  # the first line only
    assert out[6].detail == "raised SystemExit: 3"
    assert guard.errors == {"raised": 2, "invalid": 4}
    assert guard._worker is not None and guard._worker.starts == 1


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize(
    "kind, error", [("sleep", "timeout"), ("spin", "timeout"), ("segv", "crashed")]
)
def test_process_guard_survives_hang_busy_loop_and_segfault(guard, kind, error):
    """A hang in sample k costs sample k only: its worker is killed (or found dead) and the
    rest of the group is scored by a fresh one. The bound allows one more worker start-up, as
    long as the first one took under the same load (a fixed bound failed beside a benchmark)."""
    startup = _first_score_s(guard)
    t0 = time.perf_counter()
    out = guard.score(P, ["4", kind, "4", "5"])
    assert time.perf_counter() - t0 < TIMEOUT_S + 1.0 + startup
    assert out[0] == Verdict(1.0) and out[2] == Verdict(1.0) and out[3] == Verdict(0.0)
    assert (out[1].reward, out[1].error) == (0.0, error)
    if kind == "segv":
        assert out[1].detail == "its worker process died of SIGSEGV"
    else:
        assert out[1].detail.startswith(f"no result within {TIMEOUT_S:g} s")
    assert guard.errors == {error: 1}
    assert guard._worker is not None and guard._worker.starts == 2
    assert guard(P, "4") == 1.0


def _first_score_s(g: RewardGuard) -> float:
    """Seconds of a fresh guard's first score: its worker's start-up, measured under the load
    of the moment; the worker stays up."""
    t0 = time.perf_counter()
    assert g(P, "4") == 1.0
    return time.perf_counter() - t0


def test_process_fail_mode_stops_at_the_first_failure(plugin):
    g = RewardGuard(f"{plugin}:hostile", "process", timeout_s=TIMEOUT_S, on_error="fail")
    try:
        _first_score_s(g)  # started here, so the bound below holds the timeouts only
        t0 = time.perf_counter()
        with pytest.raises(RewardError, match=r"hostile' on prompt 'p7': no result within 0.3 s"):
            g.score(P, ["4", "sleep", "sleep", "sleep"])  # not 3 x the timeout
        assert time.perf_counter() - t0 < TIMEOUT_S + 1.0
        with pytest.raises(RewardError, match="raised ValueError: bad input"):
            g.score(P, ["raise", "sleep"])
        assert g(P, "4") == 1.0  # the worker was replaced: no result arrives out of turn
    finally:
        g.close()


SLOW_FIRST = """
import time

_client = None

def reward(prompt, completion):
    global _client
    if _client is None:  # an import or a connection on the first call, in each process
        time.sleep(1.0)
        _client = object()
    return float(completion.strip() == prompt.answer)
"""


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_reward_slow_on_its_first_call_is_not_timed_out_in_every_worker(plugin, tmp_path):
    # each fresh worker pays the first call again, so with timeout_s alone the first call timed
    # out, the next sample's fresh worker timed out the same way, and so on: every sample
    f = tmp_path / "slow_first.py"
    f.write_text(SLOW_FIRST)
    g = RewardGuard(f"{f}:reward", "process", timeout_s=TIMEOUT_S, startup_timeout_s=30.0)
    try:
        assert g.score(P, ["4", "4", "5"]) == [Verdict(1.0), Verdict(1.0), Verdict(0.0)]
        assert g.errors == {} and g._worker is not None and g._worker.starts == 1
    finally:
        g.close()
    # a reward that hangs from its first call costs the grace once, then timeout_s per sample
    g = RewardGuard(f"{plugin}:hostile", "process", timeout_s=TIMEOUT_S, startup_timeout_s=2.0)
    try:
        t0 = time.perf_counter()
        out = g.score(P, ["sleep", "sleep", "4"])
        assert time.perf_counter() - t0 < 2.0 + TIMEOUT_S + 1.5
        assert out[0].detail.startswith("no result within 2 s (its first call in a fresh worker)")
        assert out[1].detail.startswith(f"no result within {TIMEOUT_S:g} s (task.reward_timeout_s)")
        assert out[2] == Verdict(1.0) and g.errors == {"timeout": 2}
    finally:
        g.close()


def test_process_guard_load_errors_name_the_reward(plugin, tmp_path):
    with pytest.raises(TaskError, match=r"has no function 'nope'"):
        RewardGuard(f"{plugin}:nope", "process")
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_module_zz\n")
    with pytest.raises(TaskError, match=r"broken.py:f': loading it raised ModuleNotFoundError"):
        RewardGuard(f"{broken}:f", "process")
    with pytest.raises(TaskError, match="cannot be sent to a worker process"):
        RewardGuard(lambda p, c: 1.0, "process")


def test_close_kills_the_worker(plugin):
    g = RewardGuard(f"{plugin}:pid", "process")
    pid = int(g(P, ""))
    assert pid != os.getpid()
    g.close()
    assert _zombie_or_gone(pid)
    g.close()  # twice is fine


def _zombie_or_gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_busy_worker_dies_with_its_parent(plugin, tmp_path):
    """A SIGKILLed sampler must not leave a reward worker spinning."""
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent(f"""
        from slipstream.tasks import RewardGuard
        from slipstream.types import Prompt
        idle = RewardGuard({f"{plugin}:pid"!r}, "process")
        print(int(idle(Prompt("0", "", ""), "")), flush=True)
        busy = RewardGuard({f"{plugin}:hostile"!r}, "process", timeout_s=1000)
        print(busy._worker.proc.pid, flush=True)
        busy(Prompt("0", "", ""), "spin")
    """)
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        idle, spinning = int(parent.stdout.readline()), int(parent.stdout.readline())
        time.sleep(0.2)
        assert not _zombie_or_gone(spinning)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 2.0
    while not (_zombie_or_gone(spinning) and _zombie_or_gone(idle)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _zombie_or_gone(spinning) and _zombie_or_gone(idle)


def _task_cfg(tmp_path: Path, *extra: str):
    data = tmp_path / "rows.jsonl"
    data.write_text(
        "".join(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n" for i in range(10))
    )
    return load_config(None, ["task.kind=jsonl", f'task.path="{data}"', *extra])


@pytest.mark.parametrize(
    "reward, isolation, expected",
    [
        ("exact", "auto", "inline"),
        ("PLUGIN", "auto", "process"),
        ("exact", "process", "process"),
        ("PLUGIN", "inline", "inline"),
    ],
)
def test_build_task_isolates_user_code_by_default(plugin, tmp_path, reward, isolation, expected):
    reward = f"{plugin}:hostile" if reward == "PLUGIN" else reward
    cfg = _task_cfg(tmp_path, f'task.reward="{reward}"', f'task.reward_isolation="{isolation}"')
    task = build_task(cfg)
    try:
        assert task.guard.isolation == expected
        p = task.train_prompts()[0]
        assert [v.reward for v in score_completions(task, p, [p.answer, "x"])] == [1.0, 0.0]
        assert task.reward(p, p.answer) == 1.0
    finally:
        task.close()


def test_builtin_task_is_guarded_inline():
    task = build_task(load_config(None, []))
    assert task.guard.isolation == "inline"
    p = task.train_prompts()[0]
    assert task.reward(p, p.answer) == 1.0


def test_inline_guard_is_cheap():
    """The guard adds a try and a type check to a trusted verifier, nothing more."""
    g = RewardGuard(lambda p, c: 1.0)
    texts = ["4"] * 2000
    t0 = time.perf_counter()
    g.score(P, texts)
    per_sample = (time.perf_counter() - t0) / len(texts)
    assert per_sample < 20e-6, per_sample


HOSTILE_RUN = '''
import math, time

calls = 0

def reward(prompt, completion):
    """Per worker: raise, NaN, the true reward, hang; the hang restarts the cycle."""
    global calls
    calls += 1
    k = calls % 4
    if k == 1:
        raise RuntimeError("boom")
    if k == 2:
        return math.nan
    if k == 0:
        time.sleep(1000)
    return float(completion.strip() == prompt.answer)
'''


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_hostile_plugin_reward_in_a_real_run(tmp_path):
    """A JSONL task whose plugin raises, returns NaN and hangs on 3 of every 4 calls trains
    to the end; each step's 4 samples (B = 2, G = 2) count one error of each kind."""
    from slipstream.model import save_pretrained
    from slipstream.model.builtin import init_builtin
    from slipstream.run.sync import train_sync

    model, tok = init_builtin(seed=0)
    save_pretrained(model, tmp_path / "model")
    tok.save(tmp_path / "model")
    plugin = tmp_path / "hostile_run.py"
    plugin.write_text(HOSTILE_RUN)
    cfg = _task_cfg(
        tmp_path,
        f'task.reward="{plugin}:reward"',
        "task.reward_timeout_s=0.3",
        f'run.dir="{tmp_path / "run"}"',
        "run.steps=2",
        "run.quiet=true",
        "run.threads=1",
        "trainer.batch_prompts=2",
        "sampling.group_size=2",
        "sampling.max_new_tokens=4",
        "filters.zero_variance=false",
        "eval.num_prompts=1",
        f'model.path="{tmp_path / "model"}"',
    )
    summary = train_sync(cfg)
    assert summary["steps"] == 2 and summary["ledger"]["balanced"]
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for r in records:
        assert (r["reward/errors_raised"], r["reward/errors_invalid"]) == (1, 1)
        assert (r["reward/errors_timeout"], r["reward/errors_crashed"]) == (1, 0)
