"""DeepSpeed's flops profiler API, counted by this package's engine.

``get_model_profile`` and ``FlopsProfiler`` keep DeepSpeed's signatures and defaults, so a
script written for ``deepspeed.profiling.flops_profiler`` switches by changing the import.
What differs is what is counted: every aten op the model runs (attention, MoE routing, fused
kernels), and backward, optimizer and recompute measured, not estimated as 2 × forward.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

from dispatch_flops.counter import FlopCounter
from dispatch_flops.engine.model.activations import ActivationRecorder
from dispatch_flops.results.format import duration, human
from dispatch_flops.results.stats import FORWARD, ROOT, check_int
from dispatch_flops.views.deepspeed_printout import ProfileView, World


def _ignored_types(ignore_list) -> tuple:
    types = tuple(ignore_list or ())
    for t in types:
        if not (isinstance(t, type) and issubclass(t, nn.Module)):
            raise TypeError(f"ignore_modules / ignore_list take nn.Module classes, got {t!r}")
    return types


def _hidden_names(model: nn.Module, types: tuple) -> frozenset:
    """Names of the modules of an ignored type, and of everything inside them (never the
    root)."""
    if not types:
        return frozenset()
    tops = [name for name, m in model.named_modules() if name and isinstance(m, types)]
    return frozenset(
        name for name, _ in model.named_modules()
        if any(name == top or name.startswith(top + ".") for top in tops)
    )


class FlopsProfiler:
    """DeepSpeed's ``FlopsProfiler``: profile whatever runs between ``start_profile()`` and
    ``stop_profile()`` (a forward, or a whole training step: backward and optimizer are
    measured, not estimated). Each ``start_profile()`` starts from zero.

    >>> prof = FlopsProfiler(model)
    >>> prof.start_profile()
    >>> loss = model(batch)
    >>> prof.stop_profile()
    >>> prof.get_total_flops(as_string=True), prof.print_model_profile(profile_step=5)
    >>> prof.end_profile()

    or ``with FlopsProfiler(model) as prof: model(batch)``. ``mp_size`` (default: the
    ``ds_engine``'s, else 1) scales the "of model" lines; ``batch_size`` gives samples/second;
    ``timing=False`` leaves latencies out ('-'). The flops figures (``get_total_flops()``,
    ``.flops``, the printout's) are DeepSpeed's: 2 x MACs of the contraction ops, here of every
    contraction kernel the model runs; ``counter.total.flops`` has every op's arithmetic.
    ``recompute_fwd_factor`` is accepted for DeepSpeed's engine, which passes it: recompute
    is measured here, not estimated.
    """

    def __init__(self, model: nn.Module, ds_engine=None, recompute_fwd_factor: float = 0.0, *,
                 mp_size: Optional[int] = None, batch_size: Optional[int] = None,
                 timing: bool = True):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if mp_size is not None:
            check_int("mp_size", mp_size, 1)
        if batch_size is not None:
            check_int("batch_size", batch_size, 1)
        if not isinstance(timing, bool):
            raise TypeError(f"timing must be True or False, got {timing!r}")
        if isinstance(recompute_fwd_factor, bool) or not isinstance(
                recompute_fwd_factor, (int, float)) or recompute_fwd_factor < 0:
            raise ValueError(f"recompute_fwd_factor must be a number >= 0, got "
                             f"{recompute_fwd_factor!r}")
        self.model = model
        self.ds_engine = ds_engine  # DeepSpeed's engine, or None; may be set later, as there
        # DeepSpeed's estimate of recompute (bwd = (2 + factor) x fwd); kept for code that
        # reads it: backward and recompute are measured here when profiled
        self.recompute_fwd_factor = recompute_fwd_factor
        self._mp_size = mp_size
        self._batch_size = batch_size
        self.timing = timing
        self.started = False  # DeepSpeed's flag: a profile is running
        # DeepSpeed's figures of the last print_model_profile: fwd flops (2 x MACs), MACs,
        # params; None before
        self.flops: Optional[int] = None
        self.macs: Optional[int] = None
        self.params: Optional[int] = None
        self._ignore: tuple = ()
        self._hidden: frozenset = frozenset()
        self._counter: Optional[FlopCounter] = None
        self._recorder: Optional[ActivationRecorder] = None

    @property
    def mp_size(self) -> int:
        """Model-parallel size: the constructor's, else the engine's ``mp_world_size``, else
        1."""
        if self._mp_size is not None:
            return self._mp_size
        return getattr(self.ds_engine, "mp_world_size", None) or 1

    @property
    def batch_size(self) -> Optional[int]:
        """Samples per device: the constructor's, else the engine's
        ``train_micro_batch_size_per_gpu()``, else None."""
        if self._batch_size is not None:
            return self._batch_size
        micro_batch = getattr(self.ds_engine, "train_micro_batch_size_per_gpu", None)
        return micro_batch() if callable(micro_batch) else None

    # -- lifecycle --------------------------------------------------------------------------
    def start_profile(self, ignore_list=None) -> None:
        """Start a fresh profile (a running one is discarded). Modules of the classes in
        ``ignore_list`` are not shown; their work stays in their parent's figures."""
        if self.started:
            self._stop()
        self._ignore = _ignored_types(ignore_list)
        self._hidden = _hidden_names(self.model, self._ignore)
        hidden = self._hidden
        recorder = ActivationRecorder(self.model, skip=lambda name: name in hidden)
        counter = FlopCounter(self.model, timing=self.timing)
        recorder.attach()
        try:
            counter.__enter__()
        except BaseException:
            recorder.detach()
            raise
        self._counter, self._recorder, self.started = counter, recorder, True

    def stop_profile(self) -> None:
        """Stop counting and remove every hook; the results stay readable."""
        if self.started:
            self._stop()

    def _stop(self) -> None:
        assert self._counter is not None and self._recorder is not None  # started
        try:
            self._counter.__exit__(None, None, None)
        finally:
            self._recorder.detach()
            self.started = False

    def reset_profile(self) -> None:
        """Forget what was counted. While profiling, counting goes on from zero."""
        if self.started:
            self.start_profile(self._ignore)
        else:
            self._counter = self._recorder = None

    def end_profile(self) -> None:
        """Stop, remove every hook, and forget the results."""
        try:
            self.stop_profile()
        finally:
            self._counter = self._recorder = None

    def __enter__(self) -> "FlopsProfiler":
        self.start_profile()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_profile()

    # -- results ----------------------------------------------------------------------------
    @property
    def counter(self) -> Optional[FlopCounter]:
        """The ``FlopCounter`` behind the profile (every phase, module and op), or None."""
        return self._counter

    def _phase(self, phase: str):
        return self._counter.by_phase()[phase] if self._counter is not None else None

    def get_total_flops(self, as_string: bool = False):
        """Forward flops as DeepSpeed counts them: 2 x MACs (``counter.by_phase()`` has the
        all-ops flops of every phase)."""
        flops = 2 * self._phase(FORWARD).macs if self._counter is not None else 0
        return human(flops, compact=True) if as_string else flops

    def get_total_macs(self, as_string: bool = False):
        """Forward MACs."""
        macs = self._phase(FORWARD).macs if self._counter is not None else 0
        return human(macs, "MACs", compact=True) if as_string else macs

    def get_total_params(self, as_string: bool = False):
        """Parameters of the model (all of them, trainable or not; shared ones once)."""
        params = sum(p.numel() for p in self.model.parameters())
        return human(params, compact=True) if as_string else params

    def get_total_duration(self, as_string: bool = False):
        """Seconds inside the model's forward calls; None when not measured."""
        root = self._counter.by_module(phase=FORWARD).get(ROOT) if self._counter else None
        seconds = root.latency_s if root is not None else None
        if as_string:
            return "-" if seconds is None else duration(seconds, compact=True)
        return seconds

    def activations(self) -> dict:
        """``{module name: Activations}``: output bytes and first-call shapes."""
        return self._recorder.results() if self._recorder is not None else {}

    def model_profile(self, profile_step: int = 1, module_depth: int = -1,
                      top_modules: int = 1, detailed: bool = True, *,
                      module_ops: bool = True) -> str:
        """The text ``print_model_profile`` prints."""
        check_int("profile_step", profile_step, 0)
        check_int("module_depth", module_depth, -1)
        check_int("top_modules", top_modules, 1)
        if self._counter is None:
            raise RuntimeError("nothing profiled: call start_profile(), run the model, then "
                               "stop_profile() before printing")
        view = ProfileView(self._counter, self.model, self.activations(), self._hidden)
        return view.text(profile_step=profile_step, module_depth=module_depth,
                         top_modules=top_modules, detailed=detailed, module_ops=module_ops,
                         world=self._world(), mp_size=self.mp_size, batch_size=self.batch_size)

    def print_model_profile(self, profile_step: int = 1, module_depth: int = -1,
                            top_modules: int = 1, detailed: bool = True,
                            output_file: Optional[str] = None, *,
                            module_ops: bool = True) -> None:
        """Print the profile (to ``output_file`` when given, overwriting it). ``module_depth``
        limits the depths shown (-1: all), ``top_modules`` the modules per depth in the
        aggregated profile; ``module_ops`` lists the ops each module ran directly."""
        text = self.model_profile(profile_step, module_depth, top_modules, detailed,
                                  module_ops=module_ops)
        self.flops = self.get_total_flops()
        self.macs = self.get_total_macs()
        self.params = self.get_total_params()
        if output_file:
            with open(output_file, "w") as f:
                f.write(text)
        else:
            print(text, end="")

    def _world(self) -> Optional[World]:
        """The world / dp / mp sizes: the engine's whenever one is given (DeepSpeed's rule;
        dp is its sequence-data-parallel size when ``dp_world_size`` is None, as under
        Ulysses), else the device mesh's when the model has DTensor parameters (FSDP2, tensor
        parallelism: see ``distributed.mesh_sizes``), else torch.distributed's when
        initialised (dp = world / mp), else None."""
        engine, mp_size = self.ds_engine, self.mp_size
        initialised = dist.is_available() and dist.is_initialized()
        if engine is None and not initialised:
            return None
        if engine is None and self._mp_size is None:  # DTensor / FSDP2: the device mesh's
            from dispatch_flops.workflows.distributed import mesh_sizes
            sizes = mesh_sizes(self.model)
            if sizes is not None:
                return World(*sizes)
        world_size = getattr(engine, "world_size", None)
        if world_size is None:
            world_size = dist.get_world_size() if initialised else 1
        dp_size = getattr(engine, "dp_world_size", None)
        if dp_size is None:
            dp_size = getattr(engine, "seq_dp_world_size", None)
        if dp_size is None:
            dp_size = max(world_size // mp_size, 1)
        return World(world_size, dp_size, mp_size)


def _input(model: nn.Module, input_shape) -> torch.Tensor:
    """A tensor of ones of ``input_shape`` in the model's parameter dtype and device (as
    DeepSpeed builds it)."""
    shape = tuple(input_shape)
    if not shape or not all(isinstance(n, int) and n > 0 for n in shape):
        raise ValueError(f"input_shape must be a non-empty tuple of positive ints, got "
                         f"{input_shape!r}")
    param = next(model.parameters(), None)
    dtype = param.dtype if param is not None and param.is_floating_point() else None
    return torch.ones(shape, dtype=dtype, device=param.device if param is not None else None)


def get_model_profile(
    model: nn.Module,
    input_shape=None,
    args=None,
    kwargs=None,
    print_profile: bool = True,
    detailed: bool = True,
    module_depth: int = -1,
    top_modules: int = 1,
    warm_up: int = 1,
    as_string: bool = True,
    output_file: Optional[str] = None,
    ignore_modules=None,
    func_name: str = "forward",
    *,
    mode: Optional[str] = None,
    mp_size: Optional[int] = None,
    batch_size: Optional[int] = None,
    module_ops: bool = True,
):
    """DeepSpeed's ``get_model_profile``: ``warm_up`` unprofiled calls, then one profiled
    call of ``model.<func_name>(*args, **kwargs)`` in eval mode; prints the profile and
    returns ``(flops, macs, params)`` (strings such as ``'11.17 GMACs'`` with ``as_string``).

    >>> flops, macs, params = get_model_profile(model, input_shape=(1, 3, 224, 224))
    >>> get_model_profile(model, kwargs=inputs, func_name="generate", print_profile=False)

    ``mode`` is DeepSpeed's current name for ``func_name`` (the flops-profiler package's):
    give either. ``input_shape`` builds one tensor of ones (the model's parameter dtype and
    device) as the only positional argument. The model's train/eval flags and hooks are
    restored after.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    check_int("warm_up", warm_up, 0)
    if mode is not None:
        if func_name != "forward" and func_name != mode:
            raise ValueError(f"mode={mode!r} and func_name={func_name!r} name the method to "
                             f"profile twice: give one")
        func_name = mode
    if not isinstance(func_name, str):
        raise TypeError(f"mode / func_name must be a method name, got {func_name!r}")
    args = list(args) if args is not None else []
    kwargs = dict(kwargs) if kwargs is not None else {}
    if input_shape is not None:
        if args:
            raise ValueError("give input_shape or args, not both")
        args = [_input(model, input_shape)]
        if batch_size is None:
            batch_size = args[0].shape[0]
    if not args and not kwargs:
        raise ValueError("give the model's inputs: input_shape, args or kwargs")
    # forward through __call__, so the model's own hooks run as in any ordinary call
    fn = model if func_name == "forward" else getattr(model, func_name, None)
    if not callable(fn):
        raise AttributeError(f"{type(model).__name__} has no method {func_name!r} to profile")
    prof = FlopsProfiler(model, mp_size=mp_size, batch_size=batch_size)
    training = [(m, m.training) for m in model.modules()]
    try:
        model.eval()
        if warm_up:  # under a counter (untimed): what counting sets up on first use is warm
            with FlopCounter(model):
                for _ in range(warm_up):
                    fn(*args, **kwargs)
        prof.start_profile(ignore_list=ignore_modules)
        fn(*args, **kwargs)
        prof.stop_profile()
        flops, macs, params = prof.get_total_flops(), prof.get_total_macs(), prof.get_total_params()
        if print_profile:
            prof.print_model_profile(profile_step=warm_up, module_depth=module_depth,
                                     top_modules=top_modules, detailed=detailed,
                                     output_file=output_file, module_ops=module_ops)
    finally:
        prof.end_profile()
        for module, flag in training:
            module.training = flag
    if as_string:
        return human(flops, compact=True), human(macs, "MACs", compact=True), human(
            params, compact=True)
    return flops, macs, params
