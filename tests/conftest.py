"""Fixtures shared by test modules."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
from hypothesis import settings

# No per-example deadline: a property's examples are fast, but on a loaded 2-core CI machine
# one of them can pass hypothesis's 200 ms default (seen: 311 ms in
# test_plan_interval_never_narrows_below_the_simulated_means_error), a flaky failure that says
# nothing of the code. Tests that set their own settings keep them.
settings.register_profile("slipstream", deadline=None)
settings.load_profile("slipstream")

# Without CUDA, Triton kernels (engine.fused) run under Triton's interpreter on CPU tensors;
# the switch is read when Triton is first imported, so it is set before any test imports it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """Torch on one thread for a module (`pytestmark = pytest.mark.usefixtures("one_thread")`):
    tiny tensors gain nothing from threads, and on a busy machine spinning threads cost 10x."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
