"""Assembling a run from its config: what runs, where, and from which checkpoint.

- `preflight`: checks of a config against this machine before any work starts (the model
  folder, its sliding window, the optional libraries a setting needs).
- `components`: device placement, the engine's shape within its KV budget, the trainer with
  its proximal policy resolved, the pass-rate tracker.
- `setup`: the `Run` that `setup(cfg)` builds (folder, model, tokenizer, task, engines,
  trainer, sinks) and what it does between generation and the trainer (draws, scoring,
  filters, replay, group sizes).
- `launch`: `train_async`, an orchestrated run: samplers on a runtime (local processes or Ray
  actors), the orchestrator between them, resume from a checkpoint, one shutdown path.
- `learner`: the trainer side of an orchestrated run, a `Run` seen as the orchestrator's
  `Learner`, with deferred evaluation.
- `evaluate`: held-out evaluation (`mean@n`, `pass@1`, `pass@k`).

What decides *when* (the orchestrator, the synchronous loop, the presets, the samplers' loop)
is `slipstream.schedule`.
"""
