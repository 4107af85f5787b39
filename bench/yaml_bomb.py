"""A YAML anchor bomb handed to `llm-placement plan`: how long and how much memory the refusal takes.

A 600-byte workflow whose nested anchors would expand to a billion strings. The planner reads user
files with aliases refused (docs/planner.md), so the bomb is refused before it expands.

    python bench/yaml_bomb.py
"""

from __future__ import annotations

import contextlib
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

from rich.console import Console

LEVELS = zip("abcdefgh", "bcdefghi", strict=True)
BOMB = ('a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
        + "".join(f'{c}: &{c} [{",".join([f"*{p}"] * 9)}]\n' for p, c in LEVELS)
        + "tasks:\n  - {name: x, stage: data-prep, duration: 10s, annotations: {k: *i}}\n")


def main() -> None:
    from app.plan.workflow import WorkflowError, load_workflow

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bomb.yaml"
        path.write_text(BOMB)
        tracemalloc.start()
        t0 = time.perf_counter()
        with contextlib.suppress(WorkflowError):
            load_workflow(path)
        refuse_s = time.perf_counter() - t0
        peak_mb = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        Console().print(f"refusal in process: {refuse_s * 1000:.1f} ms, {peak_mb:.2f} MB allocated at peak")
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "app.cli", "plan", str(path)], capture_output=True,
                              text=True, timeout=120)
        wall = time.perf_counter() - t0
    rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    said = " ".join((proc.stderr or proc.stdout).split())[:120]
    Console().print(f"{len(BOMB)}-byte bomb: exit {proc.returncode} in {wall:.2f} s (process start "
                    f"included), peak RSS {rss_mb:.0f} MB; says: {said}")


if __name__ == "__main__":
    main()
