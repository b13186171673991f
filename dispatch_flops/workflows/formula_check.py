"""``check_formula``: a hand-written MFU formula checked against what the model executes.

A formula is a function of a model config (and, when it asks for them, ``batch``, ``seq`` and
the built ``model``) returning flops per token (``per="token"``) or per step, or a dict of
named components (``{"attention": ..., "mlp": ...}``: the total is their sum). For each config
the model is built on the meta device and one step is counted (forward + backward when
``training``, forward only otherwise); the formula's figure is set against the counted one,
and each named component against the counted work of the modules it names.

What the figure is set against (``against``): ``"contractions"`` (default) is 2 x the model
MACs of the counted phases, the matrix products that every published formula prices;
``"all_ops"`` is every op's model flops (``Profile.model_flops()``: element-wise work too);
``"hardware"`` is 2 x the MACs of every pass run, activation recomputation included (what
formulas "with recompute" price). Every row also carries ``hardware``, every flop executed
(``Profile.hardware_flops()``).

Components: a component's counted work is that of the modules its patterns name (shell-style,
over ``by_module()``'s dotted names: ``"*.self_attn"``), the outermost match only, less the
work of modules nested inside that another component names (an MoE block's ``mlp`` is its
router and shared expert once ``experts`` is named too). What no component names is reported
as ``UNNAMED``. Each component's miss is ``formula - counted``, in flops per step.

Sweeps: ``sweep=`` a dict of config fields to hypothesis strategies (or lists), or one
strategy of such dicts, over ``base``; hypothesis draws up to ``examples`` configs and, when
one fails (an error beyond ``tolerance``), shrinks it to the smallest failing config
(``FormulaCheck.smallest_failing``). Counts are cached per config, so shrinking re-counts no
config twice.

>>> check = check_formula(dispatch_flops.workflows.mfu_formulas.palm, [config], seq=512)
>>> print(check)                # per config: formula, counted, error; per component: the miss
>>> check.exact                 # every config and component within tolerance
"""

from __future__ import annotations

import copy
import fnmatch
import inspect
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union

import torch
from torch import nn

from dispatch_flops.counter import FlopCounter
from dispatch_flops.results.profile import Profile
from dispatch_flops.results.stats import BACKWARD, FORWARD, RECOMPUTE
from dispatch_flops.views.formula_text import formula_check_text

Number = Union[int, float, Fraction]
Formula = Callable[..., Union[Number, Mapping[str, Number]]]
Patterns = Union[str, Sequence[str]]

AGAINST = ("contractions", "all_ops", "hardware")
PER = ("token", "step")
UNNAMED = "(unnamed)"  # a component's name for the work no named component covers
TOTAL = "total"  # the formula's figure when it returns one number
# Where Hugging Face models keep each part; a user's components= replace these.
DEFAULT_COMPONENTS: dict[str, tuple[str, ...]] = {
    "embeddings": ("*embed_tokens", "*.wte", "*.wpe", "*embed_positions"),
    "attention": ("*.self_attn", "*.attn", "*.attention"),
    "experts": ("*.experts",),
    "shared_expert": ("*.shared_expert", "*.shared_experts"),
    "mlp": ("*.mlp", "*.block_sparse_moe", "*.feed_forward"),
    "lm_head": ("lm_head",),
}


@dataclass(frozen=True)
class ComponentCheck:
    """One named component in one config: the ``formula``'s figure and the ``counted`` work
    of ``modules`` (flops per step, against the check's measure), ``miss = formula -
    counted`` and ``error = miss / counted`` (``None`` when nothing was counted)."""

    name: str
    formula: Optional[Number]
    counted: int
    modules: tuple[str, ...]

    @property
    def miss(self) -> Optional[Number]:
        return None if self.formula is None else self.formula - self.counted

    @property
    def error(self) -> Optional[float]:
        miss = self.miss
        if miss is None:
            return None
        return float(miss) / self.counted if self.counted else (0.0 if miss == 0 else
                                                               float("inf"))


