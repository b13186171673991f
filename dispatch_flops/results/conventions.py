"""The field's MFU conventions side by side for one run: the flops per token each one counts,
from what the run saw, and the MFU each gives for one throughput.

Every convention is a closed form over the model's shape; this module reads that shape from
the run, never from a config: ``N`` the parameters counted in the module tree (a shared one
once; of a mixture of experts, the ``k / E`` of the experts a token uses), ``E`` those of its
``nn.Embedding`` modules, ``L·H·Q·T`` from the forward attention calls the counter recorded
(one layer per module that ran attention; heads, head dim, keys per query), and ``tokens``
from the same calls (``b·s`` through one layer) unless given. With ``f`` flops per parameter
and token (6 training: 2 forward, 4 backward; 2 forward only, each row then its formula's
forward third under the same name):

    6N                 f·N
    6N, no embeddings  f·(N − E)                      Kaplan et al. 2020
    PaLM               f·N + 2f·L·H·Q·T               Chowdhery et al. 2022, appendix B
    PaLM, causal       f·N + f·L·H·Q·T                the same, masked half of attention left out
    torchtitan         f·(N − E) + 2f·L·H·Q·T         get_nparams_and_flops (llama3)
    Megatron           f·(W + h·V) + f·L·H·Q·T        num_floating_point_operations

``W``: the weights of two or more dimensions (GEMMs) outside embeddings, routers and the LM
head, experts at ``k / E`` (Megatron's projections, MLP and routed experts; norms, biases and
the router are not GEMMs it counts); ``h·V`` its logit GEMM (the LM head). Megatron pads
``V`` to a multiple of 128 (``make_vocab_size_divisible_by``); this uses the run's ``V``.
With ``d_v != d`` the attention term takes ``(d + d_v) / 2`` as ``Q``.

>>> with FlopCounter(model) as fc:
...     model(input_ids=ids, labels=ids).loss.backward()
>>> print(fc.conventions(tokens_per_s=2973, device=DEVICES["A100-SXM4-80GB"]))
>>> fc.conventions()["torchtitan"].flops_per_token
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional, Union

from dispatch_flops.results import present, utilisation
from dispatch_flops.results.format import scientific
from dispatch_flops.results.protocols import ProfileLike
from dispatch_flops.results.roofline import DeviceSpec
from dispatch_flops.results.stats import BACKWARD, FORWARD, RECOMPUTE

Number = Union[int, float]
WIDTH = 100  # the printed table (views.text.conventions_table) fits this many columns


@dataclass(frozen=True)
class Convention:
    """One way of counting a token's flops: its ``name``, its ``formula`` with this run's
    figures, ``flops_per_token``, what it ``counts`` and ``leaves_out``, and the MFU it gives
    (``None`` without a throughput and a device)."""

    name: str
    formula: str
    flops_per_token: Number
    counts: str
    leaves_out: str
    mfu: Optional[float] = None


@dataclass(frozen=True)
class Difference:
    """What one named term is worth per token (``flops_per_token``) and which rows it sets
    apart (``between``)."""

    name: str
    flops_per_token: Number
    between: str


@dataclass(frozen=True)
class Shape:
    """What the formulas read from the run. ``parameters``: ``N`` (a token's: inactive
    experts left out); ``embedding``: ``E``; ``lm_head``: ``h·V`` (``tied``: the embedding's
    own weight); ``matrices``: ``W``; ``other``: ``N − E − W`` less an untied head (norms,
    biases, routers); ``inactive``: experts a token skips; ``layers``, ``heads``,
    ``head_dim``, ``keys``: ``L``, ``H``, ``Q``, ``T`` (None when the calls differ);
    ``attention``: ``L·H·Q·T`` per token, summed over the calls; ``causal``: what the calls
    said (None: eager attention, or none seen); ``passes``: 3 training, 1 forward only;
    ``measured``, ``contractions``, ``masked``, ``recompute``: the run's forward + backward
    model flops (masked attention pairs left out), their 2 x MACs, the masked pairs' flops
    the kernels computed anyway, and recomputed flops, per token."""

    tokens: int
    tokens_seen: bool  # read from the attention calls (False: given)
    parameters: int
    embedding: int
    lm_head: int
    tied: bool
    matrices: int
    other: int
    inactive: int
    experts: tuple  # (E, k), or () for a dense model
    layers: int
    heads: Optional[int]
    head_dim: Optional[Number]
    keys: Optional[int]
    attention: Number
    causal: Optional[bool]
    passes: int
    measured: Number
    contractions: Number
    masked: Number
    recompute: Number
    counted_attention: str  # the counter's attention option: "dense" or "causal"
    # the distinct query tokens (b·s) of the attention layers, in the order run: more than
    # one when layers see different tokens (an encoder and a decoder), and ``tokens`` is
    # then the first layer's unless given
    token_counts: tuple = ()


@dataclass(frozen=True)
class Conventions:
    """The conventions side by side for one run (``ProfileViews.conventions``): ``rows``
    (``Convention``), ``differences`` between them (``Difference``), the ``shape`` they
    read, and the throughput and peak the MFU column divides by. ``str()`` is the table;
    ``conventions["torchtitan"]`` one row."""

    model: str
    shape: Shape
    rows: tuple
    differences: tuple
    tokens_per_s: Optional[float] = None
    device: Optional[str] = None
    dtype: Optional[str] = None
    peak_flops: Optional[float] = None

    def __getitem__(self, name: str) -> Convention:
        for row in self.rows:
            if row.name == name:
                return row
        raise KeyError(f"no convention {name!r}; rows: {[r.name for r in self.rows]}")

    def to_dict(self) -> dict:
        """Plain data: each row's name, formula, flops per token and MFU."""
        return {"model": self.model, "tokens": self.shape.tokens,
                "tokens_per_s": self.tokens_per_s, "device": self.device, "dtype": self.dtype,
                "peak_flops": self.peak_flops,
                "rows": [{"name": r.name, "formula": r.formula,
                          "flops_per_token": r.flops_per_token, "mfu": r.mfu}
                         for r in self.rows],
                "differences": [{"name": d.name, "flops_per_token": d.flops_per_token,
                                 "between": d.between} for d in self.differences]}

    def __str__(self) -> str:
        return present.presenter().conventions_table(self)


