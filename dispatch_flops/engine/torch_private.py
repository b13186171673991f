"""Every private torch API the package touches, resolved here once, with what stops working
when a torch release renames one.

``TABLE`` has one ``Private`` per API: its dotted name, and the feature that is off without
it. ``NEEDED`` marks the ones nothing counts without (the dispatch mode itself, the mode
stack, autograd's sequence numbers, ...): a torch that lacks one fails ``import
dispatch_flops`` with an ``ImportError`` naming the API and the torch version. Every other
one has a fallback that keeps counting going with that feature off, and the first miss of a
feature gives one ``RuntimeWarning`` naming it (never an ``AttributeError`` in the user's
code). Most are resolved when this module is imported (what ``import torch`` has loaded
already); the ``lazy`` ones (dynamo's, which takes seconds to import) when first asked for
through ``lookup``. The rest of the package imports the APIs from here.

docs/internals.md, "torch's private APIs", lists the same table with why each is used;
tests/test_torch_private.py checks the two agree and simulates renames.
"""

from __future__ import annotations

import importlib
import os
import warnings
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Optional

import torch

NEEDED = "counting"  # an entry's feature when nothing counts without it
TESTED = "2.8 to 2.13"  # torch versions the package is tested on (docs/internals.md)

# the features a fallback turns off, as the warning names them
COMPILED = "compiled graphs not priced as graphs (only the ops they still dispatch count)"
COMPILE_HOOKS = ("compiles inside a counter's block trace its module hooks "
                 "(a graph break at every module call)")
STAYS_EAGER = "on torch < 2.9, a compiled model counted once runs eagerly afterwards"
SKIP = "torch's per-call dynamo wrapper stays around the counting mode (more cost per op)"
SAVED_HOOKS = ("checkpointing's recomputation counted as backward; saved-tensors hooks of "
               "your own not chained under saved_activations=True")
CUDA_STREAM = "CUDA timing looks each op's stream up in Python (more cost per op)"
NESTED = "jagged nested tensors not priced per sequence"
FLEX = "FlexAttention calls not counted whole"
FLEX_MASK = "FlexAttention mask_mod blocks counted as computed, not by the pairs they keep"
GROUPS = "collectives naming their group by string priced as on a group of one"
GATHER = "dispatch_flops.gather unavailable"
INTERRUPTED = ("an expert-load hook whose registration an interrupt cut short stays on "
               "its module")
DTENSOR = "DTensor logical figures may include sharding propagation's ops"
KERNEL_TIMING = 'timing="kernels" times module boundaries only (no op gets kernel time)'
GRAPH_NODES = ("CUDA graph replays' kernels are timed as rows under the module around the "
               "replay, not given to the ops captured")


class Private(NamedTuple):
    """A private torch API: ``name`` as docs/internals.md lists it; ``feature``, what is off
    without it (``NEEDED``: nothing counts); ``fallback``, what stands in; ``find``, how to
    reach it (default: the dotted name from ``torch``); ``applies``, whether this torch
    build should have it at all (CUDA, distributed); ``lazy``: resolved on first ``lookup``."""

    name: str
    feature: str
    fallback: Any = None
    find: Optional[Callable[[], Any]] = None
    applies: Optional[Callable[[], bool]] = None
    lazy: bool = False


def _from_torch(name: str):
    """``torch.a.b.C.d``: the longest leading part that is a module, then attributes;
    ``AttributeError`` or ``ImportError`` where torch has none."""
    parts = name.split(".")
    assert parts[0] == "torch", name
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for part in parts[i:]:
            obj = getattr(obj, part)
        return obj
    raise ImportError(name)


def _torch_file(relative: str) -> str:
    path = os.path.join(os.path.dirname(torch.__file__), *relative.split("/"))
    if not os.path.exists(path):
        raise ImportError(path)
    return path


def _distributed() -> bool:
    return torch.distributed.is_available()


def _cuda() -> bool:
    return torch.version.cuda is not None or torch.version.hip is not None


def _before_2_9() -> bool:  # no ignore_compile_internals: dynamo skips frames under a mode
    mode = _from_torch("torch.utils._python_dispatch.TorchDispatchMode")
    return not hasattr(mode, "ignore_compile_internals")


def _sample_node():
    with torch.enable_grad():
        return (torch.zeros(1, requires_grad=True) * 1).grad_fn


