"""slipstream: fast, cheap reinforcement learning on verifiable rewards (RLVR)."""

__version__ = "0.1.0"
