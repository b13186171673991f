"""Every text made from a result other than the module table (``table``) and the peers'
printouts (``torch_table``, ``deepspeed``): MoE expert load, the MFU conventions side by side,
MFU / HFU in words, a generation's steps and rooflines, a throughput reading.

Results compute the figures and reach these through the presenter (``results.present``: the
results room sits below this one); workflows sit above and call them directly. Each function
reads its object's public fields only."""

from __future__ import annotations

import functools
import textwrap
from statistics import mean
from typing import TYPE_CHECKING, Callable, Mapping, Optional, Sequence, TypeVar, cast

from tabulate import tabulate

from dispatch_flops.results import conventions, experts, utilisation
from dispatch_flops.results.format import duration, human, percent, scientific
from dispatch_flops.results.protocols import ConventionsLike
from dispatch_flops.results.roofline import DTypeLike, Roofline
from dispatch_flops.views.escape import printable, safe_lines
from dispatch_flops.views.table import check_width, wrapped
from dispatch_flops.views.workflow_results import (
    GenerationProfileLike,
    GenerationRooflineLike,
    PipelineProfileLike,
    PipelineRooflineLike,
    ThroughputReadingLike,
)

if TYPE_CHECKING:
    from dispatch_flops.results.profile import Profile

# a generation's row labels: workflows.generation's ENCODER, PREFILL and DECODE
_ENCODER, _PREFILL, _DECODE = "encoder", "prefill", "decode"

_Text = TypeVar("_Text", bound=Callable[..., str])


def _escaped(view: _Text) -> _Text:
    """A text view whose names (layers, models, devices) print nothing a terminal acts on."""
    @functools.wraps(view)
    def safe(*args, **kwargs) -> str:
        return safe_lines(view(*args, **kwargs))
    return cast(_Text, safe)


def _fitted(headers: list, rows: list, width: int, drop: Sequence[str],
            left: Sequence[str] = ()) -> str:
    """``rows`` under ``headers`` (first column left, the others right-aligned, except the
    left-aligned ones in ``_LEFT`` and ``left``) within ``width``: the columns named in
    ``drop`` go first, in that order, then the first column's labels are cut (head … tail)."""
    headers, rows = list(headers), [list(r) for r in rows]
    drop = [h for h in drop if h in headers]

    def render() -> str:
        align = tuple("left" if i == 0 or h in _LEFT or h in left else "right"
                      for i, h in enumerate(headers))
        return tabulate(rows, headers=headers, disable_numparse=True, colalign=align)

    text = render()
    while _widest(text) > width and drop:
        i = headers.index(drop.pop(0))
        del headers[i]
        for r in rows:
            del r[i]
        text = render()
    excess = _widest(text) - width
    if excess > 0 and rows:
        limit = max(12, max(len(str(r[0])) for r in rows) - excess)
        for r in rows:
            r[0] = _cut(str(r[0]), limit)
        text = render()
    return text


_LEFT = ("Bound",)


def _widest(text: str) -> int:
    return max(map(len, text.splitlines()), default=0)


def _cut(label: str, limit: int) -> str:
    """``label``, or its head and tail around "…" when longer than ``limit``."""
    if len(label) <= limit:
        return label
    keep = limit - 1
    return label[: keep - keep // 2] + "…" + label[len(label) - keep // 2:]


def _prose(lines: list, width: int) -> list:
    return [part for line in lines for part in wrapped(line, width)]


# -- results (through the presenter) ---------------------------------------------------------
@_escaped
def experts_table(profile: Profile, width: Optional[int] = None) -> str:
    """One line per MoE layer: experts, tokens, min / mean / max tokens per expert, the
    imbalance (max / mean), idle experts, padding; layer names shortened to fit ``width``
    (the terminal's)."""
    stats = experts.expert_stats(profile)
    if not stats:
        return "No MoE layers (no module matched the expert rules: docs/distributed.md)"
    figures = 74  # the columns after the layer's name
    limit = max(len("Layer"), check_width(width) - figures)
    # aligned as printed: escaped first, then cut
    stats = {_cut(printable(layer), limit): s for layer, s in stats.items()}
    width = max(len("Layer"), *(len(s) for s in stats))
    lines = [f"{'Layer':<{width}}  Experts  Calls  Tokens    Min     Mean     Max  Max/mean"
             "  Idle  Padding"]
    lines.append("-" * len(lines[0]))
    for layer, s in stats.items():
        imbalance = f"{s.imbalance:.2f}" if s.imbalance is not None else "-"
        # a layer listing no expert (a file can say so): no min or max to show
        low, high = (min(s.tokens), max(s.tokens)) if s.tokens else ("-", "-")
        lines.append(f"{layer:<{width}}  {s.experts:>7}  {s.calls:>5}  {human(s.total):>6}  "
                     f"{low:>5}  {s.mean:>7.1f}  {high:>6}  {imbalance:>8}  "
                     f"{s.idle:>4}  {s.padding:>7.1%}")
    return "\n".join(lines)


def _grouped(x: float) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:,.1f}"


