"""Shape-only counting made fast: run each functional op on meta tensors once per signature.

A meta tensor has no data, so the output of a functional op (no mutation, no aliasing, an
output shape that does not depend on values) is fixed by the op, its arguments' shapes,
strides and dtypes, and its other arguments. Torch computes meta outputs with Python
reference code (tens of microseconds per op); a model repeats the same signatures layer
after layer, so the runner computes each signature's output once and afterwards makes
``empty_strided`` tensors of the same shape, strides and dtype. Ops that mutate or alias
their inputs, and non-meta arguments, always run for real.
"""

from __future__ import annotations

import torch
from torch import Tensor


class _NotMeta(Exception):
    pass


_MISSING = object()


def _key(v):
    if isinstance(v, Tensor):
        if not v.is_meta:
            raise _NotMeta
        return (v.shape, v.stride(), v.dtype)
    if v.__class__ is list or v.__class__ is tuple:
        return tuple([_key(x) for x in v])
    return (v.__class__, v)  # 1, 1.0 and True are equal keys but make different dtypes


def _cacheable(func) -> bool:
    schema = func._schema
    return (
        func.namespace == "aten"
        and torch.Tag.dynamic_output_shape not in func.tags
        and torch.Tag.nondeterministic_seeded not in func.tags
        and all(a.alias_info is None for a in schema.arguments)
        and bool(schema.returns)
        and all(r.alias_info is None and str(r.type) in ("Tensor", "Tensor[]")
                for r in schema.returns)
    )


def _spec(out):
    if isinstance(out, Tensor):
        if not out.is_meta:  # a factory asked for another device: never rebuilt on meta
            raise _NotMeta
        return (out.shape, out.stride(), out.dtype)
    if out is None:
        return None
    return (out.__class__, [_spec(x) for x in out])


def _build(spec):
    if spec is None:
        return None
    if spec[0].__class__ is type:  # a list or tuple of outputs
        kind, items = spec
        return kind(_build(item) for item in items)
    shape, stride, dtype = spec
    return torch.empty_strided(shape, stride, dtype=dtype, device="meta")


class MetaRunner:
    """Runs ops for the dispatch mode (the ``run``/``add`` interface of ``clock.Timer``),
    memoising functional ops on meta tensors by signature."""

    def __init__(self) -> None:
        self._cacheable: dict[int, bool] = {}
        self._outputs: dict[tuple, object] = {}

    def run(self, resolved, args, kwargs):
        func = resolved.func  # the overload, for its schema; resolved.run calls it
        call = resolved.run
        cacheable = self._cacheable.get(id(func))
        if cacheable is None:
            cacheable = self._cacheable[id(func)] = _cacheable(func)
        if cacheable:
            try:
                key = (id(func), torch.get_default_dtype(), _key(args),
                       _key(tuple(kwargs.items())) if kwargs else ())
                spec = self._outputs.get(key, _MISSING)
            except (_NotMeta, TypeError):  # real tensors, or unhashable (symbolic) sizes
                pass
            else:
                if spec is not _MISSING:
                    return _build(spec), None
                out = call(*args, **kwargs) if kwargs else call(*args)
                try:
                    self._outputs[key] = _spec(out)
                except _NotMeta:
                    self._cacheable[id(func)] = False  # not every output is on meta
                return out, None
        return (call(*args, **kwargs) if kwargs else call(*args)), None

    def add(self, counts: list, index: int, token) -> None:
        """Count the call; nothing is timed on meta."""
        counts[0] += 1  # CALLS