class _Absent:
    """Stands in for a missing class: nothing is an instance of it."""


class _LoneGroup:
    """Stands in for a process group torch can no longer resolve by name."""

    def size(self) -> int:
        return 1

    def rank(self) -> int:
        return 0


def _top_hooks_fallback(ignore_is_tensor_wrapper_subclass):
    return None


def _no_op(*args) -> None:
    return None


def _cuda_stream_fallback(device):
    return torch.cuda.current_stream(device).cuda_stream


def _mode_flags() -> bool:
    enter = _from_torch("torch.utils._python_dispatch.TorchDispatchMode.__enter__")
    if "old_dispatch_mode_flags" not in enter.__code__.co_names:
        raise AttributeError("TorchDispatchMode.old_dispatch_mode_flags")
    return True


_DISPATCH = "torch.utils._python_dispatch."
_HOOKS = "torch.nn.modules.module."
_OPTIM = "torch.optim.optimizer."
_C10D = "torch.distributed.distributed_c10d."
TABLE: tuple[Private, ...] = (
    # the dispatch mode and its stack
    Private(_DISPATCH + "TorchDispatchMode", NEEDED),
    Private(_DISPATCH + "_get_current_dispatch_mode_stack", NEEDED),
    Private(_DISPATCH + "_push_mode", NEEDED),
    Private(_DISPATCH + "_pop_mode", NEEDED),
    Private(_DISPATCH + "_disable_current_modes", NEEDED),
    Private(_DISPATCH + "is_in_torch_dispatch_mode", STAYS_EAGER, applies=_before_2_9),
    Private("TorchDispatchMode.old_dispatch_mode_flags",
            "counters exited out of order may leave torch's dispatch flags behind",
            find=_mode_flags),
    Private("torch._C._get_dispatch_mode", NEEDED),
    Private("torch._C._TorchDispatchModeKey", NEEDED),
    Private("torch._C._DisableTorchDispatch", NEEDED),
    Private("torch._C._AutoDispatchBelowAutograd", NEEDED),
    Private("torch._C._dispatch_has_kernel_for_dispatch_key", NEEDED),
    # ops
    Private("torch._ops.OpOverload", NEEDED),
    Private("torch._ops.OpOverloadPacket", NEEDED),
    Private("OpOverload._schema", NEEDED, find=lambda: torch.ops.aten.add.Tensor._schema),
    Private("OpOverload._overloadpacket", NEEDED,
            find=lambda: torch.ops.aten.add.Tensor._overloadpacket),
    Private("torch.Tensor._values", NEEDED),
    Private("torch.Tensor._indices", NEEDED),
    Private("torch._subclasses.fake_tensor.FakeTensorMode", NEEDED),
    Private("torch._subclasses.fake_tensor.FakeTensor", NEEDED),
    Private("torch.utils._pytree.tree_map_only", NEEDED),
    Private("torch.utils._pytree.tree_leaves", NEEDED),
    # autograd: backward ops to the module whose forward made their node
    Private("torch._C._current_autograd_node", NEEDED),
    Private("torch.autograd._get_sequence_nr", NEEDED),
    Private("Node._sequence_nr", NEEDED, find=lambda: _sample_node()._sequence_nr),
    Private("torch._C._autograd._top_saved_tensors_default_hooks", SAVED_HOOKS,
            fallback=_top_hooks_fallback),
    Private("torch._C._autograd._push_saved_tensors_default_hooks", SAVED_HOOKS,
            fallback=_no_op),
    Private("torch._C._autograd._pop_saved_tensors_default_hooks", SAVED_HOOKS,
            fallback=_no_op),
    Private("torch.utils.checkpoint._recomputation_hook",
            "non-reentrant checkpointing's recomputation counted as backward"),
    Private("torch.utils.checkpoint.CheckpointFunction",
            "reentrant checkpointing's recomputation counted as backward"),
    # modules
    Private("torch.nn.Module._modules", NEEDED, find=lambda: torch.nn.Module()._modules),
    Private("torch.nn.Module._parameters", NEEDED, find=lambda: torch.nn.Module()._parameters),
    Private("torch.nn.Module._get_name", NEEDED),
    Private("torch.nn.Module._forward_pre_hooks", INTERRUPTED,
            find=lambda: torch.nn.Module()._forward_pre_hooks),
    Private(_HOOKS + "_global_forward_pre_hooks", COMPILE_HOOKS),
    Private(_HOOKS + "_global_forward_hooks", COMPILE_HOOKS),
    Private(_HOOKS + "_global_forward_hooks_always_called", COMPILE_HOOKS),
    Private(_OPTIM + "_global_optimizer_pre_hooks", COMPILE_HOOKS),
    Private(_OPTIM + "_global_optimizer_post_hooks", COMPILE_HOOKS),
    # compiled graphs (dynamo: imported by torch.compile, never by this package)
    Private("torch._dynamo.output_graph.OutputGraph.call_user_compiler", COMPILED, lazy=True),
    Private("torch._dynamo.callback.callback_handler", COMPILE_HOOKS, lazy=True),
    Private("torch._dynamo.convert_frame.CatchErrorsWrapper.__call__", STAYS_EAGER,
            applies=_before_2_9, lazy=True),
    Private("torch._dynamo.types.FrameExecStrategy", STAYS_EAGER, applies=_before_2_9,
            lazy=True),
    Private("torch._dynamo.types.FrameAction", STAYS_EAGER, applies=_before_2_9, lazy=True),
    Private("torch._C._dynamo.eval_frame.set_code_exec_strategy", SKIP),
    Private("torch._C._dynamo.eval_frame._FrameExecStrategy", SKIP),
    Private("torch._C._dynamo.eval_frame._FrameAction", SKIP),
    # FlexAttention
    Private("torch._higher_order_ops.flex_attention.flex_attention", FLEX),
    Private("torch._higher_order_ops.flex_attention.flex_attention_backward", FLEX),
    Private("torch.nn.attention.flex_attention._vmap_for_bhqkv", FLEX_MASK, lazy=True),
    Private("torch._dynamo._trace_wrapped_higher_order_op.TransformGetItemToIndex",
            FLEX_MASK, lazy=True),
    # nested tensors, CUDA, distributed
    Private("torch.nested._internal.nested_tensor.NestedTensor", NESTED, fallback=_Absent),
    Private("torch._C._cuda_getCurrentStream", CUDA_STREAM, fallback=_cuda_stream_fallback,
            applies=_cuda),
    Private("torch._C._profiler._RecordFunctionFast", KERNEL_TIMING),
    Private("torch.autograd.profiler._prepare_profiler", KERNEL_TIMING),
    Private("torch.autograd.profiler._enable_profiler", KERNEL_TIMING),
    Private("torch.autograd.profiler._disable_profiler", KERNEL_TIMING),
    Private("torch.autograd._profiler_enabled", KERNEL_TIMING),
    Private("torch.cuda._graph_annotations", GRAPH_NODES, lazy=True),
    Private(_C10D + "_resolve_process_group", GROUPS, fallback=lambda name: _LoneGroup(),
            applies=_distributed),
    Private(_C10D + "_get_default_store", GATHER, applies=_distributed),
    Private("torch/distributed/tensor/_sharding_prop.py", DTENSOR, applies=_distributed,
            find=lambda: _torch_file("distributed/tensor/_sharding_prop.py")),
    # DTensor's propagation by decomposition came after torch 2.8 (2.8 has no such file)
    Private("torch/distributed/tensor/_decompositions.py", DTENSOR,
            applies=lambda: _distributed() and not _before_2_9(),
            find=lambda: _torch_file("distributed/tensor/_decompositions.py")),
    Private("torch/distributed/_functional_collectives.py", DTENSOR, applies=_distributed,
            find=lambda: _torch_file("distributed/_functional_collectives.py")),
)
BY_NAME = {p.name: p for p in TABLE}
assert len(BY_NAME) == len(TABLE), "a name listed twice"

