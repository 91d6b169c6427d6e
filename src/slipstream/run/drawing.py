"""Drawing the prompts of a step (`Run.draw`): the ones the engine cannot hold, and with the
pass-rate band on the mastered and hopeless ones, are skipped before any generation is spent
on them.

A prompt is encoded once where it is drawn: the ids that measured it against the engine's
longest sequence go on with it (`Drawn`) to build its requests (`Run.requests`), rather than
being encoded again there. They live as long as the step's draw, never a dataset's worth: an
orchestrated run hands the orchestrator the prompts alone, and each sampler encodes the
prompts it is sent once (schedule.sampler), in its own process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from slipstream.types import Prompt

if TYPE_CHECKING:  # setup imports this module
    from slipstream.run.setup import Run


class Drawn(NamedTuple):
    """A drawn prompt and its token ids; None where they were not needed to draw it (no
    length bound: `Run.max_len` 0), and are encoded when its requests are built."""

    prompt: Prompt
    ids: list[int] | None


def draw(run: Run, n: int) -> list[Drawn]:
    """n prompts from `run.source`; with the pass-rate band on, mastered and hopeless prompts
    are skipped and replaced by further draws, or with `pass_rate_refill` off not replaced:
    the batch is the n drawn minus the skipped (at least one prompt). Each skip is counted in
    `run.prompts_skipped` and `run.counters`."""
    out: list[Drawn] = []
    tries = 0
    refill = run.cfg.filters.pass_rate_refill
    while len(out) < n and (refill or tries < n or not out):
        p = run.source.draw()
        tries += 1
        ids = run.tok.encode_prompt(p) if run.max_len else None
        if ids is not None and not run.fits(ids):  # setup checked that some fit (check_too_long)
            run.prompts_skipped["too_long"] += 1  # the engine cannot hold it: not generated
            run.counters["prompts/skipped_too_long"] += 1
            continue
        ok, reason = (
            run.pass_rates.should_draw(p.id) if run.cfg.filters.pass_rate_band else (True, "")
        )
        if ok or tries > 50 * n:  # never spin forever on a fully filtered dataset
            out.append(Drawn(p, ids))
        else:
            run.prompts_skipped[reason] += 1  # nothing generated: not a ledger entry
            run.counters["filters/prompts_skipped"] += 1
    return out
