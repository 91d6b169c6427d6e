"""Reward functions in the shapes users bring, weighted and combined into one verifier.

- slipstream: `score(prompt: Prompt, completion: str) -> float`;
- TRL: `fn(prompts, completions, **columns) -> list[float | None]`, batched, None where the
  function does not apply (TRL's GRPOTrainer convention; a NaN counts as None, since TRL turns
  None into NaN and sums with nansum). Called here with one sample at a time, by keyword as
  TRL calls it: `prompts=[messages]` and `completions=[[{"role": "assistant", "content":
  text}]]` for a row whose prompt is a conversation (a `ToolEnv` episode's: its messages
  after the prompt, assistant turns with their `tool_calls` and the `tool` replies, as TRL's
  tool loop builds them; envs.tool_env), plain strings for a string prompt (even one a chat
  template renders), and every other column of the row as a one-element list under its own
  name. One sample per call keeps the reward guard's per-sample timeout (a hang costs one
  sample).
  `completion_ids=[ids]` and `trainer_state` (a `slipstream.types.TrainerState`: the policy
  version scoring the sample as `global_step`, `run.steps` as `max_steps`) are passed where
  they are known (every single-turn sample and evaluation, every `ToolEnv` episode:
  `CompletionText`; an episode's ids are its tokens after the prompt, tool replies included,
  and its state the one its last turn ended at, envs.tool_env).
- verl: `compute_score(data_source, solution_str, ground_truth, extra_info) -> float | dict`,
  by keyword as verl's reward manager calls it; a dict's `score` is the reward, its other
  numbers are logged. `ground_truth` is the row's `reward_model.ground_truth` as stored (an
  int stays an int, as verl passes it), else the prompt's answer; `data_source` and
  `extra_info` are the row's columns of those names (`extra_info` defaults to the whole row).

An `async def` function of any shape is awaited (TRL awaits them), on one event loop per process.
Each of your functions gets its own deep copy of the prompt, so one that changes what it is given
changes nothing else.

`CombinedReward` sums weight x value over the functions that apply (TRL's nansum over reward
functions) and returns each value under `reward/<name>` (a verl dict's other numbers under
`reward/<name>/<key>`), which the guard passes on as the sample's `reward_parts`. It holds
only the functions' specs, so it pickles to a reward worker process, where `load` imports them.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import math
import numbers
import os
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from slipstream.tasks.jsonl import BUILTIN_REWARDS, TaskError, load_reward
from slipstream.tasks.rows import MISSING, verl_ground_truth
from slipstream.types import Group, Prompt

Shape = Literal["auto", "slipstream", "trl", "verl"]
Scorer = Callable[[Prompt, str], Any]  # one sample -> float, None (not applicable) or dict


@dataclass(frozen=True)
class RewardPart:
    """One reward function of a `CombinedReward`."""

    spec: str  # math_verify, exact, module:function or file.py:function
    weight: float = 1.0
    name: str = ""  # its metric name, reward/<name>; default the function's name
    shape: Shape = "auto"

    @property
    def label(self) -> str:
        return self.name or self.spec.rpartition(":")[2] or self.spec


def detect_shape(fn: Callable[..., Any]) -> Shape:
    """`trl` for `prompts`/`completions` parameters, else `verl` for `solution_str`/
    `data_source`/`ground_truth`, else `slipstream`."""
    try:
        names = set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin or C function: called as slipstream's
        return "slipstream"
    # `completions` first: TRL's own example reward is `fn(completions, ground_truth, **kwargs)`
    # (a `ground_truth` column), and verl's `compute_score` has no `prompts`/`completions`
    if names & {"prompts", "completions", "completion_ids"}:
        return "trl"
    if names & {"solution_str", "data_source", "ground_truth"}:
        return "verl"
    return "slipstream"


def adapt(fn: Callable[..., Any], shape: Shape) -> Scorer:
    """A per-sample scorer `(prompt, completion) -> value` of `fn` called in its shape; an
    `async def` function (which TRL awaits) is run to its result."""
    shape = detect_shape(fn) if shape == "auto" else shape
    if shape == "trl":
        return lambda prompt, completion: _call_trl(fn, prompt, completion)
    if shape == "verl":
        return lambda prompt, completion: awaited(
            fn(
                data_source=prompt.meta.get("data_source", ""),
                solution_str=completion,
                ground_truth=_ground_truth(prompt),
                extra_info=prompt.meta.get("extra_info", prompt.meta),
            )
        )
    return lambda prompt, completion: awaited(fn(prompt, completion))


def _ground_truth(prompt: Prompt) -> object:
    """What verl passes as `ground_truth`: the row's `reward_model.ground_truth` as stored
    (`prompt.answer` is its text where a built-in reward compares with it), else the answer."""
    truth = verl_ground_truth(prompt.meta)
    return prompt.answer if truth is MISSING else truth


_loop: tuple[int, asyncio.AbstractEventLoop] | None = None  # (its process id, the loop)
_loop_lock = threading.Lock()


def awaited(value: object) -> object:
    """`value`, or the result of awaiting it when an `async def` reward returned a coroutine:
    on one event loop of this process that outlives the call (as TRL's does, so a client an
    async reward keeps between calls stays bound to a live loop), in a thread of its own (the
    caller's thread may already run a loop)."""
    if not inspect.isawaitable(value):
        return value

    async def wait() -> object:
        return await value

    global _loop
    with _loop_lock:
        if _loop is None or _loop[0] != os.getpid():  # none yet, or forked: its thread is gone
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="async-rewards", daemon=True).start()
            _loop = (os.getpid(), loop)
        loop = _loop[1]
    return asyncio.run_coroutine_threadsafe(wait(), loop).result()


