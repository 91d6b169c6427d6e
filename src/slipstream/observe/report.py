"""`slipstream report RUN_DIR [RUN_DIR ...] --out DIR`: a static HTML page of PNG figures.

DIR receives `index.html` and one PNG per figure (observe/figures.py): reward and held-out
accuracy against wall time and generated tokens, the timeline of each sampler and the trainer,
the lag histogram, ESS over time, completion lengths and the ledger; several runs overlay in
every figure, and the summary table puts them side by side, with a row for each setting
their config.toml differ in. Nothing is averaged over runs. Runs of different settings are
named in one line on stderr and on the page (`observe.runs.comparison_notice`), a warning where
they are not on one scale (another task or held-out set). The page needs no network and no
server: open it from disk, or attach the folder to an issue.
"""

from __future__ import annotations

import datetime as dt
import html
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from slipstream.argv import OneLineParser
from slipstream.observe.figures import FIGURES, save
from slipstream.observe.means import lag_tokens, number, weighted_mean
from slipstream.observe.runs import (
    ReportError,
    RunData,
    comparison_notice,
    differing_settings,
    load_runs,
    setting,
)


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _f(x: Any, fmt: str = ",.3f") -> str:
    return "–" if x is None else format(x, fmt)


def lag_mean(run: RunData) -> float | None:
    """The run's mean lag over trained tokens: summary.json's `lag_mean` where recorded, else
    the steps' means weighted by their tokens (`staleness/lag_hist`; unweighted for records
    without it)."""
    recorded = number((run.summary or {}).get("lag_mean"))
    if recorded is not None:
        return recorded
    return weighted_mean([(v, lag_tokens(r)) for r, v in run.values("staleness/lag_mean")])


def sampler_busy(run: RunData) -> float | None:
    """The samplers' busy share of the run's time: summary.json's `sampler_busy` where
    recorded, else the steps' shares weighted by their `step_time_s` (unweighted for records
    without it)."""
    recorded = number((run.summary or {}).get("sampler_busy"))
    if recorded is not None:
        return recorded
    pairs = run.values("runtime/sampler_busy", "sampler_busy")
    return weighted_mean([(v, number(r.get("step_time_s"))) for r, v in pairs])


def _total(run: RunData, key: str) -> float | None:
    vals = [v for _, v in run.values(key)]
    return sum(vals) if vals else None


def _wall(run: RunData) -> float | None:
    return (run.summary or {}).get("wall_s", run.metrics[-1].get("wall_s"))


def trained_per_s(run: RunData) -> float | None:
    """Trained tokens per second of wall time: the throughput that counts (goodput)."""
    trained, wall = _total(run, "tokens/trained"), _wall(run)
    return trained / wall if trained is not None and wall else None


def summary_rows(
    run: RunData, first: RunData | None, settings: Sequence[str] = ()
) -> dict[str, str]:
    """Quantity -> text for one run's column of the summary table; `first`: the baseline;
    `settings`: dotted settings shown besides the usual ones (those the runs differ in)."""
    s = run.summary or {}
    last = run.metrics[-1]
    wall = _wall(run)
    acc_end = s.get("heldout_acc_end")
    if acc_end is None:
        accs = run.values("eval/heldout_acc", "heldout_acc")
        acc_end = accs[-1][1] if accs else None
    generated, trained = _total(run, "tokens/generated"), _total(run, "tokens/trained")
    gen_time = _total(run, "time/generate_s")
    trained_rate = trained_per_s(run)
    rewards = [v for _, v in run.values("reward/mean", "reward_mean")[-5:]]
    lag_maxes = [v for _, v in run.values("staleness/lag_max")]
    cfg = run.config
    rows = {
        "schedule": run.schedule,
        "steps": str(s.get("steps", last.get("step", len(run.metrics)))),
        "wall time": _f(wall, ",.1f") + " s",
        "held-out accuracy": f"{_f(s.get('heldout_acc_start'))} → {_f(acc_end)}",
        "reward (last 5 steps)": _f(_mean(rewards)),
        "generated tokens": _f(generated, ",.0f"),
        "trained tokens": _f(trained, ",.0f"),
        "generation tok/s": _f(generated / gen_time if generated and gen_time else None, ",.0f"),
        "trained tok/s (wall)": _f(trained_rate, ",.0f"),
        "sampler busy (mean)": _f(sampler_busy(run), ".0%"),
        "lag mean / max": f"{_f(lag_mean(run), '.2f')} / {_f(max(lag_maxes) if lag_maxes else None, '.0f')}",
    }
    if first is not None:
        base = trained_per_s(first)
        ratio = trained_rate / base if trained_rate is not None and base else None
        rows[f"trained tok/s vs {first.label}"] = _f(ratio, ".2f") + "×"
    led = run.final_ledger() or {}
    filtered = led.get("filtered") or {}
    rows["ledger: generated / trained"] = f"{led.get('generated', '–')} / {led.get('trained', '–')}"
    rows["ledger: filtered"] = ", ".join(f"{k} {v}" for k, v in filtered.items()) or "0"
    kinds = ("stale", "aborted", "lost", "poisoned", "unfinished", "discarded", "in_flight")
    rows["ledger: " + " / ".join(k.replace("_", " ") for k in kinds)] = " / ".join(
        str(led.get(k, "–")) for k in kinds
    )
    rows["ledger balanced"] = {True: "yes", False: "NO"}.get(led.get("balanced"), "–")  # type: ignore[arg-type]
    rows["goodput"] = _f(s.get("goodput"), ".0%")
    rows["sampler restarts / tokens lost"] = (
        f"{s.get('sampler_restarts', 0)} / {_f(s.get('tokens_lost', 0), ',.0f')}"
    )
    for section, key in (
        ("sampling", "group_size"),
        ("trainer", "batch_prompts"),
        ("schedule", "max_lag"),
        ("sampling", "max_new_tokens"),
        ("trainer", "loss"),
        ("trainer", "lr"),
    ):
        value = cfg.get(section, {}).get(key)
        if value is not None:
            rows[f"{section}.{key}"] = str(value)
    for name in settings:
        value = setting(cfg, name)
        rows[name] = "–" if value is None else str(value)
    return rows