@dataclass(frozen=True)
class ConfigCheck:
    """One config checked: ``config`` (the fields a sweep varied, or the config's own
    summary), ``tokens`` in the step, the formula's figure per step (``formula``), the
    counted ``model_flops`` (2 x MACs: ``contractions``), ``all_ops`` and ``hardware``
    flops, and the ``components``. ``error`` is ``formula / counted - 1`` against the
    check's measure (``counted``)."""

    config: Mapping[str, Any]
    tokens: int
    formula: Number
    contractions: int
    all_ops: int
    hardware: int
    against: str
    components: tuple[ComponentCheck, ...]
    tolerance: float = 0.0
    recomputed: int = 0  # 2 x MACs of every pass run, recomputation included

    @property
    def counted(self) -> int:
        return {"contractions": self.contractions, "all_ops": self.all_ops,
                "hardware": self.recomputed}[self.against]

    @property
    def error(self) -> float:
        return float(Fraction(self.formula) / self.counted - 1) if self.counted else \
            (0.0 if self.formula == 0 else float("inf"))

    @property
    def per_token(self) -> tuple[float, float]:
        """(the formula's, the counted) flops per token."""
        return float(self.formula) / self.tokens, self.counted / self.tokens

    def failing(self) -> tuple[str, ...]:
        """The names that miss beyond the tolerance: ``TOTAL`` and the components."""
        out = [TOTAL] if abs(self.error) > self.tolerance else []
        return tuple(out + [c.name for c in self.components if c.formula is not None and
                            c.error is not None and abs(c.error) > self.tolerance])

    @property
    def exact(self) -> bool:
        return not self.failing()


@dataclass(frozen=True)
class FormulaCheck:
    """A formula checked over configs: ``rows`` (one ``ConfigCheck`` each, in the order
    counted), ``smallest_failing`` (hypothesis's shrunk failing config in a sweep, else the
    first failing row; ``None`` when all pass), ``seconds`` spent and ``configs_per_s``.

    >>> check = check_formula(my_formula, configs, seq=256)
    >>> check.exact, check.worst().error
    >>> print(check)
    """

    name: str
    per: str
    against: str
    training: bool
    tolerance: float
    rows: tuple[ConfigCheck, ...]
    smallest_failing: Optional[ConfigCheck]
    seconds: float

    @property
    def exact(self) -> bool:
        return all(row.exact for row in self.rows)

    @property
    def configs_per_s(self) -> float:
        return len(self.rows) / self.seconds if self.seconds > 0 else float("inf")

    def failing(self) -> tuple[ConfigCheck, ...]:
        return tuple(row for row in self.rows if not row.exact)

    def worst(self) -> ConfigCheck:
        """The row whose total error is the largest in size."""
        return max(self.rows, key=lambda row: abs(row.error))

    def table(self) -> str:
        return formula_check_text(self)

    def __str__(self) -> str:
        return self.table()


def check_formula(formula: Formula, configs: Optional[Iterable[Any]] = None, *,
                  model: Optional[Callable[[Any], nn.Module]] = None,
                  inputs: Optional[Callable[..., Mapping[str, Any]]] = None,
                  sweep: Any = None, base: Any = None, examples: int = 50,
                  batch: int = 1, seq: int = 128, training: bool = True, per: str = "token",
                  against: str = "contractions",
                  components: Optional[Mapping[str, Patterns]] = None,
                  tolerance: float = 0.0, name: Optional[str] = None,
                  dtype: torch.dtype = torch.bfloat16) -> FormulaCheck:
    """Check ``formula`` against the counted work of each config (see the module).

    ``configs``: configs to check (a transformers ``PretrainedConfig`` or any object the
    ``model`` factory takes); or ``sweep`` (with ``base``) for hypothesis-drawn ones.
    ``model``: ``config -> nn.Module`` (default: transformers'
    ``AutoModelForCausalLM.from_config``), built under ``torch.device("meta")``.
    ``inputs``: ``(model, config, batch, seq) -> kwargs`` for the call (default: token ids
    ``[batch, seq]``, with labels when ``training``); the step is ``model(**kwargs)`` and,
    when training, ``.loss.backward()`` (or the sum of the first output's).
    ``components``: component name -> module name patterns (default ``DEFAULT_COMPONENTS``
    for the names the formula returns). ``tolerance``: the relative error allowed."""
    if per not in PER:
        raise ValueError(f"per must be one of {PER}, got {per!r}")
    if against not in AGAINST:
        raise ValueError(f"against must be one of {AGAINST}, got {against!r}")
    if (configs is None) == (sweep is None):
        raise ValueError("check_formula: give configs, or sweep= (with base=), not both")
    if sweep is not None and base is None:
        raise ValueError("check_formula: a sweep needs base=, the config its fields vary")
    run = _Runner(formula, model or _causal_lm, inputs or _token_inputs, batch, seq, training,
                  per, against, dict(components) if components is not None else None,
                  tolerance, dtype)
    start = time.perf_counter()
    smallest: Optional[ConfigCheck] = None
    if sweep is not None:
        smallest = _sweep(run, base, sweep, examples)
    else:
        for config in configs:  # type: ignore[union-attr]
            run.check(config, _summary(config))
        smallest = next((row for row in run.rows if not row.exact), None)
    seconds = time.perf_counter() - start
    return FormulaCheck(name or str(getattr(formula, "__name__", "formula")), per, against,
                        training, tolerance, tuple(run.rows), smallest, seconds)


