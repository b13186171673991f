"""Plots of a counter's results, each returned as a matplotlib ``Figure``.

matplotlib is an optional extra (``pip install matplotlib``, or ``pip install -e '.[plot]'``
from a clone). The figures are
made without pyplot, so nothing global is touched and nothing is shown by itself: in a
notebook, make the figure the cell's last expression; elsewhere, ``fig.savefig("x.png")``.
They read a ``Profile`` (or a finished counter's, ``fc.to_profile()``; a loaded one from
``Profile.from_json``), and label numbers with the package's one formatter.

>>> from dispatch_flops import plot
>>> plot.by_module(fc, depth=2).savefig("modules.png")
>>> plot.icicle(fc, depth=3)
>>> plot.roofline(fc, DeviceSpec.cpu(1e12, 50e9), by="operator")
>>> plot.pipeline(profile_pipeline(pipe, "a cat"))   # a diffusion pipeline's parts
"""

from __future__ import annotations

import io
import textwrap
from typing import Optional

from dispatch_flops.results.format import duration, human
from dispatch_flops.results.profile import as_profile
from dispatch_flops.results.roofline import (
    COMPUTE_BOUND,
    MEMORY_BOUND,
    DeviceSpec,
    dtype_name,
)
from dispatch_flops.results.stats import PHASES, ROOT, Stats, depth_of

METRICS = ("flops", "macs", "bytes", "latency_s", "model_flops")
_METRIC_LABEL = {"flops": "FLOPs", "macs": "MACs", "bytes": "Bytes moved (read + written)",
                 "latency_s": "Latency",
                 "model_flops": "Model FLOPs (masked attention pairs left out)"}
_PHASE_COLOR = {"forward": "#4C72B0", "backward": "#DD8452", "optimizer": "#55A868",
                "recompute": "#C44E52", "other": "#8C8C8C"}


_FIGURE: list[type] = []  # the Figure subclass, made on first use: matplotlib is imported only then


def _figure(width: float, height: float):
    if not _FIGURE:
        try:
            from matplotlib.figure import Figure
        except ImportError:
            raise ImportError("plots need matplotlib: pip install matplotlib (or, from a "
                              "clone, pip install -e '.[plot]')") from None

        class ShownFigure(Figure):
            """A Figure that a notebook shows when it is a cell's value, without pyplot."""

            def _repr_png_(self) -> bytes:
                buffer = io.BytesIO()
                self.savefig(buffer, format="png")
                return buffer.getvalue()

        _FIGURE.append(ShownFigure)
    return _FIGURE[0](figsize=(width, height), layout="constrained")


def _renderer(fig):
    """The figure laid out (constrained layout run) and a renderer to measure text with."""
    if not hasattr(fig.canvas, "get_renderer"):
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def _place_labels(fig, ax, points, markers=()) -> list:
    """Label ``points`` ((text, x, y) in data coordinates, most important first) next to
    their marker, each at the first of a few offsets where it stays inside the axes and
    clear of the labels placed before it and of ``markers`` ((x, y, radius in points)); a
    label with no such place is left out. The layout is frozen afterwards so the places hold
    in the saved image. Returns the texts placed."""
    from matplotlib.transforms import Bbox

    renderer = _renderer(fig)
    inside = ax.get_window_extent(renderer)
    legend = ax.get_legend()
    taken = [legend.get_window_extent(renderer)] if legend is not None else []
    scale = fig.dpi / 72  # points to pixels
    for x, y, radius in markers:
        cx, cy = ax.transData.transform((x, y))
        r = radius * scale
        taken.append(Bbox([[cx - r, cy - r], [cx + r, cy + r]]))
    placed = []
    offsets = [(5, 4), (5, -11), (-5, 4), (-5, -11), (5, 14), (5, -21), (-5, 14), (-5, -21),
               (5, 24), (5, -31)]
    for text, x, y in points:
        for dx, dy in offsets:
            label = ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy),
                                fontsize=7, ha="left" if dx > 0 else "right")
            box = label.get_window_extent(renderer)
            fits = (box.x0 >= inside.x0 and box.x1 <= inside.x1 and box.y0 >= inside.y0
                    and box.y1 <= inside.y1)
            if fits and not any(box.overlaps(other) for other in taken):
                taken.append(box)
                placed.append(text)
                break
            label.remove()
    fig.set_layout_engine("none")  # keep the axes where the labels were measured
    return placed


