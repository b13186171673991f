"""Diffusion pipelines cut into what they run: each component (text encoders, the denoiser,
the VAE's encode and decode, a safety checker, ...) and each denoising step.

One counter runs for the whole pipeline call, its model a ``ModuleDict`` of the pipeline's
modules (so rows read ``unet.down_blocks.0...``). As in ``profile_generate``, a snapshot of its
counts is taken as each part begins and ends, and a part's Profile is the difference
(``results.combine.since``). The parts:

- a component's outermost call: any call of one of its modules made while no other part
  runs (``pipe.text_encoder(ids)``, ``pipe.unet(...)``), and, for a VAE, its ``encode`` and
  ``decode`` methods (``vae.encode``, ``vae.decode``: the pipeline calls them, not the VAE's
  forward);
- a denoising step: from its first call of a denoiser (``unet``, ``transformer``,
  ``prior``, their ``_2`` twins) or a ``controlnet`` to the end of ``scheduler.step``: the
  denoiser's passes, the guidance that combines them, the scheduler's update. A loop with no
  ``scheduler.step`` has its steps cut where the timestep the denoiser is given changes.

Classifier-free guidance shows in each step's passes: one pass over a batch of twice the
images (``BATCHED``: Stable Diffusion, PixArt, DiT), two passes (``SEPARATE``), or one pass
over the images (``NONE``: guidance off, or distilled into the model as in Flux).

>>> pp = profile_pipeline(pipe, "a cat", num_inference_steps=4)
>>> pp.components["unet"].total.flops, pp.steps[0].total.flops, pp.per_image().flops
>>> print(pp.table()); pp.roofline("H100-SXM").image_s
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from statistics import mean
from typing import Any, Callable, Optional

from torch import Tensor, nn

from dispatch_flops.counter import FlopCounter
from dispatch_flops.results import schema
from dispatch_flops.results.combine import since
from dispatch_flops.results.format import duration
from dispatch_flops.results.profile import Profile
from dispatch_flops.results.roofline import Roofline
from dispatch_flops.results.stats import Stats, StringEnum
from dispatch_flops.views.text import pipeline_roofline_table, pipeline_table
from dispatch_flops.workflows.generation import ops_roofline, resolve_device
from dispatch_flops.workflows.parts import PartCutter


class Guidance(StringEnum):
    """How a denoising step ran classifier-free guidance: ``BATCHED``, one denoiser pass over
    the conditional and unconditional halves together (a batch of twice the images);
    ``SEPARATE``, two or more passes; ``NONE``, one pass over the images (guidance off, or
    distilled into the model)."""

    NONE = "none"
    BATCHED = "batched"
    SEPARATE = "separate"


NONE, BATCHED, SEPARATE = Guidance.NONE, Guidance.BATCHED, Guidance.SEPARATE
_DENOISERS = ("unet", "transformer", "prior")  # component names that denoise (and name_2 ...)
_PER_STEP = _DENOISERS + ("controlnet",)  # called once or more in every step
_VAE_METHODS = ("encode", "decode")  # a VAE's entry points: pipelines call them, not forward
_SAMPLE = ("sample", "hidden_states", "x")  # a denoiser's latent input, when passed by name
_FORMAT = "dispatch_flops.pipeline/1"  # to_dict's format
_EXTRA = "pip install diffusers (from a clone: pip install -e '.[diffusers]')"


def _named(name: str, kinds: tuple) -> bool:
    return any(name == k or name.startswith(k + "_") for k in kinds)


def _components(pipe: Any) -> dict[str, nn.Module]:
    """The pipeline's modules by attribute name: a diffusers pipeline's registered components
    (its ``config`` keys), a module's children, or any object's module attributes."""
    if isinstance(pipe, nn.Module):
        return dict(pipe.named_children())
    config = getattr(pipe, "config", None)
    names = [k for k in config.keys() if not k.startswith("_")] if isinstance(
        config, Mapping) else list(vars(pipe))
    found = {}
    for name in names:
        value = getattr(pipe, name, None)
        if isinstance(value, nn.Module):
            found[name] = value
    return found


def _batch(t: Any) -> Optional[int]:
    return t.shape[0] if isinstance(t, Tensor) and t.dim() else None


def _value(t: Any) -> Any:
    """A timestep's value (a float), or, where it cannot be read (meta), the object itself:
    a custom loop passes one ``t`` to the passes of a step."""
    if isinstance(t, Tensor):
        if t.is_meta or t.numel() == 0:
            return t
        return float(t.reshape(-1)[0])
    return float(t) if isinstance(t, (int, float)) else t


@dataclass
class _Span:
    kind: str  # "component" or "scheduler"
    name: str
    before: Profile
    start_ns: int
    after: Optional[Profile] = None
    end_ns: int = 0
    batch: Optional[int] = None
    timestep: Any = None

    def profile(self, timing: bool) -> Profile:
        assert self.after is not None
        return _timed(since(self.after, self.before), self.start_ns, self.end_ns, timing)


def _timed(p: Profile, start: int, end: int, timing: bool) -> Profile:
    return p.replace(run=replace(p.run, wall_s=(end - start) / 1e9)) if timing else p


class _Spans(PartCutter):
    """Hooks and method wrappers that cut a counted pipeline call into parts (see the
    module's docstring); every part is the outermost one running."""

    def __init__(self, counter: FlopCounter, components: dict, scheduler: Any, timing: bool):
        super().__init__(counter, timing, timing and any(
            p.is_cuda for m in components.values() for p in m.parameters()))
        self.owner: dict[int, str] = {}
        for name, module in components.items():
            for sub in module.modules():
                self.owner.setdefault(id(sub), name)
        self.components, self.scheduler = components, scheduler
        self.running: Optional[_Span] = None
        self.spans: list[_Span] = []
        self.handles: list = []
        self.wrapped: list = []  # (object, attribute, instance value before or None)

    def attach(self) -> None:
        # a part's snapshot is taken before the counter notes the call (the part counts its
        # own call), and after it notes the call's end
        self.hook(self._pre, self._post)
        for name, module in self.components.items():
            if _named(name, _DENOISERS):
                # a module's pre-hooks run after the global ones: the pass is open by then
                self.handles.append(module.register_forward_pre_hook(
                    self._pass_facts, with_kwargs=True))
            if "vae" in name or type(module).__name__.startswith(("Autoencoder", "VQModel")):
                for method in _VAE_METHODS:
                    self._wrap(module, method, "component", f"{name}.{method}")
        if self.scheduler is not None:
            self._wrap(self.scheduler, "step", "scheduler", "scheduler")

    def detach(self) -> None:
        # every step runs whatever an earlier one raised (an interrupt in a hook's removal
        # leaves no wrapper on scheduler.step or vae.decode behind)
        try:
            self.unhook()
        finally:
            try:
                # found by the hook itself, not a handle: one registered as an interrupt
                # landed, before its handle was kept, goes too
                for module in self.components.values():
                    for key, hook in list(module._forward_pre_hooks.items()):
                        if hook == self._pass_facts:
                            module._forward_pre_hooks.pop(key, None)
                            module._forward_pre_hooks_with_kwargs.pop(key, None)
                self.handles.clear()
            finally:
                while self.wrapped:
                    obj, attribute, before = self.wrapped.pop()
                    if before is None:
                        obj.__dict__.pop(attribute, None)
                    else:
                        obj.__dict__[attribute] = before

    def _wrap(self, obj: Any, attribute: str, kind: str, name: str) -> None:
        method = getattr(obj, attribute, None)
        if not callable(method):
            return
        spans = self

        @functools.wraps(method)  # keeps the signature pipelines inspect (scheduler.step's eta)
        def wrapper(*args, **kwargs):
            span = spans._open(kind, name)
            if span is not None and kind == "scheduler":
                span.timestep = kwargs.get("timestep", args[1] if len(args) > 1 else None)
                span.batch = _batch(kwargs.get("sample", args[2] if len(args) > 2 else None))
            try:
                return method(*args, **kwargs)
            finally:
                spans._close()

        self.wrapped.append((obj, attribute, vars(obj).get(attribute)))
        obj.__dict__[attribute] = wrapper

    def _open(self, kind: str, name: str) -> Optional[_Span]:
        if not self.counter.counting or not self.enter():
            return None
        self.running = _Span(kind, name, *self.begin())
        return self.running

    def _close(self) -> None:
        span = self.running
        if not self.leave() or span is None:
            return
        span.after, span.end_ns = self.end()
        self.spans.append(span)
        self.running = None

    def _pre(self, module, args) -> None:
        name = self.owner.get(id(module))
        if name is not None:
            self._open("component", name)

    def _post(self, module, args, output) -> None:
        if id(module) in self.owner:
            self._close()

    def _pass_facts(self, module, args, kwargs) -> None:
        span = self.running
        if span is None or self.depth != 1 or span.kind != "component":
            return
        sample = next((kwargs[k] for k in _SAMPLE if k in kwargs), args[0] if args else None)
        span.batch = _batch(sample)
        # read once the run is over: reading a tensor's value here would count its ops
        span.timestep = kwargs.get("timestep", args[1] if len(args) > 1 else None)


@dataclass(frozen=True)
class DenoisingStep:
    """One denoising step: its Profile (``profile``: the passes, the guidance that combines
    them, the scheduler's update), each denoiser call's (``passes``, with its component in
    ``denoisers`` and its latent batch in ``batches``) and ``scheduler.step``'s
    (``scheduler``; ``None`` in a loop without one). ``timestep``: the scheduler's (or the
    denoiser's) timestep, ``None`` where it cannot be read (meta tensors). ``guidance``:
    ``BATCHED`` (one pass over both halves), ``SEPARATE`` (two passes) or ``NONE``.
    ``evaluations``: the evaluations of the denoiser the step is made of: a step is the
    scheduler's (its ``order``, its ``timesteps``), not a ``scheduler.step`` call — Heun's
    runs two (``scheduler.order`` 2), its last one; a first-order or multistep solver's one."""

    step: int
    timestep: Optional[float]
    profile: Profile
    passes: tuple
    denoisers: tuple
    batches: tuple
    scheduler: Optional[Profile]
    guidance: Guidance
    evaluations: int = 1  # the denoiser's evaluations (scheduler.step calls): 2 in Heun's

    @property
    def total(self) -> Stats:
        return self.profile.total

    @property
    def denoiser(self) -> Stats:
        """The denoiser's passes together."""
        out = Stats()
        for p in self.passes:
            out = out + p.total
        return out


@dataclass(frozen=True)
class Average:
    """Counts averaged over the images made (``per_image``) or the steps (``per_step``)."""

    flops: float
    macs: float
    bytes_read: float
    bytes_written: float
    latency_s: Optional[float]

    @property
    def bytes(self) -> float:
        return self.bytes_read + self.bytes_written

    @classmethod
    def of(cls, stats: Stats, n: int) -> "Average":
        return cls(stats.flops / n, stats.macs / n, stats.bytes_read / n,
                   stats.bytes_written / n, None if stats.latency_s is None
                   else stats.latency_s / n)


def profile_pipeline(pipe: Any, *args, fn: Optional[Callable] = None,
                     timing: bool = False, **call_kwargs) -> "PipelineProfile":
    """Count a diffusion pipeline's call, ``pipe(*args, **call_kwargs)`` (diffusers), or
    ``fn(*args, **call_kwargs)``, any loop that calls the pipeline's denoiser once or more per
    step (the way to count on the meta device, where a pipeline's image post-processing
    cannot run), cut into components and denoising steps (see the module's docstring).

    >>> pp = profile_pipeline(pipe, "a cat", num_inference_steps=4, guidance_scale=7.5)
    >>> pp.components, pp.steps, pp.total, pp.per_image(), print(pp.table())

    ``pipe``: a diffusers pipeline, or any object whose attributes are its modules (the
    denoiser named ``unet``, ``transformer`` or ``prior``; a ``scheduler`` whose ``step``
    ends a denoising step). ``timing=True`` measures each part (a CUDA synchronize around each
    on a GPU, CUDA events per op: the parts are read inside the block).
    """
    if not isinstance(timing, bool):  # FlopCounter's "kernels" / "events" are not parts' timers
        raise ValueError(f"timing must be True or False (True: each part timed), got "
                         f"{timing!r}")
    components = _components(pipe)
    denoisers = [n for n in components if _named(n, _DENOISERS)]
    if not denoisers:
        raise ValueError(
            f"{type(pipe).__name__} has no denoiser: profile_pipeline needs a diffusion "
            f"pipeline whose denoiser is a module named one of {list(_DENOISERS)} (found "
            f"modules: {sorted(components)}); diffusers pipelines: {_EXTRA}")
    if fn is None:
        if not callable(pipe):
            raise TypeError(f"{type(pipe).__name__} is not callable: pass fn=..., a loop "
                            "that calls the pipeline's denoiser")
        call = pipe
    elif not callable(fn):
        raise TypeError(f"fn must be callable (a denoising loop), got {type(fn).__name__}")
    else:
        call = fn
    scheduler = getattr(pipe, "scheduler", None)
    # each part is read inside the block: events, whose times are there once synchronized
    counter = FlopCounter(nn.ModuleDict(components), timing="events" if timing else False)
    spans = _Spans(counter, components, scheduler, timing)
    try:  # attached inside: a part that cannot be hooked (a scripted denoiser) leaves nothing
        spans.attach()
        with counter:
            output = call(*args, **call_kwargs)
    finally:
        spans.detach()
    return PipelineProfile._of(counter.to_profile(), spans.spans, _images(output), timing,
                               _scheduler_steps(scheduler))


def _scheduler_steps(scheduler: Any) -> Optional[tuple]:
    """Where the scheduler's steps end among its ``step`` calls, as diffusers' loops count
    them (their progress bar): after call ``i`` (0-based) when ``i`` is the last timestep's,
    or ``i + 1`` is past the warm-up and a multiple of ``scheduler.order``; None for a
    first-order scheduler (each call a step) or one whose schedule cannot be read."""
    order = getattr(scheduler, "order", 1)
    timesteps = getattr(scheduler, "timesteps", None)
    steps = getattr(scheduler, "num_inference_steps", None)
    if not isinstance(order, int) or order <= 1 or timesteps is None or \
            not isinstance(steps, int) or steps <= 0:
        return None
    try:
        length = len(timesteps)
    except TypeError:
        return None
    warmup = length - steps * order
    return tuple(i for i in range(length)
                 if i == length - 1 or (i + 1 > warmup and (i + 1) % order == 0))


def _images(output: Any) -> Optional[int]:
    """How many images (or videos) a pipeline returned: its output's ``images`` or
    ``frames``, or the first item of a tuple."""
    for name in ("images", "frames", "videos", "audios"):
        value = getattr(output, name, None)
        if value is not None:
            output = value
            break
    else:
        if isinstance(output, tuple) and output:
            output = output[0]
    if isinstance(output, Tensor) and output.dim():
        return output.shape[0]
    shape = getattr(output, "shape", None)  # numpy
    if shape:
        return int(shape[0])
    return len(output) if isinstance(output, list) and output else None


class PipelineProfile:
    """A diffusion pipeline's counts by component and by denoising step (see
    ``profile_pipeline``).

    >>> pp = profile_pipeline(pipe, "a cat", num_inference_steps=4)
    >>> pp.components["text_encoder"], pp.steps[0], pp.denoising[0].guidance
    >>> print(pp.table())

    ``components``: a Profile per component, all its outermost calls together (the denoiser's
    are its passes in every step; a VAE's ``vae.encode`` and ``vae.decode`` apart);
    ``steps``: a Profile per denoising step, in order (``denoising``: the same steps with
    their passes, batches, timestep and guidance); ``outside``: ops run outside every
    component and step (latents' preparation, image post-processing); ``profile``: the whole
    call, ``total`` its Stats. ``images``: images (or videos) made, from the output (else
    the latents' batch).
    """

    def __init__(self, profile: Profile, components: dict, denoising: tuple,
                 outside: Profile, images: int, order: tuple, calls: dict):
        if not denoising:
            raise ValueError("the denoiser was never called: nothing to cut into steps "
                             "(does fn call the pipeline's denoiser?)")
        self.profile = profile
        self.components = components
        self.denoising = denoising
        self.outside = outside
        self.images = images
        self.calls = dict(calls)  # component -> its outermost calls (a denoiser's: passes)
        self.order = order  # ("component", name) | ("step", i): the parts in first-run order

    @property
    def total(self) -> Stats:
        return self.profile.total

    @property
    def steps(self) -> tuple:
        """A Profile per denoising step."""
        return tuple(s.profile for s in self.denoising)

    @property
    def timing(self) -> bool:
        return self.profile.timing

    @property
    def guidance(self) -> Guidance:
        """How the steps ran classifier-free guidance (the most common among them)."""
        kinds = [s.guidance for s in self.denoising]
        return max(set(kinds), key=kinds.count)

    @property
    def evaluations_per_image(self) -> float:
        """Images' worth of denoiser work per step: 2 with classifier-free guidance."""
        return mean(sum(s.batches) / s.evaluations for s in self.denoising) / self.images

    @property
    def evaluations(self) -> int:
        """The denoiser's evaluations over all steps (Heun's: about two a step)."""
        return sum(s.evaluations for s in self.denoising)

    @property
    def evaluations_per_step(self) -> float:
        """The denoiser's evaluations per scheduler step: 1 for a first-order or multistep
        solver, up to ``scheduler.order`` for Heun's or a single-step solver's."""
        return self.evaluations / len(self.denoising)

    def per_image(self) -> Average:
        """The whole call's counts per image made."""
        return Average.of(self.total, self.images)

    def per_step(self) -> Average:
        """The mean denoising step's counts (all its images)."""
        total = Stats()
        for s in self.denoising:
            total = total + s.total
        return Average.of(total, len(self.denoising))

    @classmethod
    def _of(cls, profile: Profile, spans: list, images: Optional[int],
            timing: bool, ends: Optional[tuple] = None) -> "PipelineProfile":
        by_scheduler = any(s.kind == "scheduler" for s in spans)
        for span in spans:
            span.timestep = _value(span.timestep)
        steps: list[list[_Span]] = []  # each: its spans, in order
        top: list = []  # ("component", span) | ("step", index)
        open_step: Optional[list] = None
        for span in spans:
            per_step = span.kind == "component" and _named(span.name, _PER_STEP)
            if span.kind == "scheduler":
                if open_step is None:  # an update with no denoiser call before it
                    top.append(("component", span))
                    continue
                open_step.append(span)
                open_step = None
            elif per_step:
                earlier = [s.timestep for s in open_step or () if _named(s.name, _DENOISERS)]
                if not by_scheduler and earlier and _named(span.name, _DENOISERS) and not any(
                        _same(t, span.timestep) for t in earlier):
                    open_step = None  # a new timestep: a new step
                if open_step is None:
                    open_step = []
                    steps.append(open_step)
                    top.append(("step", len(steps) - 1))
                open_step.append(span)
            elif open_step is not None and by_scheduler:
                open_step.append(span)  # another component inside a step's range: its part
            else:
                open_step = None
                top.append(("component", span))
        if images is None:  # the latents' batch as the scheduler updates them, else a pass's
            first = next((s.batch for s in spans if s.batch), None)
            update = next((s.batch for s in spans if s.kind == "scheduler" and s.batch), None)
            images = update or first or 1
        # evaluations grouped into the scheduler's steps (``_scheduler_steps``), where each
        # evaluation ended in its ``scheduler.step`` and there are as many as its timesteps
        evaluated = [1] * len(steps)
        if ends and by_scheduler and len(steps) == ends[-1] + 1 and all(
                any(p.kind == "scheduler" for p in parts) for parts in steps):
            group_of: dict = {}
            grouped: list = []
            first = 0
            for end in ends:
                group_of.update({i: len(grouped) for i in range(first, end + 1)})
                grouped.append([p for parts in steps[first:end + 1] for p in parts])
                first = end + 1
            evaluated = [sum(1 for g_of in group_of.values() if g_of == g)
                         for g in range(len(grouped))]
            steps = grouped
            regrouped: list = []
            for kind, item in top:  # a step's evaluations: one step, where its first was
                if kind == "step":
                    item = group_of[item]
                    if ("step", item) in regrouped:
                        continue
                regrouped.append((kind, item))
            top = regrouped
        made = tuple(_step(i, parts, images, timing, evaluated[i])
                     for i, parts in enumerate(steps))
        components: dict[str, list] = {}  # in the order they first ran
        alone = {id(item) for kind, item in top if kind == "component"}  # a lone update too
        for span in spans:
            if span.kind == "component" or id(span) in alone:
                components.setdefault(span.name, []).append(span.profile(timing))
        outside = profile
        for kind, item in top:
            outside = since(outside, made[item].profile if kind == "step"
                            else item.profile(timing))
        outside = outside.replace(
            module_facts=replace(outside.module_facts, calls={}, spans={}),
            run=replace(outside.run, wall_s=None))
        order = tuple(("step", item) if kind == "step" else ("component", item.name)
                      for kind, item in top)
        return cls(profile, {n: Profile.merge(ps) for n, ps in components.items()}, made,
                   outside, images, tuple(dict.fromkeys(order)),
                   {n: len(ps) for n, ps in components.items()})

    def roofline(self, device, dtype=None) -> PipelineRoofline:
        """Each step and each component call outside the steps against ``device``'s roofs (a
        ``DeviceSpec``, or the name of a built-in one in ``DEVICES``) at ``dtype`` (the
        pipeline's parameter dtype when None); see ``PipelineRoofline``."""
        spec = resolve_device(device)
        peak = spec.peak_flops(dtype or self.profile.dtype)
        bandwidth = spec.memory_bandwidth
        steps = tuple(ops_roofline(p, peak, bandwidth) for p in self.steps)
        outside_steps = [n for kind, n in self.order if kind == "component"]
        components = {n: ops_roofline(self.components[n], peak, bandwidth)
                      for n in outside_steps}
        outside = ops_roofline(self.outside, peak, bandwidth)
        whole = sum(r.attainable_s for r in steps) + sum(
            r.attainable_s for r in components.values()) + outside.attainable_s
        bounds = [r.bound for r in steps]
        measured_step = measured_image = None
        if self.timing:
            measured_step = mean(p.wall_s or 0.0 for p in self.steps)
            measured_image = (self.profile.wall_s or 0.0) / self.images
        return PipelineRoofline(
            device=spec.name, steps=steps, components=components, outside=outside,
            order=self.order, images=self.images, step_s=mean(r.attainable_s for r in steps),
            image_s=whole / self.images, bound=max(set(bounds), key=bounds.count),
            measured_step_s=measured_step, measured_image_s=measured_image)

    def to_dict(self) -> dict:
        """The cut as data: every part's Profile as ``Profile.to_dict`` writes it."""
        return {"format": _FORMAT, "images": self.images, "profile": self.profile.to_dict(),
                "outside": self.outside.to_dict(), "order": [list(o) for o in self.order],
                "calls": self.calls,
                "components": {n: p.to_dict() for n, p in self.components.items()},
                "steps": [dict(step=s.step, timestep=s.timestep, denoisers=list(s.denoisers),
                               batches=list(s.batches), guidance=s.guidance,
                               evaluations=s.evaluations,
                               profile=s.profile.to_dict(),
                               passes=[p.to_dict() for p in s.passes],
                               scheduler=None if s.scheduler is None
                               else s.scheduler.to_dict())
                          for s in self.denoising]}

    @classmethod
    def from_dict(cls, data: dict) -> "PipelineProfile":
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            raise ValueError(f"not a pipeline profile: expected a dict with format {_FORMAT!r}")

        def load(d):
            return None if d is None else Profile.from_dict(d)
        steps = tuple(DenoisingStep(
            step=s["step"], timestep=s["timestep"], profile=load(s["profile"]),
            passes=tuple(load(p) for p in s["passes"]), denoisers=tuple(s["denoisers"]),
            batches=tuple(s["batches"]), scheduler=load(s["scheduler"]),
            guidance=Guidance(s["guidance"]), evaluations=s.get("evaluations", 1))
            for s in data["steps"])
        return cls(load(data["profile"]), {n: load(p) for n, p in data["components"].items()},
                   steps, load(data["outside"]), data["images"],
                   tuple((k, v) for k, v in data["order"]), data["calls"])

    def to_json(self, path) -> None:
        """Write ``to_dict()`` as JSON (whole or not at all)."""
        schema.write_text(path, json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def from_json(cls, path) -> "PipelineProfile":
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))

    def table(self) -> str:
        """Components and steps in the order they ran (more than six steps: the first, the
        mean and the last), the work outside them, the total, per image, and how guidance
        ran."""
        return pipeline_table(self)

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        evaluated = ("" if self.evaluations == len(self.denoising)
                     else f" ({self.evaluations} denoiser evaluations)")
        return (f"PipelineProfile({len(self.denoising)} denoising steps{evaluated}, "
                f"{self.images} "
                f"image{'s' if self.images != 1 else ''}, guidance {self.guidance}, "
                f"{self.total.flops:,} FLOPs)")


