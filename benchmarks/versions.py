"""Is this version slower than that one? Versions of the package timed side by side, in one run.

On a shared machine a ratio moves by 0.1 from one run to the next (the machine's speed itself
moves: docs/overhead.md), so "no worse than before" cannot be read off two runs made hours
apart. This times several versions in the same paired rounds (``_paired.py``): each git
revision named is unpacked into a temporary directory as a package of its own name (the
package and its formulas, imports renamed) and imported beside the working tree's, and every
round runs the eager step, a do-nothing mode, and a fresh ``FlopCounter(model)`` per step of
each version, on ``overhead.py``'s workload (the built-in tiny GPT, forward + backward). It
prints each version's added time against the do-nothing mode's, and against the first
version's, ratios taken within rounds.

    python benchmarks/versions.py REV [REV ...] [--rounds 20] [--iters 5]

``REV`` is anything ``git archive`` takes (a commit, ``HEAD~3``, a tag); the working tree is
always timed too, last. Revisions older than the Profile (issue 12) import too: only the
counter's constructor and context manager are used.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile

import dispatch_flops

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from _paired import Rounds  # noqa: E402
from overhead import DoNothing, workload  # noqa: E402

REPO = os.path.dirname(HERE)


def unpack(rev: str, name: str, into: str):
    """The package as it was at ``rev``, imported as ``name`` from directory ``into``."""
    archive = os.path.join(into, name + ".tar")
    with open(archive, "wb") as out:
        subprocess.run(["git", "-C", REPO, "archive", rev, "dispatch_flops", "formulas"],
                       stdout=out, check=True)
    staging = os.path.join(into, "_" + name)
    with tarfile.open(archive) as tar:
        tar.extractall(staging)
    package = os.path.join(into, name)
    os.rename(os.path.join(staging, "dispatch_flops"), package)
    link = os.path.join(package, "formulas")  # the checkout's symlink, if it was committed
    if os.path.islink(link):
        os.unlink(link)
    os.rename(os.path.join(staging, "formulas"), link)
    absolute = re.compile(r"\bdispatch_flops(?=[. ])")  # imports and module-name strings
    for folder, _, files in os.walk(package):
        for file in files:
            if file.endswith(".py"):
                path = os.path.join(folder, file)
                with open(path) as f:
                    text = f.read()
                text = "\n".join(absolute.sub(name, line) if "import" in line or
                                 '"dispatch_flops.' in line else line
                                 for line in text.split("\n"))
                with open(path, "w") as f:
                    f.write(text)
    if into not in sys.path:
        sys.path.insert(0, into)
    return importlib.import_module(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revs", nargs="+", help="git revisions to time beside the working tree")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args()
    cfg, model, step, ops = workload()
    with tempfile.TemporaryDirectory() as into:
        packages = {rev: unpack(rev, f"dispatch_flops_v{i}", into)
                    for i, rev in enumerate(args.revs)}
        packages["working tree"] = dispatch_flops

        def one(make):
            def run():
                with make():
                    step()
            return run

        variants = {"eager": one(contextlib.nullcontext), "do-nothing mode": one(DoNothing)}
        for rev, package in packages.items():
            variants[rev] = one(lambda package=package: package.FlopCounter(model))
        for _ in range(3):  # warm-up: resolutions, ledgers
            for run in variants.values():
                run()
        timed = Rounds(variants, args.rounds, args.iters)
    first = next(iter(packages))
    print(f"fresh FlopCounter(model) per step, tiny GPT {cfg.n_layer}x{cfg.d_model} forward + "
          f"backward ({ops} aten ops), {args.rounds} rounds x {args.iters} steps, CPU time; "
          f"ratios paired within rounds")
    for rev in packages:
        against_first = statistics.median(
            a / b for a, b in zip(timed.added(rev), timed.added(first)))
        print(f"{rev:>14}: added {statistics.median(timed.added(rev)) / ops * 1e6:6.2f} us/op, "
              f"{timed.ratio(rev, 'do-nothing mode'):.3f}x the do-nothing mode, "
              f"{against_first:.3f}x what {first} adds")


if __name__ == "__main__":
    main()
