"""The workflows' results as their views read them: one Protocol per result a view lays out.

Workflows sit above the views and call them directly (``GenerationProfile.table()`` is
``views.text.generation_table(self)``); a view never imports the workflows. What it reads
of a result is written here, public fields only, and the workflow's class has it (mypy
checks it where the workflow hands itself over): ``workflows.generation``'s
``GenerationProfile`` and ``GenerationRoofline``, ``workflows.diffusion``'s
``PipelineProfile`` and ``PipelineRoofline``, ``workflows.throughput``'s
``ThroughputReading``, ``workflows.paper``'s ``PaperTable``.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol

from dispatch_flops.results.profile import Profile
from dispatch_flops.results.roofline import Roofline
from dispatch_flops.results.stats import Stats


class GenerationProfileLike(Protocol):
    @property
    def encoder(self) -> Optional[Profile]: ...

    @property
    def outside(self) -> Profile: ...

    @property
    def decode(self) -> tuple: ...

    @property
    def steps(self) -> tuple: ...

    @property
    def timing(self) -> bool: ...

    @property
    def kv_cache_bytes(self) -> tuple: ...

    @property
    def kv_cache_filled_bytes(self) -> tuple: ...

    def per_token(self) -> list[Any]: ...  # StepCost, prefill first


class GenerationRooflineLike(Protocol):
    @property
    def device(self) -> str: ...

    @property
    def steps(self) -> tuple: ...  # Roofline per step

    @property
    def measured_time_to_first_token_s(self) -> Optional[float]: ...

    @property
    def measured_tokens_per_s(self) -> Optional[float]: ...


class PipelineProfileLike(Protocol):
    @property
    def profile(self) -> Profile: ...

    @property
    def components(self) -> dict: ...

    @property
    def denoising(self) -> tuple: ...  # DenoisingStep

    @property
    def outside(self) -> Profile: ...

    @property
    def images(self) -> int: ...

    @property
    def calls(self) -> dict: ...

    @property
    def order(self) -> tuple: ...

    @property
    def total(self) -> Stats: ...

    @property
    def timing(self) -> bool: ...

    @property
    def guidance(self) -> str: ...

    @property
    def evaluations_per_image(self) -> float: ...

    def per_image(self) -> Any: ...  # Average

    def per_step(self) -> Any: ...  # Average


class PipelineRooflineLike(Protocol):
    @property
    def device(self) -> str: ...

    @property
    def steps(self) -> tuple: ...  # Roofline per denoising step

    @property
    def components(self) -> dict: ...

    @property
    def outside(self) -> Roofline: ...

    @property
    def order(self) -> tuple: ...

    @property
    def measured_image_s(self) -> Optional[float]: ...


class ThroughputReadingLike(Protocol):
    @property
    def steps(self) -> int: ...

    @property
    def step_s(self) -> float: ...

    @property
    def tokens(self) -> float: ...

    @property
    def tokens_per_s(self) -> float: ...

    @property
    def model_flops(self) -> float: ...

    @property
    def hardware_flops(self) -> float: ...

    @property
    def mfu_all_ops(self) -> Optional[float]: ...

    @property
    def hfu_all_ops(self) -> Optional[float]: ...

    @property
    def peak(self) -> Optional[str]: ...

    @property
    def counted_steps(self) -> int: ...

    @property
    def unpriced_steps(self) -> int: ...


class PaperTableLike(Protocol):
    @property
    def rows(self) -> tuple: ...  # PaperRow: name, inputs, params, macs, flops, model_flops

    @property
    def step(self) -> str: ...
