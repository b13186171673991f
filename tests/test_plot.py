"""Plots render headless to non-empty PNGs with the expected axes and contents."""

import pytest
import torch

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from dispatch_flops import DeviceSpec, FlopCounter, plot  # noqa: E402
from helpers import step, tiny_gpt, tiny_ids  # noqa: E402

CPU = DeviceSpec.cpu(peak_flops=1e11, memory_bandwidth=2e10)


@pytest.fixture(scope="module", params=["untimed", "timed"])
def counter(request):
    model = tiny_gpt()
    with FlopCounter(model, timing=request.param == "timed") as fc:
        step(model, tiny_ids())
    return fc


def render(fig, tmp_path, name):
    path = tmp_path / f"{name}.png"
    fig.savefig(path, dpi=50)
    assert path.stat().st_size > 1000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_by_module_bars(counter, tmp_path):
    """One bar per module at the depth, stacked by phase; a latency panel when timed."""
    fig = plot.by_module(counter, depth=2)
    render(fig, tmp_path, "by_module")
    axes = fig.axes
    assert len(axes) == (2 if counter.timing else 1)
    assert axes[0].get_xlabel() == "FLOPs" and axes[0].get_ylabel() == "Module (depth 2)"
    labels = [t.get_text() for t in axes[0].get_yticklabels()]
    assert labels == ["blocks.0", "blocks.1"]
    if counter.timing:
        assert axes[1].get_xlabel() == "Latency"
    forward, backward = (c for c in axes[0].containers)
    assert [b.get_width() for b in forward] == [
        counter.by_module(phase="forward")[n].flops for n in labels]
    assert [b.get_width() for b in backward] == [
        counter.by_module(phase="backward")[n].flops for n in labels]
    with pytest.raises(ValueError, match="depth 9"):
        plot.by_module(counter, depth=9)


def test_icicle(counter, tmp_path):
    fig = plot.icicle(counter, depth=3)
    render(fig, tmp_path, "icicle")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "FLOPs" and ax.get_ylabel() == "Depth"
    widths = sorted(p.get_width() for p in ax.patches)
    assert widths[-1] == counter.total.flops  # the root spans the whole axis
    if counter.timing:
        render(plot.icicle(counter, depth=2, metric="latency_s"), tmp_path, "icicle_time")
    with pytest.raises(ValueError, match="metric"):
        plot.icicle(counter, metric="joules")


@pytest.mark.parametrize("by", ["operator", "module"])
def test_roofline(counter, by, tmp_path):
    fig = plot.roofline(counter, CPU, torch.float32, by=by, depth=3)
    render(fig, tmp_path, f"roofline_{by}")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "Arithmetic intensity (FLOP/byte)"
    assert ax.get_ylabel() == ("Achieved FLOP/s" if counter.timing
                               else "Attainable FLOP/s (untimed: on the roof)")
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "cpu (float32)" in ax.get_title()
    roof = ax.lines[0]
    assert max(roof.get_ydata()) == pytest.approx(1e11)  # the compute roof
    points = sum(len(c.get_offsets()) for c in ax.collections)
    entries = counter.by_operator() if by == "operator" else {
        n: m.inclusive for n, m in counter.by_module().items() if n.count(".") == 2}
    assert points == len([s for s in entries.values() if s.flops and s.bytes]) > 0
    if not counter.timing:  # untimed points sit on the roof
        for collection in ax.collections:
            for x, y in collection.get_offsets():
                assert y == pytest.approx(min(1e11, 2e10 * x))


def test_plots_of_a_loaded_run(counter, tmp_path):
    counter.to_json(tmp_path / "run.json")
    loaded = FlopCounter.from_json(tmp_path / "run.json")
    render(plot.by_module(loaded, depth=1), tmp_path, "loaded_by_module")
    render(plot.roofline(loaded, CPU), tmp_path, "loaded_roofline")
