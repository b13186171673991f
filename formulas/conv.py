"""Convolution forward and backward (1d/2d/3d, transposed, groups, stride, padding, dilation).

MACs = batch x spatial x numel(weight), where spatial is the output's spatial size for a
normal convolution and the input's for a transposed one (each input element is scattered
through the whole kernel). This equals the im2col + matmul decomposition. The bias add is
one flop per output element.
"""

from __future__ import annotations

from ._registry import Cost, namespace, register_formula
from ._shapes import numel

aten = namespace("aten")  # ops this torch lacks read as names, never met


def conv_macs(x_shape, w_shape, out_shape, transposed: bool) -> int:
    # x: [n, c_in, *spatial], w: [c_out, c_in/groups, *k] (transposed: [c_in, c_out/groups, *k])
    spatial = x_shape[2:] if transposed else out_shape[2:]
    return x_shape[0] * numel(spatial) * numel(w_shape)


@register_formula([aten.convolution, aten._convolution, aten.convolution_overrideable])
def convolution(x, w, bias, stride, padding, dilation, transposed, *args, out_shape, **kw) -> Cost:
    macs = conv_macs(x, w, out_shape, transposed)
    return Cost(2 * macs + (numel(out_shape) if bias is not None else 0), macs)


@register_formula(aten.convolution_backward)
def convolution_backward(
    grad_out, x, w, bias_sizes, stride, padding, dilation, transposed, output_padding, groups,
    output_mask, *, out_shape, **kw
) -> Cost:
    # grad_input and grad_weight are each one convolution as large as the forward;
    # grad_bias is a sum over grad_out (one add per element).
    macs = conv_macs(x, w, grad_out, transposed) * (int(output_mask[0]) + int(output_mask[1]))
    return Cost(2 * macs + (numel(grad_out) if output_mask[2] else 0), macs)


# composite entry points (reach the mode undecomposed under inference_mode); they price what
# their no_grad decomposition, one `convolution`, is priced at


@register_formula([aten.conv1d, aten.conv2d, aten.conv3d])
def conv_composite(x, w, bias=None, *args, out_shape, **kw) -> Cost:
    macs = conv_macs(x, w, out_shape, transposed=False)
    return Cost(2 * macs + (numel(out_shape) if bias is not None else 0), macs)


@register_formula([aten.conv_transpose1d, aten.conv_transpose2d, aten.conv_transpose3d])
def conv_transpose_composite(x, w, bias=None, *args, out_shape, **kw) -> Cost:
    macs = conv_macs(x, w, out_shape, transposed=True)
    return Cost(2 * macs + (numel(out_shape) if bias is not None else 0), macs)