class _Runner:
    """Counts configs and checks the formula on each; a config counted once (by its key)."""

    def __init__(self, formula, model, inputs, batch, seq, training, per, against,
                 components, tolerance, dtype):
        self.formula, self.model, self.inputs = formula, model, inputs
        self.batch, self.seq, self.training, self.per = batch, seq, training, per
        self.against, self.components, self.tolerance = against, components, tolerance
        self.dtype = dtype
        self.rows: list[ConfigCheck] = []
        self._seen: dict[str, ConfigCheck] = {}

    def check(self, config: Any, shown: Mapping[str, Any]) -> ConfigCheck:
        key = repr(sorted(shown.items())) if shown else repr(config)
        if key in self._seen:
            return self._seen[key]
        with torch.device("meta"):
            model = self.model(config)
        if self.dtype is not None:
            model = model.to(self.dtype)
        model.train(self.training)
        figure = _call(self.formula, config, batch=self.batch, seq=self.seq, model=model)
        profile = self._count(model, config)
        tokens = self.batch * self.seq
        scale = tokens if self.per == "token" else 1
        parts = dict(figure) if isinstance(figure, Mapping) else None
        total = sum(parts.values()) * scale if parts is not None else figure * scale
        phases: tuple = (FORWARD, BACKWARD) if self.training else (FORWARD,)
        if self.against == "hardware":
            phases = phases + (RECOMPUTE,)
        model_phases = (FORWARD, BACKWARD) if self.training else (FORWARD,)
        row = ConfigCheck(dict(shown), tokens, _exact(total),
                          _contractions(profile, model_phases), profile.model_flops(),
                          profile.hardware_flops(), self.against,
                          self._components(profile, parts, scale, phases), self.tolerance,
                          _contractions(profile, model_phases + (RECOMPUTE,)))
        self._seen[key] = row
        self.rows.append(row)
        return row

    def _count(self, model: nn.Module, config: Any) -> Profile:
        kwargs = dict(self.inputs(model, config, self.batch, self.seq))
        with FlopCounter(model) as counter:
            if self.training:
                out = model(**kwargs)
                _loss(out).backward()
            else:
                with torch.no_grad():
                    model(**kwargs)
        return counter.to_profile()

    def _components(self, profile: Profile, parts: Optional[dict], scale: int,
                    phases: tuple) -> tuple[ComponentCheck, ...]:
        if parts is None:
            return ()
        patterns = {name: _patterns(self.components, name) for name in parts}
        names = [m for m in profile.module_names() if m]
        matched = {name: _outermost([m for m in names if _matches(m, pats)])
                   for name, pats in patterns.items()}
        per_module = {m: 0 for m in names}
        for phase in phases:
            for m, stats in profile.by_module(phase).items():
                if m in per_module:
                    per_module[m] += stats.flops if self.against == "all_ops" else \
                        2 * stats.macs
        out = []
        claimed = 0
        for name, value in parts.items():
            own = matched[name]
            inner = [m for other, ms in matched.items() if other != name for m in ms
                     if any(m.startswith(o + ".") for o in own)]
            counted = sum(per_module[m] for m in own) - sum(per_module[m] for m in inner)
            claimed += counted
            out.append(ComponentCheck(name, _exact(value * scale), counted, tuple(own)))
        total = sum(profile.by_phase()[p].flops for p in phases) \
            if self.against == "all_ops" else _contractions(profile, phases)
        if total != claimed:
            out.append(ComponentCheck(UNNAMED, None, total - claimed, ()))
        return tuple(out)


