"""Every GPU-only check of the project in one call (at most 8 minutes on one GPU; ``--quick``
about 3), ending in one verdict table (check, figure, target, PASS/FAIL/SKIP/ERROR) and the
same as JSON in ``--out DIR/verdicts.json`` (the table in ``verdicts.txt``, the whole log in
``log.txt``, check 7's trace and its README beside them).

For whoever gets a GPU (issue 53, item 5). The checks, most important first; each runs
isolated, under its own time limit, and the whole run under ``--budget`` seconds: an
exception or an overrun is an ERROR row with its one-line message and the others still run;
what the budget no longer covers is a SKIP row.

1. kernel time (``FlopCounter(timing=True)`` on CUDA) against torch.profiler on a GPT-2-small
   bf16 training step: the share of the step's kernel time attributed to ops >= 99 %, the
   step's kernel time within 5 % of the profiler's, each top op within 1 % of its
   ``self_device_time_total``; the same for cuDNN attention (forward and backward);
2. a kernel-timed step against eager: <= 1.10x amortised over ``kernel_sampling`` steps, and a
   recorded (Kineto) step alone <= 1.10x;
3. a ``torch.cuda.graph`` captured inside a counter: its replays counted (calls = replays x
   captured) and their kernel time joined; a ``torch.compile(mode="reduce-overhead")`` model
   shown with its time and its graph replays;
4. a raw Triton kernel (when triton imports) shown as its ``kernel:<name>`` row with its time;
5. model flops equal across SDPA's kernels (math, flash, efficient, cuDNN: those this device
   runs) for the same call, causal and unmasked; hardware flops printed beside (they may
   differ);
6. host cost per aten op (us) of counting against eager, a do-nothing dispatch mode and the
   kernel timer, on a host-bound GPT-2-small step: counting <= 1.25x the do-nothing mode's;
7. a fresh torch.profiler trace (CPU + CUDA, record_shapes, with_modules, with_stack: this torch
   writes module events only with it) of the project's GPT
   forward + backward and a CUDA graph replay, written to ``DIR/fresh_trace.json.gz`` with a
   ``DIR/README.md`` (torch, device, what was recorded) to turn into a test fixture; read back
   by ``engine.timing.trace_file.read`` and joined (attributed + outside = the trace's kernel
   time; the eager part >= 99 % attributed), and, where ``dispatch_flops.from_trace`` exists,
   priced offline: its total flops equal a live ``FlopCounter`` count of the same step;

then ``benchmarks/gpu_timing.py``'s other checks, imported from it: per-op CUDA events
(``timing="events"``) summed against the kernels, an event-timed step against eager, events
held over many steps, ``cuda:1`` (two GPUs), a Chrome trace export, a bf16 matmul against the
device's peak, and (not with ``--quick``) a counted compiled GPU-bound step <= 1.05x uncounted.

Exit status: 0 when no check failed or erred, 1 otherwise, 3 when there is no CUDA device
(nothing ran; the script imports on a CPU-only machine).

    python benchmarks/gpu_check.py [--quick] [--out DIR] [--budget SECONDS] [--only 1,3]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import gzip
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
import traceback
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence, Union

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:  # gpu_timing and _paired, beside this script (last: shadows nothing)
    sys.path.append(_HERE)

import gpu_timing as gt  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from dispatch_flops import FlopCounter, device_spec, human  # noqa: E402
from dispatch_flops.models import GPT, GPT2_SMALL, GPTConfig  # noqa: E402
from dispatch_flops.results.format import duration  # noqa: E402

NO_CUDA = gt.NO_CUDA  # exit status 3: no CUDA device, nothing checked
PASS, FAIL, SKIP, ERROR = "PASS", "FAIL", "SKIP", "ERROR"
STATUSES = (PASS, FAIL, SKIP, ERROR)
SCHEMA = 1  # verdicts.json's layout
BUDGET_S, QUICK_BUDGET_S = 400.0, 160.0  # checks only: start-up and the table fit in the rest
HANG_GRACE_S = 25.0  # past the budget, a check stuck in C code: the table is printed anyway

# the verdict table: column widths (with one space between: 99 columns)
WIDTHS = {"check": 28, "figure": 38, "target": 19, "result": 6, "s": 4}


# -- verdicts: data, the table, JSON ------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    """One row of the verdict table: what was checked, the figure found, the target it is held
    to, and the result (``STATUSES``); ``seconds`` the check's run time."""

    check: str
    figure: str
    target: str
    status: str
    seconds: float = 0.0


def verdict(check: str, ok: bool, figure: str, target: str) -> Verdict:
    return Verdict(check, figure, target, PASS if ok else FAIL)


class Skipped(Exception):
    """Raised by a check that cannot run here (no triton, one GPU, ...): a SKIP row."""


def _cells(text: str, width: int) -> list:
    return textwrap.wrap(text, width, break_long_words=True, break_on_hyphens=False) or [""]


def render_table(verdicts: Sequence[Verdict]) -> str:
    """The verdict table as text, every line within 100 columns (cells wrap onto more lines),
    and a footer counting each result."""
    names = list(WIDTHS)

    def line(cells: Sequence[str]) -> str:
        return " ".join(c.ljust(WIDTHS[n]) if n != "s" else c.rjust(WIDTHS[n])
                        for n, c in zip(names, cells)).rstrip()

    out = [line(names), " ".join("-" * WIDTHS[n] for n in names)]
    for v in verdicts:
        columns = [_cells(v.check, WIDTHS["check"]), _cells(v.figure, WIDTHS["figure"]),
                   _cells(v.target, WIDTHS["target"]), [v.status],
                   [f"{v.seconds:.0f}" if v.seconds else ""]]
        for k in range(max(len(c) for c in columns)):
            out.append(line([c[k] if k < len(c) else "" for c in columns]))
    counts = {s: sum(v.status == s for v in verdicts) for s in STATUSES}
    out.append(f"{len(verdicts)} rows: " + ", ".join(f"{n} {s}" for s, n in counts.items())
               + f"; {sum(v.seconds for v in verdicts):.0f} s of checks")
    return "\n".join(out)


