"""Metrics sinks (JSONL, TensorBoard, W&B), live progress, plots and reports."""
