"""What a Profile knows besides its rows: ``ModuleFacts`` (the model's modules, as the run saw
them) and ``RunFacts`` (the run: model, options, device, dtype, time, steps, rank). How each
field combines across runs is ``combine``'s table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from dispatch_flops.results.stats import GLOBAL, ROOT

# RunFacts.kernels' keys: Σ of the device activities on the blocks that recorded kernels, the
# part given to ops, the part no op launched (rows kernel:<name>), records linked to a host
# event the trace lacked, records with no link at all, CUDA graph replays, blocks that
# recorded kernels, blocks that reused each op signature's time (and that time), and those of
# them whose wall drifted from it (the next block recorded again)
KERNEL_FACTS = ("device_ns", "attributed_ns", "outside_ns", "dropped", "unlinked",
                "graph_replays", "measured_steps", "reused_steps", "reused_ns", "drifts")


@dataclass(frozen=True)
class ModuleFacts:
    """What a run knew of the model's modules. ``names`` in ``named_modules()`` order (the
    root, ``""``, alone without a model); ``types`` and ``params`` parallel to it; ``calls``
    and ``spans`` (ns inside forward calls, timing on) by name; ``saved`` (bytes saved for
    backward, ``saved_activations=True``) by the module stack that saved them."""

    names: tuple = (ROOT,)
    types: tuple = ("",)
    params: tuple = (0,)
    calls: dict = field(default_factory=dict)
    spans: dict = field(default_factory=dict)
    saved: dict = field(default_factory=dict)
    # compiled graphs (torch.compile): {stack of the module that ran them: (runs, forward ns,
    # backward ns)} (ns with timing on), and the modules whose forward ran inside one (their
    # own time does not exist: the graph runs fused kernels; see Profile.in_graphs)
    graph_runs: dict = field(default_factory=dict)
    in_graphs: tuple = ()
    # kernel timing (engine.timing.kineto): ns the device sat idle inside each module's forward
    # calls (their kernels' span minus the union of their kernels: the device waiting on the host,
    # charged to no op), by name, on the blocks that recorded kernels
    idle: dict = field(default_factory=dict)


@dataclass(frozen=True)
class RunFacts:
    """What a run was: the model's label, the counter's options, the device and dtype, the
    block's wall time (timing on), the steps it holds (``merge`` adds them), and the rank and
    world size (``None`` outside ``torch.distributed``). ``dtensor_ops``: the logical
    (unsharded) program: the DTensor-level calls the rank's counts unwrap, at their global
    shapes, and the plain-tensor ops outside them, priced times their shard factor:
    ``(overload, shapes, calls, flops, macs)`` each (see ``Profile.logical``).
    ``attention_calls`` and ``parameters``: what the MFU conventions read (``conventions``):
    the forward attention calls, ``(stack, batch, heads, q_len, k_len, head_dim, value_dim,
    causal, calls)`` each, and the model's parameters in groups, ``(name, count)`` pairs
    (``engine.model.module_facts``)."""

    model: str = GLOBAL  # the root's label: the model's class name
    has_model: bool = False
    attention: str = "dense"
    timing: bool = False
    saved_activations: bool = False
    repeats: int = 1
    wall_s: Optional[float] = None
    steps: int = 1
    dtype: str = "float32"
    device: Optional[str] = None
    device_name: Optional[str] = None
    rank: Optional[int] = None
    world_size: Optional[int] = None
    # formulas that failed on some call (their calls are reported unsupported), one line each
    pricing_errors: tuple = ()
    dtensor_ops: tuple = ()
    # torch.backends.cuda.matmul.allow_tf32 when the block began: fp32 matmuls run on tf32
    # tensor cores, and MFU divides their flops by the tf32 peak
    allow_tf32: bool = False
    attention_calls: tuple = ()
    parameters: tuple = ()
    # a pipeline stage's actions (``dispatch_flops.distributed.pipeline_stage``), in the order
    # they ran: ``(stage, action, microbatch, start_ns, ns, sent, received)`` each; action
    # torch's letter ("F" forward, "B" full backward, "I" input gradients, "W" weight
    # gradients), ns its time (start_ns from the block's start; both 0 untimed), sent and
    # received the bytes of the activations (F) or gradients (B, I) it sent and received
    pipeline: tuple = ()
    # MoE layers (engine.model.expert_load): ``(layer, tokens per expert, rows computed per expert,
    # calls)`` each, in tree order; rows exceed tokens where the kernel pads to a capacity
    experts: tuple = ()
    # kernel timing (engine.timing.kineto): what the join of the recorded blocks found, ints by
    # KERNEL_FACTS' names (empty otherwise); see ``ProfileViews.kernel_time``
    kernels: dict = field(default_factory=dict)
    # attention calls whose mask had no values (a user's mask on meta or fake tensors): model
    # flops keep every pair of theirs, the padding they would mask not subtracted
    unvalued_masks: int = 0
