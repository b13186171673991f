"""Keeping TorchDynamo out of our dispatch code, at C level where this torch can."""

from __future__ import annotations

from dispatch_flops.engine.torch_private import lookup

_EVAL_FRAME = "torch._C._dynamo.eval_frame."


def _frame_skipper():
    """Where this torch has it, the C-level switch that makes TorchDynamo leave a code object's
    frames, and every frame they call, to run as they are; None where it has not (the
    feature's warning, from ``torch_private``)."""
    set_code_exec_strategy = lookup(_EVAL_FRAME + "set_code_exec_strategy")
    strategy = lookup(_EVAL_FRAME + "_FrameExecStrategy")
    action = lookup(_EVAL_FRAME + "_FrameAction")
    if set_code_exec_strategy is None or strategy is None or action is None:
        return None
    skip = strategy(action.SKIP, action.SKIP)
    return lambda code: set_code_exec_strategy(code, skip)


# None where this torch lacks the switch: torch's own per-op wrapper then stays
SKIP_FRAMES = _frame_skipper()
