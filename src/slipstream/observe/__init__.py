"""Seeing a run: metric values with their reduction (metrics), sinks (JSONL, TensorBoard, W&B),
the live terminal view (progress), rollouts as text, the busy/idle timeline, and the
`slipstream report` figures and HTML page (runs, figures, report)."""