_RESOLVED: dict[str, Any] = {}
# TABLE names to treat as missing: a torch that renamed them, simulated (tests)
HIDDEN = frozenset(filter(None, os.environ.get("DISPATCH_FLOPS_HIDE_PRIVATE", "").split(",")))
WARNED: set = set()  # features warned about (once each per process)


def _missing(private: Private, error: BaseException) -> Any:
    if private.feature == NEEDED:
        raise ImportError(
            f"dispatch_flops cannot count on torch {torch.__version__}: it has no "
            f"{private.name} (renamed or removed); the package is tested on torch "
            f"{TESTED} (docs/internals.md, \"torch's private APIs\")") from error
    if private.feature not in WARNED:
        WARNED.add(private.feature)
        warnings.warn(f"dispatch_flops: {private.feature}: torch {torch.__version__} "
                      f"renamed or removed {private.name}", RuntimeWarning, stacklevel=3)
    return private.fallback


def lookup(name: str) -> Any:
    """The API ``name`` (a ``TABLE`` name), or its fallback where this torch lacks it (the
    feature's warning, once); ``ImportError`` for a ``NEEDED`` one. Resolved once."""
    try:
        return _RESOLVED[name]
    except KeyError:
        pass
    private = BY_NAME[name]
    if private.applies is not None and not private.applies():
        found = private.fallback
    else:
        try:
            if name in HIDDEN:
                raise AttributeError(name)
            found = private.find() if private.find is not None else _from_torch(name)
        except (AttributeError, ImportError) as e:
            found = _missing(private, e)
    _RESOLVED[name] = found
    return found


