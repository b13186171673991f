"""Module facts for a counter's result (``results.profile.ModuleFacts``): the module names,
types, parameter counts, forward calls and time spans, read from a ``ModuleTracker`` and its
ledger when a result is made, never while counting; so are the facts about the model's
modules that ``RunFacts`` keeps (attention calls, parameter groups).

>>> calls = call_counts(tracker)
>>> ModuleFacts(names=names(tracker), calls=calls, spans=spans(tracker, calls), ...)
"""

from __future__ import annotations

import weakref
from typing import Callable, Optional, Sequence

from torch import nn

from dispatch_flops.engine.counting.ledger import Frame
from dispatch_flops.engine.counting.nested import PerSequence
from dispatch_flops.engine.counting.records import CALLS, SIGNATURE
from dispatch_flops.engine.counting.tracker import ModuleTracker
from dispatch_flops.engine.model.expert_load import expert_layers
from dispatch_flops.results.stats import PHASES, ROOT, Phase, static_prefixes


def names(tracker: ModuleTracker) -> tuple[str, ...]:
    """The model's module names in ``named_modules()`` order; without a model, the root's
    and those of the modules named as they were called (``every_module``), or the root's
    alone."""
    if tracker.model is None:
        return (ROOT,) + tracker.module_names()
    return tracker.module_names()


