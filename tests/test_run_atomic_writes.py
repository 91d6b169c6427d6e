"""summary.json and ledger.json are written whole or not at all: a crash or a full disk while
a run ends leaves no torn file for `slipstream report` or a bench's `--reuse` to fail on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# A run ending on a full disk, modelled by a file-size limit of 200 bytes set once everything
# is imported: `finish` writes a summary.json of about 600 bytes, and `write_ledger` a
# ledger.json over one that a write before (at an error stop) left whole.
_FULL_DISK = """
import json, resource, signal, sys
from pathlib import Path
from types import SimpleNamespace as NS

from slipstream.run.setup import Run
from slipstream.run.summary import finish
from slipstream.schedule.ledger import Ledger

d = Path(sys.argv[1])
(d / "metrics.jsonl").write_text(json.dumps({"step": 1, "wall_s": 1.0}) + "\\n")
ledger = Ledger(generated=1, trained=1, episodes={("x" * 300): 1})
run = NS(dir=d, info={"note": "x" * 400}, heldout=True, trainer=NS(version=1, skipped_steps=0),
         ledger=ledger, prompts_skipped={}, close_workers=lambda: None,
         close_observers=lambda: None, write_ledger=lambda: None, view=NS(log=print))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (200, resource.RLIM_INFINITY))
for write in (lambda: finish(run, 0.1, 0.2, 1.0), lambda: Run.write_ledger(run)):
    try:
        write()
    except OSError as e:
        print("failed:", e.strerror)
"""


def test_a_full_disk_while_a_run_ends_leaves_no_torn_summary_or_ledger(tmp_path: Path) -> None:
    (tmp_path / "ledger.json").write_text(json.dumps({"generated": 1, "in_flight": 1}))
    out = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(tmp_path)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("failed: File too large") == 2  # both writes hit the limit
    assert not (tmp_path / "summary.json").exists()  # not there rather than torn
    assert json.loads((tmp_path / "ledger.json").read_text()) == {"generated": 1, "in_flight": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.json", "metrics.jsonl"]


_FULL_DISK_REWIND = """
import resource, signal, sys
from pathlib import Path

from slipstream.run.resume import truncate_metrics

path = Path(sys.argv[1])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (100, resource.RLIM_INFINITY))
try:
    truncate_metrics(path, 3)
except OSError as e:
    print("failed:", e.strerror)
"""


def test_a_full_disk_while_a_resume_rewinds_leaves_the_records_whole(tmp_path: Path) -> None:
    """A resume rewrites metrics.jsonl without the steps after its checkpoint; the disk full
    midway, the file keeps every record it had. Before, it was truncated first: a failed
    resume lost the run's records."""
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "note": "x" * 40}) + "\n" for s in range(1, 6)]
    path.write_text("".join(lines))
    out = subprocess.run(
        [sys.executable, "-c", _FULL_DISK_REWIND, str(path)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert "failed: File too large" in out.stdout
    assert path.read_text() == "".join(lines)
