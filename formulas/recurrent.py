"""Recurrent layers: LSTM, GRU and Elman RNN, whole layers (mkldnn, cuDNN, the composite entry
points seen under inference_mode) and single cells.

Per time step and batch row, a layer with gates G, hidden size H, input size I (and an
optional projection to P) does the two gate products, G*H*(I + P) MACs (+ P*H for the
projection), adds each bias once per gate element (2 per gate element with biases), and the
cell's pointwise work, ``ELEMENT_COSTS["<cell>_cell"]`` per hidden unit. This is what the CPU
decomposition (input projection for the whole sequence, then ``addmm`` + pointwise per step)
is priced at, op by op. Backward: twice the MACs (the input and weight gradients), the cell's
backward per hidden unit, one add per gate element for the bias gradient.
"""

from __future__ import annotations

from ._registry import Cost, namespace, register_formula
from ._shapes import numel
from .costs import ELEMENT_COSTS

aten = namespace("aten")  # ops this torch lacks read as names, never met

# cuDNN's mode numbering, which the mkldnn and cudnn kernels share
_MODES = {0: ("rnn", 1), 1: ("rnn", 1), 2: ("lstm", 4), 3: ("gru", 3)}


def layer_cost(steps: int, w_ih, w_hh, w_hr, has_biases: bool, cell: str) -> Cost:
    """One direction of one layer over ``steps`` (time x batch) rows.
    w_ih: [G*H, I], w_hh: [G*H, P or H], w_hr: [P, H] or None."""
    gate_elements = w_ih[0]
    hidden = w_hr[1] if w_hr is not None else w_hh[1]
    macs = steps * gate_elements * (w_ih[1] + w_hh[1])
    if w_hr is not None:
        macs += steps * w_hr[0] * w_hr[1]
    flops = 2 * macs + steps * hidden * ELEMENT_COSTS[cell + "_cell"]
    if has_biases:
        flops += 2 * steps * gate_elements
    return Cost(flops, macs)


def layer_backward_cost(steps: int, w_ih, w_hh, has_biases: bool, cell: str) -> Cost:
    gate_elements, hidden = w_ih[0], w_hh[1]
    macs = 2 * steps * gate_elements * (w_ih[1] + w_hh[1])
    flops = 2 * macs + steps * hidden * ELEMENT_COSTS[cell + "_cell_backward"]
    if has_biases:
        flops += steps * gate_elements
    return Cost(flops, macs)


def _sum(costs) -> Cost:
    flops = macs = 0
    for c in costs:
        flops += c.flops
        macs += c.macs
    return Cost(flops, macs)


