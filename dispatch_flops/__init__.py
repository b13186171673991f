"""dispatch_flops: count what a PyTorch model really executes.

>>> from dispatch_flops import FlopCounter
>>> with FlopCounter(model) as fc:
...     model(x)
>>> print(fc)

``__all__`` is what a user imports: the classes, the functions and the three vocabularies,
string enums whose members are their strings (``Phase.FORWARD == "forward"``): ``Phase``,
``Category`` (how an op was priced) and ``Bound`` (a roofline's bound). The older constants
stay importable from here, outside ``__all__``: the members under their old names
(``FORWARD``, ``BACKWARD``, ``OPTIMIZER``, ``RECOMPUTE``, ``OTHER``; ``EXACT``,
``NO_ARITHMETIC``, ``ESTIMATED``, ``UNSUPPORTED``, ``COMMUNICATION``; ``COMPUTE_BOUND``,
``MEMORY_BOUND``, ``COMM_BOUND``: ``FORWARD is Phase.FORWARD``), ``PHASES`` (the phases in
report order), ``ROOT`` (the root's key in ``by_module()``, ``""``), ``GLOBAL`` (the root's
label without a model, ``"global"``) and ``profile_generate``'s stages (``ENCODER``,
``PREFILL``, ``DECODE``). ``profile`` is ``measure``'s old name, deprecated.
"""

from dispatch_flops.compat.deepspeed import FlopsProfiler, get_model_profile
from dispatch_flops.compat.torch_mode import FlopCounterMode
from dispatch_flops.counter import CountingWarning, FlopCounter
from dispatch_flops.engine.model.activations import Activations
from dispatch_flops.formulas import Category, Cost, has_formula, register_formula
from dispatch_flops.results.format import human
from dispatch_flops.results.profile import ModuleFacts, Profile, RunFacts
from dispatch_flops.results.roofline import (  # noqa: F401 (its constants: outside __all__)
                          COMM_BOUND,
                          COMPUTE_BOUND,
                          DEVICES,
                          MEMORY_BOUND,
                          Bound,
                          DeviceSpec,
                          Roofline,
                          device_spec,
)
from dispatch_flops.results.stats import (  # noqa: F401 (its constants: outside __all__)
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
                          Phase,
                          Stats,
)
from dispatch_flops.results.utilisation import UtilisationWarning
from dispatch_flops.workflows.diffusion import (
                          Average,
                          DenoisingStep,
                          Guidance,
                          PipelineProfile,
                          PipelineRoofline,
                          profile_pipeline,
)
from dispatch_flops.workflows.formula_check import check_formula
from dispatch_flops.workflows.generation import (  # noqa: F401 (its constants: outside __all__)
                          DECODE,
                          ENCODER,
                          PREFILL,
                          GenerationProfile,
                          GenerationRoofline,
                          StepCost,
                          profile_generate,
)
from dispatch_flops.workflows.paper import PaperTable, paper_table
from dispatch_flops.workflows.repeat import measure, profile  # noqa: F401 (profile: deprecated)
from dispatch_flops.workflows.throughput import StepTiming, ThroughputMeter, ThroughputReading
from dispatch_flops.workflows.traces import from_trace

__version__ = "0.1.0"

__all__ = [
    # counting and its results
    "FlopCounter",
    "Profile",
    "ModuleFacts",
    "RunFacts",
    "Stats",
    "ModuleStats",
    "OpRecord",
    "Coverage",
    "Activations",
    "measure",
    "human",
    # a recorded torch.profiler trace, priced offline
    "from_trace",
    # a hand-written MFU formula checked against what ran
    "check_formula",
    # the vocabularies
    "Phase",
    "Category",
    "Bound",
    # devices and the roofline
    "DeviceSpec",
    "DEVICES",
    "device_spec",
    "Roofline",
    "UtilisationWarning",
    "CountingWarning",
    # training throughput and MFU, timed on uncounted steps
    "ThroughputMeter",
    "ThroughputReading",
    "StepTiming",
    # generation
    "profile_generate",
    "GenerationProfile",
    "GenerationRoofline",
    "StepCost",
    # diffusion pipelines
    "profile_pipeline",
    "PipelineProfile",
    "PipelineRoofline",
    "DenoisingStep",
    "Average",
    "Guidance",
    # your own formulas
    "Cost",
    "register_formula",
    "has_formula",
    # torch's and DeepSpeed's APIs
    "FlopCounterMode",
    "FlopsProfiler",
    "get_model_profile",
    # paper tables (the fvcore, thop, ptflops and calflops drop-ins: dispatch_flops.compat.*)
    "paper_table",
    "PaperTable",
]
