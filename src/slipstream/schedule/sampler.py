"""The sampler: an engine, a copy of the model and the task's verifier, fed by prompt requests.

`SamplerWorker.run(channels)` is the whole actor; it sees only the channel protocols, so any
runtime can host it (the local runtime runs it in a spawned process). It is given its engine,
task and environment factory already built: `run.sampler.SamplerFactory` builds them from a
`SamplerSpec` inside the sampler's process.

What the schedule decides here (`ScheduleSpec`):

- batching `fixed`: take one chunk of a batch when idle, run it to its longest sample, take
  the next. `continuous`: keep the engine's slots full, pulling requests as slots free.
- weight sync `in_flight`: a newer version is loaded between two decode steps, so a sequence
  may span versions (each token records its own). `between_batches`: loaded only with no
  sequence in flight: before a fixed batch starts, or, with continuous batching, after the
  engine drains (admission pauses while a newer version waits), so no sequence mixes versions.
- lag policy `abort`: a sequence whose oldest token falls more than K versions behind the
  latest published version is aborted with its whole group, as soon as that happens.
- redundant rollouts (r > 0): a request carries G + r seeds; the first G members to finish
  are kept and the rest cancelled, their tokens counted as `cancelled_tokens`. The kept
  members are the fastest, so groups are biased toward short completions (RollArt accepts
  this bias to cut the straggler wait; report it next to any accuracy claim).

With `env.tools` every member is a multi-turn episode (schedule.episodes): a turn that ends
leaves the engine, its environment steps in a worker process (envs.workers) while the engine
decodes the others, and its continuation joins the backlog in group order: the oldest group's
turns take free slots first (`oldest_first`), so admitting more groups (a larger K) does not
slow the groups the trainer needs next. A member is finished when its episode ends; "idle"
(for weight loads between batches) then also means no episode in flight.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from slipstream.config import Config
from slipstream.engine import Completion, Engine, Request, SamplingParams
from slipstream.engine.stats import PASS_SUMS
from slipstream.envs.base import EnvFactory
from slipstream.model import ModelConfig, Tokenizer
from slipstream.runtime.channels import Channels, PromptRequest, SamplerMessage, SamplerReport
from slipstream.runtime.placement import Placement
from slipstream.schedule.agentic import episode_group, make_runner
from slipstream.schedule.episodes import Episode, EpisodeRunner
from slipstream.schedule.presets import ScheduleSpec
from slipstream.schedule.record import SamplerLog
from slipstream.tasks.base import Task
from slipstream.tasks.guard import score_completions
from slipstream.types import CompletionText, Group, Prompt, Sample, TrainerState

STATS_EVERY_S = 0.5  # a busy sampler reports its counters at least this often


def score_group(
    tok: Tokenizer,
    task: Task,
    prompt: Prompt,
    completions: list[Completion],
    sampler_id: int = 0,
    state: TrainerState | None = None,
) -> Group:
    """Decode and verify each completion (one reward round trip) at `state` (what a TRL-shaped
    reward gets as `trainer_state`); samples in member order."""
    texts: list[str] = [CompletionText(tok.decode(c.tokens), c.tokens, state) for c in completions]
    samples = []
    for c, text, v in zip(completions, texts, score_completions(task, prompt, texts)):
        samples.append(
            Sample(
                prompt.id,
                c.request.prompt_tokens,
                c.tokens,
                c.logp,
                c.versions,
                c.finish_reason,
                completion_text=str(text),  # the text alone: the ids are its tokens
                reward=v.reward,
                reward_error=v.error,
                reward_parts=v.parts,
                sampler_id=sampler_id,
                seed=c.request.seed,
                t_start=c.t_start,
                t_end=c.t_end,
                kept_logmass_T=c.kept_logmass,
            )
        )
    return Group(prompt, samples)


@dataclass(frozen=True)
class SamplerSpec:
    """What a sampler process needs to build itself; picklable. `run.sampler.SamplerFactory`
    builds the worker from it inside the child (so the model is never pickled)."""

    cfg: Config
    model_config: ModelConfig
    dtype: torch.dtype
    tokenizer: Tokenizer
    schedule: ScheduleSpec
    num_slots: int
    max_len: int
    placement: Placement | None = None  # None: every sampler on the CPU


def _group_member(key: Hashable) -> tuple[int, int]:
    """(group id, member index): the key of a request (and of an episode) this sampler
    issued."""
    assert isinstance(key, tuple), key
    return key


def oldest_first(backlog: deque[Request], requests: list[Request]) -> None:
    """Insert episodes' turns into `backlog`, kept in (group id, member) order: group ids
    are issued in admission order, so the oldest group's turns take free slots first.

    Before (turns joined the front of the backlog as their environments answered), every
    admitted episode shared the slots alike: on the agentic task the first step took 4.8 s
    at K = 1 and 11.0 s at K = 8 (stop 55, seed 13), as K = 8 admits nine batches of
    episodes at once and the first batch's turns took the slots in turn with the eight
    others'. In order, the groups the trainer needs next finish first and the younger ones
    use the slots left over: K = 8's first step took 4.97 s against 11.76 before (K = 1:
    4.07 and 4.31; stop 56, seeds 19 and 20, docs/measurements.md "Oldest group first")."""
    for r in requests:
        backlog.insert(bisect.bisect(backlog, _group_member(r.key), key=_by_group), r)


def _by_group(r: Request) -> tuple[int, int]:
    return _group_member(r.key)


@dataclass
class _Member:
    request: PromptRequest
    done: list[Any] = field(default_factory=list)  # Completions, or Episodes with env.tools


@dataclass
class SamplerState:
    """Everything the loop mutates."""

    backlog: deque[Request] = field(default_factory=deque)  # requests not yet in the engine
    groups: dict[int, _Member] = field(default_factory=dict)  # in flight, by group id
    draining: bool = False  # between_batches + continuous: finishing before a weight load
    checked_version: int = -1  # latest version the abort rule has been applied against
    t_last_report: float = 0.0
    started_reported: int = 0  # `report.started` as last sent
    span: list[Any] | None = None  # open timeline interval [kind, t0, t1]
    blocked: list[tuple[float, float]] = field(default_factory=list)  # not yet accounted
    report: SamplerReport = field(default_factory=lambda: SamplerReport(0, 0.0, 0.0))


class SamplerWorker:
    """One sampler: `run(channels)` until the stop flag is set."""

    log: SamplerLog | None = None  # run.record_schedule (schedule.record)
    channels: Channels | None = None  # set by `run`: `_refill` reports through them

    def __init__(
        self,
        spec: SamplerSpec,
        sampler_id: int,
        engine: Engine,
        task: Task,
        env_factory: EnvFactory | None,
    ) -> None:
        """`engine` and `task` built for this sampler; `env_factory`: every member is an
        episode of one of its environments (None: single-turn)."""
        self.spec, self.id, self.engine, self.task = spec, sampler_id, engine, task
        self.tok = spec.tokenizer
        s = spec.cfg.sampling
        self.params = SamplingParams(s.temperature, s.top_p, s.top_k, s.max_new_tokens)
        self.lag_policy = spec.cfg.schedule.lag_policy
        self.poll_s = spec.cfg.runtime.poll_s
        self.state = SamplerState()
        self.engine.refill = self._refill
        if spec.cfg.run.record_schedule:
            self.log = SamplerLog(engine.num_slots, engine.max_len)
            engine.on_step = self.log.on_step
        self.runner: EpisodeRunner | None = None
        if env_factory is not None:
            self.runner = make_runner(spec.cfg, env_factory, engine, self.params)

    def _idle(self) -> bool:
        """Nothing in the engine (slots or its waiting line), the backlog, or an environment."""
        busy_env = self.runner is not None and self.runner.in_flight > 0
        return self.engine.idle() and not self.state.backlog and not busy_env

    # ---- the loop -------------------------------------------------------------------------
    def run(self, ch: Channels) -> None:
        """Generate groups for prompt requests until `ch.stop` is set.

        Consumes: prompt requests (`ch.prompts`); weight versions (`ch.weights`).
        Produces: one message per request on `ch.groups`, a scored `group` or an `aborted`
        one, each carrying the sampler's counters; `stats` when it goes idle or every
        `STATS_EVERY_S` while busy (generating, or waiting on environments) and after each
        engine step that started a group.
        Waits for: prompt requests, when it has nothing to generate (the orchestrator's
        admission control or the trainer's step holds them back); a full group queue.
        Unblocked by: the orchestrator issuing prompts; `ch.stop` (checked every `poll_s`).
        """
        st = self.state
        self.channels = ch
        st.report = SamplerReport(self.id, time.perf_counter(), time.perf_counter())
        self._load_weights(ch, wait=True)
        st.report.t_ready = time.perf_counter()
        self._send(ch, SamplerMessage("ready", self.id))
        try:
            self._loop(ch)
        finally:
            if self.runner is not None:
                self.runner.close()

    def _loop(self, ch: Channels) -> None:
        st = self.state
        while not ch.stop.is_set():
            self._sync_weights(ch)
            self._take(ch)
            self._poll_episodes(ch)
            # (`idle()`: requests the engine took but deferred (`defer_prefill`) still wait
            # in it, and only a step admits them)
            if self.engine.idle() and not st.backlog:
                if self.runner is not None and self.runner.in_flight:
                    t0 = time.perf_counter()
                    self.runner.wait(self.poll_s)  # only environments have work: wait for one
                    self._abort_stale(ch)  # (a group waiting on a slow environment ages too)
                    self._account("wait", t0)
                    self._report_due(ch)  # it holds work: silent, it would be killed as hung
                    continue
                if st.draining:  # the last episodes just ended: load the weights first
                    continue  # (admitting work here would restart the drain, for ever)
                self._wait_for_work(ch)
                continue
            t0 = time.perf_counter()
            done = self.engine.step()
            for c in done:
                self._finished(ch, c)
            self._abort_stale(ch)
            self._account("generate", t0)
            self._report_due(ch)
            ch.groups.push(force=False)

    def _report_due(self, ch: Channels) -> None:
        """Send the counters at once when a group has started (if this sampler dies, the
        trainer then knows which of its requests had begun), else every `STATS_EVERY_S`: they
        also tell the orchestrator that a sampler holding work is alive, not hung."""
        st = self.state
        started = st.report.started > st.started_reported
        if started or time.perf_counter() - st.t_last_report > STATS_EVERY_S:
            self._send(ch, SamplerMessage("stats", self.id))

    def _take(self, ch: Channels) -> None:
        """Move prompt requests from the channel into the backlog, as the batching allows."""
        st = self.state
        if self.spec.schedule.batching == "fixed":
            if self._idle():
                chunk = ch.prompts.get(0)
                if chunk:
                    self._start_batch(ch, chunk)
            return
        if st.draining:
            return
        free = self.engine.num_slots - self.engine.num_active
        while len(st.backlog) < free:
            chunk = ch.prompts.get(0)
            if not chunk:
                break
            self._admit(chunk)

    def _admit(self, chunk: list[PromptRequest]) -> None:
        if self.log is not None:
            self.log.requests(chunk)
        for req in chunk:
            self.state.groups[req.group_id] = _Member(req)
            ids = self.tok.encode_prompt(req.prompt)
            if self.runner is not None:  # episodes: the first turn comes from the environment
                for g, seed in enumerate(req.seeds):
                    self.runner.start(req.prompt, (req.group_id, g), seed, prompt_tokens=ids)
                self.state.report.started += 1
                continue
            for g, seed in enumerate(req.seeds):
                self.state.backlog.append(
                    Request(ids, self.params, seed=seed, key=(req.group_id, g))
                )

    def _refill(self, n: int) -> list[Request]:
        """The engine's refill hook: up to `n` backlog requests (none while draining, but for
        episodes: their turns all belong to episodes already started, which the drain waits for;
        `_take` starts no new ones meanwhile)."""
        if self.state.draining and self.runner is None:
            return []
        b = self.state.backlog
        out = [b.popleft() for _ in range(min(n, len(b)))]
        # a group starts with its first member (the backlog keeps the inbox's order)
        if self.runner is None:  # (episodes count as started when their environment is)
            started = sum(_group_member(r.key)[1] == 0 for r in out)
            self.state.report.started += started
            if started and self.channels is not None and self.log is None:
                # said before the forward pass that takes them in: a prompt that kills or
                # hangs this sampler in that pass is then known as started, so its re-issues
                # count toward runtime.max_request_retries (else resent for ever, unmarked).
                # (A run recording its schedule reports after the step, as before: its record
                # places every message between two engine steps.)
                self._send(self.channels, SamplerMessage("stats", self.id), block=False)
        return out

    def _wait_for_work(self, ch: Channels) -> None:
        st = self.state
        if st.report.busy_s and st.span and st.span[0] == "generate":
            self._send(ch, SamplerMessage("stats", self.id))  # exact counters at going idle
        ch.groups.push()
        t0 = time.perf_counter()
        chunk = ch.prompts.get(self.poll_s)
        self._account("wait", t0)
        if chunk and self.spec.schedule.batching == "fixed":
            self._start_batch(ch, chunk)
        elif chunk:
            self._admit(chunk)

    def _start_batch(self, ch: Channels, chunk: list[PromptRequest]) -> None:
        """Fixed batching: start `chunk` at the weights published before its batch, and no
        older (an idle sampler takes it in `_take` or, blocked on the prompts, in
        `_wait_for_work`; generated at older weights, a `sync` batch is stale, dropped whole)."""
        t0 = time.perf_counter()
        self._await_version(ch, max(r.issue_version for r in chunk))
        self._account("wait", t0)
        self._sync_weights(ch, batch_start=True)
        self._admit(chunk)

    # ---- weights ----------------------------------------------------------------------------
    def _sync_weights(self, ch: Channels, batch_start: bool = False) -> None:
        """Load a newer version if the schedule allows it now."""
        latest = ch.weights.version()
        if latest <= self.engine.version:
            self.state.draining = False
            return
        idle = self._idle()
        if self.spec.schedule.weight_sync == "in_flight" or batch_start or idle:
            self._load_weights(ch)
        elif self.spec.schedule.batching == "continuous":
            self.state.draining = True  # admit nothing until the engine is empty
            if self.engine.num_active == 0 and (self.runner is None or not self.runner.in_flight):
                self._load_weights(ch)
                self.state.draining = False

    def _await_version(self, ch: Channels, version: int) -> None:
        """Wait until the weight channel shows `version` or newer: a batch's requests carry
        the trainer's version when they were issued, published before them, and a fixed batch
        is generated at it (a `sync` batch at any older version is stale, dropped whole). The
        local runtime publishes in shared memory before it issues, so this returns at once;
        on Ray the weights' `offer` and the prompts travel as separate calls, and the prompts
        can land first. Raises TimeoutError after `runtime.startup_timeout_s` (the sampler is
        then restarted, and a restarted sampler is handed the latest weights)."""
        deadline = time.monotonic() + self.spec.cfg.runtime.startup_timeout_s
        while ch.weights.version() < version and not ch.stop.is_set():
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"sampler {self.id}: weights v{version}, published before its batch, "
                    f"never arrived (latest v{ch.weights.version()})"
                )
            time.sleep(min(self.poll_s, 0.005))

    def _load_weights(self, ch: Channels, wait: bool = False) -> None:
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.spec.cfg.runtime.startup_timeout_s
        got = ch.weights.read(self.engine.version, timeout=5.0)
        while got is None and wait and not ch.stop.is_set():
            if time.monotonic() > deadline:
                raise TimeoutError("sampler: no weights published")
            time.sleep(0.01)
            got = ch.weights.read(self.engine.version, timeout=5.0)
        if got is None:
            return
        state, version = got
        self.engine.load_weights(state, version)
        if self.engine.idle():  # apply now: a step with nothing to admit or decode
            refill, self.engine.refill = self.engine.refill, None
            assert not self.engine.step()
            self.engine.refill = refill
        r = self.state.report
        r.weight_loads += 1
        r.version = version
        # (in flight, the engine's copy into the parameters lands in its next step)
        r.weight_sync_s += time.perf_counter() - t0
        self._account("weight_sync", t0)

    # ---- finished and aborted groups ----------------------------------------------------------
    def _finished(self, ch: Channels, c: Completion) -> None:
        if self.runner is not None:  # a turn of an episode: its environment steps next
            self.runner.turn(c)
            return
        gid, _ = _group_member(c.request.key)
        member = self.state.groups.get(gid)
        if member is None:  # a member finishing in the same step its group was completed
            self.state.report.cancelled_tokens += len(c.tokens)
            return
        member.done.append(c)
        G = member.request.group_size
        if len(member.done) < G:
            return
        del self.state.groups[gid]
        if len(member.request.seeds) > G:  # redundant members still out: cancel them
            self.state.report.cancelled_tokens += self._cancel(gid)
        kept = sorted(member.done[:G], key=lambda x: _group_member(x.request.key)[1])
        state = TrainerState(self.engine.version, self.spec.cfg.run.steps)  # the weights it holds
        group = score_group(self.tok, self.task, member.request.prompt, kept, self.id, state)
        self._send(ch, SamplerMessage("group", self.id, request=member.request, group=group))

    def _cancel(self, gid: int) -> int:
        """Drop group `gid`'s members still waiting or running; tokens they had generated."""
        self.state.backlog = deque(r for r in self.state.backlog if _group_member(r.key)[0] != gid)
        self.engine.cancel_waiting(lambda r: _group_member(r.key)[0] == gid)  # taken, deferred
        aborted = self.engine.abort(lambda c: _group_member(c.request.key)[0] == gid)
        tokens = sum(len(c.tokens) for c in aborted)  # (an episode's: its turn in the engine)
        if self.runner is not None:  # and its history before that turn
            tokens += sum(
                len(e.tokens) for e in self.runner.cancel(lambda k: _group_member(k)[0] == gid)
            )
        return tokens

    def _poll_episodes(self, ch: Channels) -> None:
        """Continuations into the backlog, oldest group first; ended episodes to their groups."""
        if self.runner is None:
            return
        requests, ended = self.runner.poll()
        oldest_first(self.state.backlog, requests)
        for ep in ended:
            self._episode_done(ch, ep)

    def _episode_done(self, ch: Channels, ep: Episode) -> None:
        gid, _ = _group_member(ep.key)
        member = self.state.groups.get(gid)
        if member is None:
            self.state.report.cancelled_tokens += len(ep.tokens)
            return
        member.done.append(ep)
        G = member.request.group_size
        if len(member.done) < G:
            return
        del self.state.groups[gid]
        if len(member.request.seeds) > G:
            self.state.report.cancelled_tokens += self._cancel(gid)
        kept = sorted(member.done[:G], key=lambda e: _group_member(e.key)[1])
        group = episode_group(self.tok, member.request.prompt, kept, self.id)
        self._send(ch, SamplerMessage("group", self.id, request=member.request, group=group))

    def _abort_stale(self, ch: Channels) -> None:
        """Lag policy `abort`: cut groups whose oldest token is more than K behind the latest
        published version, as soon as a publish makes them so."""
        st = self.state
        latest = ch.weights.version()
        if self.lag_policy != "abort" or latest == st.checked_version:
            return
        st.checked_version = latest
        if self.log is not None:
            self.log.stale_check(latest)
        K = self.spec.schedule.max_lag
        stale = self.engine.abort(lambda c: bool(c.versions) and latest - min(c.versions) > K)
        gids = list(dict.fromkeys(_group_member(c.request.key)[0] for c in stale))
        if self.runner is not None:  # episodes between turns, or whose earlier turns are stale
            gids += [
                _group_member(k)[0]
                for k, e in self.runner.episodes.items()
                if e.oldest(latest - K - 1)
            ]
            gids = list(dict.fromkeys(gids))
        for gid in gids:
            member = st.groups.pop(gid, None)
            if member is None:
                continue
            partial = [c for c in stale if _group_member(c.request.key)[0] == gid] + member.done
            tokens = sum(len(c.tokens) for c in partial) + self._cancel(gid)
            st.report.aborted_tokens += tokens
            group = Group(member.request.prompt, [])
            self._send(ch, SamplerMessage("aborted", self.id, request=member.request, group=group))

    # ---- reporting -------------------------------------------------------------------------
    def _account(self, kind: str, t0: float) -> None:
        """Time since `t0` was spent on `kind`, but for the spells blocked on a full group
        queue (`_send`), which are `blocked`: not generating, not busy."""
        t1 = time.perf_counter()
        blocked, self.state.blocked = self.state.blocked, []
        for b0, b1 in blocked:
            if b0 > t0:
                self._span(kind, t0, b0)
            self._span("blocked", b0, b1)
            t0 = max(t0, b1)
        if t1 > t0:
            self._span(kind, t0, t1)

    def _span(self, kind: str, t0: float, t1: float) -> None:
        """Count `[t0, t1]` as `kind`; extend or close the open timeline interval."""
        st, r = self.state, self.state.report
        if kind == "generate":
            r.busy_s += t1 - t0
        elif kind == "blocked":
            r.blocked_s += t1 - t0
        if st.span and st.span[0] == kind and t0 - st.span[2] < 1e-3:
            st.span[2] = t1
            return
        if st.span:
            r.intervals.append((st.span[0], st.span[1], st.span[2]))
        st.span = [kind, t0, t1]

    def _send(self, ch: Channels, msg: SamplerMessage, block: bool = True) -> bool:
        """Put `msg` with the counters on the group queue; when the queue is full, wait
        (the time is `blocked`), or with `block` false send nothing. Whether it went."""
        st, r = self.state, self.state.report
        s = self.engine.stats
        # the report is as of the end of the time accounted so far: one sent inside a spell
        # not yet accounted (a group finishing in an engine step) would otherwise carry a time
        # its busy_s has not reached, and the next report's window more busy seconds than
        # seconds (a step's sampler_busy over 1)
        r.t, r.tokens_generated = st.span[2] if st.span else r.t_ready, s.tokens_generated
        r.decode_steps, r.prefill_tokens = s.decode_steps, s.prefill_tokens
        for k in PASS_SUMS:
            setattr(r, k, getattr(s, k))
        msg.report = replace(r, intervals=list(r.intervals))  # the queue pickles it later
        if self.log is not None and block:  # (a message that may not go takes no record)
            msg.schedule = self.log.flush()
        t0 = time.perf_counter()
        if not ch.groups.put(msg, timeout=0):  # full: blocked until the trainer makes room
            if not block:
                return False
            while not ch.groups.put(msg, timeout=self.poll_s):
                if ch.stop.is_set():
                    return False
            st.blocked.append((t0, time.perf_counter()))
        st.t_last_report, st.started_reported = r.t, r.started
        r.intervals = []
        return True
