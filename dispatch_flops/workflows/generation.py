"""LLM inference: a ``generate()`` (or any decoding loop) cut into its forward calls.

A *step* is one call of the model's forward that is not inside another: the first is the
prefill (the prompt), every later one a decode step (one new token per sequence; per beam
step for beam search). One counter runs for the whole generation; a snapshot of its counts
(``FlopCounter.to_profile()`` inside the block) is taken as each step begins and ends, and a
step's Profile is the difference (``results.combine.since``). An encoder-decoder model's encoder,
called by ``generate`` before the first step, is its own part (``encoder``); what runs between
steps (sampling, logits processors, stopping criteria) is ``outside``.

After each step the KV cache the step returned (``past_key_values``) is read: the bytes of
its key and value tensors (``kv_cache_bytes``), and of the positions filled so far
(``kv_cache_filled_bytes``: a StaticCache holds its whole length from the start).

>>> gp = profile_generate(model, input_ids, max_new_tokens=16)
>>> gp.prefill.total.flops, [s.macs for s in gp.per_token()]
>>> print(gp.table()); gp.roofline(DEVICES["H100-SXM"]).tokens_per_s
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from statistics import mean
from typing import Callable, Optional

from torch import Tensor, nn

from dispatch_flops.counter import FlopCounter
from dispatch_flops.results.combine import since
from dispatch_flops.results.format import duration, human
from dispatch_flops.results.profile import Profile
from dispatch_flops.results.roofline import (
    COMPUTE_BOUND,
    DEVICES,
    MEMORY_BOUND,
    DeviceSpec,
    Roofline,
    device_spec,
)
from dispatch_flops.views.text import generation_roofline_table, generation_table
from dispatch_flops.workflows.parts import PartCutter

ENCODER, PREFILL, DECODE = "encoder", "prefill", "decode"
# a step's new positions: the first of these its call was given (args[0] otherwise)
_STEP_INPUTS = ("decoder_input_ids", "decoder_inputs_embeds", "input_ids", "inputs_embeds")


@dataclass(frozen=True)
class StepCost:
    """One forward call of a generation: what it counted, for all its sequences together.
    ``positions``: the tokens in the cache after it, the key length its self-attention ran
    over with a dynamic cache (a static cache's attention runs over its whole length, and
    ``kv_cache_bytes`` is then the whole cache); ``latency_s``: the measured time of the
    call (timing on)."""

    step: int  # 0: the prefill
    phase: str  # PREFILL or DECODE
    sequences: int  # batch (x beams): one new token each
    new_positions: int  # query tokens per sequence: the prompt's length, then 1
    positions: int  # tokens in the cache after the step
    flops: int
    macs: int
    bytes_read: int
    bytes_written: int
    kv_cache_bytes: Optional[int]
    latency_s: Optional[float]

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    @property
    def arithmetic_intensity(self) -> Optional[float]:
        """Flops per byte moved; ``None`` when nothing moved."""
        return self.flops / self.bytes if self.bytes else None


@dataclass(frozen=True, repr=False)
class GenerationRoofline:
    """A generation against one device's roofs. ``steps`` are per forward call (prefill
    first): each a ``Roofline`` whose ``attainable_s`` is the sum of its ops' own
    ``max(flops / peak, bytes / bandwidth)`` (between the larger of the step's flops / peak
    and bytes / bandwidth and their sum), ``compute_s`` and ``memory_s`` the time of the ops
    on each roof (they sum to ``attainable_s``; see ``ops_roofline``). Per-token figures
    are per decode step, which gives every sequence one token. ``measured_*`` are ``None``
    unless timing was on.

    >>> roof = gp.roofline("H100-SXM")
    >>> roof                    # one line: first token, per decode step, tokens/s, bounds
    >>> print(roof.table())     # a row per step
    """

    device: str
    steps: tuple  # Roofline per step
    time_to_first_token_s: float  # encoder + prefill, attainable
    decode_s_per_step: float  # mean attainable time of a decode step
    tokens_per_s: float  # sequences / decode_s_per_step
    prefill_bound: str
    decode_bound: str  # the bound most decode steps hit
    measured_time_to_first_token_s: Optional[float]
    measured_decode_s_per_step: Optional[float]
    measured_tokens_per_s: Optional[float]

    def __repr__(self) -> str:
        measured = ""
        if self.measured_tokens_per_s is not None:
            measured = f"; measured {self.measured_tokens_per_s:,.1f} tokens/s"
        return (f"GenerationRoofline({self.device}: first token "
                f"{duration(self.time_to_first_token_s)} ({self.prefill_bound}), decode "
                f"{duration(self.decode_s_per_step)} per step ({self.decode_bound or '-'}), "
                f"{self.tokens_per_s:,.1f} tokens/s attainable{measured}; "
                f"{len(self.steps)} steps)")

    def table(self, width: Optional[int] = None) -> str:
        """A row per step (prefill, then each decode step): flops per byte, the compute,
        memory and attainable times, the bound and (timing on) the measured time and the
        attainable / measured ratio; within ``width`` (the terminal's: ``COLUMNS``)."""
        return generation_roofline_table(self, width)

    def __str__(self) -> str:
        return self.table()


def resolve_device(device) -> DeviceSpec:
    """``device`` itself (a ``DeviceSpec``) or the built-in one of that name in ``DEVICES``."""
    if isinstance(device, str):
        if device not in DEVICES:
            raise ValueError(f"unknown device {device!r}; built in: {sorted(DEVICES)} "
                             "(or pass a DeviceSpec)")
        device = DEVICES[device]
    if not isinstance(device, DeviceSpec):
        raise TypeError(f"device must be a DeviceSpec or one of {sorted(DEVICES)}, got "
                        f"{type(device).__name__}")
    return device


def ops_roofline(p: Profile, peak: float, bandwidth: float) -> Roofline:
    """A part of a run (a step) against a roof of ``peak`` flop/s and ``bandwidth`` B/s:
    ``attainable_s`` the sum of its ops' own ``max(flops / peak, bytes / bandwidth)``,
    ``compute_s`` / ``memory_s`` the time of the ops on each roof (they sum to
    ``attainable_s``), bound by the larger: a row's bound follows its own times."""
    # kernels run one after another, each on its own roof: a step's time is the sum of its
    # ops' (one record per module and operator), not one roof for the step's totals, where
    # a matmul's compute would hide a norm's memory traffic
    compute_bound = memory_bound = 0.0  # time of the ops on each roof
    for record in p.records():
        stats = record.stats
        flops_s, bytes_s = stats.flops / peak, stats.bytes / bandwidth
        if flops_s >= bytes_s:
            compute_bound += flops_s
        else:
            memory_bound += bytes_s
    attainable = compute_bound + memory_bound
    return Roofline(
        arithmetic_intensity=p.total.arithmetic_intensity, attainable_s=attainable,
        bound=COMPUTE_BOUND if compute_bound >= memory_bound else MEMORY_BOUND,
        efficiency=attainable / p.wall_s if p.wall_s and attainable else None,
        compute_s=compute_bound, memory_s=memory_bound, comm_s=0.0)


def _cache_layers(cache):
    """``(keys, values, self_attention)`` of each layer of a transformers cache (a Cache
    with ``layers``, an EncoderDecoderCache, or the legacy tuple of ``(k, v)`` pairs)."""
    if cache is None:
        return
    inner = getattr(cache, "self_attention_cache", None)
    if inner is not None:
        yield from _cache_layers(inner)
        for k, v, _ in _cache_layers(getattr(cache, "cross_attention_cache", None)):
            yield k, v, False
        return
    layers = getattr(cache, "layers", None)
    if layers is not None:
        for layer in layers:
            keys, values = getattr(layer, "keys", None), getattr(layer, "values", None)
            if isinstance(keys, Tensor) and isinstance(values, Tensor):
                yield keys, values, True
        return
    if isinstance(cache, (tuple, list)):
        for layer in cache:
            if isinstance(layer, (tuple, list)) and len(layer) >= 2 and all(
                    isinstance(t, Tensor) for t in layer[:2]):
                yield layer[0], layer[1], True
            if isinstance(layer, (tuple, list)) and len(layer) == 4:  # legacy cross k, v
                yield layer[2], layer[3], False


def cache_bytes(cache, positions: int) -> tuple[Optional[int], Optional[int]]:
    """(held, filled) bytes of a KV cache's tensors after ``positions`` tokens: a
    self-attention layer of length L holds L positions and has ``min(positions, L)`` filled
    (a StaticCache allocates its whole length); cross-attention is filled whole."""
    held = filled = 0
    found = False
    for keys, values, self_attention in _cache_layers(cache):
        found = True
        for t in (keys, values):
            n = t.numel() * t.element_size()
            held += n
            length = t.shape[-2] if t.dim() >= 2 else 0
            filled += n * min(positions, length) // length if self_attention and length \
                else n
    return (held, filled) if found else (None, None)


def _step_input(args, kwargs) -> Optional[Tensor]:
    for name in _STEP_INPUTS:
        value = kwargs.get(name)
        if isinstance(value, Tensor):
            return value
    return args[0] if args and isinstance(args[0], Tensor) else None


# the names a step's KV cache goes by: ``cache`` in current transformers (which warn on a
# read of the old name), ``past_key_values`` before
_CACHE_NAMES = ("cache", "past_key_values")


def _cache_of(output, kwargs):
    """The KV cache a step returned (or, failing that, was given), read under its current
    name first: reading ``past_key_values`` where ``cache`` exists prints transformers'
    deprecation warning, which a user did not ask for."""
    if isinstance(output, Mapping):  # a ModelOutput: its keys are the fields that are set
        present = list(output.keys())
        for name in _CACHE_NAMES:
            if name in present:
                return output[name]
    else:
        for name in _CACHE_NAMES:
            if name in getattr(type(output), "__dataclass_fields__", {}) or \
                    name in getattr(output, "__dict__", {}):
                cache = getattr(output, name)
                if cache is not None:
                    return cache
    for name in _CACHE_NAMES:
        if kwargs.get(name) is not None:
            return kwargs[name]
    return None


class _Steps(PartCutter):
    """Hooks that cut a counted run at the model's outermost forward calls (and, for an
    encoder-decoder model, its encoder's calls made outside them)."""

    def __init__(self, model: nn.Module, counter: FlopCounter, encoder: Optional[nn.Module],
                 timing: bool):
        super().__init__(counter, timing, any(p.is_cuda for p in model.parameters()))
        self.model, self.encoder = model, encoder
        self.running: Optional[str] = None
        self.before: Optional[tuple] = None  # (snapshot, start ns)
        self.parts: list = []  # (ENCODER | "step", Profile, facts dict)
        self.positions = 0
        self.handles: list = []

    def attach(self) -> None:
        # the snapshot is taken before the counter notes the call: the step counts its own
        self.hook(self._pre)
        self.handles.append(self.model.register_forward_hook(
            self._post_model, with_kwargs=True, always_call=True))
        if self.encoder is not None:
            self.handles.append(self.encoder.register_forward_hook(
                self._post_encoder, always_call=True))

    def detach(self) -> None:
        self.unhook()
        for handle in self.handles:
            handle.remove()
        self.handles.clear()

    def _pre(self, module, args) -> None:
        kind = "step" if module is self.model else ENCODER if module is self.encoder else None
        if kind is None or not self.counter.counting:
            return
        # the encoder's calls inside a step are the step's
        if (self.depth == 0 or kind == "step" or self.running == ENCODER) and self.enter():
            self.running = kind
            self.before = self.begin()

    def _end(self, kind: str, facts: dict) -> None:
        if not self.leave() or self.running != kind or self.before is None:
            return
        after, end = self.end()
        earlier, start = self.before
        part = since(after, earlier)
        if self.timing:
            part = part.replace(run=replace(part.run, wall_s=(end - start) / 1e9))
        self.parts.append((kind, part, facts))
        self.running = self.before = None

    def _post_model(self, module, args, kwargs, output) -> None:
        if self.running != "step" or not self.counter.counting:
            return
        facts = {}
        if self.depth == 1:
            x = _step_input(args, kwargs)
            new = x.shape[1] if x is not None and x.dim() >= 2 else 1
            self.positions += new
            held, filled = cache_bytes(_cache_of(output, kwargs), self.positions)
            facts = dict(sequences=x.shape[0] if x is not None and x.dim() else 1,
                         new_positions=new, positions=self.positions,
                         kv_cache_bytes=held, kv_cache_filled_bytes=filled)
        self._end("step", facts)

    def _post_encoder(self, module, args, output) -> None:
        if self.running == ENCODER and self.counter.counting:
            self._end(ENCODER, {})


def profile_generate(model: nn.Module, inputs=None, *, fn: Optional[Callable] = None,
                     timing: bool = False, attention: str = "dense",
                     **generate_kwargs) -> "GenerationProfile":
    """Count a generation step by step: ``model.generate(inputs, **generate_kwargs)``
    (transformers; ``inputs`` a tensor of token ids or a mapping such as a tokenizer's
    output), or ``fn(inputs, **generate_kwargs)``, any decoding loop that calls ``model``
    once per step (the way to count on the meta device, where ``generate`` cannot run).

    >>> gp = profile_generate(model, ids, max_new_tokens=8, do_sample=False)
    >>> gp.prefill.total.macs, gp.decode[-1].total.macs, gp.kv_cache_bytes[-1]
    >>> print(gp.table())

    ``timing=True`` measures each step's time (a CUDA synchronize around each call on a
    GPU, CUDA events per op: the steps are read inside the block, where kernel times are
    not in yet); ``attention`` as ``FlopCounter``'s.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if fn is None:
        call = getattr(model, "generate", None)
        if not callable(call):
            raise ValueError(f"{type(model).__name__} has no generate(): pass a transformers "
                             "generation model, or fn=... a decoding loop that calls the model")
    elif not callable(fn):
        raise TypeError(f"fn must be callable (a decoding loop), got {type(fn).__name__}")
    else:
        call = fn
    encoder = None
    if getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        get_encoder = getattr(model, "get_encoder", None)
        encoder = get_encoder() if callable(get_encoder) else None
    # each step is read inside the block: events, whose times are there as soon as synchronized
    counter = FlopCounter(model, timing="events" if timing else False, attention=attention)
    steps = _Steps(model, counter, encoder, timing)
    steps.attach()
    try:
        with counter:
            if isinstance(inputs, Mapping):
                output = call(**inputs, **generate_kwargs)
            elif inputs is None:
                output = call(**generate_kwargs)
            else:
                output = call(inputs, **generate_kwargs)
    finally:
        steps.detach()
    del output
    return GenerationProfile._of(counter.to_profile(), steps.parts)


class GenerationProfile:
    """A generation's counts cut at the model's forward calls (see ``profile_generate``).

    >>> gp = profile_generate(model, ids, max_new_tokens=8)
    >>> gp.prefill, gp.decode[0], gp.kv_cache_bytes, gp.per_token(), print(gp.table())

    ``prefill``: the Profile of the first forward call; ``decode``: one per later call;
    ``encoder``: an encoder-decoder model's encoder, run once before them (else ``None``);
    ``outside``: ops run between the calls (sampling, logits processors, stopping);
    ``total``: all of it. ``kv_cache_bytes`` and ``kv_cache_filled_bytes``: after each call,
    prefill first (``None`` where the call returned no cache).
    """

    def __init__(self, total: Profile, encoder: Optional[Profile], steps: tuple,
                 facts: tuple, outside: Profile):
        if not steps:
            raise ValueError("the model's forward was never called: nothing to cut into "
                             "steps (does fn call the model?)")
        self.total = total
        self.encoder = encoder
        self.prefill = steps[0]
        self.decode = tuple(steps[1:])
        self.outside = outside
        self._facts = facts
        self.kv_cache_bytes = tuple(f["kv_cache_bytes"] for f in facts)
        self.kv_cache_filled_bytes = tuple(f["kv_cache_filled_bytes"] for f in facts)

    @classmethod
    def _of(cls, total: Profile, parts: list) -> "GenerationProfile":
        encoders = [p for kind, p, _ in parts if kind == ENCODER]
        steps = [(p, f) for kind, p, f in parts if kind != ENCODER]
        encoder = Profile.merge(encoders) if encoders else None
        outside = total
        for _, p, _ in parts:
            outside = since(outside, p)
        outside = outside.replace(module_facts=replace(outside.module_facts, calls={}, spans={}),
                                  run=replace(outside.run, wall_s=None))
        return cls(total, encoder, tuple(p for p, _ in steps), tuple(f for _, f in steps),
                   outside)

    @property
    def steps(self) -> tuple:
        """Every forward call's Profile: the prefill, then the decode steps."""
        return (self.prefill,) + self.decode

    @property
    def timing(self) -> bool:
        return self.total.timing

    def per_token(self) -> list[StepCost]:
        """Flops, MACs and bytes of every forward call (each gives every sequence one new
        token), with its key length and the KV cache after it, prefill first."""
        out = []
        for i, (p, f) in enumerate(zip(self.steps, self._facts)):
            t = p.total
            out.append(StepCost(
                step=i, phase=PREFILL if i == 0 else DECODE, sequences=f["sequences"],
                new_positions=f["new_positions"], positions=f["positions"], flops=t.flops,
                macs=t.macs, bytes_read=t.bytes_read, bytes_written=t.bytes_written,
                kv_cache_bytes=f["kv_cache_bytes"], latency_s=p.wall_s))
        return out

    def roofline(self, device=None, dtype=None) -> GenerationRoofline:
        """Each step against ``device``'s roofs (a ``DeviceSpec``, or the name of a built-in
        one in ``DEVICES``; None: the current GPU's built-in spec) at ``dtype`` (the model's
        parameter dtype when None): time to first token, time per decode step and tokens/s,
        attainable and (timing on) measured. A step's attainable time is the sum of its ops'
        ``max(flops / peak, bytes / bandwidth)``: its ``compute_s`` is the time of the ops on
        the compute roof, its ``memory_s`` that of the ops on the memory roof (the two sum to
        ``attainable_s``), and it is bound by the larger."""
        if device is None:
            device = device_spec()
            if device is None:
                raise ValueError("no built-in spec for this device (no GPU, or one not in "
                                 f"DEVICES: {sorted(DEVICES)}): pass device= a DeviceSpec "
                                 "or a built-in name")
        device = resolve_device(device)
        dtype = dtype or self.total.dtype
        peak, bandwidth = device.peak_flops(dtype), device.memory_bandwidth

        def place(p: Profile) -> Roofline:
            return ops_roofline(p, peak, bandwidth)

        steps = tuple(place(p) for p in self.steps)
        first = steps[0].attainable_s + (place(self.encoder).attainable_s
                                         if self.encoder is not None else 0.0)
        decode = steps[1:]
        sequences = self._facts[-1]["sequences"]
        per_step = mean(r.attainable_s for r in decode) if decode else float("nan")
        bounds = [r.bound for r in decode]
        measured_first = measured_step = None
        if self.timing:
            measured_first = self.prefill.wall_s + (self.encoder.wall_s or 0.0
                                                    if self.encoder is not None else 0.0)
            measured_step = mean(p.wall_s for p in self.decode) if self.decode else None
        return GenerationRoofline(
            device=device.name, steps=steps, time_to_first_token_s=first,
            decode_s_per_step=per_step,
            tokens_per_s=sequences / per_step if decode and per_step else float("nan"),
            prefill_bound=steps[0].bound,
            decode_bound=max(set(bounds), key=bounds.count) if bounds else "",
            measured_time_to_first_token_s=measured_first,
            measured_decode_s_per_step=measured_step,
            measured_tokens_per_s=sequences / measured_step if measured_step else None)

    def table(self, width: Optional[int] = None) -> str:
        """Prefill, the first, mean and last decode step, and how much a decode step grows per
        token; the encoder and the work outside the model's calls when there is any; under
        it, what the steps were in ``generate``'s words (``max_new_tokens=8``: the prefill
        and 7 decode steps); within ``width`` (the terminal's: ``COLUMNS``)."""
        return generation_table(self, width)

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        return (f"GenerationProfile({self.total.root_label}, prefill + {len(self.decode)} "
                f"decode steps = {len(self.steps)} new tokens per sequence, "
                f"{human(self.total.total.flops, 'FLOPs')})")