def resolve() -> None:
    """Resolve every entry that is not ``lazy`` (again, after ``forget``)."""
    for private in TABLE:
        if not private.lazy:
            lookup(private.name)


def forget() -> None:
    """Drop what was resolved and warned (tests simulating a rename)."""
    _RESOLVED.clear()
    WARNED.clear()


resolve()

# what the rest of the package imports (bound once: the hot paths keep one global load);
# type checkers read torch's own declarations
if TYPE_CHECKING:
    from torch._C import _cuda_getCurrentStream as cuda_current_stream
    from torch._C import _current_autograd_node as current_autograd_node
    from torch._C._autograd import _pop_saved_tensors_default_hooks as pop_saved_tensors_hooks
    from torch._C._autograd import _push_saved_tensors_default_hooks as push_saved_tensors_hooks
    from torch._C._autograd import _top_saved_tensors_default_hooks as top_saved_tensors_hooks
    from torch._ops import OpOverload, OpOverloadPacket
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
    from torch.autograd import _get_sequence_nr as get_sequence_nr
    from torch.distributed.distributed_c10d import _resolve_process_group as resolve_process_group
    from torch.nested._internal.nested_tensor import NestedTensor
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._python_dispatch import _disable_current_modes as disable_current_modes
    from torch.utils._python_dispatch import (
        _get_current_dispatch_mode_stack as get_current_dispatch_mode_stack,
    )
    from torch.utils._python_dispatch import _pop_mode as pop_mode
    from torch.utils._python_dispatch import _push_mode as push_mode
    from torch.utils._pytree import tree_leaves, tree_map_only
else:
    TorchDispatchMode = lookup(_DISPATCH + "TorchDispatchMode")
    get_current_dispatch_mode_stack = lookup(_DISPATCH + "_get_current_dispatch_mode_stack")
    push_mode = lookup(_DISPATCH + "_push_mode")
    pop_mode = lookup(_DISPATCH + "_pop_mode")
    disable_current_modes = lookup(_DISPATCH + "_disable_current_modes")
    OpOverload = lookup("torch._ops.OpOverload")
    OpOverloadPacket = lookup("torch._ops.OpOverloadPacket")
    current_autograd_node = lookup("torch._C._current_autograd_node")
    get_sequence_nr = lookup("torch.autograd._get_sequence_nr")
    top_saved_tensors_hooks = lookup("torch._C._autograd._top_saved_tensors_default_hooks")
    push_saved_tensors_hooks = lookup("torch._C._autograd._push_saved_tensors_default_hooks")
    pop_saved_tensors_hooks = lookup("torch._C._autograd._pop_saved_tensors_default_hooks")
    FakeTensorMode = lookup("torch._subclasses.fake_tensor.FakeTensorMode")
    FakeTensor = lookup("torch._subclasses.fake_tensor.FakeTensor")
    tree_map_only = lookup("torch.utils._pytree.tree_map_only")
    tree_leaves = lookup("torch.utils._pytree.tree_leaves")
    NestedTensor = lookup("torch.nested._internal.nested_tensor.NestedTensor")
    cuda_current_stream = lookup("torch._C._cuda_getCurrentStream")
    resolve_process_group = lookup(_C10D + "_resolve_process_group")
