"""Compatibility layers, built on ``FlopCounter``: torch's ``FlopCounterMode``
(``torch_mode``), DeepSpeed's flops profiler (``deepspeed``), and the tools paper tables come
from: fvcore (``fvcore``), thop (``thop``), ptflops (``ptflops``) and calflops (``calflops``),
their shared conventions registry in ``_conventions``."""
