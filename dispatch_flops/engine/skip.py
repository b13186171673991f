"""Keeping TorchDynamo out of our dispatch code, at C level where this torch can."""

from __future__ import annotations


def _frame_skipper():
    """Where this torch has it, the C-level switch that makes TorchDynamo leave a code object's
    frames, and every frame they call, to run as they are; None where it has not."""
    try:
        from torch._C._dynamo.eval_frame import (
            _FrameAction,
            _FrameExecStrategy,
            set_code_exec_strategy,
        )
    except ImportError:
        return None
    skip = _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP)
    return lambda code: set_code_exec_strategy(code, skip)


# None where this torch lacks the switch: torch's own per-op wrapper then stays
SKIP_FRAMES = _frame_skipper()
