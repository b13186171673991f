"""FlopCounter: a counting session. Options, enter and exit, and its result: a ``Profile``.

Every view (``total``, ``by_module()``, ``table()``, exports, ...) is ``ProfileViews``', the
same methods a Profile has, read from ``to_profile()``. See docs/architecture.md for the way
an op takes from the dispatch mode to a view.
"""

from __future__ import annotations

import sys
import threading
import warnings
import weakref
from types import FrameType
from typing import Optional, Union

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks

from dispatch_flops.engine.counting import active
from dispatch_flops.engine.counting.ledger import LEDGERS_LOCK, Ledger, ledger_for
from dispatch_flops.engine.counting.mode import CountingMode, GuardedCountingMode, exit_mode
from dispatch_flops.engine.counting.model_cache import holds_dtensor
from dispatch_flops.engine.counting.records import Captured, engine_cache
from dispatch_flops.engine.counting.state import CountingState
from dispatch_flops.engine.counting.tracker import (
    ModuleTracker,
    UserHooks,
    block_frame,
    unwrap_compiled,
)
from dispatch_flops.engine.graphs import compiled as _compiled
from dispatch_flops.engine.graphs import cuda_graphs as _cuda_graphs
from dispatch_flops.engine.graphs import dynamo as _dynamo
from dispatch_flops.engine.model import expert_load as _experts
from dispatch_flops.engine.model import module_facts as _facts
from dispatch_flops.engine.model.expert_load import ExpertLoad
from dispatch_flops.engine.model.saved import SavedActivations
from dispatch_flops.engine.timing.clock import Timer, cuda_index
from dispatch_flops.engine.timing.factory import new_timer, runner_for, unrelay
from dispatch_flops.engine.timing.kineto import KERNELS, SAMPLE_EVERY, TIMINGS
from dispatch_flops.engine.timing.trace import is_tracing, trace_events
from dispatch_flops.formulas import REGISTRY, Registry
from dispatch_flops.results.facts import ModuleFacts, RunFacts
from dispatch_flops.results.profile import Profile
from dispatch_flops.results.queries import ProfileViews
from dispatch_flops.results.schema import PathLike
from dispatch_flops.results.stats import GLOBAL

ATTENTION_MODES = ("dense", "causal")
_dynamo.install()  # graphs dynamo compiles from now on count when a counter runs


