"""Small helpers for the tests: counting with ours and with torch's own counter."""

from torch.utils.flop_counter import FlopCounterMode

from dispatch_flops import FlopCounter


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
