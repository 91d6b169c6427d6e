"""When to prefill waiting requests into free slots, once a prefill costs several decode steps.

With CUDA graphs a decode step is one cheap replay, while prefilling newly admitted prompts is a
separate eager forward: admitting the moment a slot frees would pay that forward nearly every
step. `PrefillAdmission` batches admissions by the break-even rule of ski rental: free slots
wait until the decode capacity they have left idle since the last admission (each step,
`free / num_slots` of a decode step) adds up to the cost of one prefill forward. Whatever the
arrivals, that never costs more than twice the best admission schedule in hindsight. Both costs
are moving averages of the engine's measured forwards.
"""

from __future__ import annotations


class PrefillAdmission:
    """The rule's state: moving averages of a decode-only and a prefill-only forward, and the
    decode capacity left idle since the last admission (all in seconds)."""

    def __init__(self, decode_s: float = 0.0, prefill_s: float = 0.0) -> None:
        self.decode_s, self.prefill_s = decode_s, prefill_s
        self.idle_s = 0.0

    def due(self, free: int, num_slots: int) -> bool:
        """Called once per step while `free` slots wait: admit now? (True starts the count over.)"""
        self.idle_s += free / num_slots * self.decode_s
        if self.idle_s < self.prefill_s:
            return False
        self.start_over()
        return True

    def start_over(self) -> None:
        """An admission was made (deferred or at once): count idle capacity from zero."""
        self.idle_s = 0.0

    def observe(self, prefill: bool, seconds: float) -> None:
        """Fold in the time of one forward that only prefilled (or only decoded)."""
        old = self.prefill_s if prefill else self.decode_s
        new = seconds if old == 0.0 else 0.9 * old + 0.1 * seconds
        if prefill:
            self.prefill_s = new
        else:
            self.decode_s = new