@_escaped
def conventions_table(c: ConventionsLike, width: Optional[int] = None) -> str:
    """The table: a header saying what the formulas read, one line per convention (notes
    indented below it), then the differences; within ``width`` (the terminal's), at most
    ``results.conventions.WIDTH`` columns."""
    width = min(check_width(width), conventions.WIDTH)
    s = c.shape
    kind = "training (forward + backward)" if s.passes == 3 else "forward only"
    where = "the attention calls' b·s" if s.tokens_seen else "given"
    if s.tokens_seen and len(s.token_counts) > 1:  # an encoder and a decoder, say
        where = (f"the first attention layer's b·s; the layers saw "
                 f"{' and '.join(map(_grouped, s.token_counts))} tokens (an encoder and a "
                 f"decoder?): per-token figures are per the first's, pass tokens= to choose")
    head = "tied to the embedding" if s.tied else "untied"
    lines = [f"MFU conventions: {c.model}, {kind}, per token ({_grouped(s.tokens)} tokens: "
             f"{where})"]
    n = f"N {scientific(s.parameters)} parameters a token uses"
    if s.experts:
        n += f" ({s.experts[1]} of {s.experts[0]} experts)"
    lines.append(f"{n}; E {scientific(s.embedding)} in embeddings; LM head h·V "
                 f"{scientific(s.lm_head)}, {head}; W {scientific(s.matrices)} in GEMMs")
    shown = [f"{k} {_grouped(v) if v is not None else 'varies'}" for k, v in
             (("L", s.layers), ("H", s.heads), ("Q", s.head_dim), ("T", s.keys))]
    causal = {True: "causal", False: "not causal", None: "causal or not: unseen"}[s.causal]
    if s.layers:
        lines.append(f"attention: {', '.join(shown)} ({causal}; counted: "
                     f"{s.counted_attention}); L·H·Q·T per token {scientific(s.attention)}")
    else:
        lines.append("attention: none counted (L·H·Q·T 0)")
    if c.peak_flops:
        lines.append(f"MFU = flops/token x {_grouped(c.tokens_per_s or 0)} tokens/s / "
                     f"{c.peak_flops / 1e12:,.1f} TFLOP/s ({c.device}, {c.dtype} dense peak)")
    lines = _prose(lines, width)
    lines.append("")
    lines.append(f"{'convention':<22}{'formula':<34}{'flops/token':>12}{'MFU':>9}")
    wrap = textwrap.TextWrapper(width=width, initial_indent="    ",
                                subsequent_indent="    ")
    for row in c.rows:
        mfu = f"{100 * row.mfu:.1f} %" if row.mfu is not None else "-"
        formula = row.formula if len(row.formula) <= 33 else row.formula[:32] + "…"
        lines.append(f"{row.name:<22}{formula:<34}{scientific(row.flops_per_token):>12}"
                     f"{mfu:>9}")
        lines.extend(wrap.wrap(f"counts {row.counts}; leaves out {row.leaves_out}"))
    lines.append("")
    lines.append("differences per token:")
    wrap = textwrap.TextWrapper(width=width, initial_indent="", subsequent_indent=" " * 36)
    for d in c.differences:
        lines.extend(wrap.wrap(f"  {d.name:<22}{scientific(d.flops_per_token):>10}  "
                               f"{d.between}"))
    return "\n".join(lines)


@_escaped
def utilisation_text(profile: Profile, what: str, phases: Sequence[str],
                     device: Optional[utilisation.DeviceLike], dtype: Optional[DTypeLike],
                     flops: str) -> str:
    """``what`` ("mfu" or "hfu") in words, with its denominator, or why there is none."""
    utilisation.flops_figure(flops)  # a bad ``flops`` is the caller's error, raised
    try:
        value, peaks = utilisation.utilisation(profile, what, phases, device, dtype, flops)
    except ValueError as e:
        return f"no {what.upper()}: {e}"
    label = what.upper() + (" (all ops)" if flops == "all" else "")
    text = f"{label} {100 * value:.1f} % of {peaks}"
    if value > 1:
        spec = utilisation.device_of(profile, device)
        text += f" -- {utilisation.over_one(value, spec, dtype is not None)}"
    return text


