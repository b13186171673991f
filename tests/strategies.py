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
