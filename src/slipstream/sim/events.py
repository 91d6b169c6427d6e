"""The discrete-event loop behind `simulate`.

Why a small `heapq` loop and not `simpy`: the model has only a handful of event kinds, and the
expensive part, decode, is not simulated step by step. Between two events an engine's batch
is fixed and its decode step time is linear in the step index, so the time to the next finished
sequence is one closed-form sum (cost.DecodeModel). Events are then one per finished sequence
(continuous batching) or one per engine per batch (fixed batches, whose whole timeline is
computed with numpy in `share_times`). A generator-based framework would add a coroutine switch
per event and a dependency for no modelling gain; lazy invalidation by epoch counters is all
the cancellation needed.

The orchestrator it models (the same `ScheduleSpec` fields the real one reads):

- fixed batching (`sync`, `tail_batching`, `double_buffer`): batch b is cut into one share per
  engine; an engine starts its share when it has finished the previous one and its weights
  satisfy `b - version <= max_lag`, loading the newest weights first (between batches). The
  trainer trains batch b when every share is done.
- continuous batching (`async`, `pipeline`): an engine refills a slot as soon as a sequence
  ends. A new group (G samples on one engine, one shared prefill) is admitted only if the batch
  it will land in, `taken + live // B`, is within `max_lag` of the engine's weights. The trainer
  takes the first B groups to finish.
- weights between batches (`async`): a blocked engine drains its in-flight sequences, then
  loads the newest weights. In flight (`pipeline`): at every publish each engine pauses for the
  transfer between two decode steps and goes on with its sequences under the new weights.

A published step costs the trainer the weight push (disaggregated) and the engine the load.
Failures (failures.py) arrive at rate N / c; a failure of a trainer GPU, of any GPU of a
colocated or fixed-batch run, stops the job for the recovery time and rolls it back to the last
checkpoint; a failure of a sampler GPU under continuous batching takes only that engine down,
losing its in-flight groups, while the others go on (async RL's natural resilience).
"""

from __future__ import annotations

import heapq
from collections import Counter, deque

import numpy as np

from slipstream.sim.cost import (
    DecodeModel,
    prefill_time,
    train_time,
    weight_sync_time,
)
from slipstream.sim.engine import EngineState, PromptSource, share_times
from slipstream.sim.simulator import SimConfig, SimResult

FINISH, SHARE_DONE, TRAIN_DONE, TRAINER_FREE, FAIL, ENGINE_UP, RESTART = range(7)
NEVER = 1 << 62