def verdicts_to_json(verdicts: Sequence[Verdict], facts: Optional[dict] = None) -> str:
    """``{"schema", "facts" (torch, device, ...), "verdicts": [row, ...]}`` as JSON text."""
    return json.dumps({"schema": SCHEMA, "facts": dict(facts or {}),
                       "verdicts": [asdict(v) for v in verdicts]}, indent=1)


def verdicts_from_json(text: str) -> tuple:
    """``(verdicts, facts)`` from ``verdicts_to_json``'s text."""
    data = json.loads(text)
    if data.get("schema") != SCHEMA:
        raise ValueError(f"verdicts.json schema {data.get('schema')!r}, expected {SCHEMA}")
    rows = [Verdict(**row) for row in data["verdicts"]]
    bad = [v.status for v in rows if v.status not in STATUSES]
    if bad:
        raise ValueError(f"unknown results {bad}; expected one of {STATUSES}")
    return rows, data["facts"]


def exit_status(verdicts: Sequence[Verdict]) -> int:
    return 1 if any(v.status in (FAIL, ERROR) for v in verdicts) else 0


# -- the runner ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Check:
    """A check: its row name, its target (for an ERROR or SKIP row), its time limit in
    seconds (``quick_limit_s`` with ``--quick``, None: not run then), and ``run()``, which
    returns its rows (a ``Verdict`` or several) or raises (``Skipped``: SKIP; else ERROR)."""

    name: str
    target: str
    limit_s: float
    quick_limit_s: Optional[float]
    run: Callable[[], Union[Verdict, Iterable[Verdict]]]
    number: str = ""  # the numbering, for --only


class CheckTimeout(BaseException):
    """A check past its time limit (a BaseException: torch's ``except Exception`` blocks do
    not swallow it)."""


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise ``CheckTimeout`` in the main thread after ``seconds`` (SIGALRM; elsewhere, or
    without SIGALRM, no limit). Code stuck inside one C call is interrupted when it returns."""
    usable = hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()
    if not usable or seconds <= 0:
        yield
        return

    def expire(signum, frame):
        raise CheckTimeout(f"over its time limit of {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300].rstrip(": ")


class Runner:
    """Runs checks one after another, each isolated and under its time limit, within a total
    budget; ``verdicts`` grows as they finish and ``current`` names the one running (what a
    watchdog reports when a check hangs)."""

    def __init__(self, budget_s: float, quick: bool = False,
                 cleanup: Callable[[], None] = lambda: None,
                 log: Callable[[str], None] = print, min_start_s: float = 5.0) -> None:
        self.budget_s, self.quick, self.cleanup, self.log = budget_s, quick, cleanup, log
        self.min_start_s = min_start_s  # less left in the budget: the next check is skipped
        self.verdicts: list = []
        self.current: Optional[Check] = None
        self.started: float = 0.0

    def run(self, checks: Sequence[Check]) -> list:
        self.started = time.monotonic()
        deadline = self.started + self.budget_s
        for check in checks:
            limit = check.quick_limit_s if self.quick else check.limit_s
            if limit is None:
                self.verdicts.append(Verdict(check.name, "not run with --quick", check.target,
                                             SKIP))
                continue
            left = deadline - time.monotonic()
            if left < min(limit, self.min_start_s):
                self.verdicts.append(Verdict(check.name, f"no time left in the {self.budget_s:.0f}"
                                             f" s budget", check.target, SKIP))
                continue
            self.verdicts.extend(self.run_one(check, min(limit, left), cut=left < limit))
        self.current = None
        return list(self.verdicts)

    def run_one(self, check: Check, limit: float, cut: bool = False) -> list:
        """``check``'s rows; ``cut``: its limit is what is left of the budget (an overrun is
        then a SKIP row: the budget, not the check, ran out)."""
        self.current = check
        self.log(f"\n=== {check.name} (limit {limit:.0f} s) ===")
        start = time.monotonic()
        try:
            with time_limit(limit):
                rows = check.run()
            rows = [rows] if isinstance(rows, Verdict) else list(rows)
            if not rows:
                rows = [Verdict(check.name, "the check returned no rows", check.target, ERROR)]
        except Skipped as e:
            rows = [Verdict(check.name, str(e), check.target, SKIP)]
        except CheckTimeout as e:
            rows = [Verdict(check.name, f"stopped at the end of the run's budget ({e})"
                            if cut else str(e), check.target, SKIP if cut else ERROR)]
        except Exception as e:  # any failure of one check is its row; the others still run
            self.log(traceback.format_exc())
            rows = [Verdict(check.name, one_line(e), check.target, ERROR)]
        seconds = time.monotonic() - start
        try:
            with time_limit(30):
                self.cleanup()
        except (Exception, CheckTimeout) as e:
            self.log(f"cleanup after {check.name}: {one_line(e)}")
        rows = [replace(v, seconds=seconds) for v in rows]
        for v in rows:
            self.log(f"[{v.status}] {v.check}: {v.figure} (target: {v.target})")
        self.current = None
        return rows


# -- shared set-up -------------------------------------------------------------------------------
class Context:
    """What several checks share, made on first use: the GPT-2-small bf16 training step."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self._gpt2 = None

    def gpt2(self):
        """(model, step): GPT-2 small, bf16, forward + backward + AdamW, warmed up."""
        if self._gpt2 is None:
            model, step = gt.training(GPT2_SMALL, self.args.batch, self.args.seq, "cuda")
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            self._gpt2 = (model, step)
        return self._gpt2