def _sweep(run: _Runner, base: Any, sweep: Any, examples: int) -> Optional[ConfigCheck]:
    """Hypothesis draws configs (``base`` with the drawn fields) until one fails, then
    shrinks it; the smallest failing one's check, or None when every draw passed."""
    try:
        from hypothesis import HealthCheck, Phase, find, settings
        from hypothesis import strategies as st
        from hypothesis.errors import NoSuchExample
    except ImportError as e:  # pragma: no cover (a test dependency)
        raise ImportError("check_formula(sweep=...) draws configs with hypothesis: pip "
                          "install hypothesis") from e
    if isinstance(sweep, Mapping):
        sweep = st.fixed_dictionaries({k: v if isinstance(v, st.SearchStrategy) else
                                       st.sampled_from(list(v)) for k, v in sweep.items()})

    def fails(fields: Mapping[str, Any]) -> bool:
        config = _with_fields(base, fields)
        try:
            row = run.check(config, fields)
        except (ValueError, AssertionError, RuntimeError, TypeError, ZeroDivisionError):
            return False  # a config the model refuses (heads not dividing the width...)
        return not row.exact

    try:
        fields = find(sweep, fails, settings=settings(
            max_examples=examples, database=None, deadline=None,
            phases=[Phase.generate, Phase.shrink],
            suppress_health_check=list(HealthCheck)))
    except NoSuchExample:
        return None
    return run.check(_with_fields(base, fields), fields)


def _causal_lm(config: Any) -> nn.Module:
    import transformers

    return transformers.AutoModelForCausalLM.from_config(config)


def _token_inputs(model: nn.Module, config: Any, batch: int, seq: int) -> dict:
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    return {"input_ids": ids, "labels": ids} if model.training else {"input_ids": ids}


def _loss(out: Any) -> torch.Tensor:
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    first = out[0] if isinstance(out, (tuple, list)) else out
    return first.float().sum()


def _call(formula: Formula, config: Any, **available: Any):
    """The formula called with the config and the keywords it names."""
    try:
        params = inspect.signature(formula).parameters
    except (TypeError, ValueError):
        return formula(config)
    if any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return formula(config, **available)
    return formula(config, **{k: v for k, v in available.items() if k in params})


def _contractions(profile: Profile, phases: tuple) -> int:
    by_phase = profile.by_phase()
    return sum(2 * by_phase[p].macs for p in phases)


def _patterns(components: Optional[dict], name: str) -> tuple[str, ...]:
    table = components if components is not None else DEFAULT_COMPONENTS
    if name not in table:
        known = ", ".join(sorted(table))
        raise ValueError(f"check_formula: the formula returns a component {name!r} with no "
                         f"modules named for it; pass components={{{name!r}: '*.pattern'}} "
                         f"(known: {known})")
    pats = table[name]
    return (pats,) if isinstance(pats, str) else tuple(pats)


def _matches(module: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatchcase(module, p) for p in patterns)


def _outermost(modules: list[str]) -> list[str]:
    """The matched modules not nested in another matched one."""
    return [m for m in modules if not any(m.startswith(o + ".") for o in modules if o != m)]


def _with_fields(base: Any, fields: Mapping[str, Any]) -> Any:
    config = copy.deepcopy(base)
    for key, value in fields.items():
        setattr(config, key, value)
    return config


def _summary(config: Any) -> dict[str, Any]:
    """What a row shows of a config: its class and the fields that shape the work."""
    keys = ("model_type", "num_hidden_layers", "hidden_size", "intermediate_size",
            "num_attention_heads", "num_key_value_heads", "num_local_experts",
            "num_experts", "num_experts_per_tok", "vocab_size", "n_layer", "n_embd")
    out = {k: getattr(config, k) for k in keys if isinstance(getattr(config, k, None),
                                                            (int, str))}
    return out or {"config": repr(config)}


def _exact(x: Any) -> Number:
    """An integral figure as an int (formulas with divisions give Fractions or floats)."""
    if isinstance(x, Fraction) and x.denominator == 1:
        return int(x)
    if isinstance(x, float) and x.is_integer():
        return int(x)
    return x
