"""The dispatch mode: runs each op, then hands it to a cheap per-op recorder.

The per-op path is the hot path. It keeps only ints (never a tensor), resolves each
OpOverload once, and leaves all aggregation to report time.
"""

from __future__ import annotations

import inspect
import sys
import weakref
from bisect import bisect_right
from collections import OrderedDict
from functools import partial
from types import MethodType
from typing import Optional

import torch
from torch import Tensor

from dispatch_flops.engine.counting import flex as _flex
from dispatch_flops.engine.counting.calls import (
    EXOTIC,
    FLOAT,
    FORMULA,
    KEYWORDS,
    KWARGS,
    MOVEMENT_KIND,
    STRIDED,
    TOLD_APART,
    UNKNOWN,
    Exotic,
    Keyword,
    Resolved,
    key_of,
    remembered,
)
from dispatch_flops.engine.counting.calls import keyword_signature as _keyword_signature
from dispatch_flops.engine.counting.calls import work_out as _work_out  # a test patches it here
from dispatch_flops.engine.counting.dtensor import LogicalFigure
from dispatch_flops.engine.counting.dtensor import unwrapping as _unwrapping
from dispatch_flops.engine.counting.exotic import exotic_record
from dispatch_flops.engine.counting.ledger import RECOMPUTE_I, phase_of
from dispatch_flops.engine.counting.records import (
    CALLS,
    NS,
    SIGNATURE,
    Signature,
    engine_cache,
)
from dispatch_flops.engine.counting.skip import SKIP_FRAMES as _SKIP_FRAMES
from dispatch_flops.engine.counting.state import CountingState
from dispatch_flops.engine.counting.tracker import ACCUMULATE_GRAD_SEQ as _ACCUMULATE_GRAD_SEQ
from dispatch_flops.engine.counting.tracker import ModuleTracker
from dispatch_flops.engine.masks.fake_runs import FAKE_RUNS as _FAKE_RUNS
from dispatch_flops.engine.masks.tally import TALLY
from dispatch_flops.engine.torch_private import NestedTensor as _Jagged
from dispatch_flops.engine.torch_private import TorchDispatchMode
from dispatch_flops.engine.torch_private import current_autograd_node as _current_node
from dispatch_flops.engine.torch_private import disable_current_modes as _disable_current_modes
from dispatch_flops.engine.torch_private import (
    get_current_dispatch_mode_stack as _get_current_dispatch_mode_stack,
)
from dispatch_flops.engine.torch_private import pop_mode as _pop_mode
from dispatch_flops.engine.torch_private import push_mode as _push_mode
from dispatch_flops.engine.torch_private import top_saved_tensors_hooks as _top_saved_tensors_hooks
from dispatch_flops.formulas import (
    Category,
    Registry,
)
from dispatch_flops.results.stats import PRICED

# the hot path builds records as literals, [0, 0, signature], and indexes them with literals
# (a global's load per op is measurable): in the order named here
assert (CALLS, NS, SIGNATURE) == (0, 1, 2)
_BACKWARD_I = phase_of(node=True, recompute=False, optimizer=False)
_REENTRANT_I = phase_of(node=True, recompute=True, optimizer=False)

# how torch.utils.checkpoint shows it is re-running forward inside backward: non-reentrant,
# under its recomputation saved-tensors hook; reentrant, inside its autograd Function's node
_RECOMPUTATION_HOOK = "_recomputation_hook.__init__.<locals>.pack_hook"
_REENTRANT = "CheckpointFunctionBackward"
# each autograd node class's backward phase (an index into PHASES): the reentrant node's is
# recompute. Asked once per class: a node's name() is a C++ call and a new string
_NODE_PHASE: dict = {}


def node_phase(node) -> int:
    if len(_NODE_PHASE) > 4096:  # autograd Function classes made on the fly: bounded
        _NODE_PHASE.clear()
    phase = _NODE_PHASE[node.__class__] = _REENTRANT_I if node.name() == _REENTRANT \
        else _BACKWARD_I
    return phase


