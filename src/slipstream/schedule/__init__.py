"""The orchestrator and the schedule presets (sync ... pipeline); the synchronous loop."""