def _joined(names: list) -> str:
    """Names of points drawn at one place, as one label: ``blocks.{0,1}.mlp`` where they
    differ in one dotted part, else listed."""
    if len(names) == 1:
        return names[0]
    parts = [n.split(".") for n in names]
    if len({len(p) for p in parts}) == 1:
        differ = [i for i in range(len(parts[0])) if len({p[i] for p in parts}) > 1]
        if len(differ) == 1:
            i = differ[0]
            head = ".".join(parts[0][:i])
            tail = ".".join(parts[0][i + 1:])
            middle = "{" + ",".join(p[i] for p in parts) + "}"
            return ".".join(x for x in (head, middle, tail) if x)
    return f"{names[0]} +{len(names) - 1}"


def _short(text: str) -> str:
    """'1.50 G' -> '1.5 G', '500.00 M' -> '500 M': tick labels without trailing zeros."""
    number, _, unit = text.partition(" ")
    if "." in number:
        number = number.rstrip("0").rstrip(".")
    return f"{number} {unit}".rstrip()


def _formatter(metric: str):
    from matplotlib.ticker import FuncFormatter

    def number(v):  # below 1, three significant digits: log ticks 1e-4 and 1e-3 differ
        return _short(human(v)) if abs(v) >= 1 else f"{v:.3g}"

    if metric == "latency_s":
        return FuncFormatter(lambda v, _: _short(duration(v)) if v else "0")
    return FuncFormatter(lambda v, _: number(v) if v else "0")


def _value(stats: Stats, metric: str) -> float:
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    value = getattr(stats, metric)
    return float(value or 0)


def _summed(counter) -> str:
    """What a title says of a merged run: its figures are sums over its steps."""
    steps = getattr(counter, "steps", 1)  # a FlopCounter is one step
    return f" ({steps} steps summed)" if steps > 1 else ""


def _label(counter, name: str) -> str:
    return counter.root_label if name == ROOT else name


def _checkdepth_of(depth) -> None:
    if not isinstance(depth, int) or depth < 0:
        raise ValueError(f"depth must be an int >= 0 (0 is the root), got {depth!r}")


def _frontier(modules, depth: int) -> list:
    """The modules at ``depth`` and, in tree order among them, the leaves above it (a model's
    ``lm_head`` at depth 1): together they hold every flop the tree below ``depth`` does."""
    parents = {n.rpartition(".")[0] if "." in n else ROOT for n in modules if n != ROOT}
    return [n for n in modules
            if depth_of(n) == depth or (0 < depth_of(n) < depth and n not in parents)]