@register_formula(aten.mkldnn_rnn_layer)
def mkldnn_rnn_layer(x, w_ih, w_hh, b_ih, b_hh, hx, cx, reverse, batch_sizes, mode,
                     hidden_size, num_layers, has_biases, *args, out_shape, **kw) -> Cost:
    # x: [time, batch, input] (or batch first): one direction of one layer
    return layer_cost(numel(x) // x[-1], w_ih, w_hh, None, has_biases, _MODES[mode][0])


@register_formula(aten.mkldnn_rnn_layer_backward)
def mkldnn_rnn_layer_backward(x, w_ih, w_hh, b_ih, b_hh, hx, cx, output, hy, cy, grad_output,
                              grad_hy, grad_cy, reverse, mode, hidden_size, num_layers,
                              has_biases, *args, out_shape, **kw) -> Cost:
    return layer_backward_cost(numel(x) // x[-1], w_ih, w_hh, has_biases, _MODES[mode][0])


def _groups(params, has_biases: bool, layers_x_directions: int):
    """Split the flat parameter list into (w_ih, w_hh, w_hr) per layer and direction."""
    size = len(params) // max(layers_x_directions, 1)
    for i in range(0, len(params), size):
        group = params[i:i + size]
        w_hr = group[4 if has_biases else 2] if size in (3, 5) else None
        yield group[0], group[1], w_hr


def whole_rnn(cell: str):
    def formula(x, *args, out_shape, **kw) -> Cost:
        # .input(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, ...)
        # .data(data, batch_sizes, hx, params, has_biases, num_layers, dropout, train, bidir.)
        packed = not isinstance(args[2], bool)  # .data: args[2] is the params list
        params, has_biases, num_layers, _, _, bidirectional = (
            args[2:8] if packed else args[1:7])
        steps = x[0] if packed else numel(x) // x[-1]  # packed data: [sum of lengths, input]
        groups = _groups(params, has_biases, num_layers * (2 if bidirectional else 1))
        return _sum(layer_cost(steps, w_ih, w_hh, w_hr, has_biases, cell)
                    for w_ih, w_hh, w_hr in groups)

    return formula


register_formula(aten.lstm)(whole_rnn("lstm"))
register_formula(aten.gru)(whole_rnn("gru"))
register_formula([aten.rnn_tanh, aten.rnn_relu])(whole_rnn("rnn"))


def single_cell(cell: str):
    def formula(x, hx, w_ih, w_hh, b_ih=None, b_hh=None, *, out_shape, **kw) -> Cost:
        # x: [batch, input] or [input]: one step
        steps = x[0] if len(x) == 2 else 1
        cost = layer_cost(steps, w_ih, w_hh, None, False, cell)
        biases = (b_ih is not None) + (b_hh is not None)
        return Cost(cost.flops + biases * steps * w_ih[0], cost.macs)

    return formula


register_formula(aten.lstm_cell)(single_cell("lstm"))
register_formula(aten.gru_cell)(single_cell("gru"))
register_formula([aten.rnn_tanh_cell, aten.rnn_relu_cell])(single_cell("rnn"))


def fused_cell(cell: str, gates: int):
    def formula(input_gates, hidden_gates, state, input_bias=None, hidden_bias=None, *,
                out_shape, **kw) -> Cost:
        # the gate products are done already (input_gates, hidden_gates: [batch, G * H])
        hidden = numel(input_gates) // gates
        biases = (input_bias is not None) + (hidden_bias is not None)
        return Cost(hidden * ELEMENT_COSTS[cell + "_cell"] + biases * numel(input_gates))

    return formula


register_formula(aten._thnn_fused_lstm_cell)(fused_cell("lstm", 4))
register_formula(aten._thnn_fused_gru_cell)(fused_cell("gru", 3))


@register_formula([aten._thnn_fused_lstm_cell_backward_impl, aten._thnn_fused_lstm_cell_backward])
def fused_lstm_cell_backward(grad_hy, grad_cy, cx, cy, workspace, has_bias, *, out_shape,
                             **kw) -> Cost:
    # workspace: [batch, 4 H]; the bias gradient sums the gate gradients
    hidden = numel(cx)
    return Cost(hidden * ELEMENT_COSTS["lstm_cell_backward"] + has_bias * numel(workspace))


@register_formula(aten._thnn_fused_gru_cell_backward)
def fused_gru_cell_backward(grad_hy, workspace, has_bias, *, out_shape, **kw) -> Cost:
    hidden = numel(grad_hy)
    return Cost(hidden * ELEMENT_COSTS["gru_cell_backward"] + has_bias * 3 * hidden)


@register_formula(aten._cudnn_rnn)
def cudnn_rnn(x, weights, weight_stride0, weight_buf, hx, cx, mode, hidden_size, proj_size,
              num_layers, batch_first, dropout, train, bidirectional, *args, out_shape,
              **kw) -> Cost:
    cell, _ = _MODES[mode]
    has_biases = weight_stride0 in (4, 5)
    steps = numel(x) // x[-1]
    groups = _groups(weights, has_biases, num_layers * (2 if bidirectional else 1))
    return _sum(layer_cost(steps, w_ih, w_hh, w_hr, has_biases, cell)
                for w_ih, w_hh, w_hr in groups)
