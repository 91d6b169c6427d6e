"""Where metrics go: JSONL always, TensorBoard and Weights & Biases on request.

A record is a dict of name -> float, int, list of numbers, or `metrics.Metric` value. A list
is a histogram of its values, except under a name ending in `_hist` (`staleness/lag_hist`):
that list counts per bin 0, 1, ... (tokens per lag), and is drawn as the bin index weighted by
its counts, so the histogram's mean is the weighted one (the token-weighted lag). Every
sink is wrapped in `SafeSink`: a failing sink (a full disk, a missing optional package) warns
once and never stops training. `make_sinks` builds them by name; `FanOut` writes to all.
"""

from __future__ import annotations

import contextlib
import json
import math
import secrets
import string
import tomllib
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from slipstream.files import write_atomic
from slipstream.observe.means import number
from slipstream.observe.metrics import resolve


class Sink(Protocol):
    def write(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def _clean(v: Any) -> Any:
    """`v` with NaN as null and infinities as +-1e308, inside lists too: json.dumps writes
    them as NaN/Infinity, which is not JSON (jq, JavaScript and pandas' strict mode refuse)."""
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else (1e308 if v > 0 else -1e308)
    if isinstance(v, list | tuple):
        return [_clean(x) for x in v]
    return v


def _json_default(v: Any) -> Any:
    # A stray tensor or numpy value must not cost the whole JSONL log: a scalar (0-d or
    # numpy scalar) becomes a number, an array a (nested) list.
    if hasattr(v, "tolist") and getattr(v, "ndim", 0) > 0:
        return _clean(v.tolist())
    if hasattr(v, "item"):
        return _clean(v.item())
    if hasattr(v, "tolist"):
        return _clean(v.tolist())
    return str(v)


def _step(record: dict[str, Any], fallback: int) -> int:
    step = number(record.get("step"))
    return fallback if step is None else int(step)


def _numbers(values: Any) -> list[float] | None:
    """A non-empty list of finite numbers (for histograms), else None."""
    if not isinstance(values, list | tuple) or not values:
        return None
    finite = [x for x in map(number, values) if x is not None and math.isfinite(x)]
    return finite if len(finite) == len(values) else None


COUNTS_SUFFIX = "_hist"
"""A list under a name ending so holds counts per bin 0, 1, ..., not values."""


def _counts(values: list[float]) -> list[float] | None:
    """`values` (of a `COUNTS_SUFFIX` name) as counts per bin 0, 1, ... when they can be: none
    negative and something counted; else None (nothing to draw)."""
    return None if any(c < 0 for c in values) or sum(values) <= 0 else values


def _scalars(record: dict[str, Any]) -> dict[str, float]:
    """Finite numbers of a resolved record, except the step (it is the x axis)."""
    out = {}
    for k, v in record.items():
        n = number(v)
        if k != "step" and n is not None and math.isfinite(n):
            out[k] = n
    return out


class JsonlSink:
    """One JSON object per line, flushed at every write so a crash loses nothing."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._f = self.path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        clean = {k: _clean(v) for k, v in resolve(record).items()}
        self._f.write(json.dumps(clean, default=_json_default) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


class TensorBoardSink:
    """Scalars, and a histogram for each list of numbers (e.g. `completion_lens`; counts per
    bin for a `_hist` name), by step."""

    def __init__(self, log_dir: str | Path, purge_step: int | None = None) -> None:
        """`purge_step`: the first step a resumed run writes; TensorBoard hides the events of
        this step and later ones that the run before the resume had written."""
        # Imported here: tensorboard is optional, and importing it costs a second.
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(log_dir=str(log_dir), flush_secs=10, purge_step=purge_step)
        self._n = 0

    def write(self, record: dict[str, Any]) -> None:
        record = resolve(record)
        self._n += 1
        step = _step(record, self._n)
        for k, v in _scalars(record).items():
            self._writer.add_scalar(k, v, step)
        for k, v in record.items():
            values = _numbers(v)
            if values is None:
                continue
            if k.endswith(COUNTS_SUFFIX):
                counts = _counts(values)
                if counts is not None:
                    self._add_counts(k, counts, step)
            else:
                self._writer.add_histogram(k, _array(values), step)

    def _add_counts(self, tag: str, counts: list[float], step: int) -> None:
        """A histogram of the bin index i weighted by `counts[i]`: bin i is (i - 1/2, i + 1/2],
        and the count, sum and sum of squares are the weighted ones, so its mean is too."""
        seen = [i for i, c in enumerate(counts) if c > 0]
        self._writer.add_histogram_raw(
            tag,
            min=float(seen[0]),
            max=float(seen[-1]),
            num=sum(counts),
            sum=sum(i * c for i, c in enumerate(counts)),
            sum_squares=sum(i * i * c for i, c in enumerate(counts)),
            bucket_limits=[i + 0.5 for i in range(len(counts))],
            bucket_counts=counts,
            global_step=step,
        )

    def close(self) -> None:
        self._writer.close()


def _array(values: list[float]) -> Any:
    import numpy as np

    return np.asarray(values, dtype=np.float64)


class WandbSink:
    """Weights & Biases, offline by default (no network, no account; `wandb sync` uploads
    later), `online` when asked (`wandb.mode`); project, entity, name and tags as configured.

    The run's resolved config (`config`; None: its `config.toml`, when present) becomes the
    W&B run config. The W&B run id is kept in `RUN_DIR/wandb_id`: a fresh run draws a new one,
    a resumed run (`resumed`) logs to the same W&B run (`resume="allow"`). W&B steps only
    increase, so the steps a crashed run logged past its checkpoint keep the crashed run's
    values there; the resumed run's records at those steps are in metrics.jsonl.
    """

    def __init__(
        self,
        run_dir: str | Path,
        project: str = "slipstream",
        entity: str | None = None,
        name: str | None = None,
        tags: Sequence[str] = (),
        mode: str = "offline",
        config: dict[str, Any] | None = None,
        resumed: bool = False,
    ) -> None:
        import wandb  # optional: not a dependency of slipstream

        run_dir = Path(run_dir)
        config_path = run_dir / "config.toml"
        if config is None and config_path.exists():
            config = tomllib.loads(config_path.read_text())
        self._wandb = wandb
        self._run = wandb.init(
            project=project,
            entity=entity,
            dir=str(run_dir),
            name=name or run_dir.name,
            tags=list(tags),
            mode=mode,
            config=config,
            id=wandb_run_id(run_dir, resumed),
            resume="allow",
        )
        self._n = 0

    def write(self, record: dict[str, Any]) -> None:
        record = resolve(record)
        self._n += 1
        data: dict[str, Any] = dict(_scalars(record))
        for k, v in record.items():
            values = _numbers(v)
            if values is None:
                continue
            if k.endswith(COUNTS_SUFFIX):
                counts = _counts(values)
                if counts is not None:  # bin i is [i - 1/2, i + 1/2)
                    edges = [i - 0.5 for i in range(len(counts) + 1)]
                    data[k] = self._wandb.Histogram(np_histogram=(counts, edges))
            else:
                data[k] = self._wandb.Histogram(values)
        self._run.log(data, step=_step(record, self._n))

    def close(self) -> None:
        self._run.finish()


def wandb_run_id(run_dir: Path, resumed: bool) -> str:
    """The W&B run id of the run in `run_dir`: the one in its `wandb_id` file when `resumed`
    (and the file holds one), else a new one (8 lowercase letters and digits, W&B's own
    shape), written there atomically."""
    path = run_dir / "wandb_id"
    if resumed and path.exists():
        kept = path.read_text(encoding="utf-8").strip()
        if kept.isascii() and kept.isalnum():
            return kept
    alphabet = string.ascii_lowercase + string.digits
    new = "".join(secrets.choice(alphabet) for _ in range(8))
    write_atomic(path, new + "\n")
    return new


class SafeSink:
    """Wraps a sink: the first failure warns, later ones are counted silently; training goes on.

    Writes keep being tried after a failure, so a transient one (a full disk freed) heals.
    """

    def __init__(self, inner: Sink, name: str) -> None:
        self.inner, self.name = inner, name
        self.failed = False
        self.errors = 0

    def write(self, record: dict[str, Any]) -> None:
        try:
            self.inner.write(record)
        except Exception as e:  # deliberate fault tolerance: metrics never stop a run
            self._fail(f"failed ({e!r})")

    def _fail(self, what: str) -> None:
        self.errors += 1
        if not self.failed:
            warnings.warn(
                f"metrics sink {self.name} {what}; continuing without it",
                RuntimeWarning,
                stacklevel=3,
            )
        self.failed = True

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing a broken sink must not fail the run
            self.inner.close()


class _Disabled:
    """Stands in for a sink that could not be opened (missing package, unwritable folder)."""

    def write(self, record: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


SINKS: dict[str, Any] = {
    "jsonl": lambda run_dir: JsonlSink(Path(run_dir) / "metrics.jsonl"),
    "tensorboard": lambda run_dir, purge_step=None: TensorBoardSink(
        Path(run_dir) / "tensorboard", purge_step
    ),
    "wandb": WandbSink,
}
"""Sink factories by name; each takes the run folder."""


def make_sinks(
    run_dir: str | Path,
    names: Sequence[str],
    wandb: Mapping[str, Any] | None = None,
    resume_step: int | None = None,
) -> list[SafeSink]:
    """The sinks named, JSONL first and always, each wrapped in `SafeSink`; `wandb`: the
    `WandbSink` settings (the `[wandb]` config section: project, entity, name, tags, mode;
    and `config`, the run's resolved config); `resume_step`: the checkpoint step a resumed run
    goes on from, after which TensorBoard hides what the run before the resume wrote (as
    `run.resume.rewind` drops those records from metrics.jsonl), so no step shows twice.

    An unknown name is a configuration error (ValueError). A sink that fails to open warns
    once and is returned disabled (`.failed` is True), so the run goes on without it.
    """
    unknown = [n for n in names if n not in SINKS]
    if unknown:
        raise ValueError(f"unknown metrics sink {unknown[0]!r}; expected one of {', '.join(SINKS)}")
    out = []
    for name in dict.fromkeys(["jsonl", *names]):
        try:
            extra = dict(wandb or {}) if name == "wandb" else {}
            if name == "wandb":
                extra["resumed"] = resume_step is not None
            if name == "tensorboard" and resume_step is not None:
                extra = {"purge_step": resume_step + 1}
            out.append(SafeSink(SINKS[name](run_dir, **extra), name))
        except Exception as e:  # deliberate: an optional sink never stops a run
            safe = SafeSink(_Disabled(), name)
            safe._fail(f"could not be opened ({e!r})")
            out.append(safe)
    return out


class FanOut:
    """Several sinks behind one `write`/`close`, as the loop holds one sink."""

    def __init__(self, sinks: Sequence[SafeSink]) -> None:
        self.sinks = list(sinks)

    def write(self, record: dict[str, Any]) -> None:
        for s in self.sinks:
            s.write(record)

    def close(self) -> None:
        for s in self.sinks:
            s.close()