def _exact(x: Fraction) -> Number:
    return x.numerator if x.denominator == 1 else float(x)


def shape_of(profile: ProfileLike, tokens: Optional[int] = None) -> Shape:
    """The model's shape as the run saw it; ``ValueError`` when the run has no model
    parameters, or no attention calls and no ``tokens``."""
    run = profile.run
    groups = dict(run.parameters)
    if not groups.get("total"):
        raise ValueError("conventions need the model's parameters: count with "
                         "FlopCounter(model), a model that has parameters")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int)
                               or tokens <= 0):
        raise ValueError(f"tokens must be a positive int (tokens the counted run processed), "
                         f"got {tokens!r}")
    calls = run.attention_calls
    stacks: dict[tuple, int] = {}
    for call in calls:  # (stack, batch, heads, q_len, k_len, head_dim, value_dim, causal, n)
        stacks[call[0]] = stacks.get(call[0], 0) + call[-1] * call[1] * call[3]
    seen = next(iter(stacks.values()), 0)
    if tokens is None:
        if not seen:
            raise ValueError("no attention calls were counted to read the tokens from: pass "
                             "tokens= (the tokens the counted run processed)")
        tokens = seen
    # Σ over calls of the query tokens x heads x keys x head dim: L·H·Q·T per token
    pairs = sum(Fraction(n * b * s_q * h * s_k * (d + d_v), 2) for _, b, h, s_q, s_k, d, d_v,
                _, n in calls) + Fraction(0)
    attention = pairs / tokens

    def uniform(i: int):
        values = {c[i] for c in calls}
        return values.pop() if len(values) == 1 else None

    head_dims = {Fraction(c[5] + c[6], 2) for c in calls}
    causal = {c[7] for c in calls}
    phases = profile.by_phase()
    passes = 3 if phases[BACKWARD].flops else 1
    measured = phases[FORWARD].model_flops + phases[BACKWARD].model_flops
    macs = phases[FORWARD].model_macs + phases[BACKWARD].model_macs
    masked = phases[FORWARD].masked_flops + phases[BACKWARD].masked_flops
    total, embedding = groups["total"], groups.get("embedding", 0)
    inactive = groups.get("experts", 0) - groups.get("active_experts", 0)
    head, tied = groups.get("lm_head", 0), bool(groups.get("tied_head", 0))
    parameters = total - inactive
    matrices = groups.get("matrices", 0)
    experts = groups.get("experts_count", 0)
    return Shape(
        token_counts=tuple(dict.fromkeys(stacks.values())),
        tokens=tokens, tokens_seen=tokens == seen and bool(seen), parameters=parameters,
        embedding=embedding, lm_head=head, tied=tied, matrices=matrices,
        other=parameters - embedding - matrices - (0 if tied else head), inactive=inactive,
        experts=(experts, groups.get("experts_per_token", 0)) if experts else (),
        layers=len(stacks), heads=uniform(2),
        head_dim=_exact(head_dims.pop()) if len(head_dims) == 1 else None, keys=uniform(4),
        attention=_exact(attention), causal=causal.pop() if len(causal) == 1 else None,
        passes=passes, measured=_exact(Fraction(measured, tokens)),
        contractions=_exact(Fraction(2 * macs, tokens)),
        masked=_exact(Fraction(masked, tokens)),
        recompute=_exact(Fraction(phases[RECOMPUTE].flops, tokens)),
        counted_attention=run.attention)


