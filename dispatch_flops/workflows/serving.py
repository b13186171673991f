"""Serving: the exact cost of every scheduler iteration at table-lookup cost.

A serving engine runs one forward per scheduler iteration over a batch of requests, each with
its new tokens, the prefix already in its KV cache, and the rows whose logits it computes.
What that forward costs is a function of those numbers alone for a dense decoder: linear in
the new tokens for every projection, MLP and norm; per request and per layer the (query, key)
pairs its attention sees, with the layer's own window; plus the logit rows. ``CostModel``
finds that function *by counting*: it counts the model's forward (on meta: no memory, no
weights) at a few dozen ``(new, cached, logits)`` points, solves exactly (rational
arithmetic) for the coefficients of a basis of such terms, per counted figure, and checks the
solution on further counted points before it is used. A figure the basis cannot express (a
data-dependent part) fails that check and is named, never silently wrong.

``ServingMeter`` evaluates it per iteration (a few multiply-adds per request), keeps the
totals under vLLM's and SGLang's metric names and the project's own, and gives MFU and MBU
against the device's peaks over wall time or busy time.

Two attention figures side by side: ``flops`` (hardware: every pair of the score rectangle
the kernel computes, what vLLM's ``perf.py`` bills for a prefill) and ``model_flops`` (the
causal pairs only, less any window: SGLang's c·p + c(c+1)/2 rule, exact per layer).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from fractions import Fraction
from math import gcd as _gcd
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Optional, Sequence, Union

import torch
from torch import nn

from dispatch_flops.counter import FlopCounter
from dispatch_flops.results.roofline import DeviceSpec, device_spec

# what the cost model gives per forward, in this order
FIGURES = ("flops", "model_flops", "macs", "bytes_read", "bytes_written")


class Request(NamedTuple):
    """One request's part of an iteration: ``new`` tokens computed now, ``cached`` tokens
    already in its KV cache (its prefix: earlier prefill chunks, or decoded tokens), and
    ``logits`` rows computed (1 for a decode step or a prefill's last chunk, 0 for a middle
    chunk of a chunked prefill; ``new`` when every position's logits are asked)."""

    new: int
    cached: int = 0
    logits: int = 1


Batch = Sequence[Union[Request, tuple]]


def _windowed_pairs(n: int, p: int, w: int) -> int:
    """Σ over the n new tokens at positions p+1..p+n of min(position, w): the causal (query,
    key) pairs a layer with window w sees (w=0: no window)."""
    if w <= 0:
        return n * p + n * (n + 1) // 2
    # positions up to w see all before them, later ones see w
    full = max(0, min(p + n, w) - p)  # positions p+1 .. min(p+n, w)
    seen = full * p + full * (full + 1) // 2
    return seen + (n - full) * w


def _basis_names(windows: Sequence[int]) -> tuple:
    # [n=1]: a single new token takes other kernels' paths (no mask: decode); [p=0]: no cache
    names = ["1", "n", "l", "n*n", "n*p", "p", "[n=1]", "[n=1]*p", "[p=0]", "[p=0]*n",
             "[p=0]*n*n", "[n=1]*[p=0]"]
    for w in windows:
        for v in (w, w - 1):  # a window of w keys, a cache of w - 1 beside the new token
            names += [f"min(p,{v})", f"n*min(p,{v})", f"[n=1]*min(p,{v})", f"min(p+n,{v})",
                      f"n*min(p+n,{v})", f"[p=0]*min(n,{v})", f"[p=0]*n*min(n,{v})"]
        # a cache not yet full (0 < p < w - 1) that this step's tokens overflow
        names += [f"pairs[w={w}]", f"[0<p<{w - 1}]", f"[0<p<{w - 1}]*n", f"[0<p<{w - 1}]*p",
                  f"[0<p<{w - 1}]*n*n", f"[0<p<{w - 1}]*n*p", f"[0<p<{w - 1}]*p*p"]
    return tuple(names)


def _basis(n: int, p: int, rows: int, windows: Sequence[int]) -> list:
    one, empty = int(n == 1), int(p == 0)
    out = [1, n, rows, n * n, n * p, p, one, one * p, empty, empty * n, empty * n * n,
           one * empty]
    for w in windows:
        for v in (w, w - 1):
            out += [min(p, v), n * min(p, v), one * min(p, v), min(p + n, v),
                    n * min(p + n, v), empty * min(n, v), empty * n * min(n, v)]
        part = int(0 < p < w - 1)
        out += [_windowed_pairs(n, p, w), part, part * n, part * p, part * n * n,
                part * n * p, part * p * p]
    return out


def _solve(rows: list, values: list) -> Optional[list]:
    """An exact solution x of rows · x = values (Fractions; free variables 0), None when the
    system is inconsistent."""
    m = [[Fraction(v) for v in row] + [Fraction(b)] for row, b in zip(rows, values)]
    width = len(rows[0])
    pivots: list = []
    r = 0
    for c in range(width):
        pivot = next((i for i in range(r, len(m)) if m[i][c] != 0), None)
        if pivot is None:
            continue
        m[r], m[pivot] = m[pivot], m[r]
        lead = m[r][c]
        m[r] = [v / lead for v in m[r]]
        for i in range(len(m)):
            if i != r and m[i][c] != 0:
                f = m[i][c]
                m[i] = [a - f * b for a, b in zip(m[i], m[r])]
        pivots.append(c)
        r += 1
        if r == len(m):
            break
    for i in range(r, len(m)):
        if m[i][-1] != 0:
            return None
    x = [Fraction(0)] * width
    for i, c in enumerate(pivots):
        x[c] = m[i][-1]
    return x


def model_windows(config: Any) -> tuple:
    """The attention windows a transformers config declares (``sliding_window`` where a
    layer uses it: ``layer_types``, Mistral's, Gemma's alternation), sorted; () for none."""
    window = getattr(config, "sliding_window", None)
    if not window:
        return ()
    if getattr(config, "use_sliding_window", True) is False:
        return ()
    return (int(window),)


class Probe(NamedTuple):
    request: Request
    figures: tuple  # FIGURES, as counted


def count_forward(model: nn.Module, request: Request, *, config: Any = None,
                  device: Union[str, torch.device] = "meta") -> tuple:
    """``FIGURES`` of one forward of a transformers causal LM: ``request.cached`` tokens
    already in a fresh ``DynamicCache`` (run first, not counted), then ``request.new`` tokens
    counted with ``logits_to_keep`` rows."""
    import inspect

    import transformers

    n, p, rows = request
    # transformers 5.25 names the cache argument ``cache`` (``past_key_values`` deprecated)
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else \
        "past_key_values"
    config = config if config is not None else model.config
    with torch.no_grad():
        cache = transformers.DynamicCache(config=config)
        if p:
            model(input_ids=torch.zeros(1, p, dtype=torch.long, device=device),
                  use_cache=True, **{name: cache})
        ids = torch.zeros(1, n, dtype=torch.long, device=device)
        keep: Any = rows if rows else torch.zeros(0, dtype=torch.long, device=device)
        with FlopCounter(model) as fc:
            model(input_ids=ids, use_cache=True, logits_to_keep=keep, **{name: cache})
    total = fc.to_profile().total
    return (total.flops, total.flops - total.masked_flops, total.macs, total.bytes_read,
            total.bytes_written)


class FitError(ValueError):
    """A figure the cost model's terms do not express exactly on the counted points."""


@dataclass(frozen=True)
class CostModel:
    """The cost of one forward as exact rational coefficients on a basis of batch terms (see
    the module's docstring). ``cost(batch)``: ``FIGURES`` of the forward that runs ``batch``,
    each request as it would run alone with its cache (what every serving engine's per-request
    accounting assumes). ``windows``: the attention windows in the basis."""

    names: tuple
    windows: tuple
    coefficients: Mapping[str, tuple]  # figure -> Fractions on ``names``
    probes: int
    label: str = "model"

    @classmethod
    def fit(cls, count: Callable[[Request], tuple], windows: Sequence[int] = (), *,
            max_new: int = 24, max_cached: int = 48, probes: int = 0, checks: int = 24,
            seed: int = 0, label: str = "model") -> "CostModel":
        """Count ``count(request)`` (``FIGURES`` of one forward) at drawn points spanning
        each window on both sides, solve each figure exactly, and check the solution on
        ``checks`` further points: ``FitError`` naming the figure otherwise."""
        windows = tuple(sorted(set(int(w) for w in windows if w)))
        span = max((2 * w + 3 for w in windows), default=0)
        max_new, max_cached = max(max_new, span), max(max_cached, 2 * span)
        names = _basis_names(windows)
        rng = random.Random(seed)
        wanted = probes or 3 * len(names)

        def draw() -> Request:  # decode steps, fresh prefills, prefixes inside a window
            kind = rng.randrange(4)
            n = 1 if kind == 0 else rng.randint(1, max_new)
            p = 0 if kind == 1 else rng.randint(0, max_cached)
            if kind == 3 and windows:
                p = rng.randint(0, max(windows))
            return Request(n, p, rng.randint(1, n))
        points = [Request(1, 0, 1), Request(2, 0, 1), Request(2, 0, 2), Request(1, 1, 1),
                  Request(1, 2, 1), Request(1, 3, 1), Request(3, 0, 1), Request(2, 1, 1),
                  Request(2, 2, 2), Request(3, 2, 1)]
        for w in windows:
            points += [Request(1, w - 1, 1), Request(1, w, 1), Request(1, w + 1, 1),
                       Request(w + 1, 0, 1), Request(2, w - 1, 1)]
        while len(points) < wanted:
            points.append(draw())
        counted = [count(r) for r in points]
        model = cls._solved(names, windows, points, counted, label)
        # checked on fresh points; a point the solution misses joins the system (the probes
        # left a direction free), until ``checks`` fresh points in a row are exact
        passed = tries = 0
        while passed < checks:
            tries += 1
            if tries > 8 * checks + 64:
                raise FitError(f"{label}: the fit did not settle on fresh points")
            r = draw()
            want = count(r)
            if model.forward_cost([r]) == want:
                passed += 1
                continue
            passed = 0
            points.append(r)
            counted.append(want)
            model = cls._solved(names, windows, points, counted, label)
        return model

    @classmethod
    def _solved(cls, names, windows, points, counted, label) -> "CostModel":
        rows = [_basis(n, p, k, windows) for n, p, k in points]
        coefficients = {}
        for k, figure in enumerate(FIGURES):
            x = _solve(rows, [c[k] for c in counted])
            if x is None:
                raise FitError(f"{label}: {figure} is not a function of (new, cached, logits) "
                               f"with this model's windows {windows or 'none'}: a part of the "
                               "forward depends on more than the batch's shape; count it")
            coefficients[figure] = tuple(x)
        return cls(names, windows, coefficients, len(points), label)

    @classmethod
    def from_model(cls, model: nn.Module, *, windows: Optional[Sequence[int]] = None,
                   device: Union[str, torch.device] = "meta", **fit) -> "CostModel":
        """A transformers causal LM's cost model, counted (on ``device``: meta by default, a
        model built under ``torch.device("meta")``); ``windows`` from its config unless
        given."""
        config = model.config
        model.eval()
        found = windows if windows is not None else model_windows(config)
        return cls.fit(lambda r: count_forward(model, r, config=config, device=device),
                       found, label=type(model).__name__, **fit)

    def __post_init__(self) -> None:
        # per figure, the nonzero terms as integer numerators over one denominator: an
        # iteration's figure is one integer dot product (exact), then one division
        fast = {}
        for figure, coefficients in self.coefficients.items():
            den = 1
            for c in coefficients:
                den = den * c.denominator // _gcd(den, c.denominator)
            fast[figure] = (tuple((i, int(c * den)) for i, c in enumerate(coefficients) if c),
                            den)
        object.__setattr__(self, "_fast", fast)

    def cost_arrays(self, new, cached, logits) -> dict:
        """``cost`` of the batch given as three equal-length integer sequences (numpy arrays
        or lists): new tokens, cached tokens, logit rows per request; vectorised."""
        import numpy as np

        n = np.asarray(new, dtype=np.int64)
        p = np.asarray(cached, dtype=np.int64)
        lg = np.asarray(logits, dtype=np.int64)
        if n.size == 0:
            raise ValueError("an iteration needs at least one request")
        if n.shape != p.shape or n.shape != lg.shape or (n < 1).any() or (p < 0).any() \
                or (lg < 0).any() or (lg > n).any():
            raise ValueError("new, cached and logits: equal lengths, new >= 1, cached >= 0, "
                             "0 <= logits <= new")
        one = n == 1
        empty = p == 0
        sums = [int(n.size), int(n.sum()), int(lg.sum()), int((n * n).sum()),
                int((n * p).sum()), int(p.sum()), int(one.sum()), int(p[one].sum()),
                int(empty.sum()), int(n[empty].sum()), int((n * n)[empty].sum()),
                int((one & empty).sum())]
        for w in self.windows:
            for v in (w, w - 1):
                mp, mpn, mn = np.minimum(p, v), np.minimum(p + n, v), np.minimum(n, v)
                sums += [int(mp.sum()), int((n * mp).sum()), int(mp[one].sum()),
                         int(mpn.sum()), int((n * mpn).sum()), int(mn[empty].sum()),
                         int((n * mn)[empty].sum())]
            full = np.clip(np.minimum(p + n, w) - p, 0, None)
            sums.append(int((full * p + full * (full + 1) // 2 + (n - full) * w).sum()))
            part = (p > 0) & (p < w - 1)
            sums += [int(part.sum()), int(n[part].sum()), int(p[part].sum()),
                     int((n * n)[part].sum()), int((n * p)[part].sum()),
                     int((p * p)[part].sum())]
        fast = self._fast  # type: ignore[attr-defined]
        return {f: sum(c * sums[i] for i, c in fast[f][0]) // fast[f][1] for f in FIGURES}

    def terms(self, batch: Batch) -> list:
        """Σ of each basis term over ``batch``'s requests."""
        windows = self.windows
        sums = [0] * len(self.names)
        for request in batch:
            n, p, rows = request if len(request) == 3 else (*request, 1)[:3]
            if n < 1 or p < 0 or not 0 <= rows <= n:
                raise ValueError(f"a request needs new >= 1, cached >= 0 and 0 <= logits <= "
                                 f"new, not {tuple(request)}")
            for i, v in enumerate(_basis(n, p, rows, windows)):
                sums[i] += v
        return sums

    def forward_cost(self, batch: Batch) -> tuple:
        """``FIGURES`` (ints) of running each request of ``batch`` alone, summed."""
        sums = self.terms(batch)
        return tuple(int(sum(c * s for c, s in zip(self.coefficients[f], sums) if c))
                     for f in FIGURES)

    def cost(self, batch: Batch) -> dict:
        """``{figure: value}`` of one iteration over ``batch``: each request's forward as it
        would run alone with its cache, summed (the per-request accounting of vLLM's and
        SGLang's metrics); ``ValueError`` for an empty batch or a request with no new
        tokens."""
        if not batch:
            raise ValueError("an iteration needs at least one request")
        return dict(zip(FIGURES, self.forward_cost(batch)))


# -- the meter --------------------------------------------------------------------------------

VLLM = ("vllm:estimated_flops_per_gpu_total", "vllm:estimated_read_bytes_per_gpu_total",
        "vllm:estimated_write_bytes_per_gpu_total")
SGLANG = ("sglang:estimated_flops_per_gpu_total", "sglang:estimated_read_bytes_per_gpu_total",
          "sglang:estimated_write_bytes_per_gpu_total")


class ServingMeter:
    """Per scheduler iteration, ``record(batch)``; cumulative totals per GPU under vLLM's and
    SGLang's names (``counters()``) and MFU / MBU (``utilisation()``). ``tensor_parallel``
    and ``pipeline_parallel`` divide the forward's work among the GPUs that run it;
    ``device``: a ``DeviceSpec`` or its name for the percentages."""

    def __init__(self, model: CostModel, *, device: Union[DeviceSpec, str, None] = None,
                 tensor_parallel: int = 1, pipeline_parallel: int = 1,
                 dtype: str = "bfloat16") -> None:
        for name, value in (("tensor_parallel", tensor_parallel),
                            ("pipeline_parallel", pipeline_parallel)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, not {value!r}")
        if isinstance(device, str):
            spec = device_spec(device)
            if spec is None:
                raise ValueError(f"device {device!r}: not a known device; pass a DeviceSpec "
                                 "or one of dispatch_flops.DEVICES")
            device = spec
        self.model = model
        self.device = device
        self.gpus = tensor_parallel * pipeline_parallel
        self.dtype = dtype
        self.totals = dict.fromkeys(FIGURES, 0)
        self.iterations = 0
        self.tokens = 0
        self.wall_s = 0.0
        self.busy_s = 0.0

    def record(self, batch: Batch, *, wall_s: Optional[float] = None,
               busy_s: Optional[float] = None) -> dict:
        """Add one iteration (and its wall / busy seconds when given); returns its cost."""
        cost = self.model.cost(batch)
        totals = self.totals
        for f, v in cost.items():
            totals[f] += v
        self.iterations += 1
        self.tokens += sum(r[0] for r in batch)
        if wall_s is not None:
            self.wall_s += wall_s
        if busy_s is not None:
            self.busy_s += busy_s
        return cost

    def counters(self) -> dict:
        """Cumulative per-GPU counters: vLLM's names (hardware flops: every score pair, as
        its perf.py bills), SGLang's (model flops: causal pairs), and the project's own."""
        g = self.gpus
        t = self.totals
        per = {f: t[f] / g for f in FIGURES}
        out = dict(zip(VLLM, (per["flops"], per["bytes_read"], per["bytes_written"])))
        out.update(zip(SGLANG, (per["model_flops"], per["bytes_read"], per["bytes_written"])))
        out.update({f"dispatch_flops:{f}_per_gpu_total": v for f, v in per.items()})
        out["dispatch_flops:iterations_total"] = self.iterations
        out["dispatch_flops:tokens_total"] = self.tokens
        return out

    def utilisation(self) -> dict:
        """MFU (model flops / peak) and MBU (bytes / bandwidth) per GPU over the wall and
        the busy seconds recorded (None where not recorded or no device)."""
        out: dict = {}
        spec = self.device
        for basis, seconds in (("wall", self.wall_s), ("busy", self.busy_s)):
            if spec is None or not seconds:
                out[f"mfu_{basis}"] = out[f"mbu_{basis}"] = None
                continue
            peak = spec.peak_flops_by_dtype.get(self.dtype)
            per = self.counters()
            moved = per["dispatch_flops:bytes_read_per_gpu_total"] + \
                per["dispatch_flops:bytes_written_per_gpu_total"]
            out[f"mfu_{basis}"] = per["dispatch_flops:model_flops_per_gpu_total"] / (
                seconds * peak) if peak else None
            out[f"mbu_{basis}"] = moved / (seconds * spec.memory_bandwidth) \
                if spec.memory_bandwidth else None
        return out

    def prometheus(self, registry: Any = None) -> Any:
        """Register the counters with ``prometheus_client`` (the ``prometheus`` extra) as a
        collector read at each scrape; returns it."""
        try:
            from prometheus_client.core import REGISTRY, CounterMetricFamily
        except ImportError as e:
            raise ImportError("ServingMeter.prometheus needs prometheus_client: pip install "
                              "'dispatch_flops[prometheus]'; counters() gives the same as a "
                              "dict") from e
        meter = self

        class _Collector:
            def collect(self) -> Iterable:
                for name, value in meter.counters().items():
                    yield CounterMetricFamily(name.removesuffix("_total"),
                                              f"{name}, counted by dispatch_flops", value=value)

        collector = _Collector()
        (registry if registry is not None else REGISTRY).register(collector)
        return collector