class FlopCounter(ProfileViews):
    """Counts the flops, MACs and bytes of every aten op run inside the block, attributed to
    the modules of ``model`` that ran them, forward and backward.

    >>> with FlopCounter(model) as fc:
    ...     model(x).sum().backward()
    >>> fc.total.flops, fc.by_module()["layers.0"].exclusive.macs
    >>> print(fc)  # the table
    >>> fc.to_profile()  # the result as data: every view below is the Profile's

    Attention has two figures (docs/conventions.md, "Hardware and model flops"): ``flops``
    is what the kernels executed, ``model_flops`` (``Stats.model_flops``) leaves out the
    pairs a mask made useless (``is_causal``, an ``attn_mask``, a FlexAttention
    ``BlockMask``). A kernel with ``is_causal=True`` is taken to compute every (query, key)
    pair (the hardware figure). ``attention="causal"`` is deprecated (a ``FutureWarning``):
    it takes such a kernel to skip the masked pairs exactly (hardware = model), the old way
    to count causal pairs, which ``model_flops`` gives; read that instead.
    ``timing=True`` also measures latency. On CUDA each op gets the time of the kernels it
    launched (Kineto/CUPTI, recorded on one block in ``kernel_sampling`` (10) per model and
    reused on the others, 1 records every block; see ``engine.timing.kineto`` and docs/timing.md),
    each module call its kernels' span and the
    idle time inside it; where Kineto cannot record, a warning, and module boundaries only.
    ``timing="events"`` instead brackets every CUDA op with two CUDA events on its stream
    (which time the stream, gaps included, not the kernel). Ops on no CUDA device get
    ``perf_counter_ns``; module calls and the block are spans between marks.
    For medians over warm repeats use ``dispatch_flops.measure``. ``trace=True`` (timing
    implied) also keeps when every op and module call started and ended, for
    ``to_chrome_trace``. ``saved_activations=True`` also counts the bytes autograd saves for
    backward, through a ``saved_tensors_hooks`` pack hook: ``torch.func``'s ``grad``,
    ``vjp``, ``jacrev`` and ``hessian`` refuse to run under one (torch raises
    ``RuntimeError``), so count those transforms without it.
    Register custom formulas before entering the block.
    """

    def __init__(
        self,
        model: Optional[nn.Module] = None,
        *,
        attention: str = "dense",
        registry: Optional[Registry] = None,
        trace: bool = False,
        timing: Union[bool, str] = False,
        saved_activations: bool = False,
        kernel_sampling: int = SAMPLE_EVERY,
    ):
        if model is not None and not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module or None, got {type(model).__name__}")
        if attention not in ATTENTION_MODES:
            raise ValueError(f"attention must be one of {ATTENTION_MODES}, got {attention!r}")
        if attention == "causal":
            warnings.warn(
                'FlopCounter(attention="causal") is deprecated: read model_flops (the '
                "is_causal kernels' masked share is masked_flops) instead of the hardware "
                "flops it lowers", FutureWarning, stacklevel=2)
        if registry is not None and not isinstance(registry, Registry):
            raise TypeError(f"registry must be a dispatch_flops.formulas.Registry or None, got "
                            f"{type(registry).__name__}")
        if isinstance(timing, str) and timing not in TIMINGS:
            raise ValueError(f"timing must be one of True, False, {', '.join(map(repr, TIMINGS))}"
                             f", got {timing!r}")
        if isinstance(kernel_sampling, bool) or not isinstance(kernel_sampling, int) or \
                kernel_sampling < 1:
            raise ValueError(f"kernel_sampling must be a whole number of blocks, 1 or more (1: "
                             f"record kernels on every block; {SAMPLE_EVERY}: the default), "
                             f"got {kernel_sampling!r}")
        for flag, value in (("timing", timing in TIMINGS or timing),
                            ("saved_activations", saved_activations), ("trace", trace)):
            if not isinstance(value, bool):
                raise TypeError(f"{flag} must be True or False, got {value!r}")
        # torch.compile(model): count the user's module, under its own names (its graphs
        # count through engine.graphs)
        model = unwrap_compiled(model) if model is not None else None
        self.model = model
        self.attention = attention
        self.registry = registry if registry is not None else REGISTRY
        self.trace = trace  # a timeline: every op's and module call's start and end
        self.timing = bool(timing) or trace
        # CUDA ops timed by their kernels (engine.timing.kineto) unless per-op events are asked for
        self._kernels = timing is True or timing == KERNELS
        self.saved_activations = saved_activations
        self.kernel_sampling = kernel_sampling  # with timing=True on CUDA and a model
        self.root_label = type(model).__name__ if model is not None else GLOBAL
        self._mode: Optional[CountingMode] = None
        self._tracker: Optional[ModuleTracker] = None
        self._timer: Optional[Timer] = None
        self._active = False
        self._wall = [0]  # ns from entry to exit, when timing
        self._wall_start = None
        self._saved: Optional[SavedActivations] = None  # bytes saved for backward, if asked
        self._relay = None  # the Relay this counter put under the mode below it, if nested
        # the MoE layers' hooks (engine.model.expert_load)
        self._experts: Optional[ExpertLoad] = None
        self._parts: Optional[_Parts] = None  # what __enter__ installed, for __exit__
        self._captured: Optional[tuple] = None  # (Captured, ModuleFacts, RunFacts)
        # (volatile run facts, (module types, params)) read at exit: see __exit__
        self._at_exit: Optional[tuple] = None
        self._profile: Optional[Profile] = None
        self._warned = False  # a never-entered counter read: said once
        # with no model, name every module called, torch's way (FlopCounterMode sets it)
        self._every_module = False
        # workflows' module hooks, which the tracker runs around its own (UserHooks)
        self.user_hooks = UserHooks()

    # -- context manager ------------------------------------------------------------------
    def __enter__(self) -> "FlopCounter":
        if self._active:
            raise RuntimeError("this FlopCounter is already counting; nest a new FlopCounter")
        self._allow_tf32 = bool(torch.backends.cuda.matmul.allow_tf32)
        timer = new_timer(self.trace, self._cuda_devices(), kernels=self._kernels,
                          model=self.model, sampling=self.kernel_sampling) \
            if self.timing else None
        runner, relay = runner_for(timer, timer is None and self._on_meta())
        # a block a generator or coroutine owns is counted only while it runs (see
        # GuardedCountingMode); a context manager's body's block is its caller's (block_frame)
        guard = block_frame(_user_frame())
        mode = (GuardedCountingMode if guard is not None else CountingMode)(
            self.registry, runner)
        ledger = None
        # every part is set up inside one try, each noted as soon as it exists: whatever
        # raises where (a KeyboardInterrupt too), what was installed is taken off again
        parts = self._parts = _Parts(mode, relay)
        try:
            ledger = parts.ledger = ledger_for(engine_cache(self.registry).ledgers, self.model,
                                               timer)
            # what counting changes, one object: the mode and tracker write its parts
            state = CountingState(ledger if ledger is not None else Ledger())
            tracker = parts.tracker = ModuleTracker(
                self.model, mode, state, timer, ledger is not None, guard, self._every_module,
                self.user_hooks)
            mode.bind(tracker, state)
            tracker.attach()
            facts = tracker.model_facts
            if facts is not None:
                modules = tracker.modules()
                mode.follow_local_tensors(facts.get("dtensor", lambda: holds_dtensor(modules)))
            # MoE layers' expert load (hooks on recognised expert modules only)
            layers = facts.get("experts", lambda: _experts.expert_layers(
                tracker.module_names(), modules)) if facts is not None else []
            if layers:
                parts.experts = ExpertLoad(layers)
                parts.experts.attach()
            parts.mode_entered = True
            mode.__enter__()
            if self.saved_activations:
                parts.saved = SavedActivations(tracker, self.model)
                tracker.watch_saved(parts.saved)
                saved_tensors_hooks(parts.saved.pack, parts.saved.unpack).__enter__()
            parts.counting = True
            active.enter(mode, tracker)  # compiled graphs and CUDA graphs follow it
        except BaseException:
            _undo(parts.steps(self, None))  # what it raises is second to what got here
            if timer is not None:  # a Kineto session would outlive the block
                timer.close()
            self._parts = None
            raise
        self._experts, self._saved = parts.experts, parts.saved
        self._relay = relay
        self._tracker, self._mode, self._active = tracker, mode, True
        self._captured = self._profile = self._at_exit = None
        self._timer, self._wall = timer, [0]
        if timer is not None:
            self._wall_start = timer.mark()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        tracker, mode, parts = self._tracker, self._mode, self._parts
        assert tracker is not None and mode is not None and parts is not None, \
            "__exit__ without __enter__"
        if threading.get_ident() != tracker.thread:
            # its mode is on the entering thread's dispatch stack, which only that thread can
            # change: the counter stays open (and counting there) until exited there
            raise RuntimeError(
                f"this FlopCounter was entered in thread {tracker.thread} and is exited in "
                f"thread {threading.get_ident()}: exit it in the thread that entered it (it "
                f"is still counting there)")
        # every step runs whatever an earlier one raised (a KeyboardInterrupt too), and each
        # is safe to run again: the first exception is raised once all have run
        failed = _undo(parts.steps(self, (exc_type, exc, tb)))
        self._parts = None
        if failed is not None:
            raise failed

    def _wall_ends(self) -> None:
        timer = self._timer
        if timer is not None and self._wall_start is not None:  # on every stream used
            start, self._wall_start = self._wall_start, None
            timer.span(self._wall, 0, start, timer.mark(block_end=True))

    def _closes(self, tracker: ModuleTracker) -> None:
        """The block is over: its facts read, its ledger handed on (or retired)."""
        self._active = False
        # what may change once the block is over (the model's dtype and modules, the
        # process group) is read now; the counts are read when first asked for, or when
        # the next counter on the model needs the ledger (``Ledger.settle``)
        if self._at_exit is None:
            self._at_exit = (self._volatile_facts(), _facts.types_and_params(tracker))
        left_installed = tracker.mode_left_installed()
        if tracker.shared:
            if left_installed:  # its mode may go on counting into the ledger
                if self._captured is None:
                    self._captured = self._capture()
            else:
                tracker.ledger.holder = _Settler(self)
        tracker.close(left_installed)

    def _cuda_devices(self) -> list[int]:
        """The CUDA devices the model's parameters and buffers are on (its marks start
        there; ops add the devices they use)."""
        if self.model is None or not torch.cuda.is_available():
            return []
        devices = {cuda_index(t) for t in (*self.model.parameters(), *self.model.buffers())}
        return sorted(d for d in devices if d >= 0)

    def _on_meta(self) -> bool:
        """Whether the model lives on the meta device (shape-only counting: see
        ``meta.MetaRunner``): its first parameter is there (found without ``parameters()``'s
        walk of every module)."""
        todo = [self.model] if self.model is not None else []
        while todo:
            module = todo.pop()
            for p in module._parameters.values():
                if p is not None:
                    return p.is_meta
            todo.extend(reversed([m for m in module._modules.values() if m is not None]))
        return False

    # -- the result -----------------------------------------------------------------------
    def to_profile(self) -> Profile:
        """What this counter counted, as an immutable ``Profile``: the one made when the block
        ended (the same object on every call), or, inside the block, one of the counts so
        far."""
        if self._profile is not None:
            return self._profile
        if self._tracker is None:  # never entered
            if not self._warned and not type(self).__module__.startswith(
                    "dispatch_flops.compat."):
                self._warned = True
                _warn_user(f"this FlopCounter({self.root_label if self.model is not None else ''})"
                           " is read before it counted anything: it was never entered (with "
                           "FlopCounter(model) as fc: model(x)); its figures are all 0")
            return Profile((), ModuleFacts(), self._run_facts())
        if self._active:
            return self._make(self._capture())
        if self._captured is None:
            with LEDGERS_LOCK:  # the next counter on the model may be settling them now
                self._settle()
        assert self._captured is not None
        self._profile = self._make(self._captured)
        self._check_saw(self._profile)
        return self._profile

    def _check_saw(self, profile: Profile) -> None:
        """A ``CountingWarning`` when the finished block counted nothing, or when the model
        given never ran in it while other layers did (contractions under the root, in phase
        "other": usually another model was run; an optimizer step or a loss alone is no
        sign). Once per counter, when first read."""
        if type(self).__module__.startswith("dispatch_flops.compat."):
            return  # a drop-in (FlopCounterMode) keeps its original's silence
        calls = sum(counts[0] for _, counts in profile.rows)
        if not calls:
            _warn_user(f"this FlopCounter counted nothing: no aten op ran inside its block "
                       f"(was {self.root_label if self.model is not None else 'the model'} "
                       f"run outside the `with` block?); its figures are all 0")
            return
        if self.model is None or any(profile.module_facts.calls.values()):
            return
        phases = profile.by_phase()
        if phases["forward"].calls or phases["backward"].calls:  # e.g. compiled graphs
            return
        other = phases["other"].calls
        if phases["other"].macs:  # a layer's matmuls ran: not a lone optimizer step or loss
            _warn_user(f"FlopCounter({self.root_label}) counted {other:,} op calls, but "
                       f"{self.root_label} never ran inside the block: they all sit under the "
                       f"root, in phase 'other' (another model ran? count that one: "
                       f"FlopCounter(that_model))")

    def _settle(self) -> None:
        """Take this finished counter's counts from its ledger, once."""
        if self._captured is None:
            self._captured = self._capture()

    def _capture(self) -> tuple:
        """This counter's counts and module facts as they are now (cheap: no pricing)."""
        tracker, mode = self._tracker, self._mode
        assert tracker is not None and mode is not None  # entered: see to_profile
        if self._timer is not None and not self._active:
            self._timer.resolve()
        calls = _facts.call_counts(tracker)
        types, params = self._at_exit[1] if self._at_exit is not None and not self._active \
            else _facts.types_and_params(tracker)
        graph_runs, in_graphs = _compiled.graph_facts(tracker)
        timer = self._timer if not self._active else None  # resolved: its facts are in
        facts = ModuleFacts(
            names=_facts.names(tracker), types=types, params=params,
            calls=calls, spans=_facts.spans(tracker, calls) if self.timing else {},
            idle=_facts.spans(tracker, calls, timer.idle_of)
            if timer is not None and timer.measures_idle and timer.facts() else {},
            saved=self._saved.by_stack(tracker.ledger.frames) if self._saved is not None
            else {},
            graph_runs=graph_runs, in_graphs=in_graphs)
        counts = Captured(tracker.ledger, mode.resolved, self._timer is not None)
        return counts, facts, self._run_facts(
            pricing_errors=counts.errors,
            unvalued_masks=counts.unvalued_masks,
            dtensor_ops=mode.logical_ops(self.attention == "causal"),
            attention_calls=_facts.attention_calls(tracker, mode.resolved),
            parameters=_facts.parameter_groups(tracker, mode.resolved),
            pipeline=tracker.state.pipeline_actions(),
            experts=self._experts.facts() if self._experts is not None else (),
            kernels=timer.facts() if timer is not None else {})

    def _make(self, captured: tuple) -> Profile:
        counts, facts, run = captured
        tracker, mode = self._tracker, self._mode
        assert tracker is not None and mode is not None  # entered: see to_profile
        rows = counts.rows(self.attention == "causal")  # the deprecated option, applied here
        rows += _cuda_graphs.uncounted_rows(tracker)  # replays of graphs captured uncounted
        if self._timer is not None and not self._active:  # kernels no op launched
            rows += self._timer.outside_rows(tracker.ledger.frames, tracker.ledger.root.stack)
        trace = None
        if is_tracing(self._timer) and not self._active:
            trace = trace_events(self._timer, tracker.ledger, mode.resolved, self.root_label)
        # a run that counted what the ledger's last one did shares its views (same data)
        last = tracker.ledger.last
        profile = last.alike(rows, facts, run, trace) if last is not None else \
            Profile(rows, facts, run, trace=trace)
        if not self._active:
            tracker.ledger.last = profile
        return profile

    def _volatile_facts(self) -> dict:
        """The run's facts that may change after it: the model's dtype and device (its first
        floating parameter's), the rank and world size."""
        dtype, device = torch.float32, None
        first = _facts.first_parameter(self._tracker) if self._tracker is not None else None
        if first is None and self.model is not None:  # never entered: ask the model
            first = next(iter(self.model.parameters()), None)
        if first is not None:
            device = first.device
            if first.is_floating_point():
                dtype = first.dtype
        rank, world_size = _rank_and_world()
        return dict(rank=rank, world_size=world_size, dtype=str(dtype).replace("torch.", ""),
                    device=device.type if device is not None else None,
                    device_name=torch.cuda.get_device_name(device)
                    if device is not None and device.type == "cuda" else None)

    def _run_facts(self, **more) -> RunFacts:
        volatile = self._at_exit[0] if self._at_exit is not None and not self._active \
            else self._volatile_facts()
        return RunFacts(
            model=self.root_label, has_model=self.model is not None, attention=self.attention,
            timing=self.timing, saved_activations=self.saved_activations,
            wall_s=self.wall_s, allow_tf32=getattr(self, "_allow_tf32", False),
            **volatile, **more)

    # -- for workflows that follow a counter's block (generation steps, pipeline stages) -----
    @property
    def counting(self) -> bool:
        """Whether the block is running (entered and not yet exited)."""
        return self._active

    @property
    def state(self) -> CountingState:
        """What counting changes (``engine.counting.state``), for workflows that tell the counter
        about the work they run (``tag_transfer``, ``note_pipeline``). ``ValueError`` when
        the block is not running."""
        if not self._active or self._tracker is None:
            raise ValueError("the FlopCounter is not counting: use its state inside its block")
        return self._tracker.state

    @property
    def timer(self) -> Optional[Timer]:
        """The block's clock (``engine.timing.clock``: ``mark()``, ``span(...)``) when timing, else
        None."""
        return self._timer

    @property
    def block_start_ns(self) -> int:
        """When the block started, on the host clock of ``timer`` (``perf_counter_ns``);
        0 when not timing."""
        start = self._wall_start
        if self._timer is None or start is None:
            return 0
        return getattr(start, "ns", start)  # a CUDA mark keeps its host time

    def resolve_times(self) -> None:
        """Fold the times measured so far into the counts (CUDA events that completed):
        before reading ``to_profile()`` inside the block to compare with a later one."""
        if self._timer is not None:
            self._timer.resolve()

    @property
    def wall_s(self) -> Optional[float]:
        """Seconds from entering the block to leaving it (timing on), else ``None``."""
        if self._timer is None or self._active:
            return None
        self._timer.resolve()
        return self._wall[0] / 1e9

    def to_chrome_trace(self, path: PathLike) -> None:
        """Module calls and op calls on their timeline, as Trace Event Format JSON for
        Perfetto (ui.perfetto.dev) or chrome://tracing. Needs ``trace=True``; read after the
        block."""
        if self._active and self.trace:
            raise ValueError("the trace is read after the with block")
        super().to_chrome_trace(path)

    @classmethod
    def from_json(cls, path: PathLike) -> Profile:
        """The ``Profile`` a ``to_json`` file holds (``Profile.from_json``): every view,
        export and plot works on it."""
        return Profile.from_json(path)


