"""The rollout engine: a fixed pool of sequence slots, continuous batching, in-flight weights.

Each call to `step()` does, in order:

1. apply weights handed over by `load_weights` since the last step (between two decode steps:
   never inside a forward pass);
2. admit waiting requests into free slots and prefill them in one batched forward (a prefill
   step between decode steps, not chunked prefill: our prompts are short next to completions,
   so a whole-prompt prefill costs about one decode step and chunking would buy nothing but
   complexity; long-prompt workloads would want chunking);
3. one decode step for every active slot.

A slot is refilled the moment its sequence finishes, so the pool never waits for the slowest
sequence. Every sampled token records its behaviour log-prob and the engine's `version` at the
moment it was sampled, so a sequence that spans a weight update carries both versions.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from slipstream.engine.sampling import sample
from slipstream.model.llama import CausalLM
from slipstream.types import FinishReason

KVMode = Literal["keep", "recompute"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request. temperature 0 is greedy; top_k 0 and top_p 1 keep all."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64


@dataclass
class Request:
    prompt_tokens: list[int]
    params: SamplingParams
    seed: int = 0
    key: Any = None  # the caller's handle, returned with the completion


@dataclass
class Completion:
    """What the engine returns for a request: tokens with per-token log-probs and versions."""

    request: Request
    tokens: list[int]
    logp: list[float]
    versions: list[int]
    finish_reason: FinishReason
    t_start: float
    t_end: float


@dataclass
class EngineStats:
    """Counters since creation; callers diff two snapshots for a window."""

    tokens_generated: int = 0
    prefill_tokens: int = 0
    decode_steps: int = 0
    active_slot_steps: int = 0  # sum over decode steps of active slots (mean = / decode_steps)
    prefill_s: float = 0.0
    decode_s: float = 0.0
    weight_update_s: float = 0.0
    weight_updates: int = 0
    aborted: int = 0
    active_trace: list[tuple[float, int]] = field(default_factory=list)  # (time, active slots)

    def snapshot(self) -> dict[str, float]:
        return {k: v for k, v in self.__dict__.items() if k != "active_trace"}


@dataclass
class _Slot:
    request: Request
    t_start: float
    pos: int = 0  # tokens written into this slot's cache
    tokens: list[int] = field(default_factory=list)
    logp: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)


class Engine:
    """Continuous-batching generator over a `CausalLM` with a slot KV cache."""

    def __init__(
        self,
        model: CausalLM,
        eos_id: int,
        num_slots: int,
        max_len: int,
        version: int = 0,
        kv_mode: KVMode = "keep",
        trace: bool = False,
    ) -> None:
        if kv_mode not in ("keep", "recompute"):
            raise ValueError(f"kv_mode must be 'keep' or 'recompute', got {kv_mode!r}")
        self.model = model.eval()
        self.eos_id = eos_id
        self.num_slots, self.max_len = num_slots, max_len
        self.cache = model.new_cache(num_slots, max_len)
        self.slots: list[_Slot | None] = [None] * num_slots
        self.waiting: deque[Request] = deque()
        self.version = version
        self.kv_mode: KVMode = kv_mode
        self.stats = EngineStats()
        self._trace = trace
        self._pending_weights: tuple[dict[str, torch.Tensor], int] | None = None
        self._params = dict(model.named_parameters())

    # ---- intake -------------------------------------------------------------------------
    def add(self, request: Request) -> None:
        need = len(request.prompt_tokens) + request.params.max_new_tokens
        if need > self.max_len:
            raise ValueError(f"prompt + max_new_tokens = {need} exceeds engine max_len {self.max_len}")
        if not request.prompt_tokens:
            raise ValueError("empty prompt")
        self.waiting.append(request)

    @property
    def num_active(self) -> int:
        return sum(s is not None for s in self.slots)

    def idle(self) -> bool:
        return not self.waiting and self.num_active == 0

    # ---- weights --------------------------------------------------------------------------
    def load_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Hand over new weights; they take effect at the start of the next `step()`."""
        self._pending_weights = (state, version)

    def _apply_weights(self) -> None:
        if self._pending_weights is None:
            return
        state, version = self._pending_weights
        self._pending_weights = None
        t0 = time.perf_counter()
        with torch.no_grad():
            for name, p in self._params.items():
                p.copy_(state[name])  # into existing storage: no reallocation, no re-pinning
        self.version = version
        if self.kv_mode == "recompute":
            # AReaL: re-prefill each in-flight prefix under the new weights
            live = [i for i, s in enumerate(self.slots) if s is not None]
            if live:
                self._forward_prefix(live, [self._prefix(i) for i in live])
        self.stats.weight_update_s += time.perf_counter() - t0
        self.stats.weight_updates += 1

    def _prefix(self, i: int) -> list[int]:
        s = self.slots[i]
        assert s is not None
        return s.request.prompt_tokens + s.tokens[:-1]  # the last token is not yet in the cache

    # ---- the loop -------------------------------------------------------------------------
    def step(self) -> list[Completion]:
        """Apply pending weights, admit and prefill, decode once. Returns finished requests."""
        self._apply_weights()
        finished: list[Completion] = []
        admitted = self._admit()
        if admitted:
            t0 = time.perf_counter()
            logits = self._forward_prefix(admitted, [self.slots[i].request.prompt_tokens for i in admitted])  # type: ignore[union-attr]
            finished += self._sample_into(admitted, logits)
            self.stats.prefill_s += time.perf_counter() - t0
        active = [i for i, s in enumerate(self.slots) if s is not None]
        if active:
            t0 = time.perf_counter()
            slots = [self.slots[i] for i in active]
            ids = torch.tensor([[s.tokens[-1]] for s in slots])  # type: ignore[union-attr]
            pos = torch.tensor([[s.pos] for s in slots])  # type: ignore[union-attr]
            with torch.no_grad():
                logits = self.model(ids, positions=pos, cache=self.cache, slots=torch.tensor(active))
            for s in slots:
                s.pos += 1  # type: ignore[union-attr]
            finished += self._sample_into(active, logits[:, -1])
            self.stats.decode_s += time.perf_counter() - t0
            self.stats.decode_steps += 1
            self.stats.active_slot_steps += len(active)
        if self._trace:
            self.stats.active_trace.append((time.perf_counter(), self.num_active))
        return finished

    def _admit(self) -> list[int]:
        admitted = []
        now = time.perf_counter()
        for i, s in enumerate(self.slots):
            if s is None and self.waiting:
                self.slots[i] = _Slot(self.waiting.popleft(), t_start=now)
                admitted.append(i)
        return admitted

    def _forward_prefix(self, idx: list[int], seqs: list[list[int]]) -> torch.Tensor:
        """Write `seqs` into slots `idx` from position 0; return each row's last logits `[B, V]`."""
        lens = torch.tensor([len(s) for s in seqs])
        width = int(lens.max())
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        for r, s in enumerate(seqs):
            ids[r, : len(s)] = torch.tensor(s)
        pos = torch.arange(width).expand(len(seqs), width)
        with torch.no_grad():
            logits = self.model(ids, positions=pos, cache=self.cache, slots=torch.tensor(idx))
        for i, n in zip(idx, lens.tolist()):
            self.slots[i].pos = n  # type: ignore[union-attr]
        self.stats.prefill_tokens += int(lens.sum())
        return logits[torch.arange(len(seqs)), lens - 1]

    def _sample_into(self, idx: list[int], logits: torch.Tensor) -> list[Completion]:
        slots = [self.slots[i] for i in idx]
        ps = [s.request.params for s in slots]  # type: ignore[union-attr]
        tokens, logp = sample(
            logits,
            temperature=torch.tensor([p.temperature for p in ps]),
            top_k=torch.tensor([p.top_k for p in ps]),
            top_p=torch.tensor([p.top_p for p in ps]),
            seeds=torch.tensor([s.request.seed for s in slots]),  # type: ignore[union-attr]
            steps=torch.tensor([len(s.tokens) for s in slots]),  # type: ignore[union-attr]
        )
        done = []
        for i, s, tok, lp in zip(idx, slots, tokens.tolist(), logp.tolist()):
            assert s is not None
            s.tokens.append(tok)
            s.logp.append(lp)
            s.versions.append(self.version)
            self.stats.tokens_generated += 1
            if tok == self.eos_id:
                done.append(self._finish(i, FinishReason.STOP))
            elif len(s.tokens) >= s.request.params.max_new_tokens:
                done.append(self._finish(i, FinishReason.LENGTH))
        return done

    def _finish(self, i: int, reason: FinishReason) -> Completion:
        s = self.slots[i]
        assert s is not None
        self.slots[i] = None
        return Completion(s.request, s.tokens, s.logp, s.versions, reason, s.t_start, time.perf_counter())

    # ---- control --------------------------------------------------------------------------
    def abort(self, predicate: Callable[[Completion], bool]) -> list[Completion]:
        """Abort in-flight sequences for which `predicate(partial completion)` holds.

        They are returned with what they had, marked `aborted`, and their slots freed.
        """
        out = []
        now = time.perf_counter()
        for i, s in enumerate(self.slots):
            if s is None:
                continue
            partial = Completion(s.request, s.tokens, s.logp, s.versions, FinishReason.ABORTED, s.t_start, now)
            if predicate(partial):
                self.slots[i] = None
                out.append(partial)
        self.stats.aborted += len(out)
        return out

    def cancel_waiting(self, predicate: Callable[[Request], bool]) -> list[Request]:
        """Remove requests not yet admitted for which `predicate` holds."""
        keep, gone = deque(), []
        for r in self.waiting:
            (gone if predicate(r) else keep).append(r)
        self.waiting = keep
        return gone

    def generate(self, requests: Iterable[Request]) -> list[Completion]:
        """Run `requests` to completion; completions in request order."""
        reqs = list(requests)
        order = {id(r): n for n, r in enumerate(reqs)}
        for r in reqs:
            self.add(r)
        out: list[Completion] = []
        while not self.idle():
            out += self.step()
        return sorted(out, key=lambda c: order[id(c.request)])
