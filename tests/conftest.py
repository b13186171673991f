from pathlib import Path

import pytest
import torch
from hypothesis import settings

settings.register_profile("ci", max_examples=25, deadline=None)
settings.load_profile("ci")
torch.manual_seed(0)

GOLDEN = Path(__file__).parent / "golden"

# The suite is written against the torch CI runs first (2.13); .ci/run then runs the core suite
# (-m "not slow") on the oldest torch pyproject.toml declares. These tests pin what one torch
# does (golden text of its reprs, the ops its CPU kernels and decompositions run, ops it
# added), not what this package does: on an older torch they are skipped, saying why. The
# versions are where each first passed among 2.8.0, 2.9.1, 2.10.0, 2.11.0, 2.12.1 and 2.13.0.
_OLDER_TORCH_DIFFERS = {
    "test_deepspeed.py::test_golden_forward_profile":
        ("2.12", "golden text: nn.LayerNorm's repr has no bias= before torch 2.12"),
    "test_deepspeed.py::test_golden_training_step_profile":
        ("2.12", "golden text: nn.LayerNorm's repr has no bias= before torch 2.12"),
    "test_profile.py::test_table_golden":
        ("2.10", "golden table: torch before 2.10 runs more view ops"),
    "test_formulas.py::test_sdpa_forward_matches_math_decomposition":
        ("2.9", "torch 2.8 picks another CPU SDPA kernel"),
    "test_formulas.py::test_sdpa_backward_is_decomposition_plus_recompute":
        ("2.9", "torch 2.8 picks another CPU SDPA kernel"),
    "test_counter.py::test_an_op_this_torch_lacks_is_a_name_that_is_never_met":
        ("2.9", "the library names aten._fused_rms_norm_backward, which torch 2.8 lacks"),
    "test_decompositions.py::test_fused_op_matches_its_decomposition[rms_norm]":
        ("2.10", "torch 2.9's aten._fused_rms_norm runs another decomposition"),
    "test_decompositions.py::test_fused_op_matches_its_decomposition[silu_backward]":
        ("2.13", "torch's decomposition of the op changed in 2.13"),
    "test_decompositions.py::test_fused_op_matches_its_decomposition[max_pool2d]":
        ("2.13", "torch's decomposition of the op changed in 2.13"),
    "test_decompositions.py::test_fused_op_matches_its_decomposition[embedding_backward]":
        ("2.13", "torch's decomposition of the op changed in 2.13"),
    # checked on 2.13 and found to differ on 2.8 (CI's floor); the versions between untried
    "test_attention_masks.py::test_model_and_hardware_flops[GQA 2:1 window 64]":
        ("2.13", "torch 2.8 runs SDPA with GQA and a mask on its math path (bmm, "
                 "_safe_softmax: priced and masked right, checked by hand); the test reads only "
                 "the fused kernel's rows"),
    "test_attention_masks.py::test_model_and_hardware_flops[HF Gemma-3 sdpa (sliding + global)]":
        ("2.13", "on torch 2.8 the test's fused rows hold half the hardware MACs (4,194,304 "
                 "of 8,388,608): likely one layer on SDPA's math path, as with GQA above"),
    "test_attention_masks.py::test_flex_backward_operator_is_counted":
        ("2.13", "the test calls flex_attention_backward with torch 2.13's arguments"),
    "test_conventions.py::test_real_run_reads_fused_causal_attention_and_recompute":
        ("2.13", "on torch 2.8 transformers passes Llama's SDPA a mask, not is_causal"),
    "test_pipeline.py::test_sharding_propagation_by_decomposition_is_not_counted":
        ("2.13", "torch 2.8's DTensor has no sharding rule for hardswish (no propagation by "
                 "decomposition): the op raises"),
}
# files whose module-level code calls what an older torch has not got
collect_ignore = []
if torch.__version__ < "2.9":  # aten._fused_rms_norm took normalized_shape_ndim, not a shape
    collect_ignore.append("test_decompositions.py")


def pytest_collection_modifyitems(config, items):
    for item in items:
        since = _OLDER_TORCH_DIFFERS.get(item.nodeid.removeprefix("tests/"))
        if since is not None and torch.__version__ < since[0]:
            item.add_marker(pytest.mark.skip(reason=f"torch < {since[0]}: {since[1]}"))


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite the expected outputs in tests/golden/ from the current ones")


@pytest.fixture
def golden(request):
    """``golden(name, text)``: ``text`` must equal ``tests/golden/<name>``; with
    ``--update-golden`` the file is rewritten instead."""
    update = request.config.getoption("--update-golden")

    def check(name: str, text: str) -> None:
        path = GOLDEN / name
        if update:
            GOLDEN.mkdir(exist_ok=True)
            path.write_text(text)
            return
        assert path.exists(), f"no golden {name}: run pytest --update-golden"
        assert text == path.read_text()

    return check


@pytest.fixture(autouse=True)
def _no_columns(monkeypatch):
    """Tables fit ``COLUMNS`` when it is set (piped output too), and pytest-xdist's workers
    run with COLUMNS=80: each test starts without it (100 columns, output not a terminal),
    and the tests about COLUMNS set it themselves."""
    monkeypatch.delenv("COLUMNS", raising=False)


@pytest.fixture
def fresh_dynamo():
    """Dynamo reset before and after the test (its caches, compiled frames and counters), so
    that what a test compiles and counts is its own: ``pytest.mark.usefixtures("fresh_dynamo")``
    in a file that compiles."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()
