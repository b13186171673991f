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
from typing import TYPE_CHECKING, Callable, Optional, Sequence, TypeVar, cast

from tabulate import tabulate

from dispatch_flops.results import conventions, experts, utilisation
from dispatch_flops.results.format import duration, human, scientific
from dispatch_flops.results.roofline import DeviceSpec, DTypeLike
from dispatch_flops.views.escape import printable, safe_lines

if TYPE_CHECKING:  # types only: a view never imports the workflows above it
    from dispatch_flops.results.profile import Profile
    from dispatch_flops.workflows.generation import GenerationProfile, GenerationRoofline
    from dispatch_flops.workflows.throughput import ThroughputReading

# a generation's row labels: workflows.generation's ENCODER, PREFILL and DECODE
_ENCODER, _PREFILL, _DECODE = "encoder", "prefill", "decode"

_Text = TypeVar("_Text", bound=Callable[..., str])


def _escaped(view: _Text) -> _Text:
    """A text view whose names (layers, models, devices) print nothing a terminal acts on."""
    @functools.wraps(view)
    def safe(*args, **kwargs) -> str:
        return safe_lines(view(*args, **kwargs))
    return cast(_Text, safe)


# -- results (through the presenter) ---------------------------------------------------------
@_escaped
def experts_table(profile: Profile) -> str:
    """One line per MoE layer: experts, tokens, min / mean / max tokens per expert, the
    imbalance (max / mean), idle experts, padding."""
    stats = experts.expert_stats(profile)
    if not stats:
        return "No MoE layers (no module matched the expert rules: docs/distributed.md)"
    stats = {printable(layer): s for layer, s in stats.items()}  # aligned as printed
    width = max(len("Layer"), *(len(s) for s in stats))
    lines = [f"{'Layer':<{width}}  Experts  Calls  Tokens    Min     Mean     Max  Max/mean"
             "  Idle  Padding"]
    lines.append("-" * len(lines[0]))
    for layer, s in stats.items():
        imbalance = f"{s.imbalance:.2f}" if s.imbalance is not None else "-"
        lines.append(f"{layer:<{width}}  {s.experts:>7}  {s.calls:>5}  {human(s.total):>6}  "
                     f"{min(s.tokens):>5}  {s.mean:>7.1f}  {max(s.tokens):>6}  {imbalance:>8}  "
                     f"{s.idle:>4}  {s.padding:>7.1%}")
    return "\n".join(lines)


def _grouped(x: float) -> str:
    return f"{x:,}" if isinstance(x, int) else f"{x:,.1f}"


@_escaped
def conventions_table(c: conventions.Conventions) -> str:
    """The table: a header saying what the formulas read, one line per convention (notes
    indented below it), then the differences; at most ``results.conventions.WIDTH``
    columns."""
    width = conventions.WIDTH
    s = c.shape
    kind = "training (forward + backward)" if s.passes == 3 else "forward only"
    where = "the attention calls' b·s" if s.tokens_seen else "given"
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
    lines.append(f"attention: {', '.join(shown)} ({causal}; counted: {s.counted_attention}"
                 f"); L·H·Q·T per token {scientific(s.attention)}")
    if c.peak_flops:
        lines.append(f"MFU = flops/token x {_grouped(c.tokens_per_s or 0)} tokens/s / "
                     f"{c.peak_flops / 1e12:,.1f} TFLOP/s ({c.device}, {c.dtype} dense peak)")
    header = textwrap.TextWrapper(width=width, subsequent_indent="  ")
    lines = [part for line in lines for part in header.wrap(line)]
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
                     device: Optional[DeviceSpec], dtype: Optional[DTypeLike],
                     flops: str) -> str:
    """``what`` ("mfu" or "hfu") in words, with its denominator, or why there is none."""
    utilisation.flops_figure(flops)  # a bad ``flops`` is the caller's error, raised
    try:
        value, peaks = utilisation.utilisation(profile, what, phases, device, dtype, flops)
    except ValueError as e:
        return f"no {what.upper()}: {e}"
    text = f"{what.upper()} {100 * value:.1f} % of {peaks}"
    if value > 1:
        spec = utilisation.device_of(profile, device)
        text += f" -- {utilisation.over_one(value, spec, dtype is not None)}"
    return text