def _kineto():
    from dispatch_flops.engine.timing import kineto

    return kineto


def _found(fc):
    """The kernel join of a kernel-timed block, or raise saying why there is none."""
    found = getattr(fc.timer, "found", None)
    if found is None:
        why = getattr(fc.timer, "failure", None) or _kineto().unavailable() or \
            f"timer {type(fc.timer).__name__}"
        raise RuntimeError(f"kernel timing recorded nothing: {why}")
    return found


def _ratios(fc, theirs: dict, names) -> dict:
    """{op: our kernel time / the profiler's self device time} (nan where it has none)."""
    ops = fc.by_operator()
    out = {}
    for name in names:
        kernel = theirs.get(name.replace(".", "::", 1), 0.0)
        out[name] = (ops[name].latency_s or 0.0) / kernel if kernel else float("nan")
    return out


def _worst(ratios: dict) -> str:
    if not ratios:
        return "no ops"
    name = max(ratios, key=lambda n: abs(ratios[n] - 1) if ratios[n] == ratios[n] else 1e9)
    return f"worst {name} {ratios[name]:.3f}"


def _within(ratios: dict, tolerance: float) -> bool:
    return bool(ratios) and all(abs(r - 1) <= tolerance for r in ratios.values())


# -- 1. kernel time against torch.profiler -------------------------------------------------------
def kernel_time_vs_profiler(ctx: Context) -> list:
    model, step = ctx.gpt2()
    theirs, kernels_s, _ = gt._profiled(step, gt.ROUNDS)
    with FlopCounter(timing=True) as fc:  # no model: this block is recorded
        for _ in range(gt.ROUNDS):
            step()
    found = _found(fc)
    device_s = found.device_ns / 1e9
    top = [n for n, _ in fc.top_ops_by_time(ctx.args.top) if not n.startswith("kernel:")]
    print(f"GPT-2 small bf16 {ctx.args.batch} x {ctx.args.seq}, {gt.ROUNDS} training steps")
    gt._ops_against(fc, theirs, top)  # the side-by-side table, in the log
    ratios = _ratios(fc, theirs, top)
    off = [n for n, r in ratios.items() if not abs(r - 1) <= 0.01]
    return [
        verdict("1 kernel time to ops", found.attributed_share >= 0.99,
                f"{found.attributed_share:.2%} of {duration(device_s)}; outside ops "
                f"{duration(found.outside_ns / 1e9)} in {len(found.outside)} rows, "
                f"{found.dropped} dropped, {found.unlinked} unlinked", ">= 99 %"),
        verdict("1 step kernel time total", abs(device_s - kernels_s) <= 0.05 * kernels_s,
                f"ours {duration(device_s)}, profiler {duration(kernels_s)}", "within 5 %"),
        verdict(f"1 top {len(top)} ops vs profiler", _within(ratios, 0.01),
                f"{_worst(ratios)}; off: {off}",
                "each within 1 %"),
    ]


def cudnn_attention_vs_profiler(ctx: Context) -> Verdict:
    try:
        step = gt.cudnn_attention_step()
    except RuntimeError as e:
        raise Skipped(f"no cuDNN attention here: {one_line(e)}") from None
    theirs, _, _ = gt._profiled(step, gt.ROUNDS)
    with FlopCounter(timing=True) as fc:
        for _ in range(gt.ROUNDS):
            step()
    _found(fc)
    names = [n for n in fc.by_operator() if "cudnn_attention" in n]
    gt._ops_against(fc, theirs, names)
    ratios = _ratios(fc, theirs, names)
    return verdict("1 cuDNN attn vs profiler",
                   bool(names) and _within(ratios, 0.01),
                   f"{_worst(ratios)} ({len(names)} ops, fwd + bwd, 8x12x1024x64 causal)",
                   "each within 1 %")


