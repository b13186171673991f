"""Compatibility layers: torch's ``FlopCounterMode`` (``torch_mode``) and DeepSpeed's flops
profiler (``deepspeed``), built on ``FlopCounter``."""
