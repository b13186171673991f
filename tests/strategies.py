"""Hypothesis strategies shared by the tests."""

from hypothesis import strategies as st

small = st.integers(min_value=1, max_value=6)


@st.composite
def matmul_dims(draw):
    """(batch, m, k, n), all small."""
    return tuple(draw(small) for _ in range(4))


@st.composite
def conv_configs(draw, dims=None):
    """A valid convolution: dims, batch, channels, groups, kernel, stride, padding, dilation."""
    d = draw(st.sampled_from([1, 2, 3])) if dims is None else dims
    groups = draw(st.integers(1, 3))
    c_in = groups * draw(st.integers(1, 2))
    c_out = groups * draw(st.integers(1, 2))
    kernel = [draw(st.integers(1, 3)) for _ in range(d)]
    stride = [draw(st.integers(1, 2)) for _ in range(d)]
    padding = [draw(st.integers(0, 1)) for _ in range(d)]
    dilation = [draw(st.integers(1, 2)) for _ in range(d)]
    spatial = [
        draw(st.integers(dilation[i] * (kernel[i] - 1) + 1, dilation[i] * (kernel[i] - 1) + 4))
        for i in range(d)
    ]
    return dict(d=d, batch=draw(st.integers(1, 2)), c_in=c_in, c_out=c_out, groups=groups,
                kernel=kernel, stride=stride, padding=padding, dilation=dilation, spatial=spatial,
                bias=draw(st.booleans()))


@st.composite
def attention_shapes(draw):
    """(b, h_q, h_kv, s_q, s_k, d, d_v) with h_q a multiple of h_kv (GQA)."""
    h_kv = draw(st.integers(1, 2))
    return (draw(st.integers(1, 2)), h_kv * draw(st.integers(1, 3)), h_kv,
            draw(st.integers(1, 9)), draw(st.integers(1, 9)), draw(st.integers(1, 8)),
            draw(st.integers(1, 8)))


# ---- families (issue 3) ----------------------------------------------------------------------
import torch  # noqa: E402
from hypothesis.extra.numpy import mutually_broadcastable_shapes  # noqa: E402

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
float_dtypes = st.sampled_from(FLOAT_DTYPES)


@st.composite
def broadcast_operands(draw, num_shapes=2):
    """Shapes that broadcast together (zero-size dims included) and the broadcast result."""
    shapes = draw(mutually_broadcastable_shapes(num_shapes=num_shapes, min_dims=0, max_dims=3,
                                                min_side=0, max_side=4))
    return [torch.Size(s) for s in shapes.input_shapes], torch.Size(shapes.result_shape)


@st.composite
def maybe_expanded(draw, shape, dtype):
    """A tensor of `shape`, sometimes an expanded (stride-0) view of a smaller one; returns it
    with the number of elements it really stores."""
    if draw(st.booleans()) and len(shape):
        stored = [1 if draw(st.booleans()) else s for s in shape]
        base = torch.randn(stored).to(dtype)
        view = base.expand(shape)
        return view, base.numel() if view.numel() else 0
    t = torch.randn(shape).to(dtype)
    return t, t.numel()


