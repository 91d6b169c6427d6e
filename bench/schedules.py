"""The schedules against the best sync configuration: `slipstream bench schedules` as a script.

Run: python bench/schedules.py [--presets sync,pipeline] [--target 0.5] [key=value ...]
"""

from __future__ import annotations

import sys

from slipstream.run.bench import bench_schedules_main

if __name__ == "__main__":  # the sampler processes are spawned: they import this module
    sys.exit(bench_schedules_main(sys.argv[1:]))
