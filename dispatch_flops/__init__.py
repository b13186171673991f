"""dispatch_flops: count what a PyTorch model really executes.

>>> from dispatch_flops import FlopCounter
>>> with FlopCounter(model) as fc:
...     model(x)
>>> print(fc)
"""

from dispatch_flops.formulas import Cost, has_formula, register_formula

from ._format import human
from ._profile import profile
from ._results import BACKWARD, FORWARD, ROOT, ModuleStats, OpRecord, Stats
from ._roofline import COMPUTE_BOUND, DEVICES, MEMORY_BOUND, DeviceSpec, Roofline, device_spec
from .counter import FlopCounter

__version__ = "0.1.0"

__all__ = [
    "BACKWARD",
    "COMPUTE_BOUND",
    "Cost",
    "DEVICES",
    "DeviceSpec",
    "FORWARD",
    "FlopCounter",
    "MEMORY_BOUND",
    "ModuleStats",
    "OpRecord",
    "ROOT",
    "Roofline",
    "Stats",
    "device_spec",
    "has_formula",
    "human",
    "profile",
    "register_formula",
]
