"""The tracker's slot for other rooms' module hooks (``engine.counting.tracker.UserHooks``, reached
as ``FlopCounter.user_hooks``): a pre-hook runs before the tracker notes a call, a post-hook
after it notes the call's end; a handle takes them off; the counter leaves no hook behind."""

import torch
from torch import nn
from torch.nn.modules import module as torch_module

from dispatch_flops import FlopCounter


def _global_hooks() -> tuple:
    return (len(torch_module._global_forward_pre_hooks), len(torch_module._global_forward_hooks),
            len(torch_module._global_forward_hooks_always_called))


def test_user_hooks_run_around_the_trackers_notes():
    """The pre-hook sees the call not yet noted, the post-hook sees it ended, in order."""
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    counter = FlopCounter(model)
    seen = []

    def pre(module, args):
        if module is model[0]:
            seen.append(("pre", counter._tracker.current.name,
                         counter.to_profile().module_facts.calls.get("0", 0)))

    def post(module, args, output):
        if module is model[0]:
            seen.append(("post", counter._tracker.current.name,
                         counter.to_profile().module_facts.calls.get("0", 0)))

    counter.user_hooks.register(pre_fw_hook=pre)
    counter.user_hooks.register(post_fw_hook=post)
    with counter:
        model(torch.randn(2, 4))
    # before the tracker's pre-hook: the root runs, no call of "0" counted yet; after its
    # post-hook: back in the root, the call counted
    assert seen == [("pre", "", 0), ("post", "", 1)]


def test_a_handle_removes_the_hooks_and_the_counter_leaves_none():
    """A removed handle's hooks no longer run; after the block no global hook is left."""
    model = nn.Linear(4, 4)
    calls = []
    before = _global_hooks()
    counter = FlopCounter(model)
    handle = counter.user_hooks.register(lambda m, a: calls.append("pre"),
                                         lambda m, a, o: calls.append("post"))
    with counter:
        assert _global_hooks() > before
        model(torch.randn(2, 4))
    assert calls == ["pre", "post"]
    assert _global_hooks() == before
    handle.remove()
    assert not counter.user_hooks
    with FlopCounter(model) as again:
        model(torch.randn(2, 4))
    assert calls == ["pre", "post"] and again.total.flops > 0
    assert _global_hooks() == before


def test_no_user_hooks_no_extra_global_hook():
    """A counter with no user hooks registers only the tracker's own module hooks."""
    model = nn.Linear(4, 4)
    before = _global_hooks()
    with FlopCounter(model):
        during = _global_hooks()
    assert during == (before[0] + 1, before[1] + 1, before[2] + 1)