# -- 2. a kernel-timed step against eager --------------------------------------------------------
def timed_step_overhead(ctx: Context) -> list:
    kineto = _kineto()
    model, step = ctx.gpt2()
    repeat = ctx.args.repeat
    eager = gt.event_time(step, repeat)
    recorded = gt.event_time(lambda: gt._counted(model, step, every=1), repeat)
    steps = kineto.SAMPLE_EVERY
    kineto._samplers.pop(model, None)
    amortised = gt.event_time(lambda: [gt._counted(model, step) for _ in range(steps)],
                              max(2, repeat // steps)) / steps
    return [
        verdict(f"2 timed step, {steps} steps", amortised <= 1.10 * eager,
                f"{amortised / eager:.3f}x ({duration(amortised)} vs eager {duration(eager)}, "
                f"kernel_sampling {steps})", "<= 1.10x"),
        verdict("2 recorded step vs eager", recorded <= 1.10 * eager,
                f"{recorded / eager:.3f}x ({duration(recorded)} vs {duration(eager)})",
                "<= 1.10x"),
    ]


# -- 3. CUDA graphs and reduce-overhead ----------------------------------------------------------
def cuda_graph_replays(ctx: Context) -> Verdict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).to(
        "cuda", torch.bfloat16)
    x = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():  # warm-up off the capture, uncounted
        for _ in range(3):
            model(x)
    torch.cuda.current_stream().wait_stream(side)
    graph, replays = torch.cuda.CUDAGraph(), 5
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with torch.no_grad(), FlopCounter(model, timing=True, kernel_sampling=1) as fc:
            with torch.cuda.graph(graph):
                model(x)
            for _ in range(replays):
                graph.replay()
        ops = fc.by_operator()
        kernel = fc.kernel_time
    for w in said:
        print(f"  warning: {w.message}")
    calls = ops["aten.addmm"].calls if "aten.addmm" in ops else 0
    rows = sorted(n for n in ops if n.startswith("kernel:"))
    seen = kernel.graph_replays if kernel is not None else 0
    total = fc.total.latency_s or 0.0
    share = f"{kernel.attributed_share:.0%}" if kernel is not None else "-"
    print(f"  ops {sorted(ops)}; kernel time {kernel}")
    return verdict("3 cuda.graph replays", calls == 2 * replays and
                   seen == replays and total > 0,
                   f"addmm calls {calls} for {replays} replays, {seen} replays in the kernels, "
                   f"time {duration(total)}, {share} to ops by graph node id, {len(rows)} "
                   f"kernel: rows, {len(said)} warnings",
                   "calls 2 x replays, replays seen, time > 0")


def reduce_overhead(ctx: Context) -> Verdict:
    model = GPT(GPTConfig(n_layer=2, d_model=256, n_head=4, vocab_size=1024,
                          max_seq_len=128)).cuda().eval()
    idx = torch.randint(0, 1024, (4, 128), device="cuda")
    compiled = torch.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(3):  # compiled, then the graphs recorded
            compiled(idx)
    torch.cuda.synchronize()
    _, theirs_s, _ = gt._profiled(lambda: compiled(idx))
    with torch.no_grad(), FlopCounter(model, timing=True, kernel_sampling=1) as fc:
        compiled(idx)
    found = _found(fc)
    total = fc.total.latency_s or 0.0
    graph_rows = [r for r in found.outside if r.graph]
    print(f"  graph runs {fc.graph_runs}; kernel time {fc.kernel_time}")
    return verdict("3 reduce-overhead model", total > 0 and found.graph_replays > 0
                   and fc.total.flops > 0,
                   f"{human(fc.total.flops, 'FLOP')}, time {duration(total)} (profiler's "
                   f"kernels {duration(theirs_s)}), {found.graph_replays} graph replays, "
                   f"{len(graph_rows)} replayed kernel rows",
                   "flops, time > 0, replays > 0")


# -- 4. a raw Triton kernel ----------------------------------------------------------------------
def raw_triton_kernel(ctx: Context) -> Verdict:
    try:
        import triton
        import triton.language as tl
    except ImportError as e:
        raise Skipped(f"triton does not import: {one_line(e)}") from None
    from torch.autograd import DeviceType

    @triton.jit
    def df_check_double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        tl.store(y_ptr + offsets, tl.load(x_ptr + offsets, mask=mask) * 2, mask=mask)

    class Doubler(nn.Module):
        def forward(self, x):
            y = torch.empty_like(x)
            df_check_double[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
            return y

    model, x = nn.Sequential(Doubler()), torch.randn(1 << 24, device="cuda")
    model(x)  # compiled by Triton outside the block
    torch.cuda.synchronize()
    _, _, prof = gt._profiled(lambda: model(x))
    theirs = sum(e.time_range.elapsed_us() for e in prof.events()
                 if e.device_type == DeviceType.CUDA and "df_check_double" in e.name) / 1e6
    with FlopCounter(model, timing=True, kernel_sampling=1) as fc:
        model(x)
    _found(fc)
    rows = {op: s for op, s in fc.by_operator().items() if "df_check_double" in op}
    ours = sum(s.latency_s or 0.0 for s in rows.values())
    named = all(op.startswith("kernel:") for op in rows)
    return verdict("4 raw Triton kernel row", bool(rows) and named and ours > 0,
                   f"{sorted(rows)} {duration(ours)} (profiler {duration(theirs)}), module "
                   f"{duration(fc.by_module()['0'].latency_s or 0.0)}",
                   "a kernel: row, time > 0")


# -- 5. model flops across SDPA kernels ----------------------------------------------------------
def sdpa_model_flops(ctx: Context) -> list:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    backends = {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
                "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": getattr(SDPBackend, "CUDNN_ATTENTION", None)}
    shape = (2, 8, 512, 64)
    rows = []
    for causal in (True, False):
        model, hardware, missing = {}, {}, []
        for name, backend in backends.items():
            if backend is None:
                missing.append(name)
                continue
            q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16,
                                   requires_grad=True) for _ in range(3))

            def call(q=q, k=k, v=v, backend=backend, causal=causal):
                with sdpa_kernel([backend]):
                    scaled_dot_product_attention(q, k, v, is_causal=causal).sum().backward()

            try:
                call()
            except RuntimeError as e:  # this kernel does not run here
                missing.append(name)
                print(f"  {name}: unavailable ({one_line(e)})")
                continue
            with FlopCounter() as fc:
                call()
            model[name], hardware[name] = fc.model_flops(), fc.hardware_flops()
            print(f"  {'causal' if causal else 'no mask'} {name:9s} model {model[name]:,} "
                  f"hardware {hardware[name]:,} ops {sorted(fc.by_operator())}")
        same = len(set(model.values())) == 1
        figure = (f"model {human(next(iter(model.values())), 'F', 4)} on "
                  f"{', '.join(model)}" if same and model else
                  f"model: {', '.join(f'{n} {v:,}' for n, v in model.items())}")
        figure += "; hardware " + ", ".join(f"{n} {human(v, 'F', 3)}"
                                            for n, v in hardware.items())
        if missing:
            figure += f"; not here: {', '.join(missing)}"
        rows.append(verdict(f"5 SDPA model flops, {'causal' if causal else 'no mask'}",
                            same and len(model) >= 2, figure,
                            "equal on every kernel (>= 2 ran)"))
    return rows