class EventLoop:
    """State and handlers of one simulated run; `run()` returns its `SimResult`."""

    def __init__(self, cfg: SimConfig) -> None:
        c, w, s = cfg.cluster, cfg.workload, cfg.schedule
        self.cfg = cfg
        self.decode = DecodeModel.build(c.model, c.hardware, c.engine_tp)
        self.slots = cfg.engine_slots()
        self.prompt = float(w.prompt_len)
        self.prefill_s = w.prefills_per_group * prefill_time(
            c.model, c.hardware, w.prompt_len, c.engine_tp
        )
        self.sync_s = weight_sync_time(c.model, c.hardware, c.colocated)
        self.B, self.G, self.K = w.batch_prompts, w.group_size, s.max_lag
        self.continuous = s.batching == "continuous"
        self.drain = cfg.drain
        self.in_flight = s.weight_sync == "in_flight"
        self.rng = np.random.default_rng(cfg.seed)
        self.source = PromptSource(w, s.prompt_order == "by_expected_length", self.rng)
        self.engines = [EngineState(i) for i in range(c.n_engines)]
        # The orchestrator spreads groups over engines: each holds at most its share of the
        # (K + 1) batches the lag bound lets be in flight.
        self.quota = max(1, -(-(self.K + 1) * self.B // len(self.engines)))
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        self.now = 0.0
        # Trainer: `version` = optimizer steps done; `taken` = batches taken.
        self.version = self.taken = 0
        self.trainer_busy = False
        self.trainer_epoch = 0
        self.trainer_busy_s = 0.0
        self.step_end = [0.0]
        self.step_tokens: list[float] = []
        # Samples and groups of continuous batching; group g holds samples gG .. gG+G-1.
        self.s_len: list[int] = []
        self.s_start: list[int] = []
        self.s_ver: list[int] = []
        self.s_vsum: list[int] = []
        self.g_left: list[int] = []
        self.g_ver: list[int] = []
        self.g_alive: list[bool] = []
        self.ready: deque[int] = deque()
        self.live = 0  # admitted groups not yet trained or discarded
        # Fixed batching: batch index -> record (see _batch).
        self.batches: dict[int, list] = {}
        self.prepared: deque[list] = deque()  # timed batches not yet started
        self.lag_counts: Counter[int] = Counter()
        self.token_lag_sum = 0.0
        self.sample_lag_sum = 0.0
        self.token_sum = 0.0
        self.training = 0  # groups in the batch being trained
        self.woken = False
        self.groups: Counter[str] = Counter()
        # Failures.
        self.failures = 0
        self.lost_gpu_s = 0.0
        self.ckpt_version = 0
        self.ckpt_t = 0.0
        self.job_down_until = 0.0

    # -- loop ---------------------------------------------------------------------------

    def _push(self, t: float, kind: int, idx: int, epoch: int) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, idx, epoch))

    def run(self) -> SimResult:
        handlers = (
            self._on_finish,
            self._on_share_done,
            self._on_train_done,
            self._on_trainer_free,
            self._on_fail,
            self._on_engine_up,
            self._on_restart,
        )
        for e in self.engines:
            self._engine_go(e)
        if self.cfg.failures:
            self._schedule_failure()
        steps = self.cfg.steps
        while self.heap and self.version < steps:
            t, _, kind, idx, epoch = heapq.heappop(self.heap)
            self.now = t
            handlers[kind](idx, epoch)
        if self.version < steps:
            raise RuntimeError(f"simulation stalled at step {self.version} (a bug: please report)")
        return self._result()

    # -- engines: continuous batching ---------------------------------------------------

    def _engine_go(self, e: EngineState) -> None:
        if e.down:
            return
        e.t = max(e.t, self.now)
        if self.continuous:
            self._fill(e)
            self._schedule(e)
        else:
            self._try_share(e)

    def _schedule(self, e: EngineState) -> None:
        e.epoch += 1
        if e.heap:
            k = e.heap[0][0] - e.j
            self._push(e.t + self.decode.time_for_steps(e.n, e.ctx, k), FINISH, e.idx, e.epoch)

    def _on_finish(self, i: int, epoch: int) -> None:
        e = self.engines[i]
        if epoch != e.epoch:
            return
        e.advance(self.decode, e.heap[0][0] - e.j)
        e.t = self.now  # the same sum, without float drift
        self._pop_finished(e)
        self._fill(e)
        self._schedule(e)

    def _pop_finished(self, e: EngineState) -> None:
        G = self.G
        while e.heap and e.heap[0][0] == e.j:
            _, sid = heapq.heappop(e.heap)
            length = self.s_len[sid]
            e.n -= 1
            e.ctx = e.ctx - self.prompt - length if e.n else 0.0
            self.s_vsum[sid] = e.version_sum(self.s_start[sid], self.s_ver[sid])
            g = sid // G
            self.g_left[g] -= 1
            if self.g_left[g] == 0 and self.g_alive[g]:
                e.groups -= 1
                self.ready.append(g)
                self._try_train()

    def _fill(self, e: EngineState) -> None:
        """Give free slots to waiting samples, admitting new groups while the lag bound allows."""
        G = self.G
        while e.n < self.slots:
            if not e.pending and not self._admit(e):
                break
            sid = e.pending.popleft()
            heapq.heappush(e.heap, (e.j + self.s_len[sid], sid))
            e.n += 1
            e.ctx += self.prompt
            self.s_start[sid] = e.j
            self.s_ver[sid] = e.version
            g = sid // G
            if e.version < self.g_ver[g]:
                self.g_ver[g] = e.version
        # Weights between batches: a drained, blocked engine loads the newest weights.
        if e.blocked and e.n == 0 and not self.in_flight and self.version > e.version:
            self._load(e)
            self._fill(e)

    def _admit(self, e: EngineState) -> bool:
        if e.down or e.groups >= self.quota:
            return False
        # `drain`: the orchestrator's bound, live groups < min(K + 1, steps left) x B, so the
        # last steps issue only what they will train, as a recorded run's last steps do
        ending = self.drain and self.live >= (self.cfg.steps - self.taken) * self.B
        if ending or self.taken + self.live // self.B - e.version > self.K:
            e.blocked = True
            return False
        e.blocked = False
        lengths = self.source.next_group()
        base = len(self.s_len)
        self.s_len.extend(lengths.tolist())
        self.s_start.extend([0] * self.G)
        self.s_ver.extend([0] * self.G)
        self.s_vsum.extend([0] * self.G)
        self.g_left.append(self.G)
        self.g_ver.append(NEVER)
        self.g_alive.append(True)
        e.pending.extend(range(base, base + self.G))
        e.groups += 1
        self.live += 1
        self.groups["admitted"] += 1
        # Prefill once per group when its samples share the prompt (prefix caching).
        e.t += self.prefill_s
        e.busy_s += self.prefill_s
        return True

    def _load(self, e: EngineState) -> None:
        """Load the newest weights (between batches); the engine does nothing meanwhile."""
        e.t = max(e.t, self.now) + self.sync_s
        e.set_version(self.version)

    def _sync_to_now(self, e: EngineState) -> None:
        """Advance an engine to the first step boundary at or after now."""
        if e.n == 0 or e.t >= self.now:
            e.t = max(e.t, self.now)
            return
        kmax = e.heap[0][0] - e.j
        e.advance(self.decode, self.decode.steps_within(e.n, e.ctx, self.now - e.t, kmax))
        if e.j == e.heap[0][0]:
            self._pop_finished(e)

    def _abort_stale(self, e: EngineState) -> None:
        """Abort sequences of groups that can no longer be trained within max_lag."""
        limit, G = self.version - self.K, self.G
        if not any(self.g_ver[sid // G] < limit for _, sid in e.heap):
            return
        keep = []
        for end, sid in e.heap:
            g = sid // G
            if self.g_ver[g] < limit:
                e.n -= 1
                e.ctx -= self.prompt + e.j - self.s_start[sid]
                if self.g_alive[g]:
                    e.groups -= 1
                self._discard(g, "aborted")
            else:
                keep.append((end, sid))
        heapq.heapify(keep)
        e.heap = keep
        e.ctx = e.ctx if e.n else 0.0
        e.pending = deque(sid for sid in e.pending if self.g_alive[sid // G])

    def _discard(self, g: int, why: str) -> None:
        if self.g_alive[g]:
            self.g_alive[g] = False
            self.live -= 1
            self.groups[why] += 1

    # -- engines: fixed batches ---------------------------------------------------------

    def _try_share(self, e: EngineState) -> None:
        """Start this engine's share of its next batch if the lag bound allows."""
        if e.down or e.in_share:
            return
        e.t = max(e.t, self.now)
        if self.version > e.version:
            self._load(e)
        b = e.next_batch
        if b - e.version > self.K:
            e.waiting = True
            return
        e.waiting = False
        info = self._batch(b)
        dur, seq_s, n, tokens = info[2][e.idx]
        e.busy_s += dur
        e.slot_s += seq_s
        e.t += dur
        e.share_end = e.t
        e.in_share = True
        info[1].append((e.version, n, tokens))
        e.epoch += 1
        self._push(e.t, SHARE_DONE, e.idx, e.epoch)

    def _batch(self, b: int) -> list:
        """Batch b: [shares done, (version, samples, tokens) per share started, per engine
        (seconds, sequence-seconds, samples, tokens)]."""
        if b not in self.batches:
            if not self.prepared:
                self._prepare_batches(16)
            self.batches[b] = [0, [], self.prepared.popleft()]
            self.groups["admitted"] += self.B
        return self.batches[b]

    def _prepare_batches(self, k: int) -> None:
        """Draw `k` batches and time every engine's share of each in one numpy pass. Engine i
        takes the i-th contiguous chunk (group-major, so a group's samples mostly share an
        engine and its prefill)."""
        n_eng, G = len(self.engines), self.G
        drawn = self.source.next_batches(k)  # k rounded up to whole tail-batching pools
        flats = drawn.reshape(len(drawn), -1)
        cuts = [i * flats.shape[1] // n_eng for i in range(n_eng + 1)]
        shares = [flat[cuts[i] : cuts[i + 1]] for flat in flats for i in range(n_eng)]
        dur, seq_s = share_times(self.decode, self.prompt, shares, self.slots)
        groups = [
            (cuts[i + 1] - 1) // G - cuts[i] // G + 1 if cuts[i + 1] > cuts[i] else 0
            for i in range(n_eng)
        ]
        for j in range(len(flats)):
            per_engine = []
            for i in range(n_eng):
                x, at = shares[j * n_eng + i], j * n_eng + i
                seconds = float(dur[at]) + groups[i] * self.prefill_s
                per_engine.append((seconds, float(seq_s[at]), len(x), int(x.sum())))
            self.prepared.append(per_engine)

    def _on_share_done(self, i: int, epoch: int) -> None:
        e = self.engines[i]
        if epoch != e.epoch:
            return
        e.in_share = False
        info = self.batches[e.next_batch]
        info[0] += 1
        e.next_batch += 1
        if info[0] == len(self.engines):
            self._try_train()
        self._try_share(e)

    # -- trainer ------------------------------------------------------------------------

    def _take_continuous(self) -> tuple[float, float] | None:
        """Take the first B finished groups within the lag policy: (tokens, mean length)."""
        batch: list[int] = []
        while len(batch) < self.B and self.ready:
            g = self.ready.popleft()
            if not self.g_alive[g]:
                continue
            if self.taken - self.g_ver[g] > self.K and self.cfg.lag_policy != "keep":
                self._discard(g, "dropped_stale")
                self.woken = True  # fewer live groups may unblock admission
                continue
            batch.append(g)
        if len(batch) < self.B:
            self.ready.extendleft(reversed(batch))
            return None
        b, G, completion = self.taken, self.G, 0
        for g in batch:
            for sid in range(g * G, g * G + G):
                length = self.s_len[sid]
                completion += length
                lag = b - self.s_ver[sid]
                self.lag_counts[lag] += 1
                self.token_lag_sum += b * length - self.s_vsum[sid]
                self.sample_lag_sum += lag * length
            self.g_alive[g] = False
        self.live -= self.B
        self.token_sum += completion
        return self._train_tokens(completion), completion / (self.B * G)

    def _take_fixed(self) -> tuple[float, float] | None:
        info = self.batches.get(self.taken)
        if info is None or info[0] < len(self.engines):
            return None
        del self.batches[self.taken]
        completion = 0
        for version, n, tokens in info[1]:
            lag = self.taken - version
            self.lag_counts[lag] += n
            self.token_lag_sum += lag * tokens
            self.sample_lag_sum += lag * tokens
            completion += tokens
        self.token_sum += completion
        n_samples = self.B * self.G
        return self._train_tokens(completion), completion / n_samples

    def _train_tokens(self, completion: float) -> float:
        """Tokens the trainer's cost line counts for a step that generated `completion`."""
        frac = self.cfg.workload.trained_frac
        if frac is not None:
            return frac * completion
        return completion + self.B * self.G * self.prompt

    def _try_train(self) -> None:
        if self.trainer_busy or self.now < self.job_down_until:
            return
        self.woken = False
        took = self._take_continuous() if self.continuous else self._take_fixed()
        if took is not None:
            self._start_training(*took)
        if self.woken:  # only now: waking engines may finish groups and call back here
            self._wake_blocked()

    def _start_training(self, tokens: float, mean_len: float) -> None:
        self.training = self.B
        self.taken += 1
        c = self.cfg.cluster
        dur = train_time(c.model, c.hardware, tokens, c.trainer_gpus, (self.prompt + mean_len) / 2)
        self.trainer_busy = True
        self.trainer_busy_s += dur
        self.step_tokens.append(tokens)
        self._push(self.now + dur, TRAIN_DONE, 0, self.trainer_epoch)

    def _on_train_done(self, _: int, epoch: int) -> None:
        if epoch != self.trainer_epoch:
            return
        self.version += 1
        self.groups["trained"] += self.training
        self.training = 0
        self.step_end.append(self.now)
        extra = 0.0 if self.cfg.cluster.colocated else self.sync_s
        f = self.cfg.failures
        # A checkpoint at the first step end once the interval has passed (1e-9: float sums).
        if f and self.now - self.ckpt_t >= f.recovery.checkpoint_interval_h * 3600 * (1 - 1e-9):
            self.ckpt_version, self.ckpt_t = self.version, self.now
            extra += f.recovery.checkpoint_write_h * 3600
        self._push(self.now + extra, TRAINER_FREE, 0, self.trainer_epoch)
        if self.version < self.cfg.steps:  # the run ends here: start nothing new
            self._publish()

    def _on_trainer_free(self, _: int, epoch: int) -> None:
        if epoch == self.trainer_epoch:
            self.trainer_busy = False
            self._try_train()

    def _publish(self) -> None:
        """New weights exist: in-flight engines swap now; others take them when idle."""
        abort = self.cfg.lag_policy == "abort"
        for e in self.engines:
            if e.down:
                continue
            if self.in_flight:
                self._sync_to_now(e)
                e.t += self.sync_s  # decoding pauses while the weights arrive
                e.set_version(self.version)
                if abort:
                    self._abort_stale(e)
                self._fill(e)
                self._schedule(e)
            elif self.continuous:
                changed = abort or (e.blocked and e.n == 0)
                if abort:
                    self._sync_to_now(e)
                    self._abort_stale(e)
                if e.blocked and e.n == 0:  # drained and waiting for these weights
                    e.t = max(e.t, self.now)
                    self._fill(e)
                if changed:
                    self._schedule(e)
            elif e.waiting:
                self._try_share(e)

    def _wake_blocked(self) -> None:
        for e in self.engines:
            if e.blocked and not e.down and self.continuous:
                self._sync_to_now(e)
                self._fill(e)
                self._schedule(e)

    # -- failures -----------------------------------------------------------------------

    def _schedule_failure(self) -> None:
        f = self.cfg.failures
        assert f is not None
        rate = f.rate_per_s(self.cfg.cluster.n_gpus)
        self._push(self.now + self.rng.exponential(1 / rate), FAIL, 0, 0)

    def _on_fail(self, _: int, __: int) -> None:
        if not self.heap:  # only failures left to happen: nothing can make progress
            raise RuntimeError(f"simulation stalled at step {self.version} (a bug: please report)")
        self._schedule_failure()
        if self.now < self.job_down_until:
            return  # the job is down: nothing runs to fail
        c = self.cfg.cluster
        gpu = int(self.rng.integers(c.n_gpus))
        engine = (gpu - c.trainer_gpus) // c.engine_tp if gpu >= c.trainer_gpus else None
        if engine is not None and engine >= len(self.engines):
            return  # an idle leftover GPU
        self.failures += 1
        if engine is None or c.colocated or not self.continuous:
            self._job_failure()
        else:
            self._engine_failure(self.engines[engine])

    def _job_failure(self) -> None:
        """Stop everything, recover, and roll back to the last checkpoint."""
        f = self.cfg.failures
        assert f is not None
        down = f.recovery.downtime_h * 3600
        self.lost_gpu_s += self.cfg.cluster.n_gpus * (down + self.now - self.ckpt_t)
        restart = self.now + down
        self.job_down_until = restart
        lost = self.live if self.continuous else self.B * len(self.batches)
        self.groups["lost_failure"] += lost + self.training
        self.training = 0
        self.live = 0
        self.ready.clear()
        self.batches.clear()
        self.version = self.taken = self.ckpt_version
        del self.step_end[self.version + 1 :]
        del self.step_tokens[self.version :]
        self.ckpt_t = restart
        self.trainer_epoch += 1
        self.trainer_busy = False
        for e in self.engines:
            if e.in_share:
                e.busy_s -= max(0.0, e.share_end - self.now)
            e.reset()
            e.t = restart
            e.next_batch = self.version
            e.set_version(self.version)
        self._push(restart, RESTART, 0, self.trainer_epoch)

    def _engine_failure(self, e: EngineState) -> None:
        """One sampler engine goes down; its in-flight groups are lost, the rest go on."""
        f = self.cfg.failures
        assert f is not None
        if e.down:
            return
        self._sync_to_now(e)
        step_s = self.decode.step_time(max(e.n, 1), e.ctx)
        age = sum(e.j - self.s_start[sid] for _, sid in e.heap) * step_s / self.slots
        down = f.recovery.downtime_h * 3600
        self.lost_gpu_s += self.cfg.cluster.engine_tp * (down + age)
        G = self.G
        for sid in [sid for _, sid in e.heap] + list(e.pending):
            self._discard(sid // G, "lost_failure")
        e.reset()
        e.down = True
        self._push(self.now + down, ENGINE_UP, e.idx, e.epoch)
        self._wake_blocked()

    def _on_engine_up(self, i: int, epoch: int) -> None:
        e = self.engines[i]
        if epoch != e.epoch:
            return
        e.down = False
        self._load(e)
        self._engine_go(e)

    def _on_restart(self, _: int, epoch: int) -> None:
        if epoch != self.trainer_epoch:
            return
        for e in self.engines:
            e.down = False
            self._engine_go(e)

    # -- result -------------------------------------------------------------------------

    def _result(self) -> SimResult:
        wall = self.step_end[-1]
        n_eng = len(self.engines)
        # Work accounted ahead of the end (a started share, a prefill) is not in the run.
        ahead = sum(max(0.0, e.t - wall) for e in self.engines)
        busy_s = max(0.0, float(sum(e.busy_s for e in self.engines)) - ahead)
        busy = min(1.0, busy_s / (n_eng * wall))
        slot = min(1.0, float(sum(e.slot_s for e in self.engines)) / (n_eng * self.slots * wall))
        in_flight = self.training + (self.live if self.continuous else self.B * len(self.batches))
        groups = dict(self.groups)
        groups["in_flight_end"] = in_flight
        return SimResult(
            config=self.cfg,
            step_end_s=np.asarray(self.step_end),
            step_tokens=np.asarray(self.step_tokens),
            sampler_busy_frac=busy,
            sampler_slot_util=slot,
            trainer_busy_frac=min(1.0, self.trainer_busy_s / wall),
            lag_counts=dict(sorted(self.lag_counts.items())),
            token_lag_mean=self.token_lag_sum / self.token_sum if self.token_sum else 0.0,
            sample_lag_token_mean=self.sample_lag_sum / self.token_sum if self.token_sum else 0.0,
            groups=groups,
            failures=self.failures,
            lost_gpu_s=self.lost_gpu_s,
            engine_slots=self.slots,
        )