def types_and_params(tracker: ModuleTracker) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Each module's class name and parameters (``sum(p.numel() for p in
    module.parameters())``), in ``names()`` order; kept with the model's facts while its
    modules and parameters stay the same (``engine.counting.model_cache``)."""
    modules = tracker.modules()
    if not modules:
        return ("",), (0,)
    if tracker.every_module:  # the root: everything, no module of its own
        types = ("",) + tuple(type(m).__name__ for m in modules)
        return types, (0,) + tuple(sum(p.numel() for p in m.parameters()) for m in modules)
    facts = tracker.model_facts
    assert facts is not None, "a tracker with a model walked it on entry"
    return facts.get("types_and_params", lambda: (
        tuple(type(m).__name__ for m in modules),
        tuple(sum(p.numel() for p in m.parameters()) for m in modules)))


def first_parameter(tracker: ModuleTracker) -> Optional[nn.Parameter]:
    """The model's first floating parameter (its first parameter if none is floating; None
    without one), read from the modules walked on entry."""
    first = None
    for module in tracker.modules():
        for p in module._parameters.values():
            if p is not None:
                if p.is_floating_point():
                    return p
                first = first if first is not None else p
    return first


def call_counts(tracker: ModuleTracker) -> dict[str, int]:
    """Forward calls of each module, over all the frames it ran in."""
    counts: dict[str, int] = {ROOT: tracker.root_calls}
    for frame in tracker.ledger.frames:
        if frame.calls:
            counts[frame.name] = counts.get(frame.name, 0) + frame.calls
    return counts


def _span_of(frame: Frame) -> int:
    return frame.span[0]


def spans(tracker: ModuleTracker, calls: dict[str, int],
          value: Optional[Callable[[Frame], int]] = None) -> dict[str, int]:
    """ns inside each module's forward calls (timing on), or ``value(frame)`` of each (the
    idle time inside them: ``KernelTimer.idle_of``). A module re-entered by itself counts
    once (only frames with no ancestor of the same name count); a container that is never
    called itself (ModuleList) gets the sum of the modules it holds."""
    if value is None:
        value = _span_of
    out: dict[str, int] = {}
    root = tracker.root
    root_called = bool(tracker.root_calls)
    todo: list[tuple[Frame, frozenset[str]]] = [(root, frozenset())]
    while todo:
        frame, above = todo.pop()
        if (frame is not root and frame.calls) or (frame is root and root_called):
            if frame.name not in above:
                ns = value(frame)
                out[frame.name] = out.get(frame.name, 0) + ns
                parent = frame.parent.name if frame.parent is not None else None
                for prefix in static_prefixes(frame.name)[:-1]:
                    if not calls.get(prefix) and prefix not in above and not (
                        parent is not None and (parent + ".").startswith(prefix + ".")
                    ):
                        out[prefix] = out.get(prefix, 0) + ns
        inner = above | {frame.name}
        todo.extend((child, inner) for child in frame.children.values())
    return out


# -- what the MFU conventions read (``results.conventions``): attention calls, parameters ----
# The fused attention ops: where ``is_causal`` is among their arguments, and for the kernels
# (q, k, v [b, s, h, d], not SDPA's [b, h, s, d]) where their packed sequences' offsets are
_FUSED_ATTENTION = {
    "aten._scaled_dot_product_flash_attention_for_cpu.default": (4, None),
    "aten._scaled_dot_product_flash_attention.default": (4, None),
    "aten._scaled_dot_product_efficient_attention.default": (6, None),
    "aten._scaled_dot_product_cudnn_attention.default": (6, None),
    "aten._scaled_dot_product_fused_attention_overrideable.default": (5, None),
    "aten.scaled_dot_product_attention.default": (5, None),
    "aten._scaled_dot_product_attention_math.default": (5, None),
    "aten._flash_attention_forward.default": (8, 3),
    "aten._efficient_attention_forward.default": (9, 4),  # custom_mask_type: 0 is none
}
# eager attention (and SDPA's math path, which is what meta tensors take): a softmax over
# [b, h, s_q, s_k] beside the contractions q @ k^T and probs @ v in the same module
_SOFTMAX = ("aten._softmax.default", "aten._safe_softmax.default", "aten.softmax.int")
_CONTRACTIONS = {"aten.bmm.default": 0, "aten.baddbmm.default": 1, "aten.matmul.default": 0}
_TOPK = "aten.topk.default"


class _Watched:
    """The forward records of a ledger that the conventions read, found once per layout
    (records are only ever appended): attention records with what one call is
    (``(stack, batch, heads, q_len, k_len, head_dim, value_dim, causal)``), and routers'
    top-k records with (module name, experts, k)."""

    __slots__ = ("n", "attention", "topk")

    def __init__(self, ledger, resolutions: dict):
        self.n = len(ledger.records)
        self.attention: list[tuple] = []  # (record, key)
        self.topk: list[tuple] = []  # (record, (module name, experts, k))
        forward = PHASES.index(Phase.FORWARD)
        for frame in ledger.frames:
            softmaxes, contractions = [], []
            for key, rec in frame.acc[forward].items():
                resolved = resolutions.get(key if key.__class__ is int else key[0])
                signature = rec[SIGNATURE]
                if resolved is None or signature is None or signature.call is None or \
                        signature.call.__class__ is PerSequence:  # nested: sizes per sequence
                    continue
                name = str(resolved.func)
                args, out, kwargs = signature.call
                try:
                    if name in _FUSED_ATTENTION:
                        self.attention.append((rec, _fused(frame.stack, name, args, kwargs)))
                    elif name in _SOFTMAX and len(args[0]) == 4 and args[1] in (-1, 3):
                        softmaxes.append((rec, tuple(args[0])))
                    elif name in _CONTRACTIONS:
                        first = _CONTRACTIONS[name]
                        contractions.append((tuple(args[first]), tuple(args[first + 1])))
                    elif name == _TOPK:
                        dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
                        self.topk.append((rec, (frame.name, args[0][dim], args[1])))
                except (IndexError, TypeError, KeyError):  # not the shapes we read: skip
                    continue
            for rec, (b, h, s_q, s_k) in softmaxes:
                dims = _eager_dims(contractions, b * h, s_q, s_k)
                if dims is not None:
                    self.attention.append((rec, (frame.stack, b, h, s_q, s_k) + dims + (None,)))


def _fused(stack: tuple, name: str, args, kwargs) -> tuple:
    causal_at, packed_at = _FUSED_ATTENTION[name]
    q, k, v = (tuple(a) for a in args[:3])
    if packed_at is not None:
        if args[packed_at] is not None:  # packed sequences: their lengths are values
            raise TypeError
        q, k, v = ((t[0], t[2], t[1], t[3]) for t in (q, k, v))
    causal = args[causal_at] if len(args) > causal_at else kwargs.get("is_causal", False)
    if not isinstance(causal, (bool, int)):
        causal = None
    return (stack, q[0], q[1], q[2], k[2], q[3], v[3], None if causal is None else bool(causal))


def _eager_dims(contractions: list, heads: int, s_q: int, s_k: int) -> Optional[tuple]:
    """(head_dim, value_dim) from the contractions beside a softmax over [b, h, s_q, s_k]
    (``heads``: b * h): scores [.., s_q, d] @ [.., d, s_k], then [.., s_q, s_k] @ [.., s_k,
    d_v]; None when they are not there."""
    head_dim = value_dim = None

    def lead(shape: tuple) -> int:
        n = 1
        for x in shape[:-2]:
            n *= x
        return n

    for a, b in contractions:
        if len(a) < 3 or len(b) < 3 or lead(a) != heads:
            continue
        if a[-2] == s_q and b[-1] == s_k and head_dim is None:
            head_dim = a[-1]
        elif a[-2:] == (s_q, s_k) and b[-2] == s_k and value_dim is None:
            value_dim = b[-1]
    if head_dim is None or value_dim is None:
        return None
    return head_dim, value_dim


_WATCHED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _watched(ledger, resolutions: dict) -> _Watched:
    watched = _WATCHED.get(ledger)
    if watched is None or watched.n != len(ledger.records):
        watched = _WATCHED[ledger] = _Watched(ledger, resolutions)
    return watched


def attention_calls(tracker: ModuleTracker, resolutions: dict) -> tuple:
    """The forward attention calls counted so far: ``(stack, batch, heads, q_len, k_len,
    head_dim, value_dim, causal, calls)`` each (``causal`` None where the shapes cannot
    tell: eager attention, whose mask is a tensor), fused SDPA kernels and eager attention
    (a softmax over [b, h, s_q, s_k] beside its two contractions) alike."""
    calls: dict[tuple, int] = {}
    for rec, key in _watched(tracker.ledger, resolutions).attention:
        if rec[CALLS]:
            calls[key] = calls.get(key, 0) + rec[CALLS]
    return tuple(key + (n,) for key, n in calls.items())


def parameter_groups(tracker: ModuleTracker, resolutions: dict) -> tuple:
    """The model's parameters as the MFU conventions group them, ``(name, count)`` pairs
    (``()`` without a model): ``total`` (each shared parameter once); ``embedding`` (those of
    ``nn.Embedding`` modules); ``lm_head`` (the output layer's weight: the largest
    embedding's shape, or that embedding itself, ``tied_head`` 1); ``matrices`` (weights of
    two or more dimensions outside embeddings, routers and the LM head, experts counted at
    ``k / E``: Megatron's GEMMs); ``experts`` and ``active_experts`` (all of the experts'
    parameters, and the ``k / E`` of them a token uses); ``routers``; ``experts_count`` and
    ``experts_per_token`` (E and k, read from the routers' top-k calls); ``vocab`` and
    ``hidden`` (the largest embedding's shape)."""
    if tracker.model is None:
        return ()
    routers: dict[str, tuple] = {}
    names = tracker.module_names()
    for rec, (name, experts, k) in _watched(tracker.ledger, resolutions).topk:
        if rec[CALLS] and name in names:
            routers[name] = (experts, k)
    if not routers:  # the groups depend on the model alone: kept with its facts
        facts = tracker.model_facts
        assert facts is not None, "a tracker with a model walked it on entry"
        return facts.get("parameter_groups", lambda: _groups(tracker.modules(), names, {}))
    return _groups(tracker.modules(), names, routers)


def _groups(modules: Sequence[nn.Module], names: tuple[str, ...],
            routers: dict[str, tuple]) -> tuple:
    """``parameter_groups`` of ``modules`` named ``names``, with the routers that ran
    (``{name: (experts, k)}``)."""
    by_name = dict(zip(names, modules))
    params = {id(p): p for m in modules for p in m._parameters.values() if p is not None}
    embeddings = [m for m in modules if isinstance(m, nn.Embedding)]
    in_embeddings = {id(p) for m in embeddings for p in m._parameters.values()
                     if p is not None}
    token = max(embeddings, key=lambda m: m.num_embeddings, default=None)
    head, tied = None, 0
    if token is not None:
        shapes = {(token.num_embeddings, token.embedding_dim),
                  (token.embedding_dim, token.num_embeddings)}
        for m in reversed(modules):  # the output layer comes last
            if isinstance(m, nn.Embedding):
                continue
            found = [p for p in m._parameters.values() if p is not None and (
                p is token.weight or (p.dim() == 2 and tuple(p.shape) in shapes))]
            if found:
                head, tied = found[0], int(found[0] is token.weight)
                break
    in_routers: set = set()
    active: dict[int, tuple] = {}  # id(expert parameter) -> (k, E)
    # experts are the MoE layers expert load recognises (a ModuleList named ``experts``, a
    # ``*Experts`` module with ``num_experts``): a top-k over E candidates beside any list
    # of E modules (a dense model's layers) is no router
    recognised = {id(m) for _, m, _ in expert_layers(names, modules)} if routers else set()
    for name, (experts, k) in list(routers.items()):
        router = by_name[name]
        block = router if _experts_of(router, experts, recognised) else by_name.get(
            name.rsplit(".", 1)[0] if "." in name else names[0], router)
        held = _experts_of(block, experts, recognised)
        if not held:  # a top-k over no experts: no router
            del routers[name]
            continue
        for p in held:
            active[id(p)] = (k, experts)
        inside = router.parameters() if block is not router else (
            p for p in block.parameters() if p.shape[:1] == (experts,))
        in_routers.update(id(p) for p in inside if id(p) not in active)
    counts = dict.fromkeys(("experts", "active_experts", "matrices", "routers"), 0)
    for i, p in params.items():
        n = p.numel()
        used = n * active[i][0] // active[i][1] if i in active else n
        if i in active:
            counts["experts"] += n
            counts["active_experts"] += used
        if i in in_routers:
            counts["routers"] += n
        elif p.dim() >= 2 and i not in in_embeddings and (head is None or p is not head):
            counts["matrices"] += used
    first = next(iter(routers.values()), (0, 0))
    return (("total", sum(p.numel() for p in params.values())),
            ("embedding", sum(params[i].numel() for i in in_embeddings)),
            ("lm_head", head.numel() if head is not None else 0), ("tied_head", tied),
            ("matrices", counts["matrices"]), ("experts", counts["experts"]),
            ("active_experts", counts["active_experts"]), ("routers", counts["routers"]),
            ("experts_count", first[0]), ("experts_per_token", first[1]),
            ("vocab", token.num_embeddings if token is not None else 0),
            ("hidden", token.embedding_dim if token is not None else 0))


def _experts_of(module: nn.Module, experts: int, recognised: set) -> list:
    """The parameters of ``module``'s recognised expert layers (ids in ``recognised``) of
    ``experts`` experts: a ``ModuleList``'s, or a fused module's stacked with a leading
    dimension of ``experts``."""
    found: dict[int, nn.Parameter] = {}
    for m in module.modules():
        if id(m) not in recognised:
            continue
        if isinstance(m, nn.ModuleList):
            if len(m) == experts:
                found.update((id(p), p) for p in m.parameters())
            continue
        for p in m.parameters():
            if p.dim() >= 3 and p.shape[0] == experts:
                found[id(p)] = p
    return list(found.values())
