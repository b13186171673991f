"""Instructions per aten op, counted by valgrind's callgrind: steadier than a shared machine's
clock, and the number CI guards (``--check``).

One process under callgrind imports torch once and runs every variant of one workload: the
tiny GPT of overhead.py, forward + backward + AdamW (``step``), eagerly and under each mode.
Each variant is warmed up, then its measured steps run inside a ctypes callback: callgrind
collects only inside libffi's ``ffi_call`` (``--toggle-collect``) and writes one dump as each
callback returns (``--dump-after``), so the counts are exactly the measured steps'. (No
``callgrind_control``: it reaches valgrind through vgdb, and on a loaded machine it once
switched nothing on, which read as 0 instructions.) Hash seeds and torch's CPU kernels are
pinned (``PYTHONHASHSEED=0``, ``ATEN_CPU_CAPABILITY=default``), so a run repeats to a few
instructions per op.

    python benchmarks/instructions.py [--steps 5] [--breakdown] [--workload train]
    python benchmarks/instructions.py --check      (CI: fails past the baseline + 5 %)
    python benchmarks/instructions.py --record "why the cost grew"   (a new baseline)

``--check`` compares what a fresh counter per step, read each step, adds per aten op over the
eager step against ``baseline_instructions.json`` beside this file. Raising the baseline is a
deliberate commit: ``--record WHY`` writes the figures measured now with the reason, and the
commit says why counting got dearer. ``--breakdown`` adds variants that switch parts of
counting off (docs/overhead.md, "Where the instructions go").

``--workload`` picks the step: ``train`` (the default, the one ``--check`` guards), ``gpt2``
(always_on.py's transformers GPT-2 training step, the logger's figure of issue 42), ``forward``
(the same tiny GPT's forward under ``no_grad``), ``mask`` (a tiny transformers BERT's forward
under ``no_grad`` with a padding mask: SDPA with a mask argument, whose masked pairs the
counter counts), ``compiled`` (benchmarks/compiled.py's 4-block MLP compiled by inductor,
forward + backward: the compiled graph's calls; its "eager" is the compiled step with no mode,
its do-nothing mode one that lets compiled code run under it, and per aten op means per op
the counter counts, inside the graphs or not).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import glob
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # overhead.py beside it
sys.path.insert(0, os.path.dirname(HERE))  # this checkout's package, not an installed one

BASELINE = os.path.join(HERE, "baseline_instructions.json")
GUARDED = "fresh counter + read"  # what --check compares, per aten op added over eager
TOLERANCE = 0.05
_LEAST = 100_000  # instructions: fewer is a stray ffi_call's dump, not measured steps
VARIANTS = ("eager", "do-nothing mode", "  (unwrapped)", "fresh counter + read",
            "one counter")
CHECKED = ("eager", "do-nothing mode", GUARDED)  # what --check and --record measure
# parts of counting switched off, to see what each costs (--breakdown)
BREAKDOWN = ("hooks only", "no signatures")
WORKLOADS = ("train", "forward", "mask", "compiled", "gpt2")
DESCRIBED = {"train": "tiny GPT, forward + backward + AdamW",
             "forward": "tiny GPT, forward under no_grad",
             "mask": "tiny BERT (transformers, SDPA), forward under no_grad, padding mask",
             "compiled": "4-block MLP compiled by inductor, forward + backward",
             "gpt2": "always_on.py's transformers GPT-2, forward + backward + AdamW"}
ENV = {"PYTHONHASHSEED": "0", "ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1"}


def _measured(fn) -> None:
    """Run ``fn`` inside ``ffi_call``, where callgrind collects; its exception re-raised (a
    ctypes callback would print and swallow it)."""
    failed: list = []

    def call():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - re-raised below, outside the callback
            failed.append(e)

    ctypes.CFUNCTYPE(None)(call)()
    if failed:
        raise failed[0]


def _variants(model, step, names, compiled: bool = False):
    """{name: a context manager factory, or (factory, runs) for one block over all steps}."""
    from overhead import DoNothing, DoNothingUnwrapped

    if compiled:  # a mode dynamo lets compiled code run under (else the step runs eagerly)
        from compiled import DoNothing

    from dispatch_flops import FlopCounter
    from dispatch_flops.engine.counting import mode as _mode
    from dispatch_flops.engine.counting.skip import SKIP_FRAMES as _SKIP_FRAMES

    sink = []

    @contextlib.contextmanager
    def read():
        with FlopCounter(model) as fc:
            yield
        sink.append(fc.total.flops)  # a logger's read: the step's total
        sink.clear()

    made = {"eager": contextlib.nullcontext, "do-nothing mode": DoNothing,
            "  (unwrapped)": DoNothingUnwrapped, "fresh counter + read": read,
            "one counter": lambda: FlopCounter(model)}

    class HooksOnly(_mode.CountingMode):
        """Counter, tracker and hooks as they are; each op only run."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **kwargs) if kwargs else func(*args)

    class NoSignatures(_mode.CountingMode):
        """Counts every op as a view is counted (by its overload alone): no signature built,
        nothing priced. Resolutions of its own, so the real ones stay as they are."""

        views: dict = {}

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            if not NoSignatures.views:
                real = self.resolved

                class Views(dict):  # the ledger's other records are read as resolved
                    def __missing__(self, key):
                        return real[key]

                NoSignatures.views = Views()
            self.resolved = NoSignatures.views

        def resolve(self, func):
            resolved = super().resolve(func)
            resolved.view, resolved.tally, resolved.shadow = True, None, None
            return resolved

    if _SKIP_FRAMES is not None:  # as the counting mode's own code is
        _SKIP_FRAMES(HooksOnly.__torch_dispatch__.__code__)

    def swapped(cls):
        import dispatch_flops.counter as _counter

        @contextlib.contextmanager
        def counting():
            original = _counter.CountingMode
            _counter.CountingMode = cls
            try:
                with read():
                    yield
            finally:
                _counter.CountingMode = original
        return counting

    made["hooks only"] = swapped(HooksOnly)
    made["no signatures"] = swapped(NoSignatures)
    return {name: made[name] for name in names}