def by_module(counter, depth: int = 1, *, top: int = 25):
    """Horizontal bars of the modules at ``depth`` (tree order), and of the leaves shallower
    than it (a model's ``lm_head`` at depth 1 stays in a depth-2 plot, its depth in the
    label): FLOPs, and latency when timing was on, each stacked by phase. At most ``top``
    modules, the ones with the most FLOPs; the title says how many were left out. A module's
    forward latency is its call spans; other phases', its ops' time."""
    _checkdepth_of(depth)
    if not isinstance(top, int) or top < 1:
        raise ValueError(f"top must be an int >= 1, got {top!r}")
    counter = as_profile(counter)
    modules = counter.by_module()
    if not counter.has_model:  # everything ran under the root: its operators are the bars
        return _by_operator(counter, top)
    names = _frontier(modules, depth)
    if not any(depth_of(n) == depth for n in names):
        raise ValueError(f"no module ran at depth {depth}; the deepest is "
                         f"{max(map(depth_of, modules), default=0)}")
    dropped = 0
    if len(names) > top:
        keep = set(sorted(names, key=lambda n: -modules[n].flops)[:top])
        dropped = len(names) - top
        names = [n for n in names if n in keep]
    by_phase = counter.by_phase()
    phases = [p for p in PHASES if by_phase[p].calls]
    per_phase = {p: counter.by_module(phase=p) for p in phases}
    metrics = ["flops"] + (["latency_s"] if counter.timing else [])
    fig = _figure(5.5 * len(metrics) + 1.5, 1.2 + 0.32 * len(names))
    axes = fig.subplots(1, len(metrics), sharey=True, squeeze=False)[0]
    rows = range(len(names))
    # a module's forward latency in by_module(phase=FORWARD) is its call spans
    legend = _stacked(axes, metrics, phases, names, lambda phase, n, metric: _value(
        per_phase[phase][n].inclusive, metric) if n in per_phase[phase] else 0.0)
    axes[0].set_yticks(list(rows), [_label(counter, n) if depth_of(n) == depth else
                                     f"{_label(counter, n)} (depth {depth_of(n)})"
                                     for n in names])
    axes[0].invert_yaxis()
    axes[0].set_ylabel(f"Module (depth {depth})")
    ordered = [p for p in phases if p in legend]
    axes[-1].legend([legend[p] for p in ordered], ordered, loc="best", fontsize="small")
    left_out = f"; {dropped} smaller left out (top={top})" if dropped else ""
    fig.suptitle(f"{counter.root_label}{_summed(counter)}: modules at depth {depth}{left_out}")
    return fig


def _stacked(axes, metrics: list, phases: list, names: list, value) -> dict:
    """Bars of ``value(phase, name, metric)`` for each name, stacked by phase, one axis per
    metric; ``{phase: its bars}`` for the legend."""
    rows, legend = range(len(names)), {}
    for ax, metric in zip(axes, metrics):
        left = [0.0] * len(names)
        for phase in phases:
            widths = [value(phase, n, metric) for n in names]
            if not any(widths):  # empty bars would pin the axis's end to the last phase's
                continue
            legend[phase] = ax.barh(rows, widths, left=left, color=_PHASE_COLOR.get(phase),
                                    label=phase)
            left = [x + w for x, w in zip(left, widths)]
        ax.set_xlabel(_METRIC_LABEL[metric])
        ax.xaxis.set_major_formatter(_formatter(metric))
        ax.grid(axis="x", alpha=0.3)
    return legend


def _by_operator(counter, top: int):
    """``by_module`` of a counter without a model: its operators (the ``top`` with the most
    FLOPs), FLOPs and time stacked by phase, as the modules' bars are."""
    operators = counter.by_operator()
    names = sorted((n for n, s in operators.items() if s.flops or s.latency_s),
                   key=lambda n: (-operators[n].flops, n))
    dropped = max(0, len(names) - top)
    names = names[:top]
    by_phase = counter.by_phase()
    phases = [p for p in PHASES if by_phase[p].calls]
    per_phase = {p: counter.by_operator(phase=p) for p in phases}
    metrics = ["flops"] + (["latency_s"] if counter.timing else [])
    fig = _figure(5.5 * len(metrics) + 1.5, 1.2 + 0.32 * max(1, len(names)))
    axes = fig.subplots(1, len(metrics), sharey=True, squeeze=False)[0]
    rows = range(len(names))
    legend = _stacked(axes, metrics, phases, names, lambda phase, n, metric: _value(
        per_phase[phase][n], metric) if n in per_phase[phase] else 0.0)
    axes[0].set_yticks(list(rows), names)
    axes[0].invert_yaxis()
    axes[0].set_ylabel("Operator")
    ordered = [p for p in phases if p in legend]
    if ordered:
        axes[-1].legend([legend[p] for p in ordered], ordered, loc="best", fontsize="small")
    left_out = f"; {dropped} smaller left out (top={top})" if dropped else ""
    fig.suptitle(f"{counter.root_label}{_summed(counter)}: operators (no model given, so no "
                 f"modules){left_out}")
    return fig