def _call_trl(fn: Callable[..., Any], prompt: Prompt, completion: str) -> Any:
    chat = prompt.messages is not None and prompt.plain_prompt is None  # TRL: a conversation
    passed = ("prompts", "completions", "completion_ids", "trainer_state")
    columns: dict[str, Any] = {k: [v] for k, v in prompt.meta.items() if k not in passed}
    ids = getattr(completion, "token_ids", None)  # a CompletionText's
    if ids is not None:
        columns["completion_ids"] = [list(ids)]
    state = getattr(completion, "trainer_state", None)  # one object, as TRL passes its own
    if state is not None:
        columns["trainer_state"] = state
    text = str(completion)  # the plain text, as TRL's decoded completions are
    out = awaited(
        fn(
            prompts=[prompt.messages if chat else prompt.plain_prompt or prompt.text],
            completions=[_chat_completion(completion) if chat else text],
            **columns,
        )
    )
    tolist = getattr(out, "tolist", None)
    if not isinstance(out, list | tuple) and callable(tolist):
        out = tolist()  # a numpy array or a tensor, which TRL iterates as a list
    if not isinstance(out, list | tuple) or len(out) != 1:
        raise TypeError(f"returned {_short(out)}; a TRL reward returns one value per completion")
    x = _number(out[0])
    return None if x is not None and math.isnan(x) else out[0]  # TRL: NaN is None (nansum)


