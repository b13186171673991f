"""A stand-in for ``torch.cuda.CUDAGraph`` on a machine without a GPU (a CPU build of torch
refuses to make one), with the same surface: ``capture_begin(pool=None,
capture_error_mode="global", check_input_liveness=False)``, ``capture_end()``, ``replay()``,
``reset()``, ``pool()``; ``graph(g)`` is ``torch.cuda.graph``'s context (capture_begin on
entry, capture_end on exit, exceptions passed on) and ``make_graphed_callables`` follows
torch's: warm-up runs, the forward captured, the backward captured through
``torch.autograd.grad``, then an autograd Function that replays one graph in forward and the
other in backward.

As on a GPU, the ops between capture_begin and capture_end dispatch (on the CPU they also
run: their outputs are the graph's static outputs), and a replay dispatches nothing; here it
only counts itself (``replays``). While a capture is on, a ``cuda_graph_capture`` range is
open (Kineto sees it; the synthetic GPU launches no kernel inside it, as CUDA does not), and a
replay runs inside a ``cudaGraphLaunch`` range the synthetic GPU gives the graph's kernels.
"""

from __future__ import annotations

import contextlib

import torch
from torch._C._profiler import _RecordFunctionFast

CAPTURE_RANGE = "cuda_graph_capture"
LAUNCH_RANGE = "launch_graph:"  # + the graph's number: SyntheticGpu replays its kernels there
_count = [0]


class StandInGraph:
    def __init__(self, keep_graph: bool = False) -> None:
        self.keep_graph = keep_graph
        self.replays = 0
        self.captured = False
        self.number = _count[0]
        _count[0] += 1
        self._range = None

    def capture_begin(self, pool=None, capture_error_mode: str = "global",
                      check_input_liveness: bool = False) -> None:
        if capture_error_mode not in ("global", "thread_local", "relaxed"):
            raise RuntimeError(f"Unknown capture error mode. Expected `global`, "
                               f"`thread_local`, or `relaxed`, got {capture_error_mode}")
        self._range = _RecordFunctionFast(CAPTURE_RANGE)
        self._range.__enter__()

    def capture_end(self) -> None:
        if self._range is None:
            raise RuntimeError("capture_end without capture_begin")
        self._range.__exit__(None, None, None)
        self._range = None
        self.captured = True

    def replay(self) -> None:
        if not self.captured:
            raise RuntimeError("replay of a graph never captured")
        self.replays += 1
        with _RecordFunctionFast(f"{LAUNCH_RANGE}{self.number}"):
            pass

    def reset(self) -> None:
        self.captured = False

    def pool(self):
        return (0, self.number)

    def raw_cuda_graph_exec(self) -> int:
        return self.number


@contextlib.contextmanager
def graph(cuda_graph: StandInGraph, pool=None, capture_error_mode: str = "global"):
    """``torch.cuda.graph``: capture what the block runs into ``cuda_graph``."""
    cuda_graph.capture_begin(pool, capture_error_mode=capture_error_mode)
    try:
        yield
    finally:
        cuda_graph.capture_end()


def make_graphed_callables(module: torch.nn.Module, sample: torch.Tensor,
                           warmup: int = 3):
    """torch's ``make_graphed_callables`` for one module and one input, on the stand-in:
    ``(graphed, forward graph, backward graph)``."""
    params = tuple(p for p in module.parameters() if p.requires_grad)
    static_in = sample.detach().clone().requires_grad_(sample.requires_grad)
    for _ in range(warmup):  # torch warms up on a side stream: real runs, real kernels
        out = module(static_in)
        torch.autograd.grad(out, (static_in,) + params, torch.ones_like(out),
                            allow_unused=True)
    fwd, bwd = StandInGraph(), StandInGraph()
    with graph(fwd):
        static_out = module(static_in)
    static_grad_out = torch.ones_like(static_out)
    with graph(bwd):
        grads = torch.autograd.grad(static_out, (static_in,) + params, static_grad_out,
                                    allow_unused=True)
    static_grads = tuple(g.detach() if g is not None else None for g in grads)

    class Graphed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, *weights):
            static_in.detach().copy_(x)  # torch copies the input into the static buffer
            fwd.replay()
            return static_out.detach()

        @staticmethod
        def backward(ctx, grad):
            static_grad_out.copy_(grad)
            bwd.replay()
            return static_grads

    def graphed(x):
        return Graphed.apply(x, *params)

    return graphed, fwd, bwd