def _table(runs: list[RunData]) -> str:
    differ = [k for k in differing_settings(runs) if k != "schedule.name"]  # row "schedule"
    columns = [summary_rows(r, runs[0] if len(runs) > 1 else None, differ) for r in runs]
    names = list(dict.fromkeys(k for c in columns for k in c))
    head = "".join(f"<th>{html.escape(r.label)}</th>" for r in runs)
    body = "".join(
        f"<tr><th>{html.escape(n)}</th>"
        + "".join(f"<td>{html.escape(c.get(n, '–'))}</td>" for c in columns)
        + "</tr>"
        for n in names
    )
    return f"<table><thead><tr><th></th>{head}</tr></thead><tbody>{body}</tbody></table>"


# Marks figures that failed to load, visibly and on <body>, so a moved or partial report says so
# (and the test can check it in a headless browser).
_CHECK_SCRIPT = """<script>
window.addEventListener("load", function () {
  var bad = 0;
  for (var i = 0; i < document.images.length; i++) {
    var img = document.images[i];
    if (!(img.complete && img.naturalWidth > 0)) {
      bad += 1;
      var p = document.createElement("p");
      p.className = "broken";
      p.textContent = "figure missing: " + img.getAttribute("src");
      img.insertAdjacentElement("afterend", p);
    }
  }
  document.body.setAttribute("data-figures-loaded", String(document.images.length - bad));
});
</script>"""

_STYLE = """<style>
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1040px; color: #222; padding: 0 1rem; }
table { border-collapse: collapse; font-size: 0.9rem; }
th, td { border-bottom: 1px solid #ddd; padding: 0.25rem 0.75rem; text-align: left; }
tbody th { font-weight: normal; color: #555; }
figure { margin: 0; }
img { max-width: 100%; height: auto; }
pre { background: #f6f6f6; padding: 0.75rem; overflow-x: auto; font-size: 0.8rem; }
.broken { color: #b00; font-weight: bold; }
.meta { color: #666; font-size: 0.85rem; }
.notice { background: #fff4d6; padding: 0.5rem 0.75rem; }
</style>"""


def render_html(runs: list[RunData], figures: list[str], out: Path) -> str:
    """The page; `figures` are the PNG file names written next to it."""
    parts = [
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>slipstream report: {html.escape(', '.join(r.label for r in runs))}</title>{_STYLE}</head>",
        f'<body data-figures="{len(figures)}">',
        "<h1>slipstream report</h1>",
        f'<p class="meta">{len(runs)} run(s), written {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC</p>',
    ]
    notice = comparison_notice(runs)
    if notice is not None:
        parts.append(f'<p class="notice">{html.escape(notice)}</p>')
    parts += [
        "<h2>Summary</h2>",
        _table(runs),
    ]
    for name in figures:
        title = FIGURES[name][0]
        parts.append(
            f'<section><h2>{html.escape(title)}</h2><figure><img src="{html.escape(name)}" '
            f'alt="{html.escape(title)}" width="1000"></figure></section>'
        )
    shown = [r for r in runs if r.rollouts]
    if shown:
        parts.append("<h2>Rollouts of the last step</h2>")
    for r in shown:
        parts.append(
            f"<details><summary>{html.escape(r.label)}</summary><pre>{html.escape(r.rollouts or '')}</pre></details>"
        )
    parts.append("<h2>Run folders</h2><ul>")
    for r in runs:
        rel = os.path.relpath(r.dir.resolve(), out.resolve())
        parts.append(f"<li>{html.escape(r.label)}: <code>{html.escape(rel)}</code></li>")
    parts += ["</ul>", _CHECK_SCRIPT, "</body></html>\n"]
    return "\n".join(parts)


def write_report(runs: list[RunData], out: str | Path) -> Path:
    """Writes the figures and `index.html` of `runs` (`load_runs`) into `out`; returns the
    page's path."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ReportError(f"{out}: cannot create the output folder ({e.strerror})") from None
    for name, (_, make) in FIGURES.items():
        save(make(runs), out / name)
    page = out / "index.html"
    page.write_text(render_html(runs, list(FIGURES), out), encoding="utf-8")
    return page


def report_main(argv: list[str]) -> int:
    parser = OneLineParser(
        prog="slipstream report", description="Figures and an HTML page from run folders."
    )
    parser.add_argument(
        "run_dirs",
        nargs="+",
        metavar="RUN_DIR",
        help="run folders (several overlay; the settings they differ in are named)",
    )
    parser.add_argument(
        "--out", required=True, metavar="DIR", help="folder for index.html and the PNGs"
    )
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # a usage error, said in one line (or -h): its status returned
        return int(e.code or 0)
    try:
        runs = load_runs(args.run_dirs)
        notice = comparison_notice(runs)
        if notice is not None:
            print(f"slipstream report: {notice}", file=sys.stderr)
        page = write_report(runs, args.out)
    except ReportError as e:
        print(f"slipstream report: error: {e}", file=sys.stderr)
        return 2
    print(page)
    return 0
