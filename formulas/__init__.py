"""dispatch_flops.formulas: the pure formula library (never imports the engine).

Importing it registers every built-in formula and the no-arithmetic table in ``REGISTRY``.
"""

from . import (  # noqa: F401  (registers)
    attention,
    collectives,
    conv,
    distance,
    estimates,  # noqa: F401  (last: the tag fallbacks)
    fft,
    fused,
    indexing,
    linalg,
    losses,
    matmul,
    no_arithmetic,
    norms,
    optimizers,
    partial,
    pointwise,
    pooling,
    quantized,
    random,
    recurrent,
    reductions,
    vision,
)
from ._registry import (
    REGISTRY,
    ZERO_COST,
    Category,
    Cost,
    Entry,
    Formula,
    Movement,
    Registry,
    has_formula,
    register_formula,
)
from ._shapes import PackedWeight, SparseInfo
from .costs import ELEMENT_COSTS

__all__ = [
    "Category",
    "Cost",
    "ELEMENT_COSTS",
    "Entry",
    "Formula",
    "Movement",
    "PackedWeight",
    "REGISTRY",
    "Registry",
    "SparseInfo",
    "ZERO_COST",
    "has_formula",
    "register_formula",
]