# -- 6. host cost per op -------------------------------------------------------------------------
def host_cost_per_op(ctx: Context) -> Verdict:
    kineto = _kineto()
    model, step = gt.training(GPT2_SMALL, 1, 32, "cuda")  # host-bound: the host's cost shows

    def counting():
        with FlopCounter(model) as fc:
            step()
        assert fc.total.flops  # a logger's read

    def do_nothing():
        with gt._DoNothing():
            step()

    def kernels_reused():
        kineto._samplers[model] = gt._reusing(model, step)
        with FlopCounter(model, timing=True):
            step()

    def kernels_recorded():
        gt._counted(model, step, every=1)

    variants = {"eager": step, "do-nothing mode": do_nothing, "counting": counting,
                "kernels, reused": kernels_reused, "kernels, recorded": kernels_recorded}
    ops = gt.warmed_ops(model, step, variants)
    times = gt._paired_ratio(variants, 10 if ctx.args.quick else 30, sync=False)
    eager = times["eager"]
    added = {name: [t - e for t, e in zip(times[name], eager)] for name in variants}
    per_op = {name: sorted(a)[len(a) // 2] / ops * 1e6 for name, a in added.items()}
    ratio = sorted(c / d for c, d in zip(added["counting"], added["do-nothing mode"]) if d > 0)
    ratio_s = ratio[len(ratio) // 2] if ratio else float("inf")
    for name in variants:
        print(f"  {name:18s} +{per_op[name]:7.2f} us per op")
    return verdict("6 host cost per op", ratio_s <= 1.25,
                   f"counting +{per_op['counting']:.2f} us/op = {ratio_s:.2f}x do-nothing's "
                   f"+{per_op['do-nothing mode']:.2f}; kernels reused "
                   f"+{per_op['kernels, reused']:.2f}, recorded "
                   f"+{per_op['kernels, recorded']:.1f}; {ops} ops, eager "
                   f"{duration(sorted(eager)[len(eager) // 2])}",
                   "counting <= 1.25x do-nothing mode")


# -- 7. a fresh trace, read back and priced ------------------------------------------------------
TRACE_NAME = "fresh_trace.json.gz"
TRACE_MODEL = GPTConfig(n_layer=2, d_model=128, n_head=4, vocab_size=1024, max_seq_len=128)
TRACE_BATCH = (2, 64)
GRAPH_RANGE = "gpu_check: cuda graph replay"
# with_modules alone writes no "nn.Module: Name_i" events into the Chrome trace (torch 2.13,
# checked on the CPU): they are python_function events, exported only with with_stack
WITH_STACK = True


def trace_step(device: str, dtype=torch.float32):
    """(model, step): the project's GPT, forward + backward, the step the trace records."""
    torch.manual_seed(0)
    model = GPT(TRACE_MODEL).to(device, dtype)
    idx = torch.randint(0, TRACE_MODEL.vocab_size, TRACE_BATCH, device=device)

    def step():
        model(idx).float().sum().backward()

    return model, step


def _graph(device: str):
    """A small MLP captured in a CUDA graph (outside the recording), and its replay; None on
    the CPU."""
    if device != "cuda":
        return None
    mlp = nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 128)).to(
        "cuda", torch.bfloat16)
    x = torch.randn(64, 128, device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):
            mlp(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        mlp(x)
    return graph


def record_trace(out: Path, device: str = "cuda", dtype=torch.bfloat16) -> tuple:
    """Record the trace step (and on CUDA two replays of a captured graph) with
    torch.profiler into ``out/fresh_trace.json.gz``; ``(path, model, step)``."""
    from torch.profiler import ProfilerActivity, profile, record_function

    model, step = trace_step(device, dtype)
    for _ in range(2):  # first-call set-up outside the recording
        step()
        model.zero_grad(set_to_none=True)
    graph = _graph(device)
    if graph is not None:
        graph.replay()
    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities, record_shapes=True, with_modules=True,
                 with_stack=WITH_STACK) as prof:
        step()
        if graph is not None:
            with record_function(GRAPH_RANGE):
                graph.replay()
                graph.replay()
        synchronize()
    model.zero_grad(set_to_none=True)
    out.mkdir(parents=True, exist_ok=True)
    plain = out / "fresh_trace.json"
    prof.export_chrome_trace(str(plain))
    path = out / TRACE_NAME
    with open(plain, "rb") as f, gzip.open(path, "wb") as z:
        shutil.copyfileobj(f, z)
    plain.unlink()
    return path, model, step


def join_trace(path: Path) -> dict:
    """Read a trace back and join its device records to its ops and module calls: the
    figures check 7 reports."""
    from dispatch_flops.engine.timing import kernels, trace_file

    tf = trace_file.read(path)
    found = kernels.join(
        tf.host, tf.device,
        op_ranges=[(op.index, op.thread, op.start_ns, op.end_ns) for op in tf.ops],
        call_ranges=[(m.label, m.thread, m.start_ns, m.end_ns) for m in tf.modules])
    graph_ns = sum(r.ns for r in found.outside if r.graph)
    eager_ns = found.device_ns - graph_ns
    return {
        "events": len(tf.host) + len(tf.device), "ops": len(tf.ops),
        "modules": len(tf.modules), "device_records": len(tf.device),
        "graph_node_ids": sum(1 for d in tf.device if d.graph_node),
        "graph_replays": found.graph_replays, "convention": tf.convention,
        "self_links": tf.self_links, "device_name": tf.device_name,
        "device_ns": found.device_ns, "attributed_ns": found.attributed_ns,
        "outside_ns": found.outside_ns, "graph_ns": graph_ns,
        "attributed_share": found.attributed_share,
        "eager_share": found.attributed_ns / eager_ns if eager_ns else 1.0,
        "dropped": found.dropped, "unlinked": found.unlinked,
        "outside_rows": sorted({r.name[:80] for r in found.outside})[:20],
        "record_shapes": tf.record_shapes, "with_modules": tf.with_modules,
    }


def _driver() -> str:
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                               "--format=csv,noheader"], capture_output=True, text=True,
                              timeout=10)
        return done.stdout.strip().splitlines()[0] if done.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def write_readme(out: Path, device: str, facts: dict) -> Path:
    """``out/README.md``: where the trace came from and what it holds, for a fixture."""
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        hardware = (f"{torch.cuda.get_device_name()} (sm {props.major}.{props.minor}, "
                    f"{props.total_memory / 2**30:.0f} GiB), driver {_driver()}, CUDA "
                    f"{torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
    else:
        hardware = "the CPU (no GPU: no device records)"
    c, (b, s) = TRACE_MODEL, TRACE_BATCH
    text = f"""# A fresh torch.profiler trace (benchmarks/gpu_check.py, check 7)

- torch {torch.__version__}, Python {sys.version.split()[0]}
- device: {hardware}
- recorded {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}

## What was recorded

`{TRACE_NAME}`: `torch.profiler.profile(activities=[CPU, CUDA], record_shapes=True,
with_modules=True, with_stack={WITH_STACK})`, exported with `prof.export_chrome_trace` and
gzipped (with_stack: without it this torch writes no "nn.Module: Name_i" module events).
Inside the window, on one thread:

1. the project's `dispatch_flops.models.GPT` (n_layer {c.n_layer}, d_model {c.d_model},
   n_head {c.n_head}, vocab_size {c.vocab_size}, max_seq_len {c.max_seq_len}; bf16, seed 0),
   forward and backward of `model(idx).float().sum()` on `idx` of shape [{b}, {s}] (two
   warm-up steps ran before the window; no optimizer step);
2. on CUDA, inside `record_function("{GRAPH_RANGE}")`, two replays of a CUDA graph captured
   before the window: `Linear(128, 512) -> GELU -> Linear(512, 128)`, bf16, input [64, 128],
   no grad (since kineto PR#1276 its kernels carry `graph node id`).

A live `FlopCounter` count of step 1 is the figure `dispatch_flops.from_trace` should give
for the trace's eager part (the graph replay runs no aten op on the host).

## What reading it back found (engine.timing.trace_file.read + kernels.join)

```
{json.dumps(facts, indent=1, default=str)}
```

## To make it a test fixture

Copy `{TRACE_NAME}` under `tests/traces/<source>/` with this README's facts in
`tests/traces/README.md`; it was made by this project, under the project's licence.
"""
    path = out / "README.md"
    path.write_text(text)
    return path


def fresh_trace(ctx: Context) -> list:
    import dispatch_flops

    out = ctx.args.out_dir
    path, model, step = record_trace(out)
    facts = join_trace(path)
    facts["file_bytes"] = path.stat().st_size
    write_readme(out, "cuda", facts)
    print(f"  {path} ({human(facts['file_bytes'], 'B')}), {out / 'README.md'}")
    print(f"  {json.dumps(facts, default=str)}")
    total = facts["attributed_ns"] + facts["outside_ns"]
    rows = [
        verdict("7 fresh trace recorded", facts["device_records"] > 0 and facts["ops"] > 0
                and facts["modules"] > 0,
                f"{TRACE_NAME} {human(facts['file_bytes'], 'B')}: {facts['ops']} ops, "
                f"{facts['modules']} module calls, {facts['device_records']} device records, "
                f"graph node id on {facts['graph_node_ids']}, {facts['graph_replays']} graph "
                f"launches, convention {facts['convention']!r}",
                "device records, ops, modules"),
        verdict("7 fresh trace joined", total == facts["device_ns"]
                and facts["eager_share"] >= 0.99,
                f"eager part {facts['eager_share']:.2%} attributed, all "
                f"{facts['attributed_share']:.2%} of {duration(facts['device_ns'] / 1e9)} "
                f"(graph replay {duration(facts['graph_ns'] / 1e9)} outside ops); "
                f"{facts['dropped']} dropped, {facts['unlinked']} unlinked",
                "attributed + outside = all; eager >= 99 %"),
    ]
    if not hasattr(dispatch_flops, "from_trace"):
        rows.append(Verdict("7 from_trace vs live count", "not available (dispatch_flops has "
                            "no from_trace yet)", "equal total flops", SKIP))
        return rows
    priced = dispatch_flops.from_trace(path)
    with FlopCounter(model) as live:
        step()
    model.zero_grad(set_to_none=True)
    ours, theirs = priced.total, live.total
    print(f"  from_trace: {ours.flops:,} flops {ours.macs:,} MACs; live: {theirs.flops:,} "
          f"flops {theirs.macs:,} MACs")
    # a trace records no strings: gelu's approximate='tanh' (the GPT's) is priced as its
    # default (docs/traces.md); compared without gelu's ops, MACs whole
    gelu = ("aten.gelu", "aten.gelu_backward")

    def without_gelu(p) -> int:
        return p.total.flops - sum(s.flops for op, s in p.by_operator().items() if op in gelu)
    a, b = without_gelu(priced), without_gelu(live.to_profile())
    rows.append(verdict("7 from_trace vs live count", a == b and ours.macs == theirs.macs,
                        f"trace {a:,}, live {b:,} flops without gelu (MACs "
                        f"{ours.macs:,} vs {theirs.macs:,})", "equal flops and MACs"))
    return rows


# -- gpu_timing.py's other checks, by import -----------------------------------------------------
class _Tee(io.TextIOBase):
    """Writes to the real stdout and keeps a copy (to read gpu_timing's printed verdicts)."""

    def __init__(self, out) -> None:
        self.out, self.kept = out, io.StringIO()

    def write(self, text: str) -> int:
        self.kept.write(text)
        return self.out.write(text)

    def flush(self) -> None:
        self.out.flush()


def printed(name: str, targets: Sequence[str], fn: Callable[[], bool]) -> Callable[[], list]:
    """A gpu_timing check as rows: each ``[PASS] label: detail`` line it prints is a row
    (named ``name``, then ``name 2``, ...; its target from ``targets`` in order), the
    detail its figure; none printed: one row from its return value and last line."""

    def run() -> list:
        tee = _Tee(sys.stdout)
        with contextlib.redirect_stdout(tee):
            ok = fn()
        lines = tee.kept.getvalue().splitlines()
        rows = []
        for line in lines:
            for status in (PASS, FAIL):
                if line.startswith(f"[{status}] "):
                    detail = line[len(status) + 3:].partition(": ")[2] or line
                    k = len(rows)
                    rows.append(Verdict(name if k == 0 else f"{name} {k + 1}", detail,
                                        targets[min(k, len(targets) - 1)], status))
        if not rows:
            rows.append(verdict(name, bool(ok), lines[-1] if lines else "", targets[0]))
        return rows

    return run


def _second_device(ctx: Context) -> list:
    if torch.cuda.device_count() < 2:
        raise Skipped(f"{torch.cuda.device_count()} GPU: needs two")
    return printed("events on cuda:1", ["ops timed on device 1"],
                   lambda: gt.second_device(ctx.args.batch, ctx.args.seq))()


def _bounded(ctx: Context) -> list:
    small, small_step = gt.training(GPTConfig(n_layer=2, d_model=64, n_head=2, vocab_size=256,
                                              max_seq_len=32), 2, 16, "cuda")
    steps = 60 if ctx.args.quick else ctx.args.steps
    return printed("events held, many steps", ["bounded (<= 2x + fold)"],
                   lambda: gt.bounded_events(small, small_step, steps))()


def checks(ctx: Context) -> list:
    """Every check, most important first (a short budget drops the last ones)."""
    a = ctx.args

    def gpt2(fn, *rest):
        return lambda: fn(*ctx.gpt2(), *rest)

    return [
        Check("1 kernel time vs profiler", "share >= 99 %, ops within 1 %", 90, 60,
              lambda: kernel_time_vs_profiler(ctx), "1"),
        Check("1 cuDNN attn vs profiler", "each within 1 %", 30, 25,
              lambda: cudnn_attention_vs_profiler(ctx), "1"),
        Check("2 timed step vs eager", "<= 1.10x", 60, 30, lambda: timed_step_overhead(ctx),
              "2"),
        Check("3 torch.cuda.graph replays", "calls 2 x replays, time > 0", 30, 20,
              lambda: cuda_graph_replays(ctx), "3"),
        Check("3 reduce-overhead model", "flops, time > 0, replays > 0", 120, 90,
              lambda: reduce_overhead(ctx), "3"),
        Check("4 raw Triton kernel row", "a kernel: row, time > 0", 45, 30,
              lambda: raw_triton_kernel(ctx), "4"),
        Check("5 SDPA model flops", "equal on every kernel", 30, 20,
              lambda: sdpa_model_flops(ctx), "5"),
        Check("6 host cost per op", "counting <= 1.25x do-nothing", 60, 30,
              lambda: host_cost_per_op(ctx), "6"),
        Check("7 fresh trace", "recorded, joined, priced", 60, 45, lambda: fresh_trace(ctx),
              "7"),
        Check("events vs kernels", "within 10 %", 30, 20,
              printed("events vs kernels", ["within 10 %"],
                      gpt2(gt.ours_vs_kernels, a.top)), "8"),
        Check("events timed vs eager", "<= 1.10x; no sync", 30, 20,
              printed("events timed vs eager", ["<= 1.10x", "0 synchronize"],
                      gpt2(gt.timed_vs_eager, a.repeat)), "8"),
        Check("events held, many steps", "bounded", 40, 20, lambda: _bounded(ctx), "8"),
        Check("events on cuda:1", "ops timed on device 1", 30, 20,
              lambda: _second_device(ctx), "8"),
        Check("trace export", "events written", 20, 15,
              printed("trace export", ["events written"], gpt2(gt.trace_export)), "8"),
        Check("bf16 matmul vs peak", ">= 60 % of peak", 20, 15,
              printed("bf16 matmul vs peak", [">= 60 % of peak"],
                      lambda: gt.matmul_vs_peak(device_spec(), a.repeat)), "8"),
        Check("compiled GPU-bound step", "<= 1.05x uncounted", 120, None,
              printed("compiled GPU-bound step", ["<= 1.05x uncounted"],
                      lambda: gt.compiled_gpu_bound(a.repeat)), "8"),
    ]


def cleanup() -> None:
    """Between checks: a profiler left recording by an interrupted check stopped, compiled
    graphs dropped, the device idle and its cache emptied."""
    with contextlib.suppress(Exception):
        if torch.autograd._profiler_enabled():
            torch.autograd.profiler._disable_profiler()
    with contextlib.suppress(Exception):
        torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def facts() -> dict:
    """The run's setting (torch, device, ...), each fact an error's one line if it fails."""
    sources = {
        "torch": lambda: torch.__version__, "cuda": lambda: torch.version.cuda,
        "device": torch.cuda.get_device_name, "gpus": torch.cuda.device_count,
        "spec": lambda: getattr(device_spec(), "name", None),
        "kineto": lambda: _kineto().unavailable() or "available",
        "from_trace": lambda: hasattr(sys.modules["dispatch_flops"], "from_trace"),
        "python": lambda: sys.version.split()[0]}
    out = {}
    for name, source in sources.items():
        try:
            out[name] = source()
        except Exception as e:
            out[name] = one_line(e)
    return out


def default_out() -> Path:
    """A fresh folder under $OUT when set (``gpu_check``, ``gpu_check-2``, ...), else
    ./gpu_check_out."""
    base = os.environ.get("OUT")
    if not base:
        return Path("gpu_check_out")
    path, n = Path(base) / "gpu_check", 1
    while path.exists():
        n += 1
        path = Path(base) / f"gpu_check-{n}"
    return path


def finish(verdicts: Sequence[Verdict], info: dict, out: Path) -> int:
    table = render_table(verdicts)
    print("\n" + table)
    path = out / "verdicts.json"
    path.write_text(verdicts_to_json(verdicts, info))
    (out / "verdicts.txt").write_text(table + "\n")
    print(f"verdicts: {path}")
    return exit_status(verdicts)


def parse(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Every GPU-only check of dispatch_flops in one call, with one verdict "
                    "table (exit 3 without CUDA).")
    parser.add_argument("--quick", action="store_true",
                        help=f"a shorter run (~3 minutes: a {QUICK_BUDGET_S:.0f} s budget, "
                             f"fewer repeats, no compiled GPU-bound step)")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for verdicts.json, log.txt and the fresh trace (default: "
                             "a new folder under $OUT, else ./gpu_check_out)")
    parser.add_argument("--budget", type=float, default=None,
                        help=f"seconds for all checks (default {BUDGET_S:.0f}, "
                             f"--quick {QUICK_BUDGET_S:.0f})")
    parser.add_argument("--only", default="",
                        help="comma-separated check numbers to run (1-7; 8: gpu_timing's other "
                             "checks)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--repeat", type=int, default=None,
                        help="repeats of a timed comparison (default 10, --quick 5)")
    parser.add_argument("--steps", type=int, default=200, help="steps for the events check")
    parser.add_argument("--top", type=int, default=10, help="ops compared with the profiler")
    args = parser.parse_args(argv)
    if args.repeat is None:
        args.repeat = 5 if args.quick else 10
    if args.budget is None:
        args.budget = QUICK_BUDGET_S if args.quick else BUDGET_S
    for name in ("batch", "seq", "repeat", "steps", "top"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse(argv)
    if not torch.cuda.is_available():
        print(f"CUDA is not available: no GPU check ran (exit status {NO_CUDA}).")
        return NO_CUDA
    args.out_dir = (args.out or default_out()).resolve()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    log = open(args.out_dir / "log.txt", "w", buffering=1)  # the whole run's output too
    sys.stdout = _Both(sys.__stdout__, log)
    try:
        info = facts()
        info.update(quick=args.quick, budget_s=args.budget)
        print(f"gpu_check: {json.dumps(info)}; out {args.out_dir}")
        ctx = Context(args)
        chosen = checks(ctx)
        if args.only:
            wanted = {n.strip() for n in args.only.split(",")}
            chosen = [c for c in chosen if c.number in wanted]
        runner = Runner(args.budget, args.quick, cleanup)
        watchdog = _watchdog(runner, args.budget + HANG_GRACE_S, info, args.out_dir)
        verdicts = runner.run(chosen)
        watchdog.cancel()
        return finish(verdicts, info, args.out_dir)
    finally:
        sys.stdout = sys.__stdout__
        log.close()


class _Both(io.TextIOBase):
    def __init__(self, *outs) -> None:
        self.outs = outs

    def write(self, text: str) -> int:
        for out in self.outs:
            out.write(text)
        return len(text)

    def flush(self) -> None:
        for out in self.outs:
            out.flush()


def _watchdog(runner: Runner, after_s: float, info: dict, out: Path) -> threading.Timer:
    """Past the budget and a grace, a check stuck where SIGALRM cannot reach it (inside one C
    call): print the table so far, the stuck check an ERROR row, and exit 1."""

    def fire() -> None:
        stuck = runner.current
        rows = list(runner.verdicts)
        if stuck is not None:
            rows.append(Verdict(stuck.name, f"still running {after_s:.0f} s into the run "
                                f"(stuck in one call: killed)", stuck.target, ERROR))
        with contextlib.suppress(Exception):
            finish(rows, info, out)
            sys.stdout.flush()
        os._exit(1)

    timer = threading.Timer(after_s, fire)
    timer.daemon = True
    timer.start()
    return timer


if __name__ == "__main__":
    sys.exit(main())
