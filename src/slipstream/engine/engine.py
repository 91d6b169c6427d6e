"""The rollout engine: a fixed pool of sequence slots, continuous batching, in-flight weights.

Each call to `step()` does, in order:

1. apply weights handed over by `load_weights` since the last step: between two decode steps,
   never inside a forward pass;
2. top up the waiting line from the `refill` hook (the prompt source) and admit waiting
   requests into the free slots;
3. one forward that decodes one token for every slot that was live and prefills the prompts
   just admitted, then one sampling call for all of them.

Prefill strategy: whole prompts, prefilled in the same forward as the decode step (a mixed step,
as in vLLM v1 and SGLang), not chunked. Projections and MLPs run once over the flat list of
decode and prompt tokens, unpadded; only attention is split in a decode and a prefill part
(engine.forward). A separate prefill forward costs a whole extra pass of per-layer overhead at
each refill, nearly every step in RLVR, and pads the prompts to the longest. Chunking bounds a
decode step's latency behind a long prompt; RLVR prompts are short next to their completions,
so it buys nothing here (`forward.prefill_part` already takes a start position per row).
`mixed_prefill=False` runs the two as separate forwards, for exact timings; same tokens.

On a GPU (`decode_graph`, on by default with CUDA) a small model's step is bound by launching
kernels, not by running them, so a decode step is a fixed-shape forward over every slot,
captured once per span bucket as a CUDA graph and replayed (engine.forward.DecodeGraph; the same
tokens as the ragged step). Prefill stays eager and runs as its own forward, which then costs
several decode steps; `defer_prefill` (on with graphs) lets free slots wait until the decode
capacity they leave idle pays for one prefill (engine.admission), so admissions come in batches.

A slot freed in step n is refilled in step n+1 (with `defer_prefill`, once the rule says so),
so the pool never waits for the slowest sequence. Every sampled token records its behaviour
log-prob and the engine's `version` then: a sequence that spans a weight update carries both.

Driving it (the asynchronous sampler's loop)::

    engine = Engine(model, eos_id, num_slots, max_len, refill=source.take)
    while running:
        for group in collector.add(engine.step()):
            emit(group)

`refill(n)` is asked for up to `n` requests whenever fewer than `n` are waiting for the `n`
free slots; it may return fewer (none: nothing to do now), or more (they wait), and must not
block: the live sequences wait for it. Callers that push use `engine.add` instead. A
multi-turn episode's turn is a request with `park=True`: see engine.parking.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch

from slipstream.engine.admission import PrefillAdmission
from slipstream.engine.forward import (
    DecodeGraph,
    PartRows,
    SampleGraph,
    SlotKV,
    cat_parts,
    decode_part,
    forward,
    make_plan,
    prefill_part,
    wait_device,
)
from slipstream.engine.packed import PackedWeights
from slipstream.engine.parking import KVPark
from slipstream.engine.request import Completion, Request
from slipstream.engine.sampling import Sampled, fused_default, sample
from slipstream.engine.stats import EngineStats, pass_context
from slipstream.model.llama import CausalLM
from slipstream.types import FinishReason

KVMode = Literal["keep", "recompute"]
# Decode runs over the contiguous range of slots from the first live to the last: its keys are
# a view of the cache. Free slots inside the range ride along as dummy rows; below this density
# of live slots the wasted rows cost more than gathering the live slots' keys.
_MIN_DENSITY = 0.5


@dataclass
class _Slot:
    request: Request
    t_start: float
    tokens: list[int] = field(default_factory=list)
    logp: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    kept_logmass: list[float] | None = None  # a list for a request that filters, else None

    def completion(self, reason: FinishReason, now: float) -> Completion:
        r = self.request
        return Completion(r, self.tokens, self.logp, self.versions, reason, self.t_start, now,
                          self.kept_logmass)  # fmt: skip


@dataclass
class _Decode:
    """The decode rows of a step: slots live before admission, as a range or a gather."""

    rows: slice | torch.Tensor  # cache rows: a contiguous range (free slots ride along) or ids
    slot_ids: torch.Tensor  # [R] slot of each row
    live: torch.Tensor  # [R] long, 1 where the slot was live (0: a free slot riding along)
    order: list[int | None]  # slot of each row, None for free ones
    n_live: int


class Engine:
    """Continuous-batching generator over a `CausalLM` with a slot KV cache.

    Not thread-safe except `load_weights`, which any thread may call while another steps.
    """

    def __init__(
        self,
        model: CausalLM,
        eos_id: int | Iterable[int],
        num_slots: int,
        max_len: int,
        version: int = 0,
        kv_mode: KVMode = "keep",
        trace: bool = False,
        refill: Callable[[int], Iterable[Request]] | None = None,
        mixed_prefill: bool = True,
        decode_graph: bool | None = None,
        defer_prefill: bool | None = None,
        fused_sampling: bool | None = None,
    ) -> None:
        if kv_mode not in ("keep", "recompute"):
            raise ValueError(f"kv_mode must be 'keep' or 'recompute', got {kv_mode!r}")
        if num_slots < 1 or max_len < 2:
            raise ValueError(f"need num_slots >= 1 and max_len >= 2, got {num_slots}, {max_len}")
        self.model = model.eval()
        self.stop_ids = frozenset([eos_id] if isinstance(eos_id, int) else eos_id)  # any ends it
        # a stop string's check on a sequence's tokens (Tokenizer.ends_with_stop_string)
        self.stop_text: Callable[[Sequence[int]], bool] | None = None
        self.num_slots, self.max_len = num_slots, max_len
        p = model.lm_head.weight
        # the KV cache and the packed weights are built at first use (see `cache`)
        self._kv: SlotKV | None = None
        self._packed: PackedWeights | None = None
        self.slots: list[_Slot | None] = [None] * num_slots
        self.waiting: deque[Request] = deque()
        self._version: int = version
        self.version = version
        self.kv_mode: KVMode = kv_mode
        self.refill = refill
        self.mixed_prefill = mixed_prefill
        # fixed-shape decode steps, replayed as a CUDA graph on a GPU (engine.forward.DecodeGraph);
        # None: on where it pays, CUDA. On CPU (True) the same fixed-shape step runs eagerly.
        # Prefill then always runs as its own forward (mixed_prefill does not apply).
        self.decode_graph = p.device.type == "cuda" if decode_graph is None else decode_graph
        self._graph: DecodeGraph | None = None
        # with graphs, a prefill is a separate eager forward whose launch cost dwarfs a decode
        # step's: batch admissions (engine.admission). None: on where graphs are captured
        if defer_prefill is None:
            defer_prefill = self.decode_graph and p.device.type == "cuda"
        self.admission = PrefillAdmission() if defer_prefill else None
        self.stats = EngineStats()
        self.park: KVPark | None = None  # parked KV of episodes waiting for their env
        self._trace = trace
        self.on_step: Callable[[int, list[Hashable]], None] | None = None  # schedule.record
        self._num_active = 0
        self._num_filtering = 0  # live slots whose request has top-k / top-p (kept_logmass)
        self._lock = threading.Lock()
        self._pending_weights: tuple[dict[str, torch.Tensor], int] | None = None
        self._params = dict(model.named_parameters())
        # Per-slot decode state as tensors, so a decode step reads a range of them as views
        # instead of building its inputs from Python lists. Free slots hold position 0.
        dev = p.device
        self._last = torch.zeros(num_slots, dtype=torch.long, device=dev)  # next input token
        self._pos = torch.zeros(num_slots, dtype=torch.long, device=dev)  # tokens in the cache
        self._ntok = torch.zeros(num_slots, dtype=torch.long, device=dev)  # tokens sampled
        self._live = torch.zeros(num_slots, dtype=torch.long, device=dev)  # 1 while in use
        self._temp = torch.zeros(num_slots, device=dev)
        self._top_p = torch.ones(num_slots, device=dev)
        self._top_k = torch.zeros(num_slots, dtype=torch.long, device=dev)
        self._seed = torch.zeros(num_slots, dtype=torch.long, device=dev)
        self._all_slots = torch.arange(num_slots, device=dev)
        self._graph_live = torch.zeros(num_slots, dtype=torch.long, device=dev)  # the graph's input
        # sampling's pass over the logits as one Triton kernel (engine.fused); None: where it
        # runs, a CUDA device with Triton. Fixed for the engine's life: the kernel's rounding
        # is its own, and a request's tokens must not depend on which path drew them.
        self.fused_sampling = fused_default(dev) if fused_sampling is None else fused_sampling
        # a graph step's sampling, replayed as a CUDA graph of its own (engine.forward.SampleGraph)
        self._sample_graph = (
            SampleGraph(self._temp, self._seed, self._ntok, self.fused_sampling)
            if self.decode_graph and dev.type == "cuda"
            else None
        )

    # ---- intake -------------------------------------------------------------------------
    def add(self, request: Request) -> None:
        """Queue a request; it is admitted into the first free slot by a later `step()`."""
        need = len(request.prompt_tokens) + request.params.max_new_tokens
        if need > self.max_len:
            raise ValueError(
                f"prompt ({len(request.prompt_tokens)}) + max_new_tokens "
                f"({request.params.max_new_tokens}) = {need} exceeds engine max_len {self.max_len}"
            )
        if not request.prompt_tokens:
            raise ValueError("empty prompt")
        if request.params.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {request.params.max_new_tokens}")
        self.waiting.append(request)

    @property
    def num_active(self) -> int:
        return self._num_active

    def idle(self) -> bool:
        """Nothing in flight and nothing waiting (the refill hook is not consulted)."""
        return not self.waiting and self._num_active == 0

    # ---- weights --------------------------------------------------------------------------
    @property
    def version(self) -> int:
        """The policy version stamped on sampled tokens. Setting a new one (as the schedules
        do after an optimizer step on a model they share with the engine) also makes the next
        step re-read the model's parameters."""
        return self._version

    @version.setter
    def version(self, v: int) -> None:
        if self._packed is not None and v != self._version:
            self._packed.mark_stale()
        self._version = v

    @property
    def cache(self) -> SlotKV:
        """The KV cache of the slots, allocated at first use: an engine that never generates
        (the trainer's own, when the samplers run in other processes) holds none."""
        if self._kv is None:
            p = self.model.lm_head.weight
            self._kv = SlotKV(self.model.config, self.num_slots, self.max_len, p.dtype, p.device)
        return self._kv

    @property
    def _weights(self) -> PackedWeights:
        """Packed copies of the model's matrices (see `load_weights`), built at first use."""
        if self._packed is None:
            self._packed = PackedWeights(self.model, self.max_len)  # packs the model as it is now
        return self._packed

    @property
    def defer_prefill(self) -> bool:
        return self.admission is not None

    @property
    def _decode_step(self) -> DecodeGraph:
        """The fixed-shape decode step over all slots (`decode_graph`), built at first use."""
        if self._graph is None:
            capture = self._pos.device.type == "cuda"
            self._graph = DecodeGraph(
                self._weights, self.cache, self._last, self._pos, self._graph_live, capture
            )
        return self._graph

    def load_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        """Hand over new weights; they take effect at the start of the next `step()`.

        `state` maps parameter names to tensors of the same shapes (a state dict); the engine
        keeps a reference until it copies, so the caller must not modify those tensors until
        then. A newer hand-over before the next step replaces an older one. The engine reads the
        model's parameters through packed copies (engine.packed) that each step refreshes when
        the parameters were updated in place (as this does, or as an optimizer step on a shared
        model does) or `version` changed; replacing a parameter object is not seen, and needs a
        new engine.
        """
        missing = [n for n, p in self._params.items() if n not in state]
        if missing:
            raise KeyError(
                f"load_weights: state lacks {len(missing)} parameters, e.g. {missing[:3]}"
            )
        for n, p in self._params.items():
            if state[n].shape != p.shape:
                raise ValueError(
                    f"load_weights: {n} has shape {tuple(state[n].shape)}, expected {tuple(p.shape)}"
                )
        with self._lock:
            self._pending_weights = (state, version)

    def _apply_weights(self) -> None:
        with self._lock:
            pending, self._pending_weights = self._pending_weights, None
        if pending is None:
            return
        state, version = pending
        t0 = time.perf_counter()
        with torch.no_grad():
            for name, p in self._params.items():
                p.copy_(state[name])  # into existing storage: no reallocation, no re-pinning
        self.version = version
        self._weights.sync()  # the packed copies follow
        wait_device(self._pos)  # on a GPU the copies are queued: time them, not their launch
        t1 = time.perf_counter()
        live = [i for i, s in enumerate(self.slots) if s is not None]
        if self.kv_mode == "recompute" and live:
            # AReaL: re-prefill each in-flight prefix under the new weights. The last sampled
            # token is not in the cache yet: the next decode step feeds it.
            seqs = [self._slot(i).request.prompt_tokens + self._slot(i).tokens[:-1] for i in live]
            ids, part = self._prefill_part(live, seqs)
            forward(self._weights, self.cache, make_plan(self.cache, ids, [part], None))
            self.stats.recompute_tokens += len(ids)
            wait_device(self._pos)
        pause = time.perf_counter() - t0
        self.stats.weight_copy_s += t1 - t0
        self.stats.weight_update_s += pause
        self.stats.weight_pause_max_s = max(self.stats.weight_pause_max_s, pause)
        self.stats.weight_updates += 1

    # ---- the loop -------------------------------------------------------------------------
    def step(self) -> list[Completion]:
        """Apply pending weights; refill and admit; one forward that decodes every live slot and
        prefills the admitted prompts; sample. Returns the requests that finished."""
        self._apply_weights()
        self._weights.sync()  # no-op unless the model changed in place since the last step
        live = [i for i, s in enumerate(self.slots) if s is not None]
        dec = self._decode_rows(live) if live else None
        admitted = self._admit(decoding=dec is not None)
        if self.on_step is not None:  # the version stepped with, the keys admitted (slot order)
            self.on_step(self.version, [self._slot(i).request.key for i in admitted])
        finished: list[Completion] = []
        if dec is not None and admitted and (self.decode_graph or not self.mixed_prefill):
            finished = self._run(dec, []) + self._run(None, admitted)  # exact times apart
        elif dec is not None or admitted:
            finished = self._run(dec, admitted)
        if self._trace:
            self.stats.active_trace.append((time.perf_counter(), self._num_active))
        return finished

    def _decode_rows(self, live: list[int]) -> _Decode:
        lo, hi = live[0], live[-1] + 1
        dev = self._pos.device
        if self.decode_graph:  # fixed shape: every slot, free ones riding along
            lo, hi = 0, self.num_slots
        if self.decode_graph or len(live) >= _MIN_DENSITY * (hi - lo):
            rows: slice | torch.Tensor = slice(lo, hi)
            slot_ids = self._all_slots[lo:hi]
            order: list[int | None] = [i if self.slots[i] else None for i in range(lo, hi)]
        else:
            rows = slot_ids = torch.tensor(live, device=dev)
            order = list(live)
            self.stats.sparse_decode_steps += 1
        # a copy, since admission changes _live; with graphs, into the graph's input in place
        live_rows = (
            self._graph_live.copy_(self._live) if self.decode_graph else self._live[rows].clone()
        )
        return _Decode(rows, slot_ids, live_rows, order, len(live))

    def _admit(self, decoding: bool = False) -> list[int]:
        """Top up the waiting line from `refill`; move waiting requests into free slots (while
        slots are `decoding`, with `defer_prefill`, only once the admission rule says so)."""
        free = self.num_slots - self._num_active
        if self.refill is not None and len(self.waiting) < free:
            for r in self.refill(free - len(self.waiting)):
                self.add(r)
        admitted: list[int] = []
        if not free or not self.waiting:
            return admitted
        rule = self.admission
        if decoding and rule is not None and not rule.due(free, self.num_slots):
            self.stats.deferred_admissions += 1
            return admitted
        if rule is not None:  # every admission, at once or deferred, starts its count over
            rule.start_over()
        now = time.time()
        for i, s in enumerate(self.slots):  # lowest free slots first: keeps the live range dense
            if s is None and self.waiting:
                r = self.waiting.popleft()
                mass: list[float] | None = [] if r.params.filters else None
                self.slots[i] = _Slot(r, t_start=now, kept_logmass=mass)
                self._num_filtering += mass is not None
                admitted.append(i)
        self._num_active += len(admitted)
        # one indexed write per tensor: a scalar write per slot and tensor costs ~5 us each
        ps = [(s.request.params, s.request.seed) for s in map(self._slot, admitted)]
        cols = zip(*((p.temperature, p.top_p, p.top_k, seed) for p, seed in ps))
        for dst, col in zip((self._temp, self._top_p, self._top_k, self._seed), cols):
            dst[admitted] = torch.tensor(col, dtype=dst.dtype, device=dst.device)
        self._live[admitted] = 1
        return admitted

    def _prefill_part(
        self, idx: list[int], seqs: list[list[int]], starts: list[int] | None = None
    ) -> tuple[torch.Tensor, PartRows]:
        """Flat token ids `[N]` and the prefill part writing `seqs` into slots `idx` from `starts`
        (0: whole prompts; a restored parked prefix otherwise)."""
        dev = self._pos.device
        lens = torch.tensor([len(s) for s in seqs], device=dev)
        ids = torch.tensor([t for s in seqs for t in s], device=dev)
        at = torch.zeros_like(lens) if starts is None else torch.tensor(starts, device=dev)
        return ids, prefill_part(self.cache, torch.tensor(idx, device=dev), at, lens)

    def _run(self, dec: _Decode | None, admitted: list[int]) -> list[Completion]:
        """One forward over the decode rows `dec` and the prompts of `admitted`; sample; record.

        Output rows: the decode rows in slot order, then the admitted prompts' last tokens.
        """
        t0 = time.perf_counter()
        ids, parts, slot_ids, order = [], [], [], []
        n_dec = n_pre = 0
        timed, spans = True, list[tuple[int, int]]()  # (start, length) of each prompt part
        if dec is not None:
            if not self.decode_graph:
                parts.append(decode_part(self.cache, dec.rows, self._pos[dec.rows], dec.live))
                ids.append(self._last[dec.rows])
            slot_ids.append(dec.slot_ids)
            order += dec.order
            n_dec = len(dec.order)
        if admitted:
            starts = [0] * len(admitted)  # positions restored from the park, per slot
            if self.park is not None:
                reqs = [self._slot(i).request for i in admitted]
                starts = self.park.restore_all(self, admitted, reqs)
            prompts = [self._slot(i).request.prompt_tokens[n:] for i, n in zip(admitted, starts)]
            spans = list(zip(starts, map(len, prompts)))
            pre_ids, pre = self._prefill_part(admitted, prompts, starts)
            parts.append(pre)
            ids.append(pre_ids)
            slot_ids.append(torch.tensor(admitted, device=pre_ids.device))
            order += admitted
            n_pre = len(pre_ids)
            lens = torch.tensor([len(p) for p in prompts], device=pre_ids.device)
        if parts:
            out_index = torch.arange(n_dec, device=self._pos.device)
            if admitted:  # the last token of each prompt
                out_index = torch.cat([out_index, n_dec + lens.cumsum(0) - 1])
            plan = make_plan(self.cache, cat_parts(ids), parts, out_index)
            logits = forward(self._weights, self.cache, plan)
        else:  # a decode step alone, with decode_graph (step() never mixes prefill into it)
            assert dec is not None  # dec.live is the graph's input (_decode_rows)
            live = (self._slot(i) for i in dec.order if i is not None)
            span = max(len(s.request.prompt_tokens) + len(s.tokens) for s in live)
            captures = self._decode_step.captures
            logits = self._decode_step(span)
            timed = self._decode_step.captures == captures  # no capture in this step's time
            self.stats.graph_decode_steps += 1
        assert logits is not None
        # the sampling parameters of the output rows: views when the rows are a slot range
        rows = dec.rows if dec is not None and not admitted else cat_parts(slot_ids)
        got = self._sample(logits, rows, graph_step=not parts)
        if dec is not None:  # free rows riding in the range keep their state (maybe admitted now)
            self._last[dec.rows] = torch.where(
                dec.live.bool(), got.tokens[:n_dec], self._last[dec.rows]
            )
            self._pos[dec.rows] += dec.live
            self._ntok[dec.rows] += dec.live
        if admitted:
            self._last[admitted] = got.tokens[n_dec:]
            self._pos[admitted] = lens + torch.tensor(starts, device=lens.device)
            self._ntok[admitted] = 1
        seqs = (self._slot(i) for i in order[:n_dec] if i is not None)  # before their tokens
        ctx = pass_context((len(s.request.prompt_tokens) + len(s.tokens) for s in seqs), spans)
        done = self._record(order, got)
        seconds = time.perf_counter() - t0
        n_live = dec.n_live if dec is not None else None
        self.stats.account(seconds, n_live, n_dec, n_pre, ctx if timed else None)
        if self.admission is not None and timed and not (n_dec and n_pre):  # one kind of forward
            self.admission.observe(prefill=n_pre > 0, seconds=seconds)
        return done

    def _sample(
        self, logits: torch.Tensor, rows: slice | torch.Tensor, graph_step: bool
    ) -> Sampled:
        """Tokens and log-probs of the output `rows`; a graph step (every slot, decode alone)
        replays the sampling graph unless a live row filters (same tokens either way)."""
        if graph_step and self._sample_graph is not None and not self._num_filtering:
            return self._sample_graph(logits)
        return sample(
            logits,
            self._temp[rows],
            self._top_k[rows],
            self._top_p[rows],
            self._seed[rows],
            self._ntok[rows],
            fused=self.fused_sampling,
        )

    def _record(self, order: list[int | None], got: Sampled) -> list[Completion]:
        """Append each live row's token, log-prob and version; release finished slots."""
        tokens, logp = got.tokens.tolist(), got.logp.tolist()
        mass = got.kept_logmass.tolist() if got.kept_logmass is not None else None
        done, freed = [], []
        now, version, stop_text = time.time(), self.version, self.stop_text
        n = 0
        for r, i in enumerate(order):
            if i is None:
                continue
            s = self._slot(i)
            n += 1
            tok = tokens[r]
            s.tokens.append(tok)
            s.logp.append(logp[r])
            s.versions.append(version)
            if s.kept_logmass is not None and mass is not None:  # not None when it filters
                s.kept_logmass.append(mass[r])
            end = None
            if tok in self.stop_ids or (stop_text is not None and stop_text(s.tokens)):
                end = FinishReason.STOP
            elif len(s.tokens) >= s.request.params.max_new_tokens:
                end = FinishReason.LENGTH
            if end is not None:
                if self.park is not None and s.request.park:  # all but `tok` are in the cache
                    seq = s.request.prompt_tokens + s.tokens[:-1]
                    self.park.save(self.cache, i, seq, s.request.key, version)
                done.append(self._release(i, reset=False).completion(end, now))
                freed.append(i)
        self._reset(freed)
        self.stats.tokens_generated += n
        self.stats.finished += len(done)
        return done

    def _slot(self, i: int) -> _Slot:
        s = self.slots[i]
        assert s is not None
        return s

    def _release(self, i: int, reset: bool = True) -> _Slot:
        """Free slot `i` (its cache rows are simply overwritten by the next prefill); its decode
        state is zeroed now, or by the caller's one `_reset` of all it frees."""
        s = self._slot(i)
        self.slots[i] = None
        self._num_active -= 1
        self._num_filtering -= s.kept_logmass is not None
        if reset:
            self._reset([i])
        return s

    def _reset(self, ids: list[int]) -> None:
        if ids:
            self._live[ids] = self._pos[ids] = self._ntok[ids] = 0

    # ---- control --------------------------------------------------------------------------
    def abort(self, predicate: Callable[[Completion], bool]) -> list[Completion]:
        """Abort in-flight sequences for which `predicate(partial completion)` holds.

        They are returned with what they had, marked `aborted`, and their slots freed (refilled
        by the next `step()`). Staleness bound, for example:
        `engine.abort(lambda c: engine.version - min(c.versions) > K)`.
        """
        out = []
        now = time.time()
        for i, s in enumerate(self.slots):
            if s is None:
                continue
            partial = s.completion(FinishReason.ABORTED, now)
            if predicate(partial):
                self._release(i)
                out.append(partial)
        self.stats.aborted += len(out)
        return out

    def cancel_waiting(self, predicate: Callable[[Request], bool]) -> list[Request]:
        """Remove requests not yet admitted for which `predicate` holds; return them."""
        keep: deque[Request] = deque()
        gone: list[Request] = []
        for r in self.waiting:
            (gone if predicate(r) else keep).append(r)
        self.waiting = keep
        return gone

    def generate(self, requests: Iterable[Request]) -> list[Completion]:
        """Run `requests` to completion on an idle engine; completions in request order.

        The refill hook is not consulted: this is a static batch (continuous batching inside).
        """
        if not self.idle():
            raise RuntimeError("generate() needs an idle engine: it returns only its own requests")
        reqs = list(requests)
        for r in reqs:
            self.add(r)
        order = {id(r): n for n, r in enumerate(reqs)}
        refill, self.refill = self.refill, None
        out: list[Completion] = []
        try:
            while not self.idle():
                out += self.step()
        finally:
            self.refill = refill
        return sorted(out, key=lambda c: order[id(c.request)])