def _rank_and_world() -> tuple:
    """(rank, world size) under an initialised torch.distributed, else (None, None)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None, None
    return dist.get_rank(), dist.get_world_size()


class _Settler:
    """How a ledger hands a finished counter its counts: ``settler()`` is the counter's
    ``_settle``, or None once the counter is gone. A plain weak reference with no callback,
    not a ``weakref.WeakMethod``: a WeakMethod's callbacks fire as the interpreter tears
    the class down and, its own reference already cleared, print "Exception ignored in:
    <function WeakMethod...> AttributeError: 'NoneType' object has no attribute '_alive'" at
    exit (issue 58, a Trainer with a FlopsCallback)."""

    __slots__ = ("_counter",)

    def __init__(self, counter: "FlopCounter"):
        self._counter = weakref.ref(counter)

    def __call__(self):
        counter = self._counter()
        return None if counter is None else counter._settle


class CountingWarning(UserWarning):
    """A counter read that saw nothing: never entered, nothing counted in its block, or the
    model it was given never ran there while other ops did (the figures are all 0, or all
    under the root). Silence it with ``warnings.simplefilter("ignore", CountingWarning)``
    where an empty block is expected."""


# where a counter is read through its views; a read from anywhere else in the package is a
# workflow's (profile_generate, paper_table, the drop-ins...), which checks what it needs
_VIEW_ROOMS = ("dispatch_flops.counter", "dispatch_flops.results.", "dispatch_flops.views.")


def _warn_user(message: str) -> None:
    """A ``CountingWarning`` at the first frame outside this package (the user's read); none
    when a workflow of this package is the reader (it says what went wrong its own way)."""
    level = 2
    frame: Optional[FrameType] = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not name.startswith("dispatch_flops."):
            break
        if not name.startswith(_VIEW_ROOMS):
            return
        level, frame = level + 1, frame.f_back
    warnings.warn(message, CountingWarning, stacklevel=level)


def _user_frame() -> Optional[FrameType]:
    """The innermost frame outside this package: where the user entered the counter (through
    a subclass or ``FlopsProfiler.start_profile`` too)."""
    frame: Optional[FrameType] = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__", "").startswith(
            "dispatch_flops."):
        frame = frame.f_back
    return frame


class _Parts:
    """What one ``__enter__`` installed, noted as each part comes to exist: ``steps`` takes
    them off again, in reverse, each step safe to run twice."""

    __slots__ = ("mode", "relay", "ledger", "tracker", "experts", "saved", "mode_entered",
                 "counting")

    def __init__(self, mode: CountingMode, relay):
        self.mode, self.relay = mode, relay
        self.ledger: Optional[Ledger] = None
        self.tracker: Optional[ModuleTracker] = None
        self.experts: Optional[ExpertLoad] = None
        self.saved: Optional[SavedActivations] = None
        self.mode_entered = self.counting = False

    def steps(self, counter: FlopCounter, exc: Optional[tuple]) -> list:
        """The undo steps: ``exc`` is the block's exception triple when the counter was
        entered (its exit), None when entering failed."""
        mode, tracker, saved = self.mode, self.tracker, self.saved
        steps: list = []
        if saved is not None:
            steps.append(saved.leave)
        if self.mode_entered:
            steps.append(lambda: exit_mode(mode, *(exc or (None, None, None))))
        if self.counting:
            steps.append(lambda: active.leave(mode))
        if tracker is not None:
            steps.append(tracker.detach)
        if self.experts is not None:
            steps.append(self.experts.detach)
        steps.append(lambda: unrelay(self.relay))
        if exc is not None and tracker is not None:
            steps += [counter._wall_ends, lambda: counter._closes(tracker)]
        elif tracker is not None:
            steps.append(lambda: tracker.close(tracker.mode_left_installed()))
        elif self.ledger is not None:
            ledger = self.ledger
            steps.append(lambda: setattr(ledger, "busy", False))
        return steps


def _undo(steps: list) -> Optional[BaseException]:
    """Run every step, each once more if it raised (an interrupt landing in it: the steps are
    safe to repeat); the first exception raised, or None."""
    first: Optional[BaseException] = None
    for step in steps:
        for _ in range(2):
            try:
                step()
                break
            except BaseException as e:
                if first is None:
                    first = e
    return first
