"""The orchestrator's state: the work in the pipeline, and its JSON form for checkpoints.

A checkpoint is taken between two steps (the open window holds nothing then). It holds the
requests issued and not back (in flight, queued at a sampler, or waiting to be sent), the
prompts drawn and not issued, the groups back and not yet trained, and the counters of windows
and admission. With the run's own checkpoint, a resumed run issues the same requests again and
trains the same groups: nothing skipped, nothing twice.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

from slipstream.runtime.channels import PromptRequest
from slipstream.schedule.tail import LengthModel
from slipstream.types import FinishReason, Group, Prompt, Sample


@dataclass
class OrchestratorState:
    issued: int = 0  # groups issued; also the next group id
    batches_issued: int = 0  # fixed batching
    windows: int = 0  # windows closed, with or without a step
    empty_in_row: int = 0
    out_of_bound: int = 0  # stale + aborted: no longer count against admission
    consumed: int = 0  # continuous: groups taken into windows
    outstanding: dict[int, PromptRequest] = field(default_factory=dict)  # issued, not back
    queue: deque[tuple[Prompt, int]] = field(default_factory=deque)  # drawn (prompt, G), not issued
    window: list[tuple[int, Group]] = field(default_factory=list)  # continuous: arrived, not taken
    # min_lag: group id -> windows closed when it was issued
    issue_window: dict[int, int] = field(default_factory=dict)
    batches: dict[int, list[tuple[int, Group]]] = field(default_factory=dict)  # fixed: by batch
    batch_left: dict[int, int] = field(default_factory=dict)  # fixed: groups not back yet
    # the open window: every group it took, those the filters kept, its dynamic-sampling draws
    step_groups: list[Group] = field(default_factory=list)
    kept: list[Group] = field(default_factory=list)
    extra: int = 0
    unsettled: list[Group] = field(default_factory=list)  # settling them raised: in flight
    need: int = 0  # continuous: arrivals the open window still takes
    unsent: PromptRequest | None = None  # issued, refused by a full prompt queue
    # chunks sent before new work: a dead sampler's requests, min_lag's dynamic-sampling refills
    reissue: deque[list[PromptRequest]] = field(default_factory=deque)
    lost_ids: set[int] = field(default_factory=set)  # requests given up with a dead sampler
    heard: dict[int, float] = field(default_factory=dict)  # sampler id -> last message time
    ready: set[int] = field(default_factory=set)
    t_last_msg: float = 0.0

    def unqueue(self, group_id: int) -> None:
        """Take request `group_id` out of the chunks to send again (its group is back)."""
        if any(r.group_id == group_id for c in self.reissue for r in c):
            chunks = ([r for r in c if r.group_id != group_id] for c in self.reissue)
            self.reissue = deque(c for c in chunks if c)

    def requeue(self, requests: list[PromptRequest], fixed: bool) -> None:
        """A dead sampler's `requests`, to send again in issue order: one chunk per fixed batch
        (a sampler runs a fixed batch's chunk whole), else one chunk per request."""
        if fixed:
            for b in sorted({r.batch for r in requests}):
                self.reissue.append(
                    sorted((r for r in requests if r.batch == b), key=lambda r: r.group_id)
                )
        else:
            self.reissue.extend([r] for r in sorted(requests, key=lambda r: r.group_id))


def ripe(st: OrchestratorState, min_lag: int) -> list[int]:
    """Indices into the continuous window of the groups a window may take, in the order it
    takes them: all in arrival order, or with `min_lag` m those issued at least `min(m, w)`
    windows ago (w the windows closed), earliest first. Windows, not versions: a window that
    trains nothing (all filtered) does not move the version, and waiting on the version would
    then wait forever."""
    window, m = st.window, min_lag
    if not m:
        return list(range(len(window)))
    w, at = st.windows, st.issue_window
    ready = [i for i, (gid, _) in enumerate(window) if w - at.get(gid, 0) >= min(m, w)]
    return sorted(ready, key=lambda i: (at.get(window[i][0], 0), window[i][0]))


def take(st: OrchestratorState, batch: int, min_lag: int) -> list[tuple[int, Group]]:
    """Continuous batching: the groups the open window takes (`ripe`'s first `st.need`, or
    `batch` of them), or none while it has fewer; they count as consumed by admission."""
    need = st.need or batch
    if st.issue_window:  # forget the dropped ones
        alive = {g for g, _ in st.window} | set(st.outstanding)
        st.issue_window = {g: w for g, w in st.issue_window.items() if g in alive}
    order = ripe(st, min_lag)
    if len(order) < need:
        return []
    taken = set(order[:need])
    pairs = [p for i, p in enumerate(st.window) if i in taken]
    st.window = [p for i, p in enumerate(st.window) if i not in taken]
    for gid, _ in pairs:
        st.issue_window.pop(gid, None)
    st.consumed += need
    st.need = 0
    return pairs


def leftover(st: OrchestratorState) -> int:
    """Groups received but never trained or dropped (the end of the run cut them off)."""
    held = len(st.window) + sum(len(v) for v in st.batches.values())
    return held + len(st.kept) + len(st.unsettled)


def deadlock(st: OrchestratorState, batch_prompts: int, min_lag: int) -> str:
    """Why the run cannot go on when nothing is in flight and no window completes: what the
    open window waits for, and that admission issues nothing until a window closes."""
    need = st.need or batch_prompts
    old = f" old enough for it (min_lag {min_lag})" if min_lag else ""
    return (
        f"no window can complete and nothing is in flight: window {st.windows} needs {need} "
        f"groups{old} and has {len(ripe(st, min_lag))} of the {len(st.window)} back, and "
        f"admission issues nothing more until it closes (a group it waited for was dropped: "
        f"aborted, stale, poisoned or discarded)"
    )


def to_json(st: OrchestratorState, lengths: LengthModel) -> dict[str, Any]:
    """The work in the pipeline, as JSON: requests issued and not back (in flight, queued
    at a sampler, or waiting to be sent), prompts drawn and not issued, groups back and not
    yet trained, and the counters of windows and admission; and what tail batching learned
    of completion lengths (`lengths`: it orders the prompts drawn next). Taken between two
    steps (the open window holds nothing then). With the run's own checkpoint, a resumed run
    issues the same requests again and trains the same groups: nothing skipped, nothing
    twice."""
    assert not st.step_groups and not st.kept, "checkpoint between steps only"
    return {
        "lengths": lengths.state_dict(),
        "issued": st.issued,
        "batches_issued": st.batches_issued,
        "windows": st.windows,
        "out_of_bound": st.out_of_bound,
        "consumed": st.consumed,
        "requests": [_request_json(st.outstanding[g]) for g in sorted(st.outstanding)],
        "queue": [[asdict(p), g] for p, g in st.queue],
        "window": [[gid, asdict(g)] for gid, g in st.window],
        "issue_window": {str(g): v for g, v in st.issue_window.items()},
        "batches": {str(b): [[gid, asdict(g)] for gid, g in v] for b, v in st.batches.items()},
        "batch_left": {str(b): n for b, n in st.batch_left.items()},
    }


def load_json(st: OrchestratorState, d: dict[str, Any], fixed: bool, lengths: LengthModel) -> None:
    """Restore `to_json` before `start`: the requests go out again first."""
    if "lengths" in d:
        lengths.load_state_dict(d["lengths"])
    st.issued, st.batches_issued, st.windows = d["issued"], d["batches_issued"], d["windows"]
    st.out_of_bound, st.consumed = d["out_of_bound"], d["consumed"]
    reqs = [_request_from_json(r) for r in d["requests"]]
    st.outstanding = {r.group_id: r for r in reqs}
    st.queue = deque((Prompt(**p), g) for p, g in d["queue"])
    st.window = [(gid, _group_from_json(g)) for gid, g in d["window"]]
    st.issue_window = {int(g): v for g, v in d.get("issue_window", {}).items()}
    st.batches = {
        int(b): [(gid, _group_from_json(g)) for gid, g in v] for b, v in d["batches"].items()
    }
    st.batch_left = {int(b): n for b, n in d["batch_left"].items()}
    if fixed:
        for b in sorted({r.batch for r in reqs}):
            st.reissue.append([r for r in reqs if r.batch == b])
    else:
        st.reissue.extend([r] for r in reqs)


def _request_json(r: PromptRequest) -> dict[str, Any]:
    return {**asdict(r), "seeds": list(r.seeds)}


def _request_from_json(d: dict[str, Any]) -> PromptRequest:
    return PromptRequest(**{**d, "prompt": Prompt(**d["prompt"]), "seeds": tuple(d["seeds"])})


def _group_from_json(d: dict[str, Any]) -> Group:
    samples = [
        Sample(**{**s, "finish_reason": FinishReason(s["finish_reason"])}) for s in d["samples"]
    ]
    return Group(Prompt(**d["prompt"]), samples, d.get("advantages_G"), d.get("masked", 0))
