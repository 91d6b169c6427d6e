"""Where metrics go. JSONL always; a failing sink warns once and never stops training."""

from __future__ import annotations

import contextlib
import json
import math
import warnings
from pathlib import Path
from typing import Any, Protocol


class Sink(Protocol):
    def write(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else (1e308 if v > 0 else -1e308)
    return v


class JsonlSink:
    """One JSON object per line, flushed at every write so a crash loses nothing."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._f = self.path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self._f.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


class SafeSink:
    """Wraps a sink: the first failure warns, later ones are silent; training goes on."""

    def __init__(self, inner: Sink, name: str) -> None:
        self.inner, self.name, self.failed = inner, name, False

    def write(self, record: dict[str, Any]) -> None:
        try:
            self.inner.write(record)
        except Exception as e:  # deliberate fault tolerance: metrics never stop a run
            if not self.failed:
                warnings.warn(f"metrics sink {self.name} failed ({e!r}); continuing without it", stacklevel=2)
            self.failed = True

    def close(self) -> None:
        with contextlib.suppress(Exception):  # closing a broken sink must not fail the run
            self.inner.close()


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    with Path(path).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