def _workload(kind: str):
    """(model, step) of a workload (``WORKLOADS``), one thread, seeded."""
    import torch

    if kind == "compiled":
        from compiled import Block

        torch.manual_seed(0)
        torch.set_num_threads(1)
        model = torch.compile(torch.nn.Sequential(*[Block(128) for _ in range(4)]))
        x = torch.randn(8, 128)

        def step():
            model(x).sum().backward()
            model.zero_grad(set_to_none=True)

        return model, step
    if kind == "gpt2":  # the logger's step of always_on.py, whose clock ratio issue 42 sets
        from always_on import models, training_step

        torch.set_num_threads(1)
        model = models()["GPT-2"].train()
        return model, training_step(model)
    if kind == "mask":
        from transformers import BertConfig, BertModel

        torch.manual_seed(0)
        torch.set_num_threads(1)
        model = BertModel(BertConfig(num_hidden_layers=4, hidden_size=64, num_attention_heads=4,
                                     intermediate_size=128, vocab_size=256,
                                     max_position_embeddings=32,
                                     attn_implementation="sdpa")).eval()
        ids = torch.randint(0, 256, (2, 16))
        mask = torch.ones(2, 16, dtype=torch.long)
        mask[1, 10:] = 0  # the second sequence padded

        def step():
            with torch.no_grad():
                model(input_ids=ids, attention_mask=mask)

        return model, step
    from overhead import workload

    cfg, model, fwd_bwd, _ = workload()
    if kind == "forward":
        idx = torch.randint(0, cfg.vocab_size, (2, 16))

        def step():
            with torch.no_grad():
                model(idx)

        return model, step
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        fwd_bwd()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return model, step


def _inside(steps: int, names, out, kind: str = "train") -> None:
    """Inside callgrind: each variant warmed up, then ``steps`` steps measured."""
    from dispatch_flops import FlopCounter

    model, step = _workload(kind)
    step()  # compiles (compiled)
    with FlopCounter(model) as probe:
        step()
    made = _variants(model, step, names, compiled=kind == "compiled")
    for name in names:
        make = made[name]

        def run(n: int, make=make, name=name) -> None:
            if name == "one counter":  # one block over every step
                with make():
                    for _ in range(n):
                        step()
                return
            for _ in range(n):
                with make():
                    step()

        run(2)  # warm-up: caches, optimizer state, first-call set-up
        gc.collect()
        _measured(lambda: run(steps))
    json.dump({"names": list(names), "ops": probe.total.calls, "steps": steps}, out)


def measure(steps: int, names, kind: str = "train") -> dict:
    """{variant: instructions per aten op} from one callgrind run."""
    if shutil.which("valgrind") is None:
        raise SystemExit("needs valgrind (callgrind): apt-get install valgrind")
    with tempfile.TemporaryDirectory() as tmp:
        facts = os.path.join(tmp, "facts.json")
        cmd = ["valgrind", "--tool=callgrind", "--collect-atstart=no",
               "--toggle-collect=ffi_call", "--dump-after=ffi_call",
               f"--callgrind-out-file={tmp}/cg.out", sys.executable, os.path.abspath(__file__),
               "--inside", facts, "--steps", str(steps), "--variants", ",".join(names),
               "--workload", kind]
        env = dict(os.environ)
        for key, value in ENV.items():  # pinned unless set (PYTHONHASHSEED=1: the spread)
            env.setdefault(key, value)
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if done.returncode != 0 or not os.path.exists(facts):
            raise SystemExit(f"the run under callgrind failed ({done.returncode}):\n"
                             f"{done.stderr[-3000:]}")
        with open(facts) as f:
            run = json.load(f)
        dumps = sorted(glob.glob(f"{tmp}/cg.out.*"), key=lambda p: int(p.rsplit(".", 1)[1]))
        counts = []
        for path in dumps:
            with open(path) as f:
                found = re.search(r"^totals: (\d+)", f.read(), re.M)
            counts.append(int(found.group(1)) if found else 0)
        # a library's own ctypes calls while a model is built (transformers' BERT: four of
        # about a thousand instructions each) dump too; measured steps are millions
        if len(counts) > len(names):
            counts = [c for c in counts if c >= _LEAST]
        if len(counts) != len(names) or not all(counts):
            raise SystemExit(f"expected {len(names)} non-empty dumps, found {counts}")
    return {"ops": run["ops"],
            "per_op": {n: c / steps / run["ops"] for n, c in zip(names, counts)}}


