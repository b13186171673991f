"""Per-element costs for the judgement calls, in one table a user may override.

``ELEMENT_COSTS["softmax"] = 1`` (for example) makes every later count use DeepSpeed's
convention. Every value is flops per element of the tensor named in its comment.
"""

ELEMENT_COSTS: dict[str, int] = {
    # softmax over x: max (1) + subtract (1) + exp (1) + sum (1) + divide (1), per element of x
    "softmax": 5,
    # log_softmax: max + subtract + exp + sum + subtract log-sum, per element of x
    "log_softmax": 5,
    # softmax backward: g*y (1) + row sum (1) + subtract (1) + multiply by y (1)
    "softmax_backward": 4,
    # layer norm: mean (1) + subtract (1) + square (1) + sum (1) + scale by rstd (1)
    "layer_norm": 5,
    # affine part of a norm: multiply by weight (1), add bias (1), each when present
    "norm_affine": 1,
    # layer-norm backward, grad_input: recompute x_hat (2) + g*w (1) + two row sums (2)
    # + x_hat * sum (1) + combine (3); counted per element of x
    "layer_norm_backward_input": 9,
    # attention: scale the scores (1) before the softmax, per score element
    "attention_scale": 1,
}