@st.composite
def pooling_configs(draw, dims=None):
    """A valid pooling: dims, kernel, stride, padding (<= kernel / 2), dilation, ceil_mode and an
    input big enough for one window."""
    d = draw(st.sampled_from([1, 2, 3])) if dims is None else dims
    kernel = [draw(st.integers(1, 3)) for _ in range(d)]
    stride = [draw(st.integers(1, 3)) for _ in range(d)]
    padding = [draw(st.integers(0, k // 2)) for k in kernel]
    dilation = [draw(st.integers(1, 2)) for _ in range(d)]
    reach = [dilation[i] * (kernel[i] - 1) for i in range(d)]
    spatial = [draw(st.integers(reach[i] + 1, reach[i] + 5)) for i in range(d)]
    return dict(d=d, kernel=kernel, stride=stride, padding=padding, dilation=dilation,
                ceil_mode=draw(st.booleans()), spatial=spatial, batch=draw(st.integers(1, 2)),
                channels=draw(st.integers(1, 2)))


@st.composite
def reduction_cases(draw):
    """A shape (zero-size dims included), a dim subset to reduce and keepdim."""
    shape = draw(st.lists(st.integers(0, 4), min_size=1, max_size=3))
    dims = draw(st.lists(st.integers(0, len(shape) - 1), unique=True, min_size=1,
                         max_size=len(shape)))
    return shape, dims, draw(st.booleans())


# ---- saved runs (issue 31) -------------------------------------------------------------------
# values a hostile or careless file may hold where a count, a time, a name or a list belongs
NASTY_VALUES = st.one_of(
    st.sampled_from([-1, 0, 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, 2**100 - 1, 2**100,
                     10**400, -(2**63), True, False, None, float("nan"), float("inf"),
                     float("-inf"), -0.0, 0.5, 1e308, 1e-300, "", "0", "load", "float32",
                     "forward", "exact", "aten.mm", "mylib.op", "__class__.__name__", ".",
                     "x" * 300, [], {}, [[]], [""], ["", "0"], [0], {"": 0}]),
    st.integers(), st.floats(), st.text(max_size=8), st.booleans(),
    st.lists(st.integers(-2, 9), max_size=3), st.lists(st.text(max_size=3), max_size=3))


def _paths(value, path=()):
    """Every (path, container) below ``value``: where a mutation can land."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield path + (key,), value
            yield from _paths(item, path + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield path + (i,), value
            yield from _paths(item, path + (i,))


@st.composite
def mutated(draw, data: dict):
    """A deep copy of ``data`` (a valid ``to_dict()``) with one to three fields damaged: a
    value replaced by one of ``NASTY_VALUES``, a key deleted, a list emptied or an item
    repeated. The paths and kinds are drawn, so hypothesis shrinks to the one that matters."""
    import copy

    data = copy.deepcopy(data)
    for _ in range(draw(st.integers(1, 3))):
        places = list(_paths(data))
        if not places:
            break
        path, container = draw(st.sampled_from(places))
        key = path[-1]
        how = draw(st.sampled_from(["replace", "replace", "replace", "delete", "repeat",
                                    "empty"]))
        if how == "replace":
            container[key] = draw(NASTY_VALUES)
        elif how == "delete" and isinstance(container, dict):
            del container[key]
        elif how == "repeat" and isinstance(container, list):
            container.insert(key, copy.deepcopy(container[key]))
        elif how == "empty" and isinstance(container[key], (list, dict)):
            container[key] = type(container[key])()
    return data


# ---- context shapes (issue 31) -----------------------------------------------------------------
# where a counter is entered: a plain with block, a generator yielding mid-block, a
# @contextmanager (alone and through an ExitStack), a coroutine awaiting mid-block, an
# @asynccontextmanager, another thread
CONTEXT_SHAPES = ("plain", "generator", "contextmanager", "exitstack", "coroutine",
                  "asynccontextmanager", "thread")
# the work a block runs, and the faults raised (and caught in the block) at each kind of hook:
# a module's forward, its forward pre-hook and hook, backward, a checkpointed module's
# recomputation (a KeyboardInterrupt), an optimizer step's body and a step pre-hook after the
# counter's
CONTEXT_PIECES = ("forward", "train", "step", "closure_step", "outside", "forward_raises",
                  "pre_hook_raises", "post_hook_raises", "backward_raises",
                  "recompute_interrupted", "step_raises", "step_refused")


@st.composite
def context_runs(draw):
    """(the shape a counter is entered in, the pieces of work its block runs, whether the block
    ends by an exception, the counter's options)."""
    return (draw(st.sampled_from(CONTEXT_SHAPES)),
            draw(st.lists(st.sampled_from(CONTEXT_PIECES), min_size=1, max_size=6)),
            draw(st.booleans()),
            draw(st.fixed_dictionaries({"timing": st.booleans(),
                                        "saved_activations": st.booleans()})))


@st.composite
def batch_builders(draw):
    """A way users hold a batch: a function from a sequence length to a batch of token ids
    (and texts) nested in mappings, lists, tuples, named tuples and dataclasses."""
    import collections
    import dataclasses

    import torch

    Pair = collections.namedtuple("Pair", "ids mask")

    @dataclasses.dataclass
    class Batch:
        ids: object
        texts: list

    kinds = draw(st.lists(st.sampled_from(["dict", "list", "tuple", "named", "data"]),
                          min_size=1, max_size=3))
    rows = draw(st.integers(1, 3))

    def build(length: int):
        value: object = torch.zeros(rows, length, dtype=torch.long)
        for kind in kinds:
            if kind == "dict":
                value = {"input_ids": value, "flag": True}
            elif kind == "list":
                value = [value]
            elif kind == "tuple":
                value = (value, None)
            elif kind == "named":
                value = Pair(value, torch.ones(rows, length))
            else:
                value = Batch(value, ["some text"] * rows)
        return value

    return build


# names a user's model (or a received JSON file) may hold: any text, weighted to what acts on
# a terminal (escapes, C1 controls, bidi overrides, line breaks) or a spreadsheet (= + - @)
HOSTILE = ["\x1b[1A", "\x1b[2K", "\x1b]0;title\x07", "\u202e", "\u2066", "\u200f", "\n", "\r",
           "\t", "\x00", "\x7f", "\x85", "\x9b", "\u2028", "\u2029", "\ud800", "\xa0", "\u3000",
           " ", "=", "+", "-", "@", "'", '"', ",", "=cmd|' /C calc'!A0", "@SUM(A1)", "=1+1", "-5",
           "é", "中"]


@st.composite
def module_names(draw, count=2):
    """``count`` distinct names ``nn.Module.add_module`` takes: no "." and not empty."""
    part = st.one_of(st.sampled_from(HOSTILE), st.text(max_size=3))
    name = st.lists(part, min_size=1, max_size=4).map("".join).filter(
        lambda s: s and "." not in s)
    return draw(st.lists(name, min_size=count, max_size=count, unique=True))


@st.composite
def op_arguments(draw):
    """What an op's arguments may be at dispatch, as ``(kind, shape)`` specs a test makes
    tensors of: a plain tensor, a parameter, a tensor subclass, a transposed or an expanded
    one; with the other values an aten schema passes (ints, floats told apart or not, int
    lists, tensor lists, None, bools, strings, dtypes)."""
    shape = st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple)
    tensor = st.tuples(st.sampled_from(["plain", "parameter", "subclass", "transposed",
                                        "expanded"]), shape)
    return {
        "a": draw(tensor),
        "b": draw(st.none() | tensor),
        "sizes": draw(st.lists(st.integers(0, 4), max_size=3)),
        "f": draw(st.sampled_from([0.0, 1.0, -1.0, 0.5, 1e-3, float("inf")])),
        "flag": draw(st.booleans()),
        "how": draw(st.sampled_from(["none", "tanh"])),
        "ts": draw(st.lists(tensor, max_size=2)),
        "dtype": draw(st.none() | st.sampled_from(["float32", "float64"])),
        "scale": draw(st.sampled_from([2.0, 0.25])),
        "dims": draw(st.lists(st.integers(-2, 2), max_size=2)),
    }
