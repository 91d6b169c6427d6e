"""The orchestrator: one loop that runs every schedule, in the trainer process.

It decides in one place: the prompt source and draw counter (seeds as the synchronous loop's),
what is in flight, admission, lag policy, ledger, when to train. Samplers generate what they get.

Steps are cut into *windows* of B groups: a step trains on the groups of one window that pass
the filters, exactly as the synchronous loop trains on the informative groups of one batch, so
every schedule spends the same generation per step. A window whose groups are all filtered
closes without a step (the version does not move), again as in the synchronous loop; with
dynamic sampling a window first waits for replacements of its filtered groups.

- fixed batching: window w is batch w, issued whole (B prompts) once `w <= closed + K`: `sync`
  and `tail_batching` (K = 0) issue batch w+1 only after step w's weights are published;
  `double_buffer` (K = 1) keeps exactly one batch ahead. The window closes when all of its
  groups are back.
- continuous batching: one prompt at a time while accepted + running groups stay within
  (K + 1) x B of those consumed by closed windows, `issued - stale - aborted - consumed <
  (K + 1) x B`: AReaL's `(K + v + 1) x B` bound, where windows of exactly B groups make
  consumed = v x B. The bound counts groups, not tokens, so slow, hard groups are never
  starved by short ones. A window is the next B groups to arrive.

A group's lag is `version - oldest token's version`. Beyond K the lag policy applies: `drop`
(ledger: stale), `abort` (the sampler already cut most; the rest are dropped), or `keep`
(trained; the decoupled correction of the loss weighs it). The bound is checked on arrival and
again when a window takes the group, since a group that waits in the window while other
windows train (several close in one pass after a recovery, or with dynamic sampling) ages: no
group trains with a lag above K unless the policy is `keep`.

`min_lag` (measurement only): a continuous window takes only groups whose request was issued
at least `min(min_lag, windows)` windows ago, earliest first, so from step `min_lag` on each
step trains the groups started `min_lag` versions earlier (lag `min_lag`, or less where a
sampler loaded newer weights first). Holding by token versions could starve: a request started
late, under newer weights, would never ripen while admission waits for it. A retried request
keeps its lost one's window; dynamic sampling's refills are issued for the open window.

A sampler that dies takes the requests it held with it: the runtime restarts it, the router
says which requests it held, the ledger counts each as `lost`, and each is issued again as a
new request (same prompt, seeds and batch), so no window waits forever and no group is
trained twice (a group of a lost request that still arrives is dropped). A request lost more
than `max_request_retries` times is dropped instead (ledger: poisoned), with a warning. A
sampler holding work and silent for `sampler_timeout_s` is killed and treated the same way.
"""

from __future__ import annotations

import random
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from slipstream.runtime.channels import Channels, PromptRequest, Router, SamplerMessage
from slipstream.schedule import pipeline_state
from slipstream.schedule.ledger import Ledger
from slipstream.schedule.pipeline_state import OrchestratorState
from slipstream.schedule.presets import ScheduleSpec
from slipstream.schedule.record import ScheduleRecorder
from slipstream.schedule.step_stats import StepStats, discard, group_lag
from slipstream.schedule.tail import LengthModel
from slipstream.types import Group, Prompt


class Learner(Protocol):
    """The trainer side the orchestrator drives (a `Run` in production, a fake in tests)."""

    ledger: Ledger

    @property
    def version(self) -> int: ...

    def draw(self, n: int) -> list[Prompt]: ...

    def group_sizes(self, prompts: list[Prompt]) -> list[int]: ...

    def seeds(self, prompt: Prompt, n: int) -> list[int]: ...

    def settle(self, groups: list[Group]) -> list[Group]: ...

    def train(self, groups: list[Group]) -> dict[str, Any]: ...

    def publish(self, channels: Channels) -> float: ...

    def after_step(self, record: dict[str, Any], groups: list[Group]) -> None: ...


@dataclass(frozen=True)
class Options:
    batch_prompts: int  # B
    group_size: int  # G
    steps: int
    redundant: int = 0  # r
    lag_policy: str = "drop"
    tail_pool: int = 4
    poll_s: float = 0.05
    stall_timeout_s: float = 600.0
    max_empty_windows: int = 20
    sampler_timeout_s: float = 300.0  # a sampler holding work and silent this long is killed
    max_request_retries: int = 2  # a request lost more often than this is dropped (poisoned)
    chaos_kills: int = 0  # fault injection: kill a random sampler this many times...
    chaos_every_s: float = 5.0  # ...one every this many seconds (of the loop)
    chaos_seed: int = 0
    dynamic_sampling: bool = False  # DAPO: refill a window's filtered groups with new draws
    max_extra_draws: int = 32
    min_lag: int = 0  # measurement: hold groups back until their lag is min(min_lag, version)


