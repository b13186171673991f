"""dispatch_flops: count what a PyTorch model really executes.

>>> from dispatch_flops import FlopCounter
>>> with FlopCounter(model) as fc:
...     model(x)
>>> print(fc)
"""

from dispatch_flops.compat.deepspeed import FlopsProfiler, get_model_profile
from dispatch_flops.compat.torch_mode import FlopCounterMode
from dispatch_flops.counter import FlopCounter
from dispatch_flops.engine.activations import Activations
from dispatch_flops.formulas import Cost, has_formula, register_formula
from dispatch_flops.results.format import human
from dispatch_flops.results.profile import ModuleFacts, Profile, RunFacts
from dispatch_flops.results.roofline import (
                          COMM_BOUND,
                          COMPUTE_BOUND,
                          DEVICES,
                          MEMORY_BOUND,
                          DeviceSpec,
                          Roofline,
                          device_spec,
)
from dispatch_flops.results.stats import (
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
from dispatch_flops.workflows.generation import (
                          DECODE,
                          ENCODER,
                          PREFILL,
                          GenerationProfile,
                          GenerationRoofline,
                          StepCost,
                          profile_generate,
)
from dispatch_flops.workflows.repeat import profile

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
