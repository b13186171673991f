"""Instructions per aten op, counted by valgrind's callgrind: steadier than a shared machine's
clock. The same tiny GPT train step as overhead.py, eagerly and under each mode; each variant
runs in its own process under callgrind with instrumentation switched on only around its steps.

    python benchmarks/instructions.py [--steps 10]     (needs valgrind; about a minute a variant)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # overhead.py beside it

VARIANTS = ("eager", "do-nothing mode", "  (unwrapped)", "fresh counter", "one counter")


def _run_steps(variant: str, steps: int) -> None:
    """Inside callgrind: warm up, then count ``steps`` steps of ``variant``."""
    from overhead import DoNothing, DoNothingUnwrapped, workload

    from dispatch_flops import FlopCounter

    _, model, step, _ = workload()
    make = {"eager": contextlib.nullcontext, "do-nothing mode": DoNothing,
            "  (unwrapped)": DoNothingUnwrapped, "fresh counter": lambda: FlopCounter(model),
            "one counter": lambda: FlopCounter(model)}[variant]
    for _ in range(3):
        with make():
            step()

    def instrument(on: str) -> None:
        subprocess.run(["callgrind_control", "-i", on, str(os.getpid())], check=True,
                       capture_output=True)

    instrument("on")
    if variant == "one counter":
        with make():
            for _ in range(steps):
                step()
    else:
        for _ in range(steps):
            with make():
                step()
    instrument("off")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # the run inside callgrind
    args = parser.parse_args()
    if args.variant:
        return _run_steps(args.variant, args.steps)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("needs valgrind (callgrind): apt-get install valgrind")
    from overhead import workload

    ops = workload()[3]
    per_op = {}
    with tempfile.TemporaryDirectory() as tmp:
        for variant in VARIANTS:
            out = subprocess.run(
                ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                 f"--callgrind-out-file={tmp}/cg.out", sys.executable, os.path.abspath(__file__),
                 "--variant", variant, "--steps", str(args.steps)],
                capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
            found = re.search(r"Collected : (\d+)", out.stderr)
            if found is None:
                raise SystemExit(f"callgrind gave no count for {variant!r}:\n{out.stderr[-2000:]}")
            per_op[variant] = int(found.group(1)) / args.steps / ops
            print(f"{variant:>16}: {per_op[variant] / 1e3:7.1f} K instructions per aten op",
                  flush=True)
    added = {v: per_op[v] - per_op["eager"] for v in VARIANTS[1:]}
    for variant in ("fresh counter", "one counter"):
        print(f"{variant}: {added[variant] / added['do-nothing mode']:.2f}x the do-nothing "
              f"mode's added instructions, {added[variant] / added['  (unwrapped)']:.2f}x "
              f"the unwrapped one's")


if __name__ == "__main__":
    main()
