"""A paper table (``workflows.paper.PaperTable``) as Markdown or LaTeX: the units line, one
row per model, the footnote saying which column the field's tools report. Reads the table's
public fields only."""

from __future__ import annotations

import re
from typing import Optional

from dispatch_flops.views.workflow_results import PaperTableLike

UNITS = "1 MAC = 2 FLOPs; MACs: multiply-accumulates of contractions; FLOPs: every op"
FOOTNOTE = ("MACs are what fvcore (FlopCountAnalysis), thop, ptflops and torchvision report as "
            "\"FLOPs\" (\"GFLOPs\" = GMACs there); calflops and DeepSpeed report 2 x MACs. "
            "FLOPs count every op's arithmetic; model FLOPs leave out masked attention pairs. "
            "Counted by dispatch_flops from every aten op the model runs.")
SCALES = {"T": 1e12, "G": 1e9, "M": 1e6, "K": 1e3, "": 1.0}
_LATEX = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
          "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
          "^": r"\textasciicircum{}"}


def _check(scale: str, precision: int) -> None:
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {tuple(SCALES)}, got {scale!r}")
    if not isinstance(precision, int) or isinstance(precision, bool) or precision < 0:
        raise ValueError(f"precision must be an int >= 0, got {precision!r}")


def _header(table: PaperTableLike, scale: str) -> list:
    step = "fwd" if table.step == "forward" else "fwd+bwd"
    return ["Model", "Input", "Params (M)", f"MACs ({scale}, {step})",
            f"FLOPs ({scale}, {step})", f"Model FLOPs ({scale}, {step})"]


def _cells(table: PaperTableLike, scale: str, precision: int) -> list:
    divisor = SCALES[scale]
    return [[row.name, row.inputs, f"{row.params / 1e6:.{precision}f}",
             f"{row.macs / divisor:.{precision}f}", f"{row.flops / divisor:.{precision}f}",
             f"{row.model_flops / divisor:.{precision}f}"] for row in table.rows]


def paper_markdown(table: PaperTableLike, scale: str = "G", precision: int = 2) -> str:
    """A Markdown (GitHub) table: the units line, the table (names left, figures right), the
    footnote."""
    _check(scale, precision)
    header = _header(table, scale)
    cells = _cells(table, scale, precision)
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(header)]

    def line(values) -> str:
        return "| " + " | ".join(v.ljust(w) if i < 2 else v.rjust(w)
                                 for i, (v, w) in enumerate(zip(values, widths))) + " |"

    rule = "| " + " | ".join("-" * w if i < 2 else "-" * (w - 1) + ":"
                             for i, w in enumerate(widths)) + " |"
    return "\n".join([f"Units: {UNITS}.", "", line(header), rule]
                     + [line(c) for c in cells] + ["", f"Note: {FOOTNOTE}"])


def _latex(text: str) -> str:
    escaped = "".join(_LATEX.get(ch, ch) for ch in text)
    escaped = re.sub(r'"([^"]*)"', r"``\1''", escaped)  # TeX's quotes
    return escaped.replace(" x ", r" $\times$ ").replace("×", r"$\times$")


def paper_latex(table: PaperTableLike, scale: str = "G", precision: int = 2,
                caption: Optional[str] = None, label: Optional[str] = None) -> str:
    """A LaTeX ``table`` with booktabs rules: the units in the caption, the footnote under
    the tabular; names escaped."""
    _check(scale, precision)
    header = [_latex(h) for h in _header(table, scale)]
    body = [" & ".join(_latex(v) for v in c) + r" \\" for c in _cells(table, scale, precision)]
    text = caption if caption is not None else f"Model cost ({table.step} step)."
    lines = [r"\begin{table}[t]", r"\centering",
             rf"\caption{{{_latex(text)} Units: {_latex(UNITS)}.}}"]
    if label:
        lines.append(rf"\label{{{label}}}")
    lines += [r"\begin{tabular}{llrrrr}", r"\toprule", " & ".join(header) + r" \\",
              r"\midrule", *body, r"\bottomrule", r"\end{tabular}",
              rf"\par\smallskip{{\footnotesize {_latex(FOOTNOTE)}}}", r"\end{table}"]
    return "\n".join(lines)