_COMMUNICATION = Category.COMMUNICATION
# What a signature asks of each argument first: is it a tensor. ``isinstance(a, Tensor)``
# answers at once only for a plain tensor; for anything else (a parameter, an int, a list)
# it calls the tensor metaclass's ``__instancecheck__``, as dear as reading the tensor's
# shape. So the classes an aten argument most often has are told apart by identity.
_PARAMETER = torch.nn.Parameter
_NOT_TENSORS = frozenset((int, float, bool, complex, str, list, tuple, type(None),
                          torch.dtype, torch.device, torch.layout, torch.memory_format))


def _call_entry(shared: OrderedDict, sig: tuple, resolved, args, kwargs, out) -> Signature:
    """What ``_work_out`` gives for ``sig``, from ``shared`` (every counter's: models repeat
    shapes across layers and steps, so a signature is worked out, and priced, once) when it
    is there. Pure data (shapes, ints), never a tensor. Called when a record is made, never
    per op: a record, once made, holds its signature."""
    return remembered(shared, sig, lambda: _work_out(resolved, args, kwargs, out))


def _decomposed(registry_ref, func, signature: Signature, args, kwargs) -> None:
    """Price ``signature`` (a call of composite op ``func`` with ``args``) by what its
    decomposition counts: the composite's kernel run on fake copies of the tensors (same
    shapes, dtypes and device, no data), under a counting mode of its own, as no_grad would
    run it. Its bytes stay the composite's
    own (inputs read, outputs written: what a fused kernel would move). A decomposition
    that fails leaves the call priced by the op's formula, or unsupported."""
    from dispatch_flops.engine.torch_private import FakeTensorMode

    fake = FakeTensorMode(allow_non_fake_inputs=True)
    fake.cache_enabled = False  # torch's cache is process-wide: an entry per shape, kept

    def to_fake(v):
        if isinstance(v, Tensor):
            return fake.from_tensor(v)
        return [to_fake(x) for x in v] if v.__class__ in (list, tuple) else v

    registry = registry_ref()
    if registry is None:  # the registry is gone: so is every counter resolving with it
        return
    inner = CountingMode(registry)
    try:
        # every other mode off: this fake run's ops are not the user's (a counter below
        # this one would count them)
        with _disable_current_modes():
            fake_args = [to_fake(a) for a in args]
            fake_kwargs = {k: to_fake(v) for k, v in (kwargs or {}).items()}
            with torch.no_grad(), fake, inner:  # fake tensors keep the device: same kernels
                # the C++ composite kernel, as eager runs it (``decompose`` would prefer a
                # Python decomposition registered for tracing, which may differ)
                func._op_dk(torch._C.DispatchKey.CompositeImplicitAutograd, *fake_args,
                            **fake_kwargs)
        totals = dict.fromkeys(("flops", "macs", "masked_flops", "masked_macs"), 0)
        for key, rec in inner.state.forward_acc.items():
            if rec[SIGNATURE] is not None:
                op = key if key.__class__ is int else key[0]
                unit = dict(zip(PRICED, rec[SIGNATURE].unit(inner.resolved[op])))
                for name in totals:
                    totals[name] += rec[CALLS] * unit[name]
                if len(rec) > TALLY:  # a tally's hardware-only share (dropout's noise)
                    tally = rec[TALLY]
                    masked = tally.read()[0]  # over every call already
                    totals["masked_flops"] += masked * tally.flops_rate
                    totals["masked_macs"] += masked * tally.macs_rate
    except Exception:  # data-dependent, or a kernel meta cannot run: the formula prices
        return
    # the masked share too (an is_causal SDPA's): model flops as the kernel's own call has
    signature.set_cost(**totals)


