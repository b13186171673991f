"""The hot path keys a call by its signature without asking ``isinstance`` of every argument
(issue 42): the signature it builds is the one the definition gives, for every kind of
argument an aten schema passes."""

from __future__ import annotations

from typing import Optional

import torch
from hypothesis import given, settings
from torch import Tensor

from dispatch_flops import FlopCounter
from dispatch_flops.engine.counting import mode as _mode
from dispatch_flops.engine.counting.calls import FLOAT, KWARGS, STRIDED, TOLD_APART
from tests.strategies import op_arguments


@torch.library.custom_op("o42hot_probe::every_kind", mutates_args=())
def every_kind(a: Tensor, b: Optional[Tensor], sizes: list[int], f: float, flag: bool,
               ts: list[Tensor], *, how: str, scale: float, dims: list[int],
               dtype: Optional[torch.dtype]) -> Tensor:
    return a.clone()


class Sub(Tensor):
    """A tensor subclass that leaves dispatch to torch (as most do)."""


def make(spec) -> Tensor:
    kind, shape = spec
    if kind == "parameter":
        return torch.nn.Parameter(torch.ones(shape))
    if kind == "subclass":
        return torch.ones(shape).as_subclass(Sub)
    if kind == "transposed":  # not contiguous, no stride 0
        return torch.ones(shape + (2,)).transpose(0, -1)
    if kind == "expanded":
        return torch.ones(shape[:-1] + (1,)).expand(shape[:-1] + (4,))
    return torch.ones(shape)


def tensor_key(t: Tensor) -> tuple:
    """A tensor by the signature's definition: shape and dtype, and its strides after a
    marker when it is not contiguous."""
    if t.is_contiguous():
        return (t.shape, t.dtype)
    return (t.shape, t.dtype, STRIDED, t.stride())


def value_key(v):
    if isinstance(v, Tensor):
        return tensor_key(v)
    if isinstance(v, float):
        return v if v in TOLD_APART else FLOAT
    return v


def expected_signature(op, args, kwargs, out) -> tuple:
    """The signature by its definition, every value asked ``isinstance``: a tensor in two
    places (four when strided), an int[] as a tuple, a Tensor[] as its tensors' keys; the
    keyword arguments after a marker; a custom op's output keyed whole."""
    sig: list = [id(op)]
    for a in args:
        if isinstance(a, Tensor):
            sig.extend(tensor_key(a))
        elif isinstance(a, list):
            sig.append(tuple(a) if not a or isinstance(a[0], int)
                       else tuple(value_key(x) for x in a))
        else:
            sig.append(value_key(a))
    if kwargs:
        sig.append(KWARGS)
        for k, v in kwargs.items():
            sig += [k, tuple(map(value_key, v)) if isinstance(v, list) else value_key(v)]
    sig.append(tensor_key(out))
    return tuple(sig)


@settings(max_examples=60, deadline=None)
@given(op_arguments())
def test_the_hot_paths_signature_is_the_definitions(spec):
    """Whatever its arguments' classes (parameters, subclasses, strided tensors, numbers,
    int lists, tensor lists, None, strings, dtypes; positional or keyword-only), a call's
    record is keyed by the signature the definition gives."""
    op = torch.ops.o42hot_probe.every_kind.default
    made = []
    real = _mode._call_entry

    def seen(shared, sig, resolved, args, kwargs, out):  # what the hot path built, and from
        made.append((sig, args, kwargs, out))
        return real(shared, sig, resolved, args, kwargs, out)

    args = (make(spec["a"]), None if spec["b"] is None else make(spec["b"]), spec["sizes"],
            spec["f"], spec["flag"], [make(t) for t in spec["ts"]])
    kwargs = dict(how=spec["how"], scale=spec["scale"], dims=spec["dims"],
                  dtype=None if spec["dtype"] is None else getattr(torch, spec["dtype"]))
    _mode._call_entry = seen
    try:
        with FlopCounter():
            op(*args, **kwargs)
    finally:
        _mode._call_entry = real
    assert len(made) == 1
    sig, args, kwargs, out = made[0]
    assert sig == expected_signature(op, args, kwargs, out)
    assert kwargs and KWARGS in sig  # the keyword-only arguments took the keyword branch
