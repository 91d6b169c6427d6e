"""The trainer side: batches from scored groups (`batch`), log-probs recomputed
(`logprobs`), micro-batching (`microbatch`), precision (`precision`), the optimizer step
(`trainer`), checkpoints (`checkpoint`) and the warm start on scripted answers (`warmstart`).

A package like the others: without this file setuptools' `packages.find` leaves it out of a
built wheel (tests/test_packaging.py)."""