class CountingMode(TorchDispatchMode):
    """Counts every op into the accumulators of the tracker's frames: ``frame.acc[phase]
    [id(overload) or signature]`` is an op record (see ``records``). ``tracker`` keeps
    ``forward_acc`` pointed at the running frame's accumulator for ops with no autograd node
    (forward, optimizer, recompute); see ``ledger.phase_of``.

    Dicts on the hot path are keyed by ``id(func)``: ``OpOverload.__hash__`` is a Python-level
    call, and overloads are long-lived singletons (``resolved[id].func`` keeps each alive)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps each mode's __torch_dispatch__ in torch._disable_dynamo, so that
        # torch.compile never traces it: two Python frames and four eval-frame switches on every
        # op, as much as a fifth of what a do-nothing mode costs. Where this torch can, the same
        # guarantee is given once instead, to the code object (below the class).
        return _SKIP_FRAMES is None

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # torch.compile compiles under this mode (every mode is off while it compiles) and
        # runs the compiled code under it, instead of skipping the frame and caching the skip
        # (pytorch#190286); compiled graphs count through graphs.compiled.Graph
        return True

    def __init__(self, registry: Registry, runner=None):
        super().__init__()
        # runs each op when not None: a timing.Timer (timing on) or a meta.MetaRunner, or a
        # runner put around it (``wrap_runner``); its add(record, NS, token) counts the call
        self.runner = runner
        self.registry = registry
        # resolutions and worked-out signatures, shared by every counter on the same registry
        # version (the engine's cache: a registration starts a new one)
        cache = engine_cache(registry)
        self.resolved = cache.resolutions
        self._shared = cache.signatures
        # DTensor-level calls worked out, shared like the signatures (engine.counting.dtensor)
        self.logical_signatures = cache.logical
        # the runners put around the mode's own, innermost first (``wrap_runner``)
        self._wrappers: list = []
        # what counting changes (the counter's, handed over by ``bind``; a mode of its own
        # until then: a composite's fake run counts into it)
        self.state = CountingState()
        self._boundary_seqs: list = self.state.boundary_seqs
        self._boundary_frames: list = self.state.boundary_frames
        self._book: list = self.state.records
        self.tracker: Optional[ModuleTracker] = None  # see bind; None again once it closes
        # DTensor's logical figure (engine.counting.dtensor): made when the first DTensor is met
        self.dtensor: Optional[LogicalFigure] = None

    def bind(self, tracker: ModuleTracker, state: CountingState) -> None:
        """Count into ``state`` (the counter's), taking backward frames from ``tracker``,
        which keeps ``state.forward_acc`` current."""
        self.tracker = tracker
        self.state = state
        # aliases the hot path reads in one load: lists changed in place, never replaced
        self._boundary_seqs = state.boundary_seqs  # the tracker appends; we only bisect
        self._boundary_frames = state.boundary_frames
        self._book = state.records  # every record made goes here too (see Ledger)

    def unbind(self) -> None:
        """Counting is over: no cycle left for the garbage collector to find (mode and
        tracker), nor the last autograd node kept alive."""
        self.tracker = None
        self.state.forget_node()

    # -- the runner stack ------------------------------------------------------------------
    def wrap_runner(self, make):
        """Put ``make(runner)`` around the runner the mode has now (a nested counter's relay,
        a CUDA graph capture's annotation) and return it; ``unwrap_runner`` takes it off
        again, in any order. A wrapper keeps what it wraps as its ``runner``."""
        wrapper = make(self.runner)
        self._wrappers.append(wrapper)
        self.runner = wrapper
        return wrapper

    def unwrap_runner(self, wrapper) -> None:
        """Take ``wrapper`` (from ``wrap_runner``) off, wherever it sits in the stack: the
        wrapper put around it, if any, wraps what it wrapped. Taken off already: nothing."""
        stack = self._wrappers
        at = next((i for i, w in enumerate(stack) if w is wrapper), None)
        if at is None:
            return
        del stack[at]
        if at < len(stack):
            stack[at].runner = wrapper.runner
        else:
            self.runner = wrapper.runner

    def runners(self) -> list:
        """The runner stack, outermost first, down to the mode's own runner (not None)."""
        found = list(reversed(self._wrappers))
        own = self._wrappers[0].runner if self._wrappers else self.runner
        return found + ([own] if own is not None else [])

    # -- DTensor ----------------------------------------------------------------------------
    def divert(self, handler) -> None:
        """From now on, every op reaches ``handler(mode, func, types, args, kwargs)`` instead
        of the hot path (which it calls through ``counted``): DTensor's logical figure, once a
        DTensor was met (``engine.counting.dtensor``). Only a diverted mode pays for the handler's
        checks; every other mode keeps the plain hot path."""
        # an instance attribute shadows the class's __torch_dispatch__ (torch looks it up on
        # the mode object); torch asks that it be a method of the mode itself
        self.__dict__["__torch_dispatch__"] = MethodType(handler, self)

    @property
    def diverted(self) -> bool:
        """Whether ops go to a ``divert`` handler."""
        return "__torch_dispatch__" in self.__dict__

    def counted(self, func, types, args=(), kwargs=None):
        """The hot path (the class's ``__torch_dispatch__``), for a ``divert`` handler."""
        return type(self).__torch_dispatch__(self, func, types, args, kwargs)

    def dtensor_figure(self) -> LogicalFigure:
        """DTensor's logical figure of this mode's calls, made when first asked for."""
        figure = self.dtensor
        if figure is None:
            figure = self.dtensor = LogicalFigure(self)
        return figure

    def follow_local_tensors(self, holds_dtensor: bool) -> None:
        """Follow plain-tensor ops into the logical figure from the first op on, when the
        model holds DTensor parameters (tensor parallelism, FSDP2: ``holds_dtensor``):
        otherwise from the first DTensor met
        (``LogicalFigure.run_sharding_propagation_uncounted``)."""
        if holds_dtensor:
            self.dtensor_figure().run_sharding_propagation_uncounted()

    def logical_ops(self, skipping_causal: bool = False) -> tuple:
        """See ``LogicalFigure.logical_ops``: () for a mode that met no DTensor."""
        if self.dtensor is None:
            return ()
        return self.dtensor.logical_ops(skipping_causal)

    def _recheck(self, caller) -> None:
        """An op with no autograd node (``caller``: its Python caller) while the tracker is in
        a state that may have ended without the hook that ends it: a recomputation (it runs
        only inside backward: a BaseException ended it, and torch runs no always-call hook for
        those) or an optimizer step (one that raised ran no post-hook). Asked only then: the
        ops of other phases keep the plain path."""
        tracker, state = self.tracker, self.state
        if tracker is None:
            state.unbound()
            return
        if state.recomputing:
            tracker.end_recompute()
        if not state.stepping:
            return
        # The frames between an op and its step, seen once, stay inside the step while they
        # run (a function's callers are fixed); an optimizer runs its ops from a few of them,
        # so an op's caller, or one a frame or two above it, is known. Inside the step one
        # always is (the step's own frame): none means the step is over.
        frame, known = caller, state.in_step
        if known:
            while frame is not None and frame not in known:
                frame = frame.f_back
        if frame is None or not known:
            state.seen_in_step(tracker.check_steps(caller))

    guarded = False  # counts only while its block's frame runs (GuardedCountingMode)

    # -- attribution ------------------------------------------------------------------------
    def node_frame(self, node, seq: int) -> tuple:
        """``(frame, phase index)`` of the ops autograd node ``node`` (numbered ``seq``) runs:
        the frame entered last before the node was made (``state.boundary_*``), its phase the
        node class's (reentrant checkpointing re-runs forward inside its own node's backward:
        recompute); AccumulateGrad nodes all carry one sequence number and go to their
        parameter's module. The one rule of backward attribution: the hot path asks it for
        each new node, ``attribution`` for the calls that reach the mode another way."""
        if seq == _ACCUMULATE_GRAD_SEQ:
            tracker = self.tracker
            assert tracker is not None  # a mode counts only while bound to one
            return tracker.frame_of_accumulation(node), _BACKWARD_I
        frame = self._boundary_frames[bisect_right(self._boundary_seqs, seq) - 1]
        phase = _NODE_PHASE.get(node.__class__)
        return frame, (phase if phase is not None else node_phase(node))

    def attribution(self) -> Optional[tuple]:
        """``(frame, accumulator)`` an op run now counts into, as the hot path finds it (which
        inlines the common cases): for calls that reach the mode outside ``__torch_dispatch__``
        (the flex operators, ``counting.flex``) and compat's ``FlopCounterMode`` (a torch-format
        formula's flops). None when the mode is not bound to a tracker."""
        tracker = self.tracker
        if tracker is None:
            return None
        node = _current_node()
        if node is None or self.state.recomputing:
            return tracker.current, self.state.forward_acc
        seq = node._sequence_nr()
        frame, phase = self.node_frame(node, seq)
        acc = frame.acc[phase]
        if seq != _ACCUMULATE_GRAD_SEQ:
            hooks = _top_saved_tensors_hooks(False)
            if hooks is not None and hooks[0].__qualname__ == _RECOMPUTATION_HOOK:
                frame = self._recompute_frame(hooks[0], seq)
                acc = frame.acc[RECOMPUTE_I]
        return frame, acc

    def current_acc(self) -> Optional[dict]:
        """The accumulator of ``attribution``, None when unbound."""
        found = self.attribution()
        return None if found is None else found[1]

    def keep_resolution(self, key: int, resolved: "Resolved") -> None:
        """Keep ``resolved`` under ``key`` unless one is kept there: an op that reaches the
        mode another way (a FlexAttention operator, ``engine.counting.flex``), a call's
        unsupported twin (``engine.counting.exotic``)."""
        self.resolved.setdefault(key, resolved)

    def book(self, rec: list) -> None:
        """Keep a record made outside the hot path in the ledger's book (see ``bind``)."""
        self._book.append(rec)

    def _recompute_frame(self, hook, seq: int):
        """Where an op that non-reentrant checkpointing re-runs outside any module call goes
        (in its recompute phase): the frame holding the modules this recomputation (``hook``)
        re-ran (the checkpointed function's module), or, before any, the unpacking node's
        frame."""
        home_hook, home = self.state.recompute_home
        if home_hook is not hook:
            home = self._boundary_frames[bisect_right(self._boundary_seqs, seq) - 1]
        return home

    def resolve(self, func) -> Resolved:
        """What the mode knows of overload ``func``, worked out once (``resolved``)."""
        entry = self.registry.lookup(func)
        formula = entry.formula
        keywords: tuple[Keyword, ...] = ()
        if formula is not None:  # a formula, an estimate, or a no-arithmetic op's bytes
            kind = FORMULA
            parameters = inspect.signature(formula).parameters
            keywords = tuple(keyword for keyword in KEYWORDS if keyword.name in parameters)
        elif entry.category is Category.NO_ARITHMETIC:
            kind = MOVEMENT_KIND[entry.movement]
        else:
            kind = UNKNOWN
        write_only = frozenset(
            a.name
            for a in func._schema.arguments
            if a.kwarg_only and a.alias_info is not None and a.alias_info.is_write
        )
        out_in_signature = (
            torch.Tag.dynamic_output_shape in func.tags or func.namespace != "aten"
        )
        resolved = Resolved(func, entry.category, kind, formula, keywords, write_only,
                             out_in_signature)
        resolved.dtype = entry.dtype
        if any(keyword.signed for keyword in keywords):
            # their values join the signature (a call's price depends on them)
            resolved.out_in_signature = True
            resolved.signed = _keyword_signature
        if _decomposable(func, entry):
            resolved.category, resolved.kind = Category.EXACT, FORMULA
            # the registry weakly: a resolution lives in the engine's cache for the registry,
            # kept weakly by it; a strong reference back would keep each registry (a drop-in
            # builds one a call) and its ledgers as long as the process (issue 56)
            resolved.decompose = partial(_decomposed, weakref.ref(self.registry), func)
        self.resolved[id(func)] = resolved
        return resolved

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # The hot path: runs for every aten op. Keep it flat (no helper calls in the common
        # case) and keep only ints. Records are [calls, ns, signature] (see records): calls
        # and times counted here, flops and bytes by the signature when it is read.
        if types:  # plain tensors: types == ()
            unwrapping = _unwrapping(types)
            if unwrapping is not None:  # it runs the op first: the mode says NotImplemented
                if unwrapping == "DTensor":  # its logical figure: engine.counting.dtensor
                    figure = self.dtensor or self.dtensor_figure()
                    figure.logical(func, args, kwargs)
                    figure.run_sharding_propagation_uncounted()
                return NotImplemented
        key = id(func)
        resolved = self.resolved.get(key)
        if resolved is None:
            resolved = self.resolve(func)
        runner = self.runner
        if runner is None:
            out = resolved.run(*args, **kwargs) if kwargs else resolved.run(*args)
        else:
            out, elapsed = runner.run(resolved, args, kwargs)
        node = _current_node()
        state = self.state  # one load; then one per part read (engine.counting.state)
        if node is None:
            if state.recomputing or state.stepping:  # see _recheck
                caller = sys._getframe(1)
                if state.recomputing or caller not in state.in_step:
                    self._recheck(caller)
                replay = state.replay
                if replay is not None:  # a step replayed: its calls are known by overload
                    replay[key] = replay.get(key, 0) + 1  # (engine.counting.step_replay)
                    return out
            acc = state.forward_acc
            if state.p2p_tags and resolved.category is _COMMUNICATION:  # see p2p_tags
                acc = state.take_tag(args, acc)
        elif state.recomputing:  # the tracker points forward_acc at the recomputation
            acc = state.forward_acc
        else:
            last = state.last  # one read: device threads never see half an update
            if node is last[0]:  # a node runs several ops in a row (the same object while
                acc, seq = last[1], last[2]  # it lives: last keeps it alive)
            else:  # a new node: where its ops go (node_frame)
                seq = node._sequence_nr()
                frame, phase = self.node_frame(node, seq)
                acc = frame.acc[phase]
                state.last = (node, acc, seq)
            if seq != _ACCUMULATE_GRAD_SEQ:  # AccumulateGrad saves nothing: never re-runs
                hooks = _top_saved_tensors_hooks(False)
                if hooks is not None and hooks[0].__qualname__ == _RECOMPUTATION_HOOK:
                    acc = self._recompute_frame(hooks[0], seq).acc[RECOMPUTE_I]
        if resolved.view:  # no arithmetic, no bytes: count the call
            rec = acc.get(key)
            if rec is None:
                rec = acc[key] = [0, 0, None]
                self._book.append(rec)
        else:
            # An op's flops and bytes are functions of its signature: the op and its arguments
            # as shapes and dtypes, plus strides where the tensor is not contiguous (an
            # expanded one reads fewer bytes than its shape says). Count calls per signature
            # here; each distinct one is worked out once (``_call_entry``) and priced when
            # results are read. Sparse, nested and symbolically sized tensors take the slow
            # path (sparse COO is the one that would key like a dense tensor: checked here;
            # the others raise on the way).
            try:
                # a jagged tensor answers shape and is_contiguous() through dispatch, where a
                # mode below would see them: straight to the slow path, which reads metadata
                if types and _Jagged in types:
                    raise EXOTIC
                sig: list = [key]
                for a in args:
                    cls = a.__class__
                    if cls is Tensor or cls is _PARAMETER or \
                            cls not in _NOT_TENSORS and isinstance(a, Tensor):
                        sig.append(a.shape)
                        sig.append(a.dtype)
                        if not a.is_contiguous():  # a sparse COO tensor never is
                            if a.is_sparse:
                                raise EXOTIC
                            sig.append(STRIDED)
                            sig.append(a.stride())
                    elif cls is list or cls is tuple:
                        # an int[] (sizes, dims; an aten list holds one type) as it is: a
                        # sixth of the signature's time went into keying them one by one
                        sig.append(tuple(a) if not a or a[0].__class__ is int else key_of(a))
                    elif cls is float and a not in TOLD_APART:
                        sig.append(FLOAT)
                    else:
                        sig.append(a)
                if kwargs:  # after a marker no argument can be: names and keys in a row
                    sig.append(KWARGS)
                    for k, v in kwargs.items():
                        sig.append(k)
                        cls = v.__class__
                        if cls is float:  # the optimizers' alpha=, value=
                            sig.append(v if v in TOLD_APART else FLOAT)
                        elif cls is list or cls is tuple or cls is Tensor or \
                                cls not in _NOT_TENSORS and isinstance(v, Tensor):
                            sig.append(key_of(v))
                        else:  # dtype=, device=, layout=, memory_format=: as key_of keys them
                            sig.append(v)
                if resolved.out_in_signature:  # see Resolved.signed
                    sig = resolved.signed(sig, resolved, args, out)
                elif (cls := out.__class__) is Tensor or cls is _PARAMETER or \
                        cls not in _NOT_TENSORS and isinstance(out, Tensor):
                    sig.append(out.dtype)  # a scalar's type or the default dtype sets it
                signature = tuple(sig)
                rec = acc.get(signature)
                if rec is None:  # the record keeps its signature, worked out once
                    rec = acc[signature] = [0, 0, _call_entry(self._shared, signature,
                                                              resolved, args, kwargs, out)]
                    self._book.append(rec)
            except (Exotic, RuntimeError, TypeError):
                rec = exotic_record(self, key, resolved, acc, args, kwargs, out)
        if resolved.tally is not None:  # a mask's values: see engine.masks
            resolved.tally(rec, args, kwargs, out)
        if resolved.shadow is not None and (out.__class__ is Tensor and out.is_meta or
                                            _FAKE_RUNS):  # masks built from shapes
            resolved.shadow(rec, args, kwargs, out)
        if runner is None:
            rec[0] += 1  # CALLS
        else:  # the runner counts the call and its time (NS), under a lock where it needs one
            runner.add(rec, 1, elapsed)
        return out


def _decomposable(func, entry) -> bool:
    """Whether ``func`` is a composite (CompositeImplicitAutograd: it reaches the mode whole
    only under inference_mode) priced by counting its decomposition: one with a built-in
    formula, an estimate, or none (a formula of the user's is kept; a no-arithmetic op stays
    one)."""
    if entry.category is Category.NO_ARITHMETIC or func.namespace != "aten":
        return False
    if entry.category is Category.EXACT and not getattr(
            entry.formula, "__module__", "").startswith("dispatch_flops.formulas"):
        return False
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(func.name(),
                                                              "CompositeImplicitAutograd")
    except RuntimeError:  # an overload with no C++ registration (a Python-only twin)
        return False


class GuardedCountingMode(CountingMode):
    """A counting mode whose block a generator or coroutine owns (``tracker.block_frame``):
    while that frame is suspended, other code on its thread (the loop's other tasks, the
    generator's consumer) runs under this mode too; those ops are run, not counted (see
    ``ModuleTracker.sees``)."""

    guarded = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        tracker = self.tracker
        assert tracker is not None  # a mode counts only while bound to its tracker
        if not tracker.sees(sys._getframe()):
            return func(*args, **kwargs) if kwargs else func(*args)
        return CountingMode.__torch_dispatch__(self, func, types, args, kwargs)


def exit_mode(mode: TorchDispatchMode, exc_type=None, exc=None, tb=None) -> None:
    """Take ``mode`` off the dispatch mode stack wherever it is. Counters exited out of order
    (``a.__enter__(); b.__enter__(); a.__exit__()``) would otherwise pop ``b``'s mode and
    leave ``a``'s counting: the modes above it are taken off and put back, and the lowest of
    them inherits the dispatch flags ``mode`` saved on entry (torch restores them in LIFO
    order)."""
    stack = _get_current_dispatch_mode_stack()
    if stack and stack[-1] is mode:
        mode.__exit__(exc_type, exc, tb)
        return
    if not any(m is mode for m in stack):
        return
    above = []
    while True:
        top = _pop_mode()
        if top is mode:
            break
        above.append(top)
    lowest = above[-1]
    for flags in ("old_dispatch_mode_flags", "old_non_infra_dispatch_mode_flags",
                  "old_without_ignore_compile_internals_dispatch_mode_flags"):
        mine, theirs = getattr(mode, flags, None), getattr(lowest, flags, None)
        if mine and theirs:
            theirs[-1] = mine.pop()
    for m in reversed(above):
        _push_mode(m)


# FlexAttention's operators reach the modes as themselves: counted whole (engine.counting.flex)
_flex.install(CountingMode, GuardedCountingMode)

if _SKIP_FRAMES is not None:
    _SKIP_FRAMES(CountingMode.__torch_dispatch__.__code__)
    _SKIP_FRAMES(GuardedCountingMode.__torch_dispatch__.__code__)