def icicle(counter, depth: int = 3, *, metric: str = "flops"):
    """The module tree as an icicle: one row per depth, the root on top, each module as wide
    as its inclusive ``metric`` (one of ``METRICS``, all phases) and drawn under its
    parent. Modules wide enough carry their name and value."""
    _checkdepth_of(depth)
    modules = counter.by_module()
    if ROOT not in modules:
        raise ValueError("nothing was counted")
    _value(Stats(), metric)  # checks the metric's name
    children: dict[str, list[str]] = {}
    for name in modules:
        if name != ROOT:
            parent = name.rpartition(".")[0]
            children.setdefault(parent if parent in modules else ROOT, []).append(name)
    fig = _figure(12, 1.0 + 0.7 * (depth + 1))
    ax = fig.subplots()
    from matplotlib import colormaps

    colors = colormaps["tab20"]
    shown = []
    labels = []  # (text, its bar)

    def value(name):
        return _value(modules[name].inclusive, metric)  # latency_s: spans + backward ops

    total = value(ROOT)

    def draw(name: str, left: float, level: int, color):
        width = value(name)
        bars = ax.barh(level, width, left=left, height=0.92, color=color, edgecolor="white")
        shown.append(name)
        if total and width / total > 0.02:
            short = _label(counter, name).rpartition(".")[2] or _label(counter, name)
            text = human(width) if metric != "latency_s" else duration(width)
            labels.append((ax.text(left + width / 2, level, f"{short}\n{text}", ha="center",
                                   va="center", fontsize=7, clip_on=True), bars[0]))
        if level < depth:
            x = left
            for i, child in enumerate(children.get(name, [])):
                draw(child, x, level + 1, colors(i % 20) if level == 0 else color)
                x += value(child)
            own = width - (x - left)  # what the module ran itself (the root: optimizer, loss)
            if children.get(name) and total and own / total > 0.001:
                ax.barh(level + 1, own, left=x, height=0.92, color="white",
                        edgecolor=color if level else "#888888", hatch="//", linewidth=0.5)
                if own / total > 0.02:
                    short = _label(counter, name).rpartition(".")[2] or _label(counter, name)
                    text = human(own) if metric != "latency_s" else duration(own)
                    own_bar = ax.patches[-1]
                    labels.append((ax.text(x + own / 2, level + 1, f"{short} (own)\n{text}",
                                           ha="center", va="center", fontsize=7,
                                           clip_on=True), own_bar))

    draw(ROOT, 0.0, 0, "#BBBBBB")
    ax.set_yticks(range(depth + 1), [str(d) for d in range(depth + 1)])
    ax.set_ylabel("Depth")
    ax.invert_yaxis()
    ax.set_xlabel(_METRIC_LABEL[metric])
    ax.xaxis.set_major_formatter(_formatter(metric))
    ax.set_xlim(0, total or 1)
    fig.suptitle(f"{counter.root_label}{_summed(counter)}: {_METRIC_LABEL[metric]} by module "
                 f"(icicle, {len(shown)} modules to depth {depth})")
    # a name wider than its box would run into its neighbours: left out
    renderer = _renderer(fig)
    for label, patch in labels:
        if label.get_window_extent(renderer).width > patch.get_window_extent(renderer).width:
            label.remove()
    fig.set_layout_engine("none")
    return fig


