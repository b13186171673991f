"""The least a counter built from module hooks and per-signature keys can cost (issue 42).

Issue 42 asks a fresh counter per step to add at most 1.2x what a do-nothing dispatch mode adds
(BERT-base forward; GPT-2 and Llama training steps). This script climbs from that floor to the
counter one rung at a time, each rung doing the least a counter of this design must do, and
nothing else:

- ``do-nothing mode``: a mode that only runs each op (always_on.py's floor);
- ``+ empty hooks``: with two empty global module hooks (a forward pre-hook and an
  always-called forward hook), registered and removed every step as a counter's are: torch's
  own module-call path with hooks;
- ``runs-only mode + empty hooks``: the same hooks over a mode that only runs each op the
  counter's way (per_op_parts.py's ``RunsOnly``: the op's own callable, torch's per-op compile
  guard skipped, as the counter's is): what the counter saves before it does anything;
- ``least tracker``: those hooks doing the least attribution can do (the module's record
  dict looked up by id and made current; the caller's restored after), and, as the counter's,
  optimizer step hooks (they note that a step runs), under that mode;
- ``+ counts by overload``: the mode also reads the autograd node and counts each call under
  its overload in the current dict (per_op_parts.py's ``ByOverload``);
- ``+ keys by arguments``: the mode keys by its arguments, as the counter's signature does
  (per_op_parts.py's ``ByArguments``), each call the counter keys: views and the ops of an
  optimizer step (which the counter replays once learned) stay counted under their overload.
  What per-signature counting needs before any pricing, phases, backward attribution, masks or
  results;
- ``counted + read``: a fresh ``FlopCounter(model)`` per step, its total (and, training, its
  per-module table) read.

Each rung's added time over the eager step, as a ratio to the do-nothing mode's, paired in
rounds (``_paired.py``: thread CPU time, medians over rounds). A rung at or above the target
shows that no counter of this design (module hooks, a Python key per op) can meet it on this
machine, whatever it cuts elsewhere.

    python benchmarks/floor_ladder.py [--rounds 10] [--iters 3] [--model bert|gpt2|llama|all]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _paired import Rounds, warmed_ops  # noqa: E402
from always_on import TARGET, DoNothing, models, training_step  # noqa: E402
from per_op_parts import ByOverload, RunsOnly, keyed_mode  # noqa: E402

from dispatch_flops import FlopCounter  # noqa: E402
from dispatch_flops.engine.counting.records import engine_cache  # noqa: E402
from dispatch_flops.engine.counting.skip import SKIP_FRAMES  # noqa: E402

_RESOLUTIONS = engine_cache(FlopCounter().registry).resolutions  # every counter's, by op id
_STEPPING = [False]  # an optimizer step runs (the least tracker's step hooks set it)


def _counted_by_overload(func) -> bool:
    """Whether the counter counts ``func``'s call under its overload alone: a view (as the
    engine resolved it), or an op of an optimizer step (replayed: engine.counting.step_replay)."""
    if _STEPPING[0]:
        return True
    resolved = _RESOLUTIONS.get(id(func))
    return resolved is not None and resolved.view


ByArguments = keyed_mode(True, _counted_by_overload)
if SKIP_FRAMES is not None:
    for _mode in (RunsOnly, ByOverload, ByArguments):
        SKIP_FRAMES(_mode.__torch_dispatch__.__code__)


def _under_hooks(step, pre, post, mode=None):
    """``step`` with ``pre`` and ``post`` registered as global module hooks for its duration
    (and under ``mode``, made fresh, when given), as a counter registers its own."""
    def go():
        first = register_module_forward_pre_hook(pre)
        second = register_module_forward_hook(post, always_call=True)
        try:
            if mode is None:
                with DoNothing():
                    step()
            else:
                with mode():
                    step()
        finally:
            first.remove()
            second.remove()
    return go


def _least_tracker(model, step, mode_class):
    """``step`` under a fresh ``mode_class`` whose ``acc`` the hooks point at the running
    module's dict (one per module of ``model``, made per step): attribution at its least."""
    ids = [id(m) for m in model.modules()]

    def go():
        frames = {i: {} for i in ids}
        outer: list = []
        mode = mode_class()

        def pre(module, args):
            acc = frames.get(id(module))
            if acc is not None:
                outer.append(mode.acc)
                mode.acc = acc

        def post(module, args, out):
            if id(module) in frames:
                mode.acc = outer.pop()

        def stepping(optimizer, args, kwargs):
            _STEPPING[0] = True

        def stepped(optimizer, args, kwargs):
            _STEPPING[0] = False

        handles = [register_module_forward_pre_hook(pre),
                   register_module_forward_hook(post, always_call=True),
                   register_optimizer_step_pre_hook(stepping),
                   register_optimizer_step_post_hook(stepped)]
        try:
            with mode:
                step()
        finally:
            for handle in handles:
                handle.remove()
            _STEPPING[0] = False
    return go


def ladder(name: str, model, step, read, rounds: int, iters: int) -> None:
    """Time the rungs on ``step`` of ``model`` (``read``: what is read after a counted step)
    and print each one's ratio to the do-nothing mode's added time."""
    def do_nothing():
        with DoNothing():
            step()

    def counted_read():
        with FlopCounter(model) as fc:
            step()
        read(fc)

    def empty_pre(module, args):
        return None

    def empty_post(module, args, out):
        return None

    variants = {
        "eager": step,
        "do-nothing mode": do_nothing,
        "+ empty hooks": _under_hooks(step, empty_pre, empty_post),
        "runs-only mode + empty hooks": _under_hooks(step, empty_pre, empty_post, RunsOnly),
        "least tracker": _least_tracker(model, step, RunsOnly),
        "+ counts by overload": _least_tracker(model, step, ByOverload),
        "+ keys by arguments": _least_tracker(model, step, ByArguments),
        "counted + read": counted_read,
    }
    ops = warmed_ops(model, step, variants)
    paired = Rounds(variants, rounds, iters)
    print(f"{name}: {ops} aten ops, eager {paired.median('eager') * 1e3:.2f} ms CPU "
          f"({rounds} rounds x {iters})")
    width = max(map(len, variants))
    for v in list(variants)[1:]:
        ratio = paired.ratio(v, "do-nothing mode")
        added = statistics.median(paired.added(v))
        over = f"  <- over {TARGET}" if ratio > TARGET and v != "counted + read" else ""
        print(f"  {v:>{width}}: added {added * 1e3:6.2f} ms ({added / ops * 1e6:5.2f} us/op), "
              f"{ratio:.2f}x the do-nothing mode{over}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--model", choices=("bert", "gpt2", "llama", "all"), default="all")
    parser.add_argument("--tokens", type=int, default=32, help="sequence length (bert)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.model in ("bert", "all"):
        from transformers import BertConfig, BertModel

        torch.manual_seed(0)
        bert = BertModel(BertConfig()).eval()  # base size, no weights downloaded
        ids = torch.randint(0, bert.config.vocab_size, (1, args.tokens))

        def forward():
            with torch.no_grad():
                bert(input_ids=ids)

        ladder(f"BERT-base forward, no_grad, 1 x {args.tokens} tokens", bert, forward,
               lambda fc: fc.total.flops, args.rounds, args.iters)
    for name, model in models().items():
        if args.model not in ("all", name.lower().replace("-", "")):
            continue
        model.train()
        ladder(f"{name} training step", model, training_step(model),
               lambda fc: (fc.total.flops, len(fc.by_module())), args.rounds, args.iters)
    print(f"target: counted + read <= {TARGET}x the do-nothing mode")


if __name__ == "__main__":
    main()