class Orchestrator:
    """Issues prompt requests, receives groups, trains a step per window, publishes weights."""

    def __init__(
        self,
        spec: ScheduleSpec,
        opts: Options,
        learner: Learner,
        channels: Channels,
        health: Callable[[], None] = lambda: None,
        timeline: Any = None,
        runtime: Any = None,
    ) -> None:
        self.spec, self.opts, self.learner, self.ch = spec, opts, learner, channels
        self.health = health
        self.runtime = runtime  # `channels.Runtime`: restarts dead samplers (None: no restarts)
        p = channels.prompts
        self.router = p if isinstance(p, Router) else Router([p])
        self.timeline = timeline
        self.state = OrchestratorState()
        self.stats = StepStats()
        self.lengths = LengthModel()
        self.fixed = spec.batching == "fixed"
        self._wait_span: list[float] | None = None
        # schedule.auto_lag.LagControl: a step record -> K of the next window (None: K fixed)
        self.lag_control: Callable[[dict[str, Any]], int] | None = None
        # schedule.watchdog: after a rollback, True for a group of discarded policy versions
        self.reject: Callable[[Group], bool] | None = None
        self.recorder: ScheduleRecorder | None = None  # run.record_schedule (schedule.record)

    # ---- start ------------------------------------------------------------------------------
    def wait_ready(self, timeout: float) -> None:
        """Block until every sampler reported `ready` (built, holding version 0)."""
        deadline = time.monotonic() + timeout
        while len(self.state.ready) < self.ch.num_samplers:
            msg = self.ch.groups.get(self.opts.poll_s)
            if msg is not None:
                self.receive(msg)
            else:
                self.health()
                self.recover()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"samplers not ready after {timeout:.0f}s ({len(self.state.ready)} ready)"
                )

    def start(self) -> None:
        """Start the clocks and issue the first work (before the initial evaluation, so that
        samplers generate while the trainer evaluates)."""
        self.stats.start()
        self.state.t_last_msg = self.stats.t_start
        self.issue()

    # ---- the loop -----------------------------------------------------------------------------
    def run(self) -> None:
        """Until `steps` versions are trained.

        Consumes: sampler messages (groups, aborted groups, counters).
        Produces: prompt requests (as admission allows), one optimizer step and one weight
        publish per window with informative groups, one record per step (`after_step`).
        Waits for: groups, when no window is complete (`runtime/trainer_wait`).
        Unblocked by: a sampler finishing a group; a dead sampler is restarted and its work
        issued again; a stall raises."""
        st = self.state
        chaos = random.Random(self.opts.chaos_seed)
        next_kill = self.stats.t_start + self.opts.chaos_every_s
        while self.learner.version < self.opts.steps:
            self.health()  # a stop request surfaces here, between messages
            if self.stats.kills < self.opts.chaos_kills and time.perf_counter() > next_kill:
                assert self.runtime is not None, "fault injection needs a runtime"
                # a sampler that holds work, if any: killing an idle one tests little
                held = [i for i, n in enumerate(self.router.load) if n > 0]
                self.runtime.kill(chaos.choice(held or list(range(self.ch.num_samplers))))
                self.stats.kills += 1
                next_kill = time.perf_counter() + self.opts.chaos_every_s
            self.recover()
            self.issue()
            t0 = time.perf_counter()
            msg = self.ch.groups.get(self.opts.poll_s)
            t1 = time.perf_counter()
            self.stats.wait_s += t1 - t0
            self._waited(t0, t1)
            if msg is None:
                self._check_silent(t1)
                self._check_stall(t1)
                continue
            st.t_last_msg = t1
            self.receive(msg)
            self._close_ready_windows()
        self.stats.t_end = time.perf_counter()
        self._waited(0.0, 0.0)  # flush the open wait interval

    def _close_ready_windows(self) -> None:
        while (
            self.learner.version < self.opts.steps
            and (groups := self._complete_window()) is not None
        ):
            self.close_window(groups)

    # ---- issuing ------------------------------------------------------------------------------
    def issue(self) -> None:
        """Issue every prompt request the schedule and admission control allow now."""
        self._issue()
        self.router.push()

    def _issue(self) -> None:
        st, K, B = self.state, self.spec.max_lag, self.opts.batch_prompts
        left = self.opts.steps - self.learner.version  # steps still to train
        if left <= 0:
            return
        while st.reissue:  # requests of a dead sampler come first
            if not self.router.put(st.reissue[0], timeout=0):
                return
            st.reissue.popleft()
        if self.fixed:
            while st.batches_issued < st.windows + min(K + 1, left):
                st.batches_issued += 1
                self._issue_batch(st.batches_issued - 1, self._next(B))
            return
        while True:  # AReaL: accepted + running stays within (K + 1) x B of what was consumed
            if st.unsent is None:
                held = self.opts.min_lag and st.need  # the open window's refills first
                if held or st.issued - st.out_of_bound - st.consumed >= min(K + 1, left) * B:
                    return
                st.unsent = self._request(*self._next(1)[0], batch=-1)
            if not self.router.put([st.unsent], timeout=0):
                return  # queue full: sent after the next message
            st.unsent = None

    def _issue_batch(self, b: int, items: list[tuple[Prompt, int]]) -> None:
        """Fixed batching: batch `b` (or dynamic-sampling draws for it) in one chunk per sampler."""
        reqs = [self._request(p, g, batch=b) for p, g in items]
        n = sum(self.router.live) or 1
        for chunk in filter(
            None, (reqs[i * len(reqs) // n : (i + 1) * len(reqs) // n] for i in range(n))
        ):
            if not self.router.put(chunk, timeout=self.opts.stall_timeout_s):
                raise TimeoutError("prompt queue full: samplers are not taking work")
        self.state.batch_left[b] = self.state.batch_left.get(b, 0) + len(reqs)

    def _next(self, n: int) -> list[tuple[Prompt, int]]:
        """The next `n` prompts to issue, with their group sizes. Drawn B at a time, as the
        synchronous loop draws them; tail batching draws `tail_pool` x B and sorts them by
        expected completion length (schedule.tail)."""
        st = self.state
        while len(st.queue) < n:
            unit = self.opts.batch_prompts
            if self.spec.prompt_order == "by_expected_length":
                unit *= self.opts.tail_pool
            prompts = self.learner.draw(unit)
            items = list(zip(prompts, self.learner.group_sizes(prompts)))
            if self.spec.prompt_order == "by_expected_length":
                items.sort(key=lambda it: self.lengths.expected(it[0]))
            st.queue.extend(items)
        return [st.queue.popleft() for _ in range(n)]

    def _request(self, prompt: Prompt, group_size: int, batch: int) -> PromptRequest:
        st = self.state
        seeds = tuple(self.learner.seeds(prompt, group_size + self.opts.redundant))
        req = PromptRequest(st.issued, prompt, seeds, group_size, self.learner.version, batch)
        st.outstanding[req.group_id] = req
        st.issued += 1
        if self.opts.min_lag:
            st.issue_window[req.group_id] = st.windows
        return req

    # ---- receiving ------------------------------------------------------------------------------
    def receive(self, msg: SamplerMessage) -> None:
        st = self.state
        if msg.kind == "error":
            raise msg.failure()
        if msg.report is None or self.stats.add_report(msg.report):  # else: a dead incarnation's
            for kind, t0, t1 in msg.report.intervals if msg.report else ():
                self._interval(f"sampler{msg.sampler_id}", kind, t0, t1)
            now = st.heard[msg.sampler_id] = time.perf_counter()
            if msg.kind == "ready":
                st.ready.add(msg.sampler_id)
                self.router.up(msg.sampler_id)
                if msg.sampler_id in self.stats.dead_at:
                    t_dead = self.stats.dead_at[msg.sampler_id]
                    self._interval(f"sampler{msg.sampler_id}", "down", t_dead, now)
                self.stats.sampler_back(msg.sampler_id, now)
        if msg.kind not in ("group", "aborted"):
            self._record(msg, None)
            return
        assert msg.request is not None and msg.group is not None
        gid = msg.request.group_id
        self.router.done(gid)  # a late copy too: a sampler that sent it holds it no more
        if gid in st.lost_ids or gid not in st.outstanding:  # its sampler was declared dead
            st.lost_ids.discard(gid)
            self.stats.late_groups += 1
            self._record(msg, "late")
            return
        req = st.outstanding.pop(gid)
        st.unqueue(gid)  # back from a dead sampler before its resend went out: not sent again
        self.stats.delivered_group(msg.sampler_id, msg.group)
        self.learner.ledger.generated += 1
        self.learner.ledger.count_episodes(msg.group)
        if msg.kind == "aborted":
            self.learner.ledger.aborted += 1
            self._out_of_bound(req)
            self._record(msg, "aborted")
            return
        group = msg.group
        self.lengths.update(group.prompt, [s.num_tokens for s in group.samples])
        if self.reject is not None and self.reject(group):
            discard(self.learner.ledger, self.stats, [group])
            self._out_of_bound(req)
            self._record(msg, "discarded")
            return
        if group.lag(self.learner.version) > self.spec.max_lag and self.opts.lag_policy != "keep":
            self.learner.ledger.stale += 1
            self.stats.stale_tokens += group.num_tokens
            self._out_of_bound(req)
            self._record(msg, "stale")
            return
        self._record(msg, "window")
        if self.fixed:
            st.batches.setdefault(req.batch, []).append((req.group_id, group))
            st.batch_left[req.batch] -= 1
        else:
            st.window.append((req.group_id, group))

    def _record(self, msg: SamplerMessage, verdict: str | None) -> None:
        """run.record_schedule: the message, in the order taken, and what became of its group."""
        if self.recorder is not None:
            self.recorder.message(msg, verdict)

    # ---- failures -------------------------------------------------------------------------------
    def recover(self) -> None:
        """Take back the requests of samplers the runtime restarted and issue them again."""
        if self.runtime is None:
            return
        t_dead = time.perf_counter()  # before `check` starts any replacement (a local one)
        dead = self.runtime.check()
        if not dead:
            return
        # first every message already here (the dead one's last groups and counters among
        # them); a reader that prefetches (Ray) sees a message only once its outstanding get
        # has brought it, so its gets wait `poll_s`. A replacement's (ready after `t_dead`)
        # wait until its predecessor is settled, else `sampler_lost` would mark it down
        wait = self.opts.poll_s if self.ch.groups.prefetch else 0.0
        later: list[SamplerMessage] = []
        # a dead sampler's last groups may still be coming in (`settling`): late, not lost
        while (msg := self.ch.groups.get(wait)) is not None or self.ch.groups.settling():
            if msg is None:
                continue
            r = msg.report
            if msg.sampler_id in dead and r is not None and r.t_ready > t_dead:
                later.append(msg)
            else:
                self.receive(msg)
        for i in dead:
            self.sampler_lost(i, t_dead)
        for msg in later:
            self.receive(msg)
        self._close_ready_windows()

    def sampler_lost(self, i: int, at: float | None = None) -> None:
        """Sampler `i` died (seen `at`, by default now). Requests it had started generating
        are lost (ledger) and issued again, each as a new request for the same prompt, seeds
        and batch; those it had not started are sent again as they were. From now on only
        reports of an incarnation ready after `at` (its replacement's) count."""
        st, now = self.state, time.perf_counter() if at is None else at
        st.ready.discard(i)
        st.heard.pop(i, None)
        report = self.stats.reports.get(i)
        self.stats.sampler_died(i, now)
        # as of its last report: a group started since then counts as not started (no tokens
        # of it were reported, so none are counted lost)
        started, queued = self.router.down(i, report.started if report else 0)
        again: list[PromptRequest] = [st.outstanding[gid] for gid in queued]
        self.stats.requeued += len(queued)
        for gid in started:
            req = st.outstanding.pop(gid)
            st.lost_ids.add(gid)
            self.learner.ledger.generated += 1
            if req.retries >= self.opts.max_request_retries:
                self._poisoned(req)
                continue
            self.learner.ledger.lost += 1
            new = PromptRequest(
                st.issued, req.prompt, req.seeds, req.group_size, self.learner.version, req.batch,
                req.retries + 1,
            )  # fmt: skip
            st.issued += 1
            st.outstanding[new.group_id] = new
            again.append(new)
            if gid in st.issue_window:  # min_lag: it takes the lost one's place in its window
                st.issue_window[new.group_id] = st.issue_window[gid]
            if not self.fixed:
                st.out_of_bound += 1  # the new request takes the lost one's place in the bound
        st.requeue(again, self.fixed)

    def _poisoned(self, req: PromptRequest) -> None:
        """Give up a request lost with its sampler once more than the retries allow: a
        prompt that crashes every sampler it reaches must not use up `max_restarts`."""
        self.learner.ledger.poisoned += 1
        self._out_of_bound(req)  # its window no longer waits for it; admission frees its place
        warnings.warn(
            f"prompt {req.prompt.id!r} (group {req.group_id}) was lost with its sampler "
            f"{req.retries + 1} times: dropped (ledger: poisoned; runtime.max_request_retries "
            f"= {self.opts.max_request_retries})",
            RuntimeWarning,
            stacklevel=2,
        )

    def _check_silent(self, now: float) -> None:
        """Kill a sampler that holds work and has sent nothing for `sampler_timeout_s` (its
        restart then goes through `recover`)."""
        if self.runtime is None:
            return
        for i, t in list(self.state.heard.items()):
            if self.router.load[i] > 0 and now - t > self.opts.sampler_timeout_s:
                self.state.heard.pop(i)
                self.stats.hung += 1
                self.runtime.kill(i)

    def _check_stall(self, now: float) -> None:
        """Raise when no message came for `stall_timeout_s` (with none in flight, none can)."""
        st = self.state
        if now - st.t_last_msg <= self.opts.stall_timeout_s:
            return
        if st.outstanding:
            raise TimeoutError(
                f"no group from the samplers for {self.opts.stall_timeout_s:.0f}s "
                f"with {len(st.outstanding)} in flight"
            )
        raise RuntimeError(pipeline_state.deadlock(st, self.opts.batch_prompts, self.opts.min_lag))

    def _out_of_bound(self, req: PromptRequest) -> None:
        if self.fixed:
            self.state.batch_left[req.batch] -= 1
        else:
            self.state.out_of_bound += 1

    def _complete_window(self) -> list[Group] | None:
        """Groups that complete what the open window waits for, in issue order; else None."""
        st = self.state
        if self.fixed:
            w = st.windows
            if st.batch_left.get(w, -1) != 0:
                return None
            del st.batch_left[w]
            pairs = [p for p in st.batches.pop(w, []) if not self._aged_out(p[1])]
        else:
            st.window = [p for p in st.window if not self._aged_out(p[1])]
            pairs = pipeline_state.take(st, self.opts.batch_prompts, self.opts.min_lag)
            if not pairs:  # (it takes at least one group)
                return None
        return [g for _, g in sorted(pairs, key=lambda p: p[0])]

    def _issue_refills(self, n: int) -> None:
        """min_lag: `n` refills of the open window's filtered groups, as issued `min_lag` windows
        ago (younger, it would wait for them for ever: admission waits for it). Nothing else is
        admitted meanwhile: made at the weights before its step, it would age past K."""
        st = self.state
        for prompt, g in self._next(n):
            req = self._request(prompt, g, batch=-1)
            st.issue_window[req.group_id] = st.windows - min(self.opts.min_lag, st.windows)
            st.reissue.append([req])  # sent first, with any a dead sampler left

    def _aged_out(self, group: Group) -> bool:
        """True (and counted stale) when `group` waited past the lag bound K (policy not keep)."""
        if self.opts.lag_policy == "keep":
            return False
        if group.lag(self.learner.version) <= self.spec.max_lag:
            return False
        self.learner.ledger.stale += 1
        self.stats.stale_tokens += group.num_tokens
        if self.recorder is not None:
            self.recorder.aged(group)
        if not self.fixed:
            self.state.out_of_bound += 1  # its place in the admission bound is free again
        return True

    def close_window(self, groups: list[Group]) -> None:
        """Settle `groups` (filters, advantages); with dynamic sampling, wait for replacements
        of filtered groups; then one optimizer step on the kept groups, publish, issue, record."""
        st, B = self.state, self.opts.batch_prompts
        st.step_groups += groups
        filtered = self.learner.ledger.filtered.copy()
        try:
            st.kept += self.learner.settle(groups) if groups else []
        except BaseException:  # none of them settled: back, not trained (in flight)
            self.learner.ledger.filtered, st.unsettled = filtered, groups
            raise
        if self.opts.dynamic_sampling and len(st.kept) < B and st.extra < self.opts.max_extra_draws:
            more = min(B - len(st.kept), self.opts.max_extra_draws - st.extra)
            st.extra += more
            if self.fixed:  # as the synchronous loop: draw what is missing, into this batch
                prompts = self.learner.draw(more)
                self._issue_batch(st.windows, list(zip(prompts, self.learner.group_sizes(prompts))))
            else:
                st.need = more
                if self.opts.min_lag:
                    self._issue_refills(more)
            return
        groups, kept, extra = st.step_groups, st.kept, st.extra
        st.step_groups, st.extra = [], 0  # `kept` stays until trained: in flight if it raises
        st.windows += 1
        if not kept:
            st.empty_in_row += 1
            if st.empty_in_row > self.opts.max_empty_windows:
                raise RuntimeError(
                    f"{st.empty_in_row} windows in a row had no informative group: check the reward"
                )
            self.issue()
            return
        st.empty_in_row = 0
        self.stats.trained_keys(kept)
        lag = group_lag(kept, self.learner.version, self.spec.max_lag)
        t0 = time.perf_counter()
        metrics = self.learner.train(kept)
        t1 = time.perf_counter()
        st.kept = []
        self.learner.ledger.count_step(kept, metrics)
        publish_s = self.learner.publish(self.ch)
        t2 = time.perf_counter()
        self._interval("trainer", "train", t0, t1)
        self._interval("trainer", "weight_sync", t1, t2)
        self.issue()  # samplers get the next work before evaluation and checkpointing
        record = {
            "step": self.learner.version,
            "version": self.learner.version,
            **self.stats.record(groups, kept, metrics, lag, t1 - t0, publish_s),
            "queue/depth": self.ch.groups.depth(),
            "queue/in_flight": len(st.outstanding),
            "filters/extra_draws": extra,
            **self.learner.ledger.flat(),
        }
        if self.lag_control is not None:  # K changes here, between windows, and only here
            self.spec = replace(self.spec, max_lag=self.lag_control(record))
            self.issue()
            record["queue/in_flight"] = len(st.outstanding)  # with what the new K admitted
        self.learner.after_step(record, groups)  # evaluation, checkpoint: between two steps
        self.stats.step_begins()

    # ---- checkpoint ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The work in the pipeline, as JSON (`pipeline_state.to_json`); between steps only."""
        return pipeline_state.to_json(self.state, self.lengths)

    def load_state_dict(self, d: dict[str, Any]) -> None:
        """Restore `state_dict()` before `start`: the requests go out again first."""
        pipeline_state.load_json(self.state, d, self.fixed, self.lengths)

    def summary(self) -> dict[str, Any]:
        """Run-level staleness and utilisation (over the whole loop)."""
        st = self.state
        return {
            "schedule": self.spec.name,
            **self.stats.summary(),
            "groups_issued": st.issued,
            "groups_unfinished": len(st.outstanding),
            "windows": st.windows,
        }

    def leftover(self) -> int:
        """Groups received but never trained or dropped (the end of the run cut them off)."""
        return pipeline_state.leftover(self.state)

    def settle_unfinished(self) -> int:
        """At the end of the run: count the requests samplers had started and not delivered
        in the ledger (`unfinished`), and the received groups never trained (`in_flight`).
        Returns the tokens generated for both (as of the samplers' last reports), which never
        reach an optimizer step."""
        st, led = self.state, self.learner.ledger
        led.in_flight = self.leftover()
        for i in range(len(self.router.inboxes)):
            report = self.stats.reports.get(i)
            led.unfinished += len(self.router.held(i, report.started if report else 0)[0])
        led.generated += led.unfinished
        tokens = sum(self.stats.undelivered_tokens(i) for i in self.stats.reports)
        received = [g for _, g in st.window] + [g for v in st.batches.values() for _, g in v]
        return tokens + sum(g.num_tokens for g in received + st.kept + st.unsettled)

    def _waited(self, t0: float, t1: float) -> None:
        """Extend the trainer's open wait interval, or close it and open a new one."""
        span = self._wait_span
        if span is not None and t0 - span[1] < 2e-3:
            span[1] = t1
            return
        if span is not None and span[1] - span[0] > 1e-3:
            self._interval("trainer", "wait", span[0], span[1])
        self._wait_span = [t0, t1] if t1 > t0 else None

    def _interval(self, actor: str, kind: str, t0: float, t1: float) -> None:
        if self.timeline is not None:
            o = self.stats.t_start
            self.timeline.interval(actor, kind, max(t0 - o, 0.0), max(t1 - o, 0.0))