def _chat_completion(completion: str) -> list[dict[str, Any]]:
    """A conversational row's completion as TRL passes it: an episode's messages after its
    prompt (a copy: a reward may change them), else the one assistant message."""
    messages = getattr(completion, "messages", None)  # a tool episode's CompletionText's
    if messages:
        return copy.deepcopy(list(messages))
    return [{"role": "assistant", "content": str(completion)}]


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:
        text = type(value).__name__
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass
class CombinedReward:
    """Several reward functions as one verifier (module docstring); picklable before `load`."""

    parts: tuple[RewardPart, ...]
    _fns: list[Scorer] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.parts:
            raise TaskError("no reward function")
        labels = [p.label for p in self.parts]
        dup = sorted({x for x in labels if labels.count(x) > 1})
        if dup:
            raise TaskError(f"task.rewards: two functions named {dup[0]!r}; give each a name")
        self.__qualname__ = " + ".join(p.name or p.spec for p in self.parts)  # in messages

    @property
    def trusted(self) -> bool:
        """Only built-in rewards: run inline under `task.reward_isolation = "auto"`."""
        return all(p.spec in BUILTIN_REWARDS for p in self.parts)

    @property
    def plain(self) -> bool:
        """One function of weight 1 and no name: its value is the reward, nothing else logged."""
        p = self.parts[0]
        return len(self.parts) == 1 and p.weight == 1.0 and not p.name

    def load(self) -> CombinedReward:
        """Import the functions (raises `TaskError` naming a bad one); returns self."""
        if self._fns is None:
            self._fns = [adapt(load_reward(p.spec), p.shape) for p in self.parts]
        return self

    def __getstate__(self) -> dict[str, Any]:  # functions are imported again where it lands
        return {"parts": self.parts, "_fns": None, "__qualname__": self.__qualname__}

    def __call__(self, prompt: Prompt, completion: str) -> Any:
        """The reward of one sample: a number, or `{"score": total, "reward/<name>": ...}`."""
        fns = self.load()._fns
        assert fns is not None
        values = [fn(_own(prompt, part), completion) for part, fn in zip(self.parts, fns)]
        if self.plain and not isinstance(values[0], dict | list | tuple) and values[0] is not None:
            return values[0]  # the guard checks it is a finite number
        out: dict[str, Any] = {}
        total = 0.0
        for part, value in zip(self.parts, values):
            if value is None:  # TRL: this function does not apply to the sample
                continue
            if isinstance(value, dict):
                # the dict's other numbers are logged; a flag (verl's data_source == ...) is not
                extra = {
                    k: _number(v)
                    for k, v in value.items()
                    if k != "score" and not isinstance(v, bool)
                }
                out.update(
                    {f"reward/{part.label}/{k}": x for k, x in extra.items() if x is not None}
                )
                value = value.get("score")
            x = _number(value)
            if x is None or not math.isfinite(x):
                return {"score": math.nan, f"reward/{part.label}": value}  # the guard: invalid
            out[f"reward/{part.label}"] = x
            total += part.weight * x
        return {"score": total, **out}


def _own(prompt: Prompt, part: RewardPart) -> Prompt:
    """`prompt` for a user's function: a deep copy, so that one which changes what it is given
    (`prompts[0].append(...)`, verl's `extra_info`, `prompt.meta`) changes neither the other
    functions' inputs, nor the group's next samples, nor the prompt the run trains on and logs.
    A built-in reward gets `prompt` itself."""
    return prompt if part.spec in BUILTIN_REWARDS else copy.deepcopy(prompt)


def _number(v: object) -> float | None:
    """`v` as a float when it is one number: an int, a float, a bool (True is 1, as for one
    function alone, `guard.as_reward`), a numpy scalar (np.float32 is no Python float,
    np.bool_ no Real) or a 0-d tensor/array, as TRL's `torch.tensor(rewards)` takes them; None
    for anything else. Not `observe.means.number` on purpose: that one reads numbers of JSON
    records, where a bool is a flag and no number."""
    if isinstance(v, numbers.Real):
        return float(v)
    item = getattr(v, "item", None)
    if callable(item) and getattr(v, "ndim", None) == 0:  # torch.tensor(1.0), np.array(1.0)
        try:
            x = item()
        except Exception:  # a user type's item() may raise anything
            return None
        return float(x) if isinstance(x, numbers.Real) else None
    return None


def resolve(target: Any) -> Callable[[Prompt, str], Any]:
    """The callable a guard scores with: a spec string loaded, a `CombinedReward` loaded."""
    if isinstance(target, str):
        return load_reward(target)
    if isinstance(target, CombinedReward):
        return target.load()
    return target


def part_means(groups: Sequence[Group]) -> dict[str, float]:
    """Mean of each `reward/<name>` over the samples it applies to (a step's metrics)."""
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for g in groups:
        for s in g.samples:
            for k, v in s.reward_parts.items():
                sums[k] += v
                counts[k] += 1
    return {k: sums[k] / counts[k] for k in sorted(sums)}
