"""Per-element costs for the judgement calls, in one table a user may override.

``ELEMENT_COSTS["softmax"] = 1`` (for example) makes every later count use DeepSpeed's
convention: formulas read this table when they are called, never at import. Every value is
flops per element of the tensor named in its comment (the output, for pointwise ops).

The convention (docs/conventions.md has the reasons and the peers' choices): one flop per
elementary operation on one element, where elementary means an arithmetic operation
(+ - * /), a comparison, min/max, a select, a rounding, or one call of a C math-library
function (exp, log, sqrt, rsqrt, sin, tanh, erf, pow, fmod, ...). An op that is a formula of
those (sigmoid, gelu, silu, a norm) costs the operations of its formula. Integer and boolean
element operations count too: ``flops`` counts element operations, whatever the dtype.
"""

class CostTable(dict):
    """A dict that counts its changes (``version``), so that whoever keeps what formulas
    computed from it can tell when to compute again."""

    version = 0

    def _changed(self) -> None:
        self.version += 1

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self._changed()

    def __delitem__(self, key):
        super().__delitem__(key)
        self._changed()

    def update(self, *args, **kwargs):
        super().update(*args, **kwargs)
        self._changed()

    def __ior__(self, other):  # type: ignore[misc]  # dict's __or__ is typed for a dict
        self.update(other)
        return self

    def setdefault(self, key, default=None):
        value = super().setdefault(key, default)
        self._changed()
        return value

    def pop(self, *args):
        value = super().pop(*args)
        self._changed()
        return value

    def popitem(self):
        item = super().popitem()
        self._changed()
        return item

    def clear(self):
        super().clear()
        self._changed()


