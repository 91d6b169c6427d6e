"""Assembling a run from its config: what runs, where, and from which checkpoint; the
commands that run whole runs.

- `preflight`: checks of a config against this machine before any work starts (the model
  folder, its sliding window, the optional libraries a setting needs).
- `components`: device placement, the engine's shape within its KV budget, the trainer with
  its proximal policy resolved, the pass-rate tracker.
- `setup`: the `Run` that `setup(cfg)` builds (folder, model, tokenizer, task, engines,
  trainer, sinks) and what it does between generation and the trainer (draws, scoring,
  filters, replay, group sizes).
- `drawing`: the prompts of a step drawn (too long and out-of-band ones skipped), each with the
  ids that measured it, which its requests reuse.
- `agentic`: multi-turn runs from the config: the environment factory (`env.tools`,
  `env.factory`, the built-in agentic task), its warm start, held-out accuracy of episodes.
- `sync`: `train_sync`, the in-process synchronous run: built, resumed, handed to the loop
  (`schedule.sync.train_steps`), finished.
- `launch`: `train_async`, an orchestrated run: samplers on a runtime (local processes or Ray
  actors), the orchestrator between them, resume from a checkpoint, one shutdown path.
- `sampler`: `SamplerFactory`, a sampler's engine, task and environments built inside its
  process (what the runtime pickles).
- `learner`: the trainer side of an orchestrated run, a `Run` seen as the orchestrator's
  `Learner`, with deferred evaluation.
- `resume`: checkpoints of a run (`checkpoint`) and resuming from them (`latest_checkpoint`,
  `rewind`, `restore`).
- `rollback`: the watchdog made for a run, and its rollbacks restoring a checkpoint into it.
- `summary`: the end of a run (`finish`: summary.json, ledger.json) and its step records read
  back.
- `evaluate`: held-out evaluation (`mean@n`, `pass@1`, `pass@k`).
- `replay_run`: `slipstream replay RUN_DIR`, a recorded asynchronous run re-executed in one
  process; `replay_compare`: the replay compared with the run, step records and weights.
- `bench`: `slipstream bench schedules`, the schedules' runs on one task compared.

What decides *when* (the orchestrator, the synchronous loop, the presets, the samplers' loop,
the watchdog's alarms) is `slipstream.schedule`, which never imports this package.
"""
