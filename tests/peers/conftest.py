"""The peers' own test files, run against the drop-ins (dispatch_flops.compat.fvcore, .thop,
.ptflops): each file is the project's, at the commit its NOTICE names, with only its import
changed. All of them are slow (they run whole models through every counter). A test that
checks what only the original has (a jit graph, a tracer warning) is skipped here, with why."""

from pathlib import Path

import pytest

HERE = Path(__file__).parent

# "<folder>/<file>::<test>" -> why it cannot pass on a counter that runs the model instead of
# tracing it
SKIPPED = {
    "fvcore/test_flop_count.py::TestFlopCountAnalysis::test_autograd_function":
        "prices a jit node, prim::PythonOp._CustomOp: the drop-in sees the aten ops an "
        "autograd.Function runs (none here), not the Function",
    "fvcore/test_flop_count.py::TestFlopCountAnalysis::test_scripted_function":
        "expects the jit node prim::CallFunction unsupported: the drop-in counts what the "
        "scripted function runs (its matmul), which is supported",
    "fvcore/test_jit_model_analysis.py::TestJitModelAnalysis::test_disable_warnings":
        "asserts torch.jit's TracerWarning: the drop-in does not trace (its unsupported-op and "
        "uncalled-module logging switches are tested in tests/test_peer_shims.py)",
}


@pytest.hookimpl(tryfirst=True)  # before -m "not slow" deselects
def pytest_collection_modifyitems(config, items):
    for item in items:  # every item of the session: this folder's only
        if HERE not in Path(item.path).parents:
            continue
        item.add_marker(pytest.mark.slow)
        path = Path(item.path).relative_to(HERE).as_posix() + "::" + item.nodeid.split("::", 1)[1]
        reason = SKIPPED.get(path)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
