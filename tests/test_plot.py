"""Plots render headless to non-empty PNGs with the expected axes and contents."""

import pytest
import torch

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")

from dispatch_flops import DeviceSpec, FlopCounter, Profile, plot  # noqa: E402
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
    # the leaves above depth 2 stay, their depth said: lm_head holds flops blocks do not
    assert labels == ["wte (depth 1)", "wpe (depth 1)", "blocks.0", "blocks.1",
                      "ln_f (depth 1)", "lm_head (depth 1)"]
    names = [label.split(" ")[0] for label in labels]
    modules = counter.by_module()
    assert sum(modules[n].flops for n in names) == modules[""].flops - modules[""].exclusive.flops
    for name, m in modules.items():  # every module of >= 1 % at depth <= 2 is shown
        if m.flops >= 0.01 * counter.total.flops and name.count(".") == 1:
            assert name in names, name
    if counter.timing:
        assert axes[1].get_xlabel() == "Latency"
    # a bar per phase that has flops in these modules: not the loss's sum (other: at the root)
    phases = [c.get_label() for c in axes[0].containers]
    assert phases == ["forward", "backward"]
    other = counter.by_module(phase="other")
    assert counter.by_phase()["other"].calls and not any(
        other[n].flops for n in names if n in other)
    for phase, bars in zip(phases, axes[0].containers):
        per_phase = counter.by_module(phase=phase)
        assert [b.get_width() for b in bars] == [
            per_phase[n].flops if n in per_phase else 0 for n in names]
    for ax in axes:  # the longest bar ends inside the axes, not on its edge
        ends = [b.get_x() + b.get_width() for c in ax.containers for b in c]
        assert ax.get_xlim()[1] > max(ends) * 1.01
    assert [t.get_text() for t in axes[-1].get_legend().get_texts()] == phases
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
        n: counter.by_module()[n].inclusive for n in plot._frontier(counter.by_module(), 3)}
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


def test_plots_of_merged_steps_say_they_are_sums(counter):
    merged = Profile.merge([counter, counter])
    titles = [plot.by_module(merged, depth=1).get_suptitle(),
              plot.icicle(merged, depth=2).get_suptitle(),
              plot.roofline(merged, CPU).axes[0].get_title()]
    assert all("(2 steps summed)" in t for t in titles), titles
    assert "summed" not in plot.by_module(merged.per_step(), depth=1).get_suptitle()


def text_boxes(fig):
    """Window boxes of every non-empty text artist the figure draws (annotations, bar
    labels, tick labels excluded), after laying it out."""
    renderer = plot._renderer(fig)
    return [(t.get_text(), t.get_window_extent(renderer)) for ax in fig.axes
            for t in ax.texts if t.get_text() and t.get_visible()], renderer


@pytest.mark.parametrize("kind", ["roofline_operator", "roofline_module", "icicle"])
def test_labels_never_overlap_or_leave_the_axes(counter, kind):
    """No two labels overlap; each lies inside its axes (an icicle's inside its bar)."""
    if kind == "icicle":
        fig = plot.icicle(counter, depth=3)
    else:
        fig = plot.roofline(counter, CPU, by=kind.split("_")[1], depth=3, label_top=30)
    boxes, renderer = text_boxes(fig)
    assert boxes
    inside = fig.axes[0].get_window_extent(renderer)
    for i, (text, box) in enumerate(boxes):
        assert inside.x0 - 1 <= box.x0 and box.x1 <= inside.x1 + 1, text
        assert inside.y0 - 1 <= box.y0 and box.y1 <= inside.y1 + 1, text
        for other, box2 in boxes[i + 1:]:
            assert not box.overlaps(box2), (text, other)


def test_roofline_labels_are_not_piled_on_the_roof(counter):
    """Untimed, every point sits on the roof: its labels still do not overlap, and the
    heaviest is labelled."""
    fig = plot.roofline(counter, CPU, label_top=20)
    boxes, _ = text_boxes(fig)
    heaviest = max(counter.by_operator().items(), key=lambda kv: kv[1].flops)[0]
    assert heaviest in [t for t, _ in boxes]


def test_log_tick_labels_are_distinct(counter):
    """Each axis's visible tick labels differ (1e-4 and 1e-3 are not both "0")."""
    fig = plot.roofline(counter, CPU, by="operator")
    renderer = plot._renderer(fig)
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    for axis, (a, b) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, ax.get_ylim())):
        shown = [t.get_text() for t, v in zip(axis.get_majorticklabels(),
                                                axis.get_majorticklocs())
                 if min(a, b) <= v <= max(a, b) and t.get_text()]
        assert len(shown) >= 2 and len(set(shown)) == len(shown), shown
    assert renderer is not None


def test_by_module_without_a_model_plots_the_operators(tmp_path):
    """A counter given no model has only its root: by_module shows its operators (those with
    flops), the most first, stacked by phase, instead of an error."""
    model, ids = tiny_gpt(), tiny_ids()
    with FlopCounter() as bare:
        step(model, ids)
    fig = plot.by_module(bare)
    render(fig, tmp_path, "by_module_bare")
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    operators = bare.by_operator()
    assert labels == sorted((n for n, s in operators.items() if s.flops),
                            key=lambda n: (-operators[n].flops, n))[:25]
    assert ax.get_ylabel() == "Operator" and "no model" in fig._suptitle.get_text()
    assert sum(b.get_width() for c in ax.containers for b in c) == pytest.approx(
        sum(operators[n].flops for n in labels))


def test_icicle_labels_the_roots_own_work(tmp_path):
    """A training step's optimizer (and loss) work is the root's own: the space after its
    children on row 1 is a hatched bar named "GPT (own)", as wide as the root's exclusive
    flops."""
    model, ids = tiny_gpt(), tiny_ids()
    optimizer = torch.optim.AdamW(model.parameters())
    with FlopCounter(model) as fc:
        step(model, ids)
        optimizer.step()
    fig = plot.icicle(fc, depth=2)
    render(fig, tmp_path, "icicle_own")
    ax = fig.axes[0]
    own = fc.by_module()[""].exclusive.flops
    assert own > 0.1 * fc.total.flops  # AdamW's step: worth a label
    hatched = [p for p in ax.patches if p.get_hatch() == "//" and p.get_y() < 1.5]
    assert len(hatched) == 1 and hatched[0].get_width() == pytest.approx(own)
    assert any(t.get_text().startswith("GPT (own)\n") for t in ax.texts)


def test_roofline_labels_do_not_overlap(tmp_path):
    """Modules of equal figures (blocks.0.mlp, blocks.1.mlp) share one label; no label
    overlaps another; the points left unlabelled are named in the corner."""
    model, ids = tiny_gpt(), tiny_ids()
    with FlopCounter(model) as fc:
        step(model, ids)
    fig = plot.roofline(fc, CPU, torch.float32, by="module", depth=3)
    render(fig, tmp_path, "roofline_labels")
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    labels = [t for t in ax.texts if not t.get_text().startswith("not labelled")]
    texts = [t.get_text() for t in labels]
    assert "blocks.{0,1}.mlp" in texts and "blocks.0.mlp" not in texts
    boxes = [t.get_window_extent(renderer) for t in labels]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    fig = plot.roofline(fc, CPU, torch.float32, by="operator", label_top=2)
    corner = [t.get_text() for t in fig.axes[0].texts if t.get_text().startswith("not lab")]
    assert len(corner) == 1 and "aten." in corner[0]
