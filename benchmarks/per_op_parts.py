"""What each part of the counting mode's per-op path costs, on a real step's ops.

The aten ops of always_on.py's GPT-2 training step are recorded once (each op with copies of
its arguments), then run again, outside autograd and without modules, under modes that each
do a little more of what the counter does per op, and under the counter itself:

- ``runs only``: a mode that runs each op (torch's per-op compile guard skipped, as ours is);
- ``+ keyed by overload``: also finds the autograd node and counts the call under its overload;
- ``+ keyed by arguments``: keys the call as the counter's signature does (each tensor's shape
  and dtype, its strides where not contiguous, lists as tuples, floats the formulas do not
  tell apart as one marker) and counts it under that key;
- ``+ ... no tensor reads``: the same loop over the arguments, reading no tensor attribute;
- ``counter``, ``counter, tallies off``: a FlopCounter (no model), with and without the mask
  tallies.

Each variant's added time over the ops run bare, per op, medians over rounds (this thread's
CPU time). Ops run with warm caches here, unlike inside a step: read the differences, not
the sums.

    python benchmarks/per_op_parts.py [--rounds 12]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from always_on import models, training_step  # noqa: E402

from dispatch_flops import FlopCounter  # noqa: E402
from dispatch_flops.engine.counting.calls import FLOAT, TOLD_APART, key_of  # noqa: E402
from dispatch_flops.engine.counting.records import engine_cache  # noqa: E402
from dispatch_flops.engine.counting.skip import SKIP_FRAMES  # noqa: E402

_node = torch._C._current_autograd_node
_SCALARS = frozenset((int, float, bool, complex, str, list, tuple, type(None), torch.dtype,
                      torch.device, torch.layout, torch.memory_format))


def recorded_ops() -> list:
    """(op, args, kwargs) of every aten op of one GPT-2 training step, arguments copied."""
    model = models()["GPT-2"].train()
    step = training_step(model)
    for _ in range(3):  # the optimizer's state made
        step()
    calls: list = []

    def copied(v):
        if isinstance(v, Tensor):
            return v.detach().clone()
        return [copied(x) for x in v] if isinstance(v, list) else v

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            # random draws and host reads change what follows them: left out
            if func.namespace == "aten" and func.__name__.split(".")[0] not in (
                    "bernoulli_", "_local_scalar_dense"):
                calls.append((func, tuple(copied(a) for a in args),
                              {k: copied(v) for k, v in (kwargs or {}).items()}))
            return out

    with Recorder():
        step()
    return calls


class _Mode(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return SKIP_FRAMES is None

    def __init__(self):
        super().__init__()
        self.acc: dict = {}


class RunsOnly(_Mode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func._op(*args, **kwargs) if kwargs else func._op(*args)


class ByOverload(_Mode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func._op(*args, **kwargs) if kwargs else func._op(*args)
        _node()
        key = id(func)
        rec = self.acc.get(key)
        if rec is None:
            rec = self.acc[key] = [0, 0, None]
        rec[0] += 1
        return out


def keyed_mode(read_tensors: bool, by_overload=None):
    """A mode keying each op by its arguments; ``by_overload(func)``, when given and true,
    counts that op under its overload instead (what the counter does for views and replayed
    optimizer steps)."""
    # the loop of CountingMode.__torch_dispatch__'s signature, copied on purpose: what it
    # costs is measured here without the rest of the counter around it
    class ByArguments(_Mode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func._op(*args, **kwargs) if kwargs else func._op(*args)
            _node()
            if by_overload is not None and by_overload(func):
                signature: object = id(func)  # the overload's key, as ByOverload's
            else:
                sig = [id(func)]
                for a in args:
                    cls = a.__class__
                    if cls is Tensor or cls is torch.nn.Parameter or \
                            cls not in _SCALARS and isinstance(a, Tensor):
                        if read_tensors:
                            sig.append(a.shape)
                            sig.append(a.dtype)
                            if not a.is_contiguous():
                                sig.append(a.stride())
                    elif cls is list or cls is tuple:
                        sig.append(tuple(a) if not a or a[0].__class__ is int else key_of(a))
                    elif cls is float and a not in TOLD_APART:
                        sig.append(FLOAT)
                    else:
                        sig.append(a)
                if kwargs:
                    for k, v in kwargs.items():
                        sig.append(k)
                        sig.append(key_of(v))
                signature = tuple(sig)
            rec = self.acc.get(signature)
            if rec is None:
                rec = self.acc[signature] = [0, 0, None]
            rec[0] += 1
            return out
    return ByArguments


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    torch.set_num_threads(1)
    calls = recorded_ops()

    def bare():
        with torch.no_grad():
            for func, a, k in calls:
                func(*a, **k)

    def under(make):
        def go():
            with make():
                bare()
        return go

    resolutions = engine_cache(FlopCounter().registry).resolutions  # every counter's

    def counter(tallies: bool):
        def go():
            saved = {}
            if not tallies:  # for this block, no op reads a mask
                for key, resolved in resolutions.items():
                    saved[key], resolved.tally = resolved.tally, None
            try:
                with FlopCounter():
                    bare()
            finally:
                for key, tally in saved.items():
                    resolutions[key].tally = tally
        return go

    keyed, unread = keyed_mode(True), keyed_mode(False)
    for mode in (RunsOnly, ByOverload, keyed, unread):
        if SKIP_FRAMES is not None:
            SKIP_FRAMES(mode.__torch_dispatch__.__code__)
    variants = {"bare": bare, "runs only": under(RunsOnly),
                "+ keyed by overload": under(ByOverload),
                "+ keyed by arguments": under(keyed),
                "+ ... no tensor reads": under(unread),
                "counter, tallies off": counter(False), "counter": counter(True)}
    for go in variants.values():
        go()
    times: dict = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, go in variants.items():
            gc.collect()
            start = time.thread_time()
            for _ in range(3):
                go()
            times[name].append((time.thread_time() - start) / 3)
    n = len(calls)
    base = statistics.median(times["bare"])
    print(f"always_on.py's GPT-2 step: {n} aten ops run again outside autograd "
          f"({args.rounds} rounds x 3)")
    for name in list(variants)[1:]:
        added = statistics.median(times[name]) - base
        print(f"  {name:>22}: {added / n * 1e9:6.0f} ns an op added")


if __name__ == "__main__":
    main()
