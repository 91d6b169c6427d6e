"""What decides *when* things happen: the orchestrator and the schedule presets (sync ...
pipeline), the synchronous loop on a built run (`sync.train_steps`) and the step record, the
samplers' loop, episodes, admission, the ledger, the self-tuning lag bound, the watchdog's
alarms, the schedule record and the replay of one sampler.

Building a run from its config, resuming, finishing and evaluating it are `slipstream.run`,
which imports this package; nothing here imports `slipstream.run`.
"""
