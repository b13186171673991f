"""dispatch_flops: count what a PyTorch model really executes.

>>> from dispatch_flops import FlopCounter
>>> with FlopCounter(model) as fc:
...     model(x)
>>> print(fc)
"""

from dispatch_flops.formulas import Cost, has_formula, register_formula

from ._activations import Activations
from ._deepspeed import FlopsProfiler, get_model_profile
from ._format import human
from ._generation import (DECODE, ENCODER, PREFILL, GenerationProfile, GenerationRoofline,
                          StepCost, profile_generate)
from ._profile import ModuleFacts, Profile, RunFacts
from ._repeat import profile
from ._results import (
    BACKWARD,
    COMMUNICATION,
    ESTIMATED,
    EXACT,
    FORWARD,
    GLOBAL,
    NO_ARITHMETIC,
    OPTIMIZER,
    OTHER,
    PHASES,
    RECOMPUTE,
    ROOT,
    UNSUPPORTED,
    Coverage,
    ModuleStats,
    OpRecord,
    Stats,
)
from ._roofline import (COMM_BOUND, COMPUTE_BOUND, DEVICES, MEMORY_BOUND, DeviceSpec, Roofline,
                        device_spec)
from ._torch_mode import FlopCounterMode
from .counter import FlopCounter

__version__ = "0.1.0"

__all__ = [
    "Activations",
    "BACKWARD",
    "COMM_BOUND",
    "COMMUNICATION",
    "COMPUTE_BOUND",
    "Cost",
    "Coverage",
    "DECODE",
    "DEVICES",
    "DeviceSpec",
    "ENCODER",
    "ESTIMATED",
    "EXACT",
    "FORWARD",
    "FlopCounter",
    "FlopCounterMode",
    "FlopsProfiler",
    "GLOBAL",
    "GenerationProfile",
    "GenerationRoofline",
    "MEMORY_BOUND",
    "ModuleStats",
    "NO_ARITHMETIC",
    "OPTIMIZER",
    "ModuleFacts",
    "OpRecord",
    "OTHER",
    "PHASES",
    "PREFILL",
    "Profile",
    "RECOMPUTE",
    "ROOT",
    "Roofline",
    "RunFacts",
    "StepCost",
    "Stats",
    "UNSUPPORTED",
    "device_spec",
    "get_model_profile",
    "has_formula",
    "human",
    "profile",
    "profile_generate",
    "register_formula",
]
