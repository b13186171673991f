"""Quantised linear layers and convolutions (``torch.ao.quantization``): ``quantized::`` ops.

A quantised GEMM or convolution multiplies int8 weights by int8 (static) or dynamically
quantised uint8 activations, accumulating in int32: the same MACs as its float twin
(``matmul.linear``, ``conv.conv_macs``), filed under dtype "int8" so that MFU divides them by
the int8 peak. The fp16 dynamic variants compute in float16. The bias add is one flop per
output element, a fused activation (relu, leaky relu, tanh) one more, a fused residual add
(``conv2d_add``) one more. The (de)quantisation around the GEMM (scales, zero points,
rounding; a dynamic op's min/max of its input) inside these ops is not counted.

The conversions themselves, as ops of their own, are priced by their affine map: quantise
``q = x / scale + zero_point`` and dequantise ``x = (q - zero_point) * scale`` are 2 flops an
element (rounding and clamping are the conversion to an integer type, as in ``_to_copy``); a
dynamic quantisation first finds its input's min and max, 2 more an element. The quantised
tensors' metadata and raw views do no arithmetic.

The weights reach the formula as a ``PackedWeight`` (the engine reads the packed
TorchScript object once per signature): a linear's MACs need only the input's and output's
shapes, a convolution's need the weight's.
"""

from __future__ import annotations

from ._registry import REGISTRY, Cost, Movement, namespace, register_formula
from ._shapes import PackedWeight, numel
from .conv import conv_macs

quantized = namespace("quantized")  # ops this torch lacks read as names, never met
aten = namespace("aten")

INT8 = "int8"

# name -> flops per output element of a fused epilogue (activation, residual add)
_LINEAR_INT8 = {"linear": 0, "linear_relu": 1, "linear_leaky_relu": 1, "linear_tanh": 1,
                "linear_dynamic": 0, "linear_relu_dynamic": 1,
                "linear_with_input_q_dq_qweight_dq_output_fp32": 0,
                "linear_with_input_q_dq_qweight_dq_relu_output_fp32": 1}
_LINEAR_FP16 = {"linear_dynamic_fp16": 0, "linear_relu_dynamic_fp16": 1}
_CONV_INT8 = {"conv1d": 0, "conv2d": 0, "conv3d": 0, "conv1d_relu": 1, "conv2d_relu": 1,
              "conv3d_relu": 1, "conv2d_add": 1, "conv2d_add_relu": 2, "conv1d_dynamic": 0,
              "conv2d_dynamic": 0, "conv3d_dynamic": 0, "conv_transpose1d": 0,
              "conv_transpose2d": 0, "conv_transpose3d": 0, "conv_transpose1d_dynamic": 0,
              "conv_transpose2d_dynamic": 0, "conv_transpose3d_dynamic": 0}


def _packed(args) -> PackedWeight:
    for a in args:
        if isinstance(a, PackedWeight):
            return a
    # the engine could not read this backend's packed weights: no formula can price it
    raise ValueError("the packed weights of this quantised op could not be read")


def _bytes_read(args, dtypes, packed: PackedWeight, weight_itemsize: int) -> int:
    """The tensor arguments (the engine's rule) plus the packed weights, which the engine
    cannot see: ``weight_itemsize`` bytes a weight, a float32 bias."""
    read = sum(numel(a) * d.itemsize for a, d in zip(args, dtypes or ())
               if d is not None and not isinstance(a, PackedWeight))
    out_features = packed.weight[1] * packed.groups if packed.transposed else packed.weight[0]
    return read + numel(packed.weight) * weight_itemsize + 4 * out_features * packed.bias


def quantized_linear_cost(x, out_shape, bias: bool, epilogue: int) -> Cost:
    # x: [..., in], out: [..., out]; the weight [out, in] is packed
    macs = numel(out_shape) * x[-1]
    return Cost(2 * macs + numel(out_shape) * (int(bias) + epilogue), macs)


def _linear(epilogue: int, weight_itemsize: int):
    def formula(*args, out_shape, dtypes=None, **kw) -> Cost:
        packed = _packed(args)
        cost = quantized_linear_cost(args[0], out_shape, packed.bias, epilogue)
        return cost._replace(bytes_read=_bytes_read(args, dtypes, packed, weight_itemsize))
    return formula


def _conv(epilogue: int, weight_itemsize: int):
    def formula(*args, out_shape, dtypes=None, **kw) -> Cost:
        packed = _packed(args)
        macs = conv_macs(args[0], packed.weight, out_shape, packed.transposed)
        return Cost(2 * macs + numel(out_shape) * (int(packed.bias) + epilogue), macs,
                    bytes_read=_bytes_read(args, dtypes, packed, weight_itemsize))
    return formula


for _table, _make, _dtype, _itemsize in ((_LINEAR_INT8, _linear, INT8, 1),
                                         (_CONV_INT8, _conv, INT8, 1),
                                         (_LINEAR_FP16, _linear, "float16", 2)):
    for _epilogue in sorted(set(_table.values())):
        _ops = quantized.present([n for n, e in _table.items() if e == _epilogue])
        if _ops:
            register_formula(_ops, dtype=_dtype)(_make(_epilogue, _itemsize))


@register_formula(quantized.linear_dynamic_fp16_unpacked_weight, dtype="float16")
def linear_dynamic_fp16_unpacked(x, weight, bias=None, *, out_shape, **kw) -> Cost:
    return quantized_linear_cost(x, out_shape, bias is not None, 0)


def _elements(x) -> int:
    """Elements of a tensor or of a list of tensors (the ``.tensors`` overloads)."""
    if x and not isinstance(x[0], int):
        return sum(numel(t) for t in x)
    return numel(x)


@register_formula([aten.quantize_per_tensor, aten.quantize_per_channel, aten.dequantize])
def affine_conversion(x, *args, out_shape, **kw) -> Cost:
    return Cost(2 * _elements(x))


@register_formula(aten.quantize_per_tensor_dynamic)
def dynamic_quantization(x, *args, out_shape, **kw) -> Cost:
    return Cost(4 * numel(x))  # min and max, then the affine map


REGISTRY.no_arithmetic(aten.present(
    """q_scale q_zero_point q_per_channel_axis qscheme _empty_affine_quantized
    _empty_per_channel_affine_quantized""".split()), Movement.NONE)
REGISTRY.no_arithmetic(aten.present(
    """int_repr q_per_channel_scales q_per_channel_zero_points
    _make_per_tensor_quantized_tensor _make_per_channel_quantized_tensor""".split()),
    Movement.COPY)