def rows_of(s: Shape) -> tuple[tuple, tuple]:
    """(rows, differences) for a shape: each row ``(name, formula, flops per token, counts,
    leaves out)``."""
    f = 2 * s.passes  # flops per parameter and token: 6 training, 2 forward only
    n, e, a = s.parameters, s.embedding, Fraction(s.attention)
    lhqt = f"{2 * f}·L·H·Q·T"
    half = f"{f}·L·H·Q·T"
    # model flops leave out the masked pairs the counter saw (a mask's values, is_causal); on
    # the meta device a mask has no values, and every pair stays in
    pairs = "unmasked (query, key) pairs" if s.masked or s.counted_attention == "causal" else \
        "every (query, key) pair"
    head = "the LM head (tied: the embedding)" if s.tied else "the LM head"
    no_head = "; the LM head with them (tied)" if s.tied else ""
    phases = "forward + backward" if s.passes == 3 else "forward"
    rows: list[tuple] = [
        ("measured", "counted flops / tokens", s.measured,
         f"every {phases} op the run counted: matmuls, attention ({pairs}), norms, activations, "
         "softmax, RoPE, residuals, loss", "the optimizer, recomputed forward ops"),
        ("measured matmuls", "2·MACs / tokens", s.contractions,
         f"the multiply-accumulates of every {phases} op (what mfu() divides)",
         "element-wise work, the optimizer, recompute"),
    ]
    if s.recompute or s.masked:
        rows.append(("hardware", "executed flops / tokens",
                     Fraction(s.measured) + Fraction(s.masked) + Fraction(s.recompute),
                     "every op run: masked attention pairs the kernels computed, recomputed "
                     "forward ops (what hfu() divides)", "the optimizer"))
    rows += [
        ("6N", f"{f}·{scientific(n)}", f * n, f"every parameter a token uses, {head} included",
         "attention scores and values (L·H·Q·T), element-wise work"),
        ("6N no embeddings", f"{f}·({scientific(n)} − {scientific(e)})", f * (n - e),
         "non-embedding parameters (Kaplan et al.)",
         f"embedding tables{no_head}; attention scores; element-wise work"),
        ("PaLM", f"{f}N + {lhqt}", f * n + 2 * f * a,
         "every parameter, attention QK^T and AV over all T keys",
         "the causal mask's saving; element-wise work"),
        ("PaLM causal", f"{f}N + {half}", f * n + f * a,
         "every parameter, attention over the unmasked half of the keys",
         "element-wise work"),
        ("torchtitan", f"{f}(N − E) + {lhqt}", f * (n - e) + 2 * f * a,
         "non-embedding parameters, attention over all T keys",
         f"embedding tables{no_head}; the causal mask's saving; element-wise work"),
        ("Megatron", f"{f}(W + h·V) + {half}", f * (s.matrices + s.lm_head) + f * a,
         "GEMMs only: projections, MLP / routed experts, logits (h·V); causal half of "
         "attention", "embedding lookups, norms, biases, routers; element-wise work"),
    ]
    differences: list[tuple] = [
        ("embeddings", f * e, "6N vs 6N no embeddings; PaLM vs torchtitan"),
        ("LM head (h·V)", f * s.lm_head,
         "tied to the embedding: dropped with it by the no-embedding rows" if s.tied else
         "its own weight: in N of every row; Megatron's logit term"),
        ("causal halving", f * a, "PaLM vs PaLM causal; Megatron halves too"),
        ("norms, biases, routers", f * s.other, "in 6N (every parameter), not Megatron's"),
        ("element-wise work", Fraction(s.measured) - Fraction(s.contractions),
         "measured vs measured matmuls; no convention counts it"),
    ]
    if s.inactive:
        differences.append(("inactive experts", f * s.inactive,
                            "left out of every row: N is what a token uses"))
    if s.masked:
        differences.append(("masked attention pairs", s.masked,
                            "computed by the kernels, not needed: hardware, not model flops"))
    if s.recompute:
        differences.append(("recompute", s.recompute,
                            "hardware flops, not model flops: in no MFU row"))
    rows_out = tuple((name, formula, _exact(Fraction(x)), counts, out)
                     for name, formula, x, counts, out in rows)
    diffs_out = tuple((name, _exact(Fraction(x)), between) for name, x, between in differences)
    return rows_out, diffs_out


def conventions(profile: ProfileLike, tokens: Optional[int] = None,
                tokens_per_s: Optional[float] = None, device: Optional[DeviceSpec] = None,
                dtype=None) -> Conventions:
    """The conventions of ``profile`` side by side (``ProfileViews.conventions``)."""
    shape = shape_of(profile, tokens)
    peak = spec = name = None
    if tokens_per_s is not None:
        if isinstance(tokens_per_s, bool) or not isinstance(tokens_per_s, (int, float)) or \
                not math.isfinite(tokens_per_s) or tokens_per_s <= 0:
            raise ValueError(f"tokens_per_s must be a positive number (the measured "
                             f"throughput), got {tokens_per_s!r}")
        spec = utilisation.device_of(profile, device)
        name = utilisation.dtype_name(dtype) if dtype is not None else profile.run.dtype
        peak = spec.peak_flops(name)
    rows, differences = rows_of(shape)
    return Conventions(
        model=profile.root_label, shape=shape,
        rows=tuple(Convention(r[0], r[1], r[2], r[3], r[4],
                              r[2] * tokens_per_s / peak if peak else None) for r in rows),
        differences=tuple(Difference(*d) for d in differences),
        tokens_per_s=tokens_per_s, device=spec.name if spec is not None else None,
        dtype=name, peak_flops=peak)
