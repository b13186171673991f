"""dispatch_flops: count what a PyTorch model really executes.

>>> from dispatch_flops import FlopCounter
>>> with FlopCounter(model) as fc:
...     model(x)
>>> print(fc)
"""

from dispatch_flops.formulas import Cost, has_formula, register_formula

from ._format import human
from ._results import (
    BACKWARD,
    ESTIMATED,
    EXACT,
    FORWARD,
    NO_ARITHMETIC,
    ROOT,
    UNSUPPORTED,
    Coverage,
    ModuleStats,
    OpRecord,
    Stats,
)
from .counter import FlopCounter

__version__ = "0.1.0"

__all__ = [
    "BACKWARD",
    "Cost",
    "Coverage",
    "ESTIMATED",
    "EXACT",
    "FORWARD",
    "FlopCounter",
    "ModuleStats",
    "NO_ARITHMETIC",
    "OpRecord",
    "ROOT",
    "Stats",
    "UNSUPPORTED",
    "has_formula",
    "human",
    "register_formula",
]