# -- workflows (called directly) -------------------------------------------------------------
@_escaped
def generation_roofline_table(roof: GenerationRoofline) -> str:
    """A row per step (prefill, then each decode step): flops per byte, the compute, memory
    and attainable times, the bound and (timing on) the measured time and the attainable /
    measured ratio; under it the roofline's one line (its repr)."""
    timed = roof.measured_tokens_per_s is not None or roof.measured_time_to_first_token_s \
        is not None
    rows = []
    for i, r in enumerate(roof.steps):
        cells = [_PREFILL if i == 0 else f"{_DECODE} {i}",
                 "-" if r.arithmetic_intensity is None else f"{r.arithmetic_intensity:.2f}",
                 duration(r.compute_s or 0.0), duration(r.memory_s or 0.0),
                 duration(r.attainable_s), r.bound]
        if timed:
            measured = r.attainable_s / r.efficiency if r.efficiency else None
            cells += ["-" if measured is None else duration(measured),
                      "-" if r.efficiency is None else f"{100 * r.efficiency:.3g}%"]
        rows.append(cells)
    headers = ["Step", "FLOP/B", "Compute", "Memory", "Attainable", "Bound"]
    if timed:
        headers += ["Measured", "Efficiency"]
    align = tuple("left" if h in ("Step", "Bound") else "right" for h in headers)
    return "\n".join([f"{roof.device}: time = the sum of each op's max(flops / peak, "
                      "bytes / bandwidth)",
                      tabulate(rows, headers=headers, disable_numparse=True,
                               colalign=align), repr(roof)])


@_escaped
def generation_table(gp: GenerationProfile) -> str:
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
    align = ("left",) + ("right",) * (len(headers) - 1)
    lines = [tabulate(rows, headers=headers, disable_numparse=True, colalign=align)]
    held, filled = gp.kv_cache_bytes[0], gp.kv_cache_filled_bytes[0]
    if held is not None and filled != held:  # a static cache
        lines.append(f"KV cache holds {human(held, 'B')} from the prefill on, "
                     f"{human(filled, 'B')} of it filled then: attention runs over all "
                     "of it at every step")
    lines.append(_steps_line(gp, costs[-1].sequences))
    return "\n".join(lines)


def _steps_line(gp: GenerationProfile, sequences: int) -> str:
    """What the steps were, in the words of ``generate``'s arguments: each forward call gives
    every sequence one new token, the prefill's included, so ``max_new_tokens=8`` is the
    prefill and 7 decode steps."""
    n = len(gp.steps)
    plural = "s" if n != 1 else ""
    return (f"{n} new token{plural} per sequence ({sequences} sequence"
            f"{'s' if sequences != 1 else ''}): the prefill's, then {len(gp.decode)} "
            f"decode step{'s' if len(gp.decode) != 1 else ''} of one token each")


def _flops(n: float) -> str:
    for scale, unit in ((1e15, "PFLOP"), (1e12, "TFLOP"), (1e9, "GFLOP"), (1e6, "MFLOP")):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n:.4g} FLOP"


@_escaped
def throughput_text(reading: ThroughputReading) -> str:
    """One line: timed steps, s/step, tokens/s, model and hardware flops per step, MFU / HFU
    and their peak (or why there is none), then the steps left out of the figures."""
    r = reading
    tokens = f"{r.tokens_per_s:,.0f} tokens/s, " if r.tokens else ""
    text = (f"{r.steps} timed steps: {r.step_s:.4g} s/step, {tokens}"
            f"model {_flops(r.model_flops)}/step, "
            f"hardware {_flops(r.hardware_flops)}/step")
    mfu, hfu = r.mfu, r.hfu
    if mfu is not None and hfu is not None:
        text += f", MFU {100 * mfu:.3g} % / HFU {100 * hfu:.3g} % of {r.peak}"
    else:
        text += (", no MFU (no peak: pass device=DeviceSpec.cpu(flop_s, bytes_s), "
                 "DeviceSpec.calibrate() or DeviceSpec(...))")
    extra = [f"{r.counted_steps} counted (not timed)"] if r.counted_steps else []
    if r.unpriced_steps:
        extra.append(f"{r.unpriced_steps} timed with inputs never counted (left out)")
    return text + (f" [{'; '.join(extra)}]" if extra else "")
