"""Fixtures shared by test modules."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

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
