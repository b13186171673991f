"""The DeepSpeed-style printout: summary, aggregated profile per depth, detailed module tree
with each module's own ops. Reads finished results only; never touches the dispatch mode.

Sections, order and wording follow DeepSpeed's flops profiler and its descendants (see
docs/migrating.md): a DeepSpeed user finds the lines where they expect them. Per-module
figures are the forward's, as DeepSpeed's are; backward, optimizer and recompute appear in
the summary, measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from torch import nn

from dispatch_flops.results.format import duration, human, percent
from dispatch_flops.results.stats import (
    BACKWARD,
    FORWARD,
    NO_ARITHMETIC,
    OPTIMIZER,
    RECOMPUTE,
    ROOT,
    Stats,
    depth_of,
)
from dispatch_flops.views.escape import printable, safe_lines

_WIDTH = 60  # DeepSpeed's "{:<60}  {:<8}" summary lines
_RULE = "-" * 78

_NOTATIONS = """Notations:
data parallel size (dp_size), model parallel size(mp_size),
number of parameters (params), number of multiply-accumulate operations(MACs),
number of floating-point operations (flops), floating-point operations per second (FLOPS),
fwd latency (forward propagation latency), bwd latency (backward propagation latency),
step (weights update latency), iter latency (sum of fwd, bwd and step latency)"""

_ORDER = ("Each module profile is listed after its name in the following order:\n"
          "params, percentage of total params, MACs, percentage of total MACs, fwd latency, "
          "percentage of total fwd latency, fwd FLOPS, output activation bytes, input shape, "
          "output shape")
_NOTES = (
    "Note: 1. A module can run torch.nn.functional or tensor ops directly, not through a "
    "submodule: they make up the difference between a parent's MACs (or latency) and the sum "
    "of its submodules'.",
    "2. flops are 2 * MACs of the contraction ops (matmul, convolution, attention, recurrent "
    "kernels), DeepSpeed's figure; the 'ops' lists and the step line give each op's "
    "arithmetic, element-wise work (softmax, normalisation, bias adds, optimizer) included.",
    "3. A module's fwd latency is the time spent inside its forward calls, hook to hook; the "
    "top module's is the fwd latency above. Latencies show '-' when timing was off.",
    "4. Activation bytes are the bytes of the tensors a module's forward returns, summed over "
    "its calls; shapes are those of its first call.",
)
_OPS_ORDER = ", ops it ran directly"
_OPS_NOTE = (" 'ops' lists those aten ops with their flops, MACs, latency, FLOPS and shares of "
             "the total fwd flops and latency.")


@dataclass(frozen=True)
class World:
    """Process-group sizes, printed when an engine is given or ``torch.distributed`` is
    initialised."""

    world_size: int
    dp_size: int
    mp_size: int


def _line(label: str, value: str) -> str:
    return f"{label:<{_WIDTH}}  {value}".rstrip()


def _latency(seconds: Optional[float]) -> str:
    return "-" if seconds is None else duration(seconds, compact=True)


def _rate(amount: int, seconds: Optional[float], unit: str = "FLOPS") -> str:
    return human(amount / seconds, unit, compact=True) if seconds else "-"


def _shape(shapes: tuple) -> str:
    listed = [list(s) for s in shapes]
    return str(listed[0] if len(listed) == 1 else listed)


def _sum_latency(*values: Optional[float]) -> Optional[float]:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


class ProfileView:
    """The figures of one profile, read once from a finished ``FlopCounter`` and an
    ``ActivationRecorder``'s results; ``text()`` lays them out.

    >>> ProfileView(counter, model, activations).text(profile_step=5)
    """

    def __init__(self, counter, model: nn.Module, activations: dict,
                 hidden: frozenset = frozenset()):
        self.counter = counter
        self.model = model
        self.activations = activations
        self.hidden = hidden
        self.modules = dict(model.named_modules())  # named_modules() order and names
        self.forward = counter.by_module(phase=FORWARD)
        self.phases = counter.by_phase()
        self.params = {
            name: self.forward[name].params if name in self.forward
            else sum(p.numel() for p in module.parameters())
            for name, module in self.modules.items()
        }
        root = self.forward.get(ROOT)
        self.total_params = self.params[ROOT]
        self.total_macs = self.phases[FORWARD].macs
        self.total_flops = 2 * self.total_macs  # DeepSpeed's figure
        self.total_op_flops = self.phases[FORWARD].flops  # every op's, for the ops lists
        self.total_latency = root.latency_s if root is not None else None
        self.own_ops = self._own_ops()

    def _own_ops(self) -> dict[str, dict[str, Stats]]:
        """Forward ops each shown module ran directly, by operator. An op run inside a hidden
        (ignored) module goes to its nearest shown ancestor, as DeepSpeed's functionals do.
        Ops that do no arithmetic (views, copies) are left out."""
        out: dict[str, dict[str, Stats]] = {}
        for r in self.counter.records():
            if r.phase != FORWARD or r.category == NO_ARITHMETIC:
                continue
            owner = next((n for n in reversed(r.stack) if n not in self.hidden), ROOT)
            ops = out.setdefault(owner, {})
            ops[r.operator] = ops.get(r.operator, Stats()) + r.stats
        return out

    # -- one module -----------------------------------------------------------------------
    def module_items(self, name: str, module_ops: bool = True) -> list[str]:
        """The profile items printed after module ``name``'s class name."""
        m = self.forward.get(name)
        params = self.params[name]
        macs = m.macs if m is not None else 0
        flops = 2 * macs
        latency = m.latency_s if m is not None else None
        act = self.activations.get(name)
        items = [
            human(params, compact=True), f"{percent(params, self.total_params)} Params",
            human(macs, "MACs", compact=True), f"{percent(macs, self.total_macs)} MACs",
            _latency(latency),
            f"{percent(latency, self.total_latency) if latency is not None else '-'} latency",
            _rate(flops, latency),
            f"{human(act.output_bytes if act else 0, 'B', compact=True)} activation",
            f"input shape {_shape(act.input_shapes) if act else '-'}",
            f"output shape {_shape(act.output_shapes) if act else '-'}",
        ]
        ops = self.own_ops.get(name)
        if module_ops and ops:
            items.append(f"ops = {self._ops(ops)}")
        extra = self.modules[name].extra_repr() if name in self.modules else ""
        if extra:
            items.append(extra)
        return items

    def _ops(self, ops: dict[str, Stats]) -> dict:
        ordered = sorted(ops.items(), key=lambda item: (-item[1].flops, item[0]))
        return {
            op: {
                "flops": human(s.flops, compact=True),
                "MACs": human(s.macs, "MACs", compact=True),
                "latency": _latency(s.latency_s),
                "FLOPS": _rate(s.flops, s.latency_s),
                "flops%": percent(s.flops, self.total_op_flops),
                "latency%": percent(s.latency_s, self.total_latency)
                if s.latency_s is not None else "-",
            }
            for op, s in ordered
        }

    # -- sections -------------------------------------------------------------------------
    def summary(self, profile_step: int, world: Optional[World], mp_size: int,
                batch_size: Optional[int]) -> list[str]:
        fwd, bwd = self.phases[FORWARD], self.phases[BACKWARD]
        step, recompute = self.phases[OPTIMIZER], self.phases[RECOMPUTE]
        lines = ["-------------------------- Flops Profiler (dispatch_flops) "
                 "--------------------------",
                 f"Profile Summary at step {profile_step}:", _NOTATIONS, ""]
        if world is not None:
            lines += [_line("world size:", str(world.world_size)),
                      _line("data parallel size:", str(world.dp_size)),
                      _line("model parallel size:", str(world.mp_size))]
        if batch_size is not None:
            lines.append(_line("batch size per device:", str(batch_size)))
        fwd_latency = self.total_latency
        lines += [
            _line("params per device:", human(self.total_params, compact=True)),
            _line("params of model = params per device * mp_size:",
                  human(self.total_params * mp_size, compact=True)),
            _line("fwd MACs per device:", human(fwd.macs, "MACs", compact=True)),
            _line("fwd flops per device:", human(2 * fwd.macs, compact=True)),
            _line("fwd flops of model = fwd flops per device * mp_size:",
                  human(2 * fwd.macs * mp_size, compact=True)),
            _line("fwd latency:", _latency(fwd_latency)),
            _line("fwd FLOPS per device = fwd flops per device / fwd latency:",
                  _rate(2 * fwd.macs, fwd_latency)),
        ]
        iteration = [fwd_latency]
        if bwd.calls:
            lines += [
                _line("bwd MACs per device:", human(bwd.macs, "MACs", compact=True)),
                _line("bwd flops per device:", human(2 * bwd.macs, compact=True)),
                _line("bwd latency:", _latency(bwd.latency_s)),
                _line("bwd FLOPS per device = bwd flops per device / bwd latency:",
                      _rate(2 * bwd.macs, bwd.latency_s)),
                _line("fwd+bwd FLOPS per device = fwd+bwd flops / fwd+bwd latency:",
                      _rate(2 * (fwd.macs + bwd.macs),
                            _sum_latency(fwd_latency, bwd.latency_s))),
            ]
            iteration.append(bwd.latency_s)
        if recompute.calls:
            lines += [_line("recompute flops per device:",
                            human(2 * recompute.macs, compact=True)),
                      _line("recompute latency:", _latency(recompute.latency_s))]
            iteration.append(recompute.latency_s)
        if step.calls:
            lines += [_line("step flops per device (all ops):", human(step.flops, compact=True)),
                      _line("step latency:", _latency(step.latency_s))]
            iteration.append(step.latency_s)
        iter_latency = _sum_latency(*iteration)
        if len(iteration) > 1:
            lines.append(_line("iter latency:", _latency(iter_latency)))
        if batch_size is not None:
            lines.append(_line("samples/second:", _rate(batch_size, iter_latency, "")))
        unsupported = self.counter.unsupported_ops()
        if unsupported:
            listed = ", ".join(f"{op} x{n}" for op, n in sorted(unsupported.items()))
            lines.append(f"Ops with no formula (bytes counted, flops unknown): {listed}")
        return lines

    def aggregated(self, module_depth: int, top_modules: int) -> list[str]:
        """DeepSpeed's aggregated profile: at each depth, modules summed by class, the
        ``top_modules`` largest by each figure (AProfiler's activation bytes included)."""
        by_depth: dict[int, dict[str, list]] = {}
        for name, module in self.modules.items():
            depth = depth_of(name)
            if name in self.hidden or (module_depth >= 0 and depth > module_depth):
                continue
            m = self.forward.get(name)
            act = self.activations.get(name)
            figures = [self.params[name], m.macs if m else 0, 2 * m.macs if m else 0,
                       m.latency_s if m else None, act.output_bytes if act else 0]
            groups = by_depth.setdefault(depth, {})
            group = groups.setdefault(module._get_name(), [0, 0, 0, None, 0])
            for i, value in enumerate(figures):
                group[i] = _sum_latency(group[i], value) if i == 3 else group[i] + value
        rows = (("params     ", 0, lambda v: human(v, compact=True)),
                ("MACs       ", 1, lambda v: human(v, "MACs", compact=True)),
                ("flops      ", 2, lambda v: human(v, compact=True)),
                ("fwd latency", 3, _latency),
                ("activation ", 4, lambda v: human(v, "B", compact=True)))
        lines = ["", "----------------------------- Aggregated Profile per device "
                 "-----------------------------",
                 f"Top {top_modules} modules in terms of params, MACs, flops, fwd latency or "
                 f"activation bytes at different model depths:"]
        for depth in sorted(by_depth):
            groups = by_depth[depth]
            lines.append(f"depth {depth}:")
            for label, index, fmt in rows:
                if all(figures[index] is None for figures in groups.values()):
                    lines.append(f"    {label} - -")  # not measured (timing off)
                    continue
                top = sorted(groups.items(), key=lambda item: -(item[1][index] or 0))
                shown = {cls: fmt(figures[index]) for cls, figures in top[:top_modules]}
                lines.append(f"    {label} - {shown}")
        return lines

    def detailed(self, module_depth: int, module_ops: bool) -> list[str]:
        name_of = {id(module): name for name, module in self.modules.items()}
        lines = ["", "------------------------------ Detailed Profile per device "
                 "------------------------------", _ORDER + (_OPS_ORDER if module_ops else ""),
                 "", _NOTES[0] + (_OPS_NOTE if module_ops else ""), *_NOTES[1:], ""]
        lines.append(self._tree(self.model, ROOT, 0, module_depth, module_ops, name_of))
        return lines

    def _tree(self, module: nn.Module, name: str, depth: int, module_depth: int,
              module_ops: bool, name_of: dict) -> str:
        """``module``'s repr as ``nn.Module.__repr__`` lays it out, profile items first."""
        own = ", ".join(self.module_items(name, module_ops))
        children = []
        if module_depth < 0 or depth < module_depth:
            for key, child in module._modules.items():
                if child is None:
                    continue
                child_name = f"{name}.{key}" if name else key
                if child_name in self.hidden:
                    continue
                if name_of.get(id(child)) != child_name:  # a shared module, shown once
                    shown = f"{child._get_name()}(same module as ({name_of.get(id(child))}))"
                else:
                    shown = self._tree(child, child_name, depth + 1, module_depth, module_ops,
                                       name_of)
                children.append(f"({printable(key)}): " + shown.replace("\n", "\n  "))
        if not children:
            return f"{module._get_name()}({own})"
        return f"{module._get_name()}(\n  " + "\n  ".join([own] + children) + "\n)"

    def text(self, *, profile_step: int = 1, module_depth: int = -1, top_modules: int = 1,
             detailed: bool = True, module_ops: bool = True, world: Optional[World] = None,
             mp_size: int = 1, batch_size: Optional[int] = None) -> str:
        lines = self.summary(profile_step, world, mp_size, batch_size)
        lines += self.aggregated(module_depth, top_modules)
        if detailed:
            lines += self.detailed(module_depth, module_ops)
        lines.append(_RULE)
        # module names and reprs are the user's: nothing in them acts on the terminal
        return safe_lines("\n".join(lines)) + "\n"