def _environment() -> dict:
    import torch
    return {"torch": torch.__version__.split("+")[0], "python": platform.python_version(),
            "machine": platform.machine()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--workload", choices=WORKLOADS, default="train",
                        help="the step measured (--check and --record: train only)")
    parser.add_argument("--breakdown", action="store_true",
                        help="also the variants with parts of counting switched off")
    parser.add_argument("--check", action="store_true",
                        help=f"fail when {GUARDED!r} adds over {TOLERANCE:.0%}% more per op "
                             "than the baseline")
    parser.add_argument("--record", metavar="WHY", help="write a new baseline, saying why")
    parser.add_argument("--inside", help=argparse.SUPPRESS)  # the run under callgrind
    parser.add_argument("--variants", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        with open(args.inside, "w") as out:
            _inside(args.steps, args.variants.split(","), out, args.workload)
        return
    if (args.check or args.record) and args.workload != "train":
        parser.error("--check and --record guard the train workload only")
    names = CHECKED if args.check or args.record else \
        VARIANTS + (BREAKDOWN if args.breakdown else ())
    if args.workload == "compiled":  # that mode would run the step eagerly: no floor
        names = tuple(n for n in names if n != "  (unwrapped)")
    run = measure(args.steps, names, args.workload)
    per_op = run["per_op"]
    added = {n: per_op[n] - per_op["eager"] for n in names}
    print(f"{DESCRIBED[args.workload]}, {run['ops']} aten ops per step, "
          f"{args.steps} steps (callgrind, instructions per aten op; per step: x {run['ops']})")
    for name in names:
        extra = "" if name == "eager" else (
            f"  added {added[name] / 1e3:6.2f} K, "
            f"{added[name] / added['do-nothing mode']:.2f}x the do-nothing mode" + (
                f", {added[name] / added['  (unwrapped)']:.2f}x unwrapped"
                if "  (unwrapped)" in added else ""))
        print(f"{name:>22}: {per_op[name] / 1e3:7.2f} K{extra}", flush=True)
    here = {**_environment(), "steps": args.steps, "ops": run["ops"],
            "added_per_op": {n: round(added[n]) for n in names if n != "eager"}}
    if args.record:
        with open(BASELINE, "w") as f:
            json.dump({**here, "why": args.record}, f, indent=1)
            f.write("\n")
        print(f"baseline written: {BASELINE}")
    if args.check:
        sys.exit(check(here))


def check(here: dict) -> int:
    """0 when the guarded figure is within the baseline's tolerance, else 1 (and why)."""
    with open(BASELINE) as f:
        base = json.load(f)
    for key in ("torch", "python", "machine", "ops"):  # per op: any number of steps
        if base[key] != here[key]:
            print(f"the baseline was recorded with {key} {base[key]}, this run has "
                  f"{here[key]}: instruction counts are not comparable across them. Record a "
                  f"baseline here (--record WHY) in a commit of its own.")
            return 1
    was, now = base["added_per_op"][GUARDED], here["added_per_op"][GUARDED]
    limit = was * (1 + TOLERANCE)
    verdict = "OK" if now <= limit else "FAILED"
    print(f"{verdict}: {GUARDED} adds {now / 1e3:.2f} K instructions per aten op; baseline "
          f"{was / 1e3:.2f} K, limit {limit / 1e3:.2f} K (+{TOLERANCE:.0%}).")
    if now > limit:
        print("Counting got dearer per op. Find the change (python benchmarks/instructions.py "
              "--breakdown), or, if the cost is wanted, raise the baseline in a commit that "
              "says why: python benchmarks/instructions.py --record 'WHY'")
        return 1
    if now < was * (1 - TOLERANCE):
        print("Cheaper than the baseline by more than the tolerance: record the new figure "
              "(--record 'WHY'), so the guard holds what was won.")
    return 0


if __name__ == "__main__":
    main()