def roofline(counter, device: Optional[DeviceSpec] = None, dtype=None, *,
             by: str = "operator", depth: int = 2, label_top: int = 8):
    """Operators (``by="operator"``) or modules at ``depth`` and leaves above it
    (``by="module"``, inclusive)
    against ``device``'s roofs at ``dtype`` (defaults as ``fc.roofline_by_operator``):
    x is arithmetic intensity (FLOP/byte), y the achieved FLOP/s when timing was on, else
    the attainable FLOP/s (on the roof). Marker area follows the share of FLOPs (of time
    when timed); colour says compute- or memory-bound. Entries without flops or bytes
    cannot sit on a log scale and are left out (counted in the legend)."""
    if by not in ("operator", "module"):
        raise ValueError(f"by must be 'operator' or 'module', got {by!r}")
    _checkdepth_of(depth)
    counter = as_profile(counter)
    spec, dtype = counter.device(device), dtype or counter.dtype
    peak, bandwidth = spec.peak_flops(dtype), spec.memory_bandwidth
    if by == "operator":
        entries = counter.by_operator()
    else:
        modules = counter.by_module()
        entries = {_label(counter, n): modules[n].inclusive for n in _frontier(modules, depth)}
    timed = counter.timing
    points = []  # (name, intensity, flop/s, weight, bound)
    left_out = 0
    for name, stats in entries.items():
        if not stats.flops or not stats.bytes:
            left_out += 1
            continue
        line = spec.roofline(stats, dtype)
        if timed and stats.latency_s:
            y, weight = stats.achieved_flops, stats.latency_s
        else:
            y, weight = stats.flops / line.attainable_s, stats.flops
        points.append((name, line.arithmetic_intensity, y, weight, line.bound))
    ridge = peak / bandwidth
    xs = [p[1] for p in points] + [ridge]
    lo, hi = min(xs) / 4, max(xs) * 4
    grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    fig = _figure(8, 5.5)
    ax = fig.subplots()
    ax.loglog(grid, [min(peak, bandwidth * x) for x in grid], color="black", linewidth=1.5,
              label=f"roof: {human(peak, 'FLOP/s')}, {human(bandwidth, 'B/s')}")
    ax.axvline(ridge, color="grey", linestyle=":", linewidth=1)
    total = sum(p[3] for p in points) or 1.0
    for bound, color in ((COMPUTE_BOUND, "#C44E52"), (MEMORY_BOUND, "#4C72B0")):
        chosen = [p for p in points if p[4] == bound]
        if chosen:
            ax.scatter([p[1] for p in chosen], [p[2] for p in chosen],
                       s=[20 + 600 * p[3] / total for p in chosen], color=color, alpha=0.6,
                       edgecolor="black", linewidth=0.5, label=f"{bound} ({len(chosen)})")
    if left_out:
        ax.plot([], [], " ", label=f"{left_out} without flops or bytes, not shown")
    ax.set_xlabel("Arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("Achieved FLOP/s" if timed else "Attainable FLOP/s (untimed: on the roof)")
    ax.xaxis.set_major_formatter(_formatter("flops"))
    ax.yaxis.set_major_formatter(_formatter("flops"))
    ax.grid(which="major", alpha=0.3)
    ax.legend(loc="lower right", fontsize="small")
    what = "operators" if by == "operator" else f"modules at depth {depth}"
    ax.set_title(f"{counter.root_label}{_summed(counter)} on {spec.name} "
                 f"({dtype_name(dtype)}): {what}")
    # points at one place (blocks.0.mlp and blocks.1.mlp: the same figures) share a label;
    # the heaviest first; labels step off the markers and each other, and what finds no
    # place is named in the legend instead
    groups: dict = {}
    for name, x, y, weight, _ in points:
        groups.setdefault((round(x, 9), round(y, 3)), []).append((name, weight))
    labelled = sorted(((_joined([n for n, _ in members]), x, y, sum(w for _, w in members))
                       for (x, y), members in groups.items()), key=lambda g: -g[3])
    markers = [(p[1], p[2], (20 + 600 * p[3] / total) ** 0.5 / 2) for p in points]
    placed = _place_labels(fig, ax, [(text, x, y) for text, x, y, _ in labelled[:label_top]],
                           markers)
    rest = [text for text, _, _, _ in labelled if text not in placed]
    if rest:  # above the roof's slope, top left, nothing is ever drawn
        listed = ", ".join(rest[:8]) + (f", … {len(rest) - 8} more" if len(rest) > 8 else "")
        ax.text(0.01, 0.99, textwrap.fill(f"not labelled: {listed}", 60), fontsize=7,
                transform=ax.transAxes, va="top", ha="left", color="#444444")
    return fig


def experts(counter, *, layers: Optional[list] = None):
    """Tokens per expert of each MoE layer (``Profile.experts``): one row of bars per layer,
    the mean dashed, the title giving the imbalance (max / mean); rows a capacity kernel
    computed with no token in them stacked light on top (padding). ``layers``: the names
    to draw (all by default). ``ValueError`` for a run without recognised experts, or a
    layer it does not have."""
    p = as_profile(counter)
    stats = p.experts()
    if not stats:
        raise ValueError("no MoE layers in this run (no module matched the expert rules: "
                         "docs/distributed.md)")
    names = list(stats) if layers is None else list(layers)
    unknown = [n for n in names if n not in stats]
    if unknown:
        raise ValueError(f"no MoE layer {unknown}; the run's: {list(stats)}")
    fig = _figure(6.4, 1.2 + 1.6 * len(names))
    axes = fig.subplots(len(names), 1, squeeze=False)[:, 0]
    for ax, name in zip(axes, names):
        s = stats[name]
        xs = range(s.experts)
        ax.bar(xs, s.tokens, color="tab:blue", label="tokens")
        padding = [r - t for r, t in zip(s.rows, s.tokens)]
        if any(padding):
            ax.bar(xs, padding, bottom=s.tokens, color="tab:blue", alpha=0.3,
                   label="padding")
            ax.legend(loc="upper right", fontsize="small")
        ax.axhline(s.mean, color="black", linestyle="--", linewidth=1)
        imbalance = f"{s.imbalance:.2f}" if s.imbalance is not None else "-"
        ax.set_title(f"{name}: {_short(human(s.total))} tokens, max/mean {imbalance}"
                     + (f", padding {s.padding:.1%}" if any(padding) else ""),
                     fontsize="medium")
        ax.set_ylabel("tokens")
    axes[-1].set_xlabel("expert")
    return fig


_PART_COLOR = {"denoiser": "#4C72B0", "guidance and scheduler": "#DD8452",
               "component": "#55A868", "outside": "#8C8C8C"}


def pipeline(pp, *, metrics: tuple = ("flops", "bytes")):
    """Horizontal bars, one per part of a diffusion pipeline (a ``PipelineProfile``) in the
    order it ran: each component, each denoising step (its denoiser passes, then the rest:
    guidance and the scheduler's update), the work outside them. One axis per metric of
    ``METRICS`` (``latency_s`` when timing was on)."""
    for metric in metrics:
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    labels, parts = [], []  # parts: {segment: Stats} per bar
    for kind, item in pp.order:
        if kind == "component":
            labels.append(item)
            parts.append({"component": pp.components[item].total})
        else:
            step = pp.denoising[item]
            rest = Stats(*[getattr(step.total, f) - getattr(step.denoiser, f)
                           for f in ("calls", "flops", "macs", "bytes_read", "bytes_written")])
            labels.append(f"step {item + 1}")
            parts.append({"denoiser": step.denoiser, "guidance and scheduler": rest})
    labels.append("outside")
    parts.append({"outside": pp.outside.total})
    fig = _figure(5.0 * len(metrics) + 1.5, 1.2 + 0.3 * len(labels))
    axes = fig.subplots(1, len(metrics), sharey=True, squeeze=False)[0]
    rows, legend = range(len(labels)), {}
    for ax, metric in zip(axes, metrics):
        left = [0.0] * len(labels)
        for segment, color in _PART_COLOR.items():
            widths = [_value(p[segment], metric) if segment in p else 0.0 for p in parts]
            if not any(widths):
                continue
            legend[segment] = ax.barh(rows, widths, left=left, color=color, label=segment)
            left = [x + w for x, w in zip(left, widths)]
        ax.set_xlabel(_METRIC_LABEL[metric])
        ax.xaxis.set_major_formatter(_formatter(metric))
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(list(rows), labels)
    axes[0].invert_yaxis()
    axes[-1].legend(list(legend.values()), list(legend), loc="best", fontsize="small")
    n = pp.images
    fig.suptitle(f"{len(pp.steps)} denoising steps, {n} image{'s' if n != 1 else ''}, "
                 f"guidance {pp.guidance}: {human(pp.total.flops)}FLOPs")
    return fig
