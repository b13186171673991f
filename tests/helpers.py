"""The tests' shared kit: counting with ours and with torch's own counter, the tiny GPT, a
stand-in for the CUDA attention kernels, the attention-mask builders and their oracle, a fake
host clock and an op log. (``fresh_dynamo`` is a fixture: tests/conftest.py.)"""

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map
from torch.utils.flop_counter import FlopCounterMode

from dispatch_flops import FlopCounter
from dispatch_flops.models import GPT, GPTConfig
from dispatch_flops.results.stats import Stats


def ours(fn, *args, model=None, **kwargs):
    with FlopCounter(model, **kwargs) as fc:
        fn(*args)
    return fc


def torch_flops(fn, *args):
    with FlopCounterMode(display=False) as mode:
        fn(*args)
    return mode.get_total_flops()


def macs_of(fc, *operators):
    """MACs of the given operators only (all when none given)."""
    by_op = fc.by_operator()
    return sum(s.macs for op, s in by_op.items() if not operators or op in operators)


TINY = GPTConfig(n_layer=2, d_model=32, n_head=4, vocab_size=64, max_seq_len=16)


def tiny_gpt(config: GPTConfig = TINY):
    """The built-in GPT at TINY's shapes (or ``config``'s), seeded: every test's tiny GPT."""
    torch.manual_seed(0)
    return GPT(config)


def tiny_ids(batch: int = 2, tokens: int = 8, config: GPTConfig = TINY):
    """Token ids for the tiny GPT."""
    return torch.randint(0, config.vocab_size, (batch, tokens))


def step(model, idx):
    """One forward + backward."""
    model(idx).sum().backward()


def attention_stats(fc) -> Stats:
    """The counts of the attention ops alone (SDPA kernels, flex operators)."""
    total = Stats()
    for name, stats in fc.by_operator().items():
        if "attention" in name:
            total = total + stats
    return total


# -- the CUDA attention kernels, on any device ------------------------------------------------
aten = torch.ops.aten

CUDA_ATTENTION_KERNELS = frozenset({
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_flash_attention_backward.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_efficient_attention_backward.default,
    aten._scaled_dot_product_cudnn_attention.default,
    aten._scaled_dot_product_cudnn_attention_backward.default,
    aten._flash_attention_forward.default,  # dense, or varlen (packed, cum_seq_q / cum_seq_k)
    aten._flash_attention_backward.default,
    aten._efficient_attention_forward.default,  # dense, or varlen (cu_seqlens_q / _k)
    aten._efficient_attention_backward.default,
})


class StandInKernels(TorchDispatchMode):
    """Runs the CUDA-only attention kernels (flash, memory-efficient and cuDNN: SDPA's
    overloads and the raw kernels, forward and backward, dense and varlen) on the CPU or meta
    as empty outputs, so that a counter above this mode sees the real op and its arguments;
    every other op runs. The outputs are those torch's meta registrations of the kernels give
    (torch/_meta_registrations.py, after each ATen schema): shapes, dtypes and strides, the
    logsumexp, the philox seed and offset, the debug mask, the max lengths, and None where the
    kernel returns an undefined tensor (cum_seq_q / cum_seq_k, a gradient not asked for), on
    the inputs' device."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in CUDA_ATTENTION_KERNELS:
            return func(*args, **kwargs)
        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        on_meta = func(*tree_map(lambda t: _like(t, "meta"), args),
                       **tree_map(lambda t: _like(t, "meta"), kwargs))
        return tree_map(lambda t: _like(t, device), on_meta)


def _like(t, device):
    """An empty tensor of ``t``'s shape, strides and dtype on ``device`` (anything else as is)."""
    if not isinstance(t, torch.Tensor):
        return t
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=device)


# -- attention masks: predicates, the masks built from them, and the oracle ---------------------
def keep_all(i, j):
    return True


def causal(i, j):
    return j <= i


def window(w):
    """Causal, each query seeing its last ``w`` keys (itself included)."""
    return lambda i, j: j <= i and i - j < w


def chunked(c):
    """Causal within chunks of ``c`` tokens."""
    return lambda i, j: j <= i and i // c == j // c


def documents(lengths):
    """Causal within each packed document of the given lengths."""
    doc = [d for d, n in enumerate(lengths) for _ in range(n)]
    return lambda i, j: j <= i and doc[i] == doc[j]


def loop_pairs(allowed, s_q: int, s_k: int) -> int:
    """Unmasked (query, key) pairs of one head: a naive loop over the predicate."""
    return sum(1 for i in range(s_q) for j in range(s_k) if allowed(i, j))


def mask_of(allowed, s_q: int, s_k: "int | None" = None) -> torch.Tensor:
    """The boolean [s_q, s_k] mask of ``allowed`` (True: the pair is kept); s_k = s_q unless
    given."""
    s_k = s_q if s_k is None else s_k
    return torch.tensor([[bool(allowed(i, j)) for j in range(s_k)] for i in range(s_q)])


def additive(keep: torch.Tensor, fill=float("-inf"), dtype=torch.float32) -> torch.Tensor:
    """The additive mask of the boolean ``keep``: 0 where kept, ``fill`` elsewhere (-inf;
    transformers' torch.finfo(dtype).min; cuDNN's -65504)."""
    return torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, fill)


# -- a fake host clock and an op log -------------------------------------------------------------
class FakeClock:
    """A host clock (``time.perf_counter``'s stand-in) that moves only when a step says how long
    it took: ``now`` moved by hand, or ``tick(meter)`` once inside a step, by ``counted_s`` when
    the meter counts that step and ``timed_s`` otherwise."""

    def __init__(self, timed_s: float = 1.0, counted_s: float = 100.0):
        self.now = 0.0
        self.timed_s, self.counted_s = timed_s, counted_s

    def __call__(self):
        return self.now

    def tick(self, meter):
        self.now += self.counted_s if meter.counting else self.timed_s


class OpLog(TorchDispatchMode):
    """The aten ops that reach the dispatcher, in order (``ops``: one name a call); compiled
    code runs under it, as the counter's mode does."""

    @classmethod
    def ignore_compile_internals(cls):
        return True

    def __init__(self) -> None:
        super().__init__()
        self.ops: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def real_package(name: str, attribute: str):
    """The installed package ``name`` (its module holding ``attribute``), else a skip: the
    original tools are not in the test extra, and ``tests/peers/<name>`` (their own tests,
    run against our drop-ins) would import as an empty namespace package of that name."""
    import pytest

    module = pytest.importorskip(name)
    if not hasattr(module, attribute):
        pytest.skip(f"{name} is not installed (only tests/peers/{name.split('.')[0]} is)")
    return module