ELEMENT_COSTS: dict[str, int] = CostTable({
    # ---- pointwise arithmetic: one operation per output element ---------------------------
    "add": 1, "sub": 1, "rsub": 1, "mul": 1, "div": 1, "neg": 1, "abs": 1, "reciprocal": 1,
    "square": 1, "sign": 1, "sgn": 1, "fmod": 1, "remainder": 1, "copysign": 1,
    "heaviside": 1, "ldexp": 1, "hypot": 1, "nextafter": 1, "float_power": 1,
    # floor_divide: a divide, then a floor
    "floor_divide": 2,
    # frac: x - trunc(x)
    "frac": 2,
    # rounding
    "floor": 1, "ceil": 1, "round": 1, "trunc": 1,
    # comparisons, selects, logic and bit operations: one each
    "eq": 1, "ne": 1, "lt": 1, "le": 1, "gt": 1, "ge": 1, "maximum": 1, "minimum": 1,
    "fmax": 1, "fmin": 1, "where": 1, "masked_fill": 1, "isnan": 1, "isinf": 1,
    "isfinite": 1, "isposinf": 1, "isneginf": 1, "signbit": 1, "logical_and": 1,
    "logical_or": 1, "logical_xor": 1, "logical_not": 1, "bitwise_and": 1, "bitwise_or": 1,
    "bitwise_xor": 1, "bitwise_not": 1, "bitwise_left_shift": 1, "bitwise_right_shift": 1,
    "__lshift__": 1, "__rshift__": 1, "__and__": 1, "__or__": 1, "__xor__": 1,
    "gcd": 1, "lcm": 1,
    # clamp: one comparison per bound given (clamp_min/clamp_max: one)
    "clamp_bound": 1,
    # nan_to_num: test (1) and select (1)
    "nan_to_num": 2,
    # ---- elementary functions: one library call per element -------------------------------
    "exp": 1, "exp2": 1, "expm1": 1, "log": 1, "log2": 1, "log10": 1, "log1p": 1, "sqrt": 1,
    "rsqrt": 1, "sin": 1, "cos": 1, "tan": 1, "asin": 1, "acos": 1, "atan": 1, "atan2": 1,
    "sinh": 1, "cosh": 1, "tanh": 1, "asinh": 1, "acosh": 1, "atanh": 1, "erf": 1, "erfc": 1,
    "erfinv": 1, "lgamma": 1, "digamma": 1, "i0": 1, "pow": 1,
    # sinc: pi * x (1), sin (1), divide (1)
    "sinc": 3,
    # logit: 1 - x (1), divide (1), log (1)
    "logit": 3,
    # xlogy: log (1), multiply (1), select where x == 0 (1)
    "xlogy": 3,
    # logaddexp: max(a, b) (1) + log1p(exp(-|a - b|)): subtract (1), abs (1), negate (1),
    # exp (1), log1p (1), add (1)
    "logaddexp": 7, "logaddexp2": 7,
    # deg2rad / rad2deg: one multiply
    "deg2rad": 1, "rad2deg": 1,
    # ---- ternary --------------------------------------------------------------------------
    # addcmul / addcdiv: t1 * t2 or t1 / t2 (1), add to self (1); a `value` other than 1
    # multiplies once more (added by the formula)
    "addcmul": 2, "addcdiv": 2,
    # lerp: end - start (1), times weight (1), plus start (1)
    "lerp": 3,
    # ---- activations: the operations of their defining formula ----------------------------
    # relu: max(x, 0)
    "relu": 1,
    # threshold / relu backward: compare (1), select (1)
    "threshold": 2, "threshold_backward": 2,
    # hardtanh / relu6: clamp to two bounds
    "hardtanh": 2, "relu6": 2,
    # hardtanh backward: two comparisons (2), select (1)
    "hardtanh_backward": 3,
    # leaky_relu: slope * x (1), max (1)
    "leaky_relu": 2,
    # leaky_relu backward: compare (1), select the slope (1), multiply the gradient (1)
    "leaky_relu_backward": 3,
    # sigmoid: 1 / (1 + exp(-x)): negate (1), exp (1), add (1), divide (1)
    "sigmoid": 4,
    # sigmoid backward from its output y: g * y * (1 - y)
    "sigmoid_backward": 3,
    # tanh backward from its output y: g * (1 - y * y)
    "tanh_backward": 3,
    # silu: x * sigmoid(x)
    "silu": 5,
    # silu backward: sigmoid (4), 1 - s (1), x * (1), + 1 (1), * s (1), * g (1)
    "silu_backward": 9,
    # gelu (erf form): 0.5 * x * (1 + erf(x / sqrt 2)): scale (1), erf (1), add (1), 2 muls
    "gelu": 5,
    # gelu backward (erf): the cdf half (4) + x * pdf: x^2 (1), scale (1), exp (1), 2 muls
    # (2), add (1), times g (1)
    "gelu_backward": 11,
    # gelu (tanh form): x^3 (2), * 0.044715 (1), + x (1), * sqrt(2/pi) (1), tanh (1), + 1 (1),
    # * x (1), * 0.5 (1)
    "gelu_tanh": 9,
    # gelu (tanh form) backward: inner (5), tanh (1), left half (2), right half (8), sum and
    # times g (2)
    "gelu_tanh_backward": 18,
    # elu: exp (1), - 1 (1), * alpha (1), select on x > 0 (1)
    "elu": 4,
    # elu backward: compare and select (1), + alpha or * scale (1), * g (1)
    "elu_backward": 3,
    # selu, celu: elu plus one more scale
    "selu": 5, "celu": 5,
    # softplus: beta * x (1), exp (1), log1p (1), / beta (1), compare with the threshold (1),
    # select (1)
    "softplus": 6,
    # softplus backward: beta * x (1), exp (1), z / (z + 1) (2), * g (1), threshold compare
    # and select (2)
    "softplus_backward": 7,
    # mish: x * tanh(softplus(x)): softplus (6), tanh (1), multiply (1)
    "mish": 8,
    # mish backward: softplus (2), tanh (1), sigmoid (4), t^2 (1), 1 - (1), x * s (1), * (1),
    # + t (1), * g (1)
    "mish_backward": 13,
    # hardswish: x * relu6(x + 3) / 6: add (1), clamp (2), multiply (1), divide (1)
    "hardswish": 5,
    # hardswish backward: two comparisons (2), (2x + 3) / 6 (3), select (1), * g (1)
    "hardswish_backward": 7,
    # hardsigmoid: relu6(x + 3) / 6
    "hardsigmoid": 4,
    # hardsigmoid backward: two comparisons (2), select (1), * g / 6 (1)
    "hardsigmoid_backward": 4,
    # hardshrink / softshrink: two comparisons and a select (softshrink also shifts: +1)
    "hardshrink": 3, "softshrink": 4,
    # log_sigmoid: min(x, 0) - log1p(exp(-|x|)): min (1), abs (1), negate (1), exp (1),
    # log1p (1), subtract (1)
    "log_sigmoid": 6,
    # log_sigmoid backward: sign select (1), buffer / (1 + buffer) (2), subtract (1), * g (1)
    "log_sigmoid_backward": 5,
    # glu, per output element: sigmoid of the gate half (4), times the other half (1)
    "glu": 5,
    # glu backward, per grad element: sigmoid (4), g * s (1), 1 - s (1), * s (1), * a (1), * g
    "glu_backward": 9,
    # prelu: weight * x (1), max (1); backward: compare, select, * g (3) + weight grad (2)
    "prelu": 2, "prelu_backward": 5,
    # logit backward: x (1 - x) (2), divide (1)
    "logit_backward": 3,
    # ---- complex-valued ops, in real flops (a complex element is two reals) ---------------
    # (a + bi) + (c + di): two real adds
    "complex_add": 2, "complex_sub": 2, "complex_rsub": 2, "complex_neg": 2,
    # (a + bi)(c + di) = (ac - bd) + (ad + bc)i: 4 multiplies, 2 adds
    "complex_mul": 6,
    # (a + bi)/(c + di): c^2 + d^2 (3), ac + bd (3), bc - ad (3), two divides (2)
    "complex_div": 11, "complex_reciprocal": 5,
    # |a + bi| = sqrt(a^2 + b^2): 2 multiplies, an add, a sqrt
    "complex_abs": 4,
    # exp(a + bi) = e^a (cos b + i sin b): exp, cos, sin, 2 multiplies
    "complex_exp": 5,
    # complex multiply-accumulate (matmul, conv): 4 real multiply-accumulates per complex one
    "complex_mac": 4,
    # any other complex pointwise op: its real cost once per component, a lower bound
    "complex_factor": 2,
    # ---- reductions, per input element; per-output finishing work is added by the formula --
    # sum, prod, any/all, amax/amin/argmax/argmin, max/min: the accumulator starts at the
    # identity and meets every element once (n operations, not n - 1)
    "reduce": 1,
    # mean: the sum (1); the divide per output is added by the formula
    "mean": 1,
    # var / std (two-pass): mean (1), subtract (1), square (1), accumulate (1); the two
    # divides per output (and std's sqrt) are added by the formula
    "var": 4,
    # vector norms: p = 2: square (1) + accumulate (1); p = 1 / inf: abs (1) + accumulate
    # (1); p = 0: compare (1) + count (1); other p: abs, pow, accumulate (3)
    "norm_2": 2, "norm_1": 2, "norm_inf": 2, "norm_0": 2, "norm_p": 3,
    # logsumexp: max (1), subtract (1), exp (1), accumulate (1); log and add-back per output
    "logsumexp": 4,
    # cumsum / cumprod / cummax / cummin: one operation per element
    "cumulative": 1,
    # logcumsumexp: a running logaddexp per element
    "logcumsumexp": 7,
    # count_nonzero / nansum: a test (1) and an accumulate (1)
    "count_nonzero": 2, "nansum": 2,
    # histc: bin index (x - min) * scale (2), range test (1), increment (1)
    "histogram": 4,
    # ---- ordering ---------------------------------------------------------------------------
    # sort: ceil(log2 n) comparisons per element of a row of n (a comparison sort's count);
    # topk: ceil(log2 (k + 1)) per element (a k-heap); this entry scales both
    "comparison": 1,
    # kthvalue / median / mode: selection, about 2 comparisons per element (quickselect)
    "selection": 2,
    # ---- normalisation, per element of x -----------------------------------------------------
    # softmax over x: max (1) + subtract (1) + exp (1) + sum (1) + divide (1), per element of x
    "softmax": 5,
    # log_softmax: max + subtract + exp + sum + subtract log-sum, per element of x
    "log_softmax": 5,
    # softmax backward: g*y (1) + row sum (1) + subtract (1) + multiply by y (1)
    "softmax_backward": 4,
    # layer norm: mean (1) + subtract (1) + square (1) + sum (1) + scale by rstd (1); the same
    # statistics for batch, group and instance norm in training
    "layer_norm": 5,
    # batch norm with running statistics (eval): subtract the mean (1), scale by rstd (1)
    "batch_norm_eval": 2,
    # RMS norm: square (1) + sum (1) + scale by the reciprocal root (1)
    "rms_norm": 3,
    # affine part of a norm: multiply by weight (1), add bias (1), each when present
    "norm_affine": 1,
    # layer-norm backward, grad_input: recompute x_hat (2) + g*w (1) + two row sums (2)
    # + x_hat * sum (1) + combine (3); counted per element of x (batch and group norm too)
    "layer_norm_backward_input": 9,
    # RMS-norm backward, grad_input: g*w (1), * x (1), row sum (1), * rrms (1), x * c (1),
    # subtract (1)
    "rms_norm_backward_input": 6,
    # batch-norm backward in eval: g * (w * rstd), the product per channel precomputed
    "batch_norm_eval_backward_input": 1,
    # a norm's weight gradient: g * x_hat (1) + sum over rows (1); bias gradient: sum (1)
    "norm_backward_weight": 2, "norm_backward_bias": 1,
    # attention: scale the scores (1) before the softmax, per score element
    "attention_scale": 1,
    # ---- losses, per element of the input (the reduction is added by the formula) ------------
    # nll: test the target against ignore_index (1), negate the picked log-probability (1),
    # per sample; a class weight multiplies once more
    "nll": 2,
    # mse: subtract (1), square (1); backward: subtract, times 2/n (folded), times g (3)
    "mse": 2, "mse_backward": 3,
    # l1: subtract (1), abs (1)
    "l1": 2,
    # smooth_l1: |x - y| (2), compare with beta (1), 0.5 z^2 / beta (3) or z - beta/2; select
    # folded; backward: subtract (1), two comparisons (2), scale (1), times g (1)
    "smooth_l1": 6, "smooth_l1_backward": 5,
    # huber: |x - y| (2), compare (1), 0.5 z^2 or delta (z - delta/2) (2); backward as smooth_l1
    "huber": 5, "huber_backward": 5,
    # binary cross-entropy: (y - 1) (1), log1p(-x) (2), clamp at -100 (1), multiply (1),
    # log x (1), clamp (1), y * (1), subtract (1); backward: (x - y) / max(x(1 - x), eps)
    # (5), times g (1)
    "binary_cross_entropy": 9, "binary_cross_entropy_backward": 6,
    # with logits: log_sigmoid(x) (6), (1 - y) x (2), subtract (1); a pos_weight adds
    # (p - 1) y + 1 and its multiply (3)
    "binary_cross_entropy_with_logits": 9,
    # soft margin: log(1 + exp(-y x)): multiply, negate, exp, log1p; backward: 5
    "soft_margin": 4, "soft_margin_backward": 5,
    # multi margin, per (sample, class): margin - x_y + x_j (2), max with 0 (1), square when
    # p = 2 folded (1); backward the same
    "multi_margin": 4, "multi_margin_backward": 4,
    # ---- recurrent cells, per hidden unit per time step (the gate matmuls are MACs and the
    # biases one add per gate element, both counted by the formula) --------------------------
    # LSTM: add the two gate products (4), sigmoid on i, f, o (12), tanh on g (1),
    # c = f c + i g (3), h = o tanh(c) (2)
    "lstm_cell": 22,
    # LSTM backward: do (1), dc (5), di, df, dg, dc_prev (4), three sigmoid' (9), tanh' (3)
    "lstm_cell_backward": 22,
    # GRU: r and z: add (1) + sigmoid (4) each (10), n = tanh(i_n + r * h_n) (3),
    # h = (h - n) * z + n (3)
    "gru_cell": 16,
    # GRU backward: the forward's operations, differentiated: about two per forward one
    "gru_cell_backward": 32,
    # Elman RNN: add the two products (1), tanh or relu (1)
    "rnn_cell": 2, "rnn_cell_backward": 3,
    # ---- random and dropout ---------------------------------------------------------------
    # drawing random bits (rand, randn, randint, randperm, uniform_, normal_) is integer work
    # in the generator; we count the arithmetic done with the draws, not the draws
    "random_draw": 0,
    # bernoulli: compare a uniform draw with p
    "bernoulli": 1,
    # dropout: compare a draw with p (1), multiply by the mask (1), scale by 1 / (1 - p) (1)
    "dropout": 3,
    # dropout backward: g * mask (1) * scale (1)
    "dropout_backward": 2,
    # ---- optimizers, per parameter element ----------------------------------------------------
    # Adam(W) step, as torch's foreach/loop code spells it (the fused kernel does the same):
    # exp_avg.lerp_(g, 1 - b1) (3), exp_avg_sq.mul_(b2) (1), .addcmul_(g, g, 1 - b2) (3),
    # sqrt (1), / bias_correction2_sqrt (1), + eps (1), param.addcdiv_(exp_avg, denom,
    # -step_size) (3) = 13. Decoupled weight decay (AdamW) adds param.mul_(1 - lr*wd) (1);
    # L2 weight decay (Adam) adds grad + wd * param (2); amsgrad a maximum (1); maximize a
    # negation (1); a grad_scale an unscale (1).
    "adam_step": 13,
    # SGD: param.add_(g, alpha=-lr) (2); momentum: buf * m (1) + g (1), (1 - dampening) *
    # (1) when dampening; nesterov: g + m * buf (2); weight decay: g + wd * param (2)
    "sgd_step": 2,
})