# -- workflows (called directly) -------------------------------------------------------------
@_escaped
def generation_roofline_table(roof: GenerationRooflineLike, width: Optional[int] = None) -> str:
    """A row per step (prefill, then each decode step): flops per byte, the compute, memory
    and attainable times, the bound and (timing on) the measured time and the attainable /
    measured ratio; under it the roofline's one line (its repr)."""
    timed = roof.measured_tokens_per_s is not None or roof.measured_time_to_first_token_s \
        is not None
    rows = [_roofline_cells(_PREFILL if i == 0 else f"{_DECODE} {i}", r, timed)
            for i, r in enumerate(roof.steps)]
    return _roofline_text(roof, rows, "Step", timed, width)


def _roofline_cells(label: str, r: Roofline, timed: bool) -> list:
    """A part's row of a roofline table: flops per byte, compute, memory and attainable
    times, the bound and (timed) the measured time and the attainable / measured ratio."""
    cells = [label, "-" if r.arithmetic_intensity is None else f"{r.arithmetic_intensity:.2f}",
             duration(r.compute_s or 0.0), duration(r.memory_s or 0.0),
             duration(r.attainable_s), r.bound]
    if timed:
        measured = r.attainable_s / r.efficiency if r.efficiency else None
        cells += ["-" if measured is None else duration(measured),
                  "-" if r.efficiency is None else f"{100 * r.efficiency:.3g}%"]
    return cells


def _roofline_text(roof, rows: list, first: str, timed: bool,
                   width: Optional[int] = None) -> str:
    headers = [first, "FLOP/B", "Compute", "Memory", "Attainable", "Bound"]
    if timed:
        headers += ["Measured", "Efficiency"]
    fit = check_width(width)
    table = _fitted(headers, rows, fit, ("FLOP/B", "Measured"))
    return "\n".join(_prose([f"{roof.device}: time = the sum of each op's max(flops / peak, "
                             "bytes / bandwidth); Compute, Memory: the time of the ops on "
                             "each roof (Attainable is their sum); bound: the larger"], fit)
                      + [table] + _prose([repr(roof)], fit))


def roofline_table(rooflines: Mapping[str, Roofline], first: str, device: str, timed: bool,
                   width: Optional[int] = None) -> str:
    """``rooflines`` (a label each: an op, a module) as a roofline table on ``device``: per
    part flops per byte, compute, memory and attainable times, the bound and, ``timed``, the
    measured time and attainable / measured."""
    rows = [_roofline_cells(label, r, timed) for label, r in rooflines.items()]
    headers = [first, "FLOP/B", "Compute", "Memory", "Attainable", "Bound"]
    if timed:
        headers += ["Measured", "Efficiency"]
    fit = check_width(width)
    return "\n".join(_prose([f"{device}: attainable = max(flops / peak, bytes / bandwidth); "
                             "efficiency = attainable / measured"], fit)
                      + [_fitted(headers, rows, fit, ("FLOP/B", "Measured"))])