def _step(i: int, parts: list, images: int, timing: bool,
          evaluations: int = 1) -> DenoisingStep:
    """Step ``i`` from its spans (its ``evaluations``' together): its first call's start to
    its last's end."""
    first, last = parts[0], parts[-1]
    assert last.after is not None
    passes = [s for s in parts if _named(s.name, _DENOISERS)]
    updates = [s for s in parts if s.kind == "scheduler"]
    t = updates[0].timestep if updates else passes[0].timestep if passes else None
    batches = tuple(s.batch or 0 for s in passes)
    per_evaluation = batches[:max(1, len(batches) // evaluations)]
    return DenoisingStep(
        step=i, timestep=t if isinstance(t, float) else None,
        profile=_timed(since(last.after, first.before), first.start_ns, last.end_ns, timing),
        passes=tuple(s.profile(timing) for s in passes),
        denoisers=tuple(s.name for s in passes), batches=batches,
        scheduler=None if not updates else updates[0].profile(timing) if len(updates) == 1
        else Profile.merge([u.profile(timing) for u in updates]),
        guidance=_guidance(per_evaluation, images), evaluations=evaluations)


def _guidance(batches: tuple, images: int) -> Guidance:
    if len(batches) >= 2:
        return SEPARATE
    return BATCHED if batches and batches[0] == 2 * images else NONE


def _same(a: Any, b: Any) -> bool:
    """One timestep: the same object, or equal values."""
    if a is None or b is None:  # a denoiser given no timestep: each call its own step
        return False
    return a is b or (isinstance(a, float) and isinstance(b, float) and a == b)


@dataclass(frozen=True, repr=False)
class PipelineRoofline:
    """A pipeline against one device's roofs: a ``Roofline`` per denoising step and per
    component call outside the steps (``components``), each part's time the sum of its ops'
    ``max(flops / peak, bytes / bandwidth)`` (as ``GenerationRoofline``'s). ``step_s``: the
    mean step's attainable time; ``image_s``: the whole call's (its steps, components and
    outside work) per image made. ``measured_*``: the same from the timed run (``None``
    untimed).

    >>> roof = pp.roofline("H100-SXM")
    >>> roof.step_s, roof.image_s, print(roof.table())
    """

    device: str
    steps: tuple  # Roofline per denoising step
    components: dict  # name -> Roofline, components outside the steps
    outside: Roofline
    order: tuple  # the parts in the order they ran, as PipelineProfile.order
    images: int
    step_s: float
    image_s: float
    bound: str  # the bound most steps hit
    measured_step_s: Optional[float]
    measured_image_s: Optional[float]

    def __repr__(self) -> str:
        measured = ("" if self.measured_image_s is None
                    else f"; measured {duration(self.measured_image_s)} per image")
        return (f"PipelineRoofline({self.device}: {duration(self.step_s)} per denoising "
                f"step ({self.bound}), {duration(self.image_s)} per image attainable"
                f"{measured}; {len(self.steps)} steps)")

    def table(self) -> str:
        """A row per component and per step: flops per byte, compute, memory and attainable
        times, the bound, and (timed) the measured time and attainable / measured."""
        return pipeline_roofline_table(self)

    def __str__(self) -> str:
        return self.table()
