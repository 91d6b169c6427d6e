"""Seeing a run: metric values with their reduction (metrics), sinks (JSONL, TensorBoard, W&B),
the live terminal view (progress), rollouts as text, the busy/idle timeline, the
`slipstream report` figures and HTML page (runs, figures, report) and its weighted step means
(means), the training clock (clock) and speedups in time to target with unreached runs censored
at their budget (censored)."""