@_escaped
def generation_table(gp: GenerationProfileLike, width: Optional[int] = None) -> str:
    """Prefill, the first, mean and last decode step, and how much a decode step grows per
    token; the encoder and the work outside the model's calls when there is any."""
    timed = gp.timing
    costs = gp.per_token()
    rows = []

    def row(label, flops, macs, read, written, positions, kv, seconds):
        moved = read + written
        cells = [label, positions, human(flops), human(macs), human(read, "B"),
                 human(written, "B"), f"{flops / moved:.2f}" if moved else "-",
                 "-" if kv is None else human(kv, "B")]
        if timed:
            cells.append("-" if seconds is None else duration(seconds))
        rows.append(cells)

    def of_profile(label, p):
        t = p.total
        row(label, t.flops, t.macs, t.bytes_read, t.bytes_written, "", None, p.wall_s)

    def of_cost(label, c):
        row(label, c.flops, c.macs, c.bytes_read, c.bytes_written, c.positions,
            c.kv_cache_bytes, c.latency_s)

    if gp.encoder is not None:
        of_profile(_ENCODER, gp.encoder)
    of_cost(_PREFILL, costs[0])
    decode = costs[1:]
    if decode:
        of_cost(f"{_DECODE} first", decode[0])
        n = len(decode)
        timed_mean = mean(c.latency_s or 0.0 for c in decode)
        rows.append([f"{_DECODE} mean", f"{mean(c.positions for c in decode):g}"] + [
            human(mean(getattr(c, k) for c in decode)) + u for k, u in (
                ("flops", ""), ("macs", ""), ("bytes_read", "B"), ("bytes_written", "B"))
        ] + [f"{mean(c.flops for c in decode) / mean(c.bytes for c in decode):.2f}", "-"]
            + ([duration(timed_mean)] if timed else []))
        if n > 1:
            of_cost(f"{_DECODE} last", decode[-1])
            first, last = decode[0], decode[-1]
            span = last.positions - first.positions or 1

            def growth(k, unit=""):
                return human((getattr(last, k) - getattr(first, k)) / span, unit)
            kv = (None if last.kv_cache_bytes is None or first.kv_cache_bytes is None
                  else human((last.kv_cache_bytes - first.kv_cache_bytes) / span, "B"))
            rows.append(["growth per token", "+1", growth("flops"), growth("macs"),
                         growth("bytes_read", "B"), growth("bytes_written", "B"), "-",
                         kv or "-"] + (["-"] if timed else []))
    of_profile("outside model", gp.outside)
    headers = ["Step", "Positions", "FLOPs", "MACs", "Read", "Written", "FLOP/B", "KV cache"]
    if timed:
        headers.append("Time")
    fit = check_width(width)
    lines = [_fitted(headers, rows, fit, ("MACs", "Written", "Positions", "Read"))]
    held, filled = gp.kv_cache_bytes[0], gp.kv_cache_filled_bytes[0]
    if held is not None and filled != held:  # a static cache
        lines.append(f"KV cache holds {human(held, 'B')} from the prefill on, "
                     f"{human(filled, 'B')} of it filled then: attention runs over all "
                     "of it at every step")
    lines.append(_steps_line(gp, costs[-1].sequences))
    return "\n".join(lines[:1] + _prose(lines[1:], fit))


def _steps_line(gp: GenerationProfileLike, sequences: int) -> str:
    """What the steps were, in the words of ``generate``'s arguments: each forward call gives
    every sequence one new token, the prefill's included, so ``max_new_tokens=8`` is the
    prefill and 7 decode steps."""
    n = len(gp.steps)
    plural = "s" if n != 1 else ""
    return (f"{n} new token{plural} per sequence ({sequences} sequence"
            f"{'s' if sequences != 1 else ''}): the prefill's, then {len(gp.decode)} "
            f"decode step{'s' if len(gp.decode) != 1 else ''} of one token each")


# a pipeline's guidance kinds: workflows.diffusion's NONE, BATCHED and SEPARATE
_GUIDANCE = {"batched": "classifier-free guidance batched: one pass over the conditional and "
                        "unconditional halves",
             "separate": "classifier-free guidance in separate passes",
             "none": "no classifier-free guidance"}
PIPELINE_STEPS_SHOWN = 6  # more denoising steps than this: the first, the mean and the last


def _part_cells(label: str, calls: str, stats, whole: int, timed: bool, seconds) -> list:
    moved = stats.bytes_read + stats.bytes_written
    cells = [label, calls, human(stats.flops), human(stats.macs), human(stats.bytes_read, "B"),
             human(stats.bytes_written, "B"), f"{stats.flops / moved:.2f}" if moved else "-",
             percent(stats.flops, whole)]
    if timed:
        cells.append("-" if seconds is None else duration(seconds))
    return cells


def _passes(step) -> str:
    """A step's denoiser calls: ``1 x 2`` one pass over a batch of 2, ``2 x 1`` two of one."""
    if len(set(step.batches)) == 1:
        return f"{len(step.batches)} x {step.batches[0]}"
    return " + ".join(str(b) for b in step.batches)


@_escaped
def pipeline_table(pp: PipelineProfileLike, width: Optional[int] = None) -> str:
    """The components and denoising steps of a pipeline in the order they first ran (more
    than ``PIPELINE_STEPS_SHOWN`` steps: the first, the mean and the last), the work outside
    them and the total; under it the counts per image and how guidance ran."""
    timed, whole = pp.timing, pp.total.flops
    steps = pp.denoising
    rows = []
    for kind, item in pp.order:
        if kind == "component":
            p = pp.components[item]
            rows.append(_part_cells(item, str(pp.calls[item]), p.total, whole, timed,
                                    p.wall_s))
        elif item == 0:
            shown = steps if len(steps) <= PIPELINE_STEPS_SHOWN else (steps[0], None,
                                                                      steps[-1])
            for step in shown:
                if step is None:
                    m = pp.per_step()
                    rows.append([f"mean of {len(steps)} steps", _passes(steps[1]),
                                 human(m.flops), human(m.macs), human(m.bytes_read, "B"),
                                 human(m.bytes_written, "B"),
                                 f"{m.flops / m.bytes:.2f}" if m.bytes else "-",
                                 percent(m.flops, whole)]
                                + (["-" if m.latency_s is None else duration(m.latency_s)]
                                   if timed else []))
                    continue
                t = "" if step.timestep is None else f" (t={step.timestep:g})"
                rows.append(_part_cells(f"step {step.step + 1}{t}", _passes(step),
                                        step.total, whole, timed, step.profile.wall_s))
    rows.append(_part_cells("outside", "", pp.outside.total, whole, timed, None))
    rows.append(_part_cells("total", "", pp.total, whole, timed, pp.profile.wall_s))
    headers = ["Part", "Calls", "FLOPs", "MACs", "Read", "Written", "FLOP/B", "%FLOPs"]
    if timed:
        headers.append("Time")
    each = pp.per_image()
    n, evaluations = pp.images, pp.evaluations_per_image
    notes = (f"Per image ({n} image{'s' if n != 1 else ''}): {human(each.flops)}FLOPs, "
             f"{human(each.macs)}MACs, {human(each.bytes, 'B')} moved. {len(steps)} denoising "
             f"step{'s' if len(steps) != 1 else ''}, {evaluations:g} denoiser evaluation"
             f"{'s' if evaluations != 1 else ''} per image per step ({_GUIDANCE[pp.guidance]}"
             "); a step's Calls: denoiser passes x latent batch.")
    fit = check_width(width)
    return "\n".join([_fitted(headers, rows, fit, ("Read", "Written", "FLOP/B"), ("Calls",))]
                     + _prose([notes], fit))


@_escaped
def pipeline_roofline_table(roof: PipelineRooflineLike, width: Optional[int] = None) -> str:
    """A row per component and per denoising step in the order they ran, and the work
    outside them; under it the roofline's one line (its repr)."""
    timed = roof.measured_image_s is not None
    rows = []
    for kind, item in roof.order:
        if kind == "component":
            rows.append(_roofline_cells(item, roof.components[item], timed))
        else:
            rows.append(_roofline_cells(f"step {item + 1}", roof.steps[item], timed))
    rows.append(_roofline_cells("outside", roof.outside, timed))
    return _roofline_text(roof, rows, "Part", timed, width)


def _flops(n: float) -> str:
    for scale, unit in ((1e15, "PFLOP"), (1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP")):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n:.4g} FLOP"


# why a meter's MFU and a Profile's differ, said wherever the meter's is printed
ALL_OPS_VS_MFU = ("every op's model flops at one peak; Profile.mfu() counts 2 x model MACs, each "
                  "op at its dtype's peak")


@_escaped
def throughput_text(reading: ThroughputReadingLike) -> str:
    """One line: timed steps, s/step, tokens/s, model and hardware flops per step, MFU / HFU
    and their peak (or why there is none), then the steps left out of the figures."""
    r = reading
    tokens = f"{r.tokens_per_s:,.0f} tokens/s, " if r.tokens else \
        "no tokens/s (no token ids: step(batch, tokens=n)), "
    text = (f"{r.steps} timed steps: {r.step_s:.4g} s/step, {tokens}"
            f"model {_flops(r.model_flops)}/step, "
            f"hardware {_flops(r.hardware_flops)}/step")
    mfu, hfu = r.mfu_all_ops, r.hfu_all_ops
    if mfu is not None and hfu is not None:
        text += (f", MFU (all ops, one peak) {100 * mfu:.3g} % / HFU {100 * hfu:.3g} % of "
                 f"{r.peak} ({ALL_OPS_VS_MFU})")
    else:
        text += (", no MFU (no peak: pass device=DeviceSpec.cpu(flop_s, bytes_s), "
                 "DeviceSpec.calibrate() or DeviceSpec(...))")
    extra = [f"{r.counted_steps} counted (not timed)"] if r.counted_steps else []
    if r.unpriced_steps:
        extra.append(f"{r.unpriced_steps} timed with inputs never counted (left out)")
    # one line, whatever its length: a log's line (grep it), not a view laid out to a width
    return text + (f" [{'; '.join(extra)}]" if extra else "")
