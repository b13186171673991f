"""The first hour of a new user (issue 46): one meaning per "model flops", every text view
fits the terminal, a view by module type, a roofline's bound that follows its own times,
calibration that says how far to trust it, and the meter's peak and tokens."""

import re
import warnings

import pytest
import torch
from torch import nn

from dispatch_flops import FlopCounter
from dispatch_flops.results.format import human
from helpers import step, tiny_gpt, tiny_ids


def _trained(loss_outside: bool = True):
    model = tiny_gpt()
    with FlopCounter(model) as fc:
        out = model(tiny_ids())
        # a loss after the model runs in phase "other": hardware work, not model flops
        (nn.functional.cross_entropy(out.flatten(0, 1), tiny_ids().flatten())
         if loss_outside else out.sum()).backward()
    return fc


def _cells(text: str, row: str) -> dict:
    lines = text.splitlines()
    header = lines[0].split()
    line = next(s for s in lines if s.startswith(row + " "))
    values = [v for v in line[len(row):].split("  ") if v.strip()]
    return dict(zip(header[1:], (v.strip() for v in values)))


def test_the_model_column_and_the_footer_say_one_model_flops():
    """The root's Model cell is the footer's model flops (forward + backward), the loss in
    phase other included in neither."""
    fc = _trained()
    assert fc.by_phase()["other"].flops > 0
    text = fc.table(depth=1, width=200)
    assert _cells(text, "GPT")["Model"] == human(fc.model_flops())
    assert f"Model flops (forward + backward): {human(fc.model_flops())}," in text
    assert human(fc.by_module()[""].inclusive.model_flops) != human(fc.model_flops())


def test_a_forward_only_footer_says_forward():
    model = tiny_gpt()
    with FlopCounter(model) as fc:
        model(tiny_ids())
    text = fc.table(width=200)
    assert "Model flops (forward): " in text and "forward + backward" not in text


# -- every text view fits the terminal -------------------------------------------------------
def _views():
    """(name, text made now) for every text view, on small real runs: the module table
    (default, explicit columns, op rows, a gathered run with ranks=True), MoE expert load,
    the MFU conventions, a generation's table and roofline. (A throughput reading and
    ``mfu_text`` are one line each, log lines: not laid out to a width.)"""
    import transformers
    from moe_models import ListMoE

    from dispatch_flops import DEVICES, profile_generate
    from dispatch_flops.workflows.distributed import gathered

    model = tiny_gpt()
    runs = []
    for _ in range(2):
        with FlopCounter(model, timing=True) as fc:
            step(model, tiny_ids())
        runs.append(fc.to_profile())
    run = gathered(runs)
    moe = nn.Sequential(nn.Linear(8, 8))
    moe.add_module("a_mixture_of_experts_layer_with_a_long_name",
                   ListMoE(8, 16, 4, [0, 1, 1, 2, 0, 0]))
    with FlopCounter(moe) as experts:
        moe(torch.randn(6, 8))
    torch.manual_seed(0)
    llm = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gp = profile_generate(llm, torch.randint(0, 64, (1, 8)), max_new_tokens=3,
                              do_sample=False, timing=True)
        with FlopCounter(llm) as lm:
            ids = torch.randint(0, 64, (2, 8))
            llm(ids, labels=ids).loss.backward()
    roof = gp.roofline("H100-SXM")
    conventions = lm.conventions(tokens_per_s=1000, device=DEVICES["A100-SXM4-80GB"])
    return lambda: [
        ("table", fc.table()), ("table ops", fc.table(depth=3, ops=3)),
        ("table columns", fc.table(depth=3, columns=["type", "calls", "flops", "percent"])),
        ("table ranks", run.table(ranks=True)), ("experts", experts.experts_table()),
        ("conventions", str(conventions)), ("generation", gp.table()),
        ("generation roofline", roof.table())]


def test_every_text_view_fits_80_and_100_columns(monkeypatch):
    """At ``COLUMNS=80`` and ``=100`` every line of every view fits, and no line ends on a
    figure whose unit starts the next."""
    views = _views()
    for width in (80, 100):
        monkeypatch.setenv("COLUMNS", str(width))
        for name, text in views():
            lines = text.splitlines()
            assert max(map(len, lines)) <= width, (name, width, text)
            unit = re.compile(r"\s+(?:[KMGTP]?B|[KMGTP]|µs|ms|%)\b")
            for line, after in zip(lines, lines[1:]):
                assert not (re.search(r"\d$", line) and unit.match(after)), (name, line, after)


def test_explicit_width_wins_and_explicit_columns_are_all_kept(monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    fc = _trained()
    text = fc.table(depth=3, ops=3, columns=["calls", "flops", "percent", "read"], width=60)
    assert max(map(len, text.splitlines())) <= 60
    header = text.splitlines()[0]
    assert all(h in header for h in ("Calls", "FLOPs", "%", "Read"))


def test_a_long_op_name_costs_no_column():
    """Op rows' names are cut to the modules' labels before any column goes."""
    fc = _trained()
    wide = fc.table(depth=1, width=100).splitlines()[0].split()
    with_ops = fc.table(depth=1, ops=5, width=100)
    assert with_ops.splitlines()[0].split() == wide
    assert any("…" in line for line in with_ops.splitlines() if "↳" in line)


def test_wrapping_never_splits_a_figure_from_its_unit():
    from dispatch_flops.views.table import wrapped

    line = "Model flops (forward + backward): 4.17 G, hardware flops (all executed): 4.30 G"
    for width in range(40, 90):
        parts = wrapped(line, width)
        assert " ".join(p.strip() for p in parts) == line
        assert not any(p.rstrip().endswith(("4.17", "4.30")) for p in parts)


# -- a view by module class ------------------------------------------------------------------
def test_by_type_against_by_module():
    """A class's inclusive figures are those of its outermost modules summed (from
    by_module), its own figures its modules' exclusive ones; own figures sum to the total."""
    fc = _trained()
    modules, types = fc.by_module(), fc.module_types()
    by_type = fc.by_type()
    for cls, s in by_type.items():
        mine = [n for n in modules if types.get(n) == cls]
        outer = [n for n in mine if not any(n.startswith(o + ".") or (o == "" and n)
                                            for o in mine if o != n)]
        assert s.flops == sum(modules[n].flops for n in outer), cls
        assert s.exclusive.flops == sum(modules[n].exclusive.flops for n in mine), cls
    assert sum(s.exclusive.flops for s in by_type.values()) == fc.total.flops
    assert by_type["SelfAttention"].calls == 2 and by_type["Linear"].calls == 9
    assert list(by_type)[0] == "GPT" and by_type["GPT"].flops == fc.total.flops
    assert by_type["MLP"].flops > by_type["SelfAttention"].flops > 0


def test_table_by_type():
    fc = _trained()
    text = fc.table(group="type", width=100)
    assert text.splitlines()[0].split()[0] == "Class"
    row = _cells(text, "SelfAttention")
    assert row["FLOPs"] == human(fc.by_type()["SelfAttention"].flops)
    assert row["Own"] == human(fc.by_type()["SelfAttention"].exclusive.flops)
    with pytest.raises(ValueError, match="group must be one of"):
        fc.table(group="class")


# -- a roofline's bound follows its own times ------------------------------------------------
def test_a_generation_rooflines_bound_follows_its_times():
    """Each step's Compute and Memory are the time of its ops on each roof: they sum to its
    attainable time, and the bound is the larger, in the data and in the printed rows."""
    import transformers

    from dispatch_flops import profile_generate

    torch.manual_seed(0)
    llm = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=2, vocab_size=64, n_positions=64)).eval()
    gp = profile_generate(llm, torch.randint(0, 64, (2, 32)), max_new_tokens=3,
                          do_sample=False)
    for device in ("H100-SXM", "L4"):
        roof = gp.roofline(device)
        for r in roof.steps:
            assert r.compute_s + r.memory_s == pytest.approx(r.attainable_s)
            assert r.bound == ("compute-bound" if r.compute_s >= r.memory_s else "memory-bound")
        for line in roof.table(width=200).splitlines()[3:3 + len(roof.steps)]:
            cells = line.split()
            assert "bound" in line and cells[-1].endswith("-bound")


# -- the meter: its peak from the start, tokens or why there are none -----------------------
def test_the_meters_peak_is_known_at_construction():
    from dispatch_flops import DeviceSpec, ThroughputMeter

    spec = DeviceSpec.cpu(1e11, 2e10)
    meter = ThroughputMeter(tiny_gpt(), device=spec)
    assert meter.peak_flop_s == 1e11 and meter.peak.startswith("100 GFLOPS float32")
    assert ThroughputMeter(tiny_gpt()).peak_flop_s is None  # a CPU without a spec: none


def test_float_inputs_log_no_tokens_per_s_and_say_why():
    from dispatch_flops import DeviceSpec, ThroughputMeter

    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    meter = ThroughputMeter(model, device=DeviceSpec.cpu(1e11, 2e10), every=10)
    x = torch.randn(4, 8)
    with pytest.warns(RuntimeWarning, match="tokens="):
        for _ in range(4):
            with meter.step(x):
                model(x).sum().backward()
        reading = meter.reading()
    assert "tokens_per_s" not in reading.metrics() and "mfu_all_ops" in reading.metrics()
    assert "no tokens/s (no token ids: step(batch, tokens=n))" in str(reading)
    given = ThroughputMeter(model, device=DeviceSpec.cpu(1e11, 2e10), every=10)
    for _ in range(4):
        with given.step(x, tokens=4):
            model(x).sum().backward()
    assert given.reading().metrics()["tokens_per_s"] > 0


# -- calibration that says how far to trust it -----------------------------------------------
def _fake_rates(monkeypatch, per_round):
    """calibration's timer replaced: round r of every figure reaches ``per_round[r]`` (x1e9;
    fp8 never runs, int8 at a millionth): the arithmetic, not this machine, under test."""
    from dispatch_flops.results import calibration

    names: dict = {}  # each figure's make function -> its dtype
    seen: dict = {}
    real = calibration._matmuls

    def matmuls(device):
        made = real(device)
        names.update({make: dtype for dtype, make in made.items()})
        return made

    def best_rate(clock, make, slice_s, sizes):
        key = names.get(make, "copy")
        r = seen[key] = seen.get(key, -1) + 1
        if key == "float8_e4m3fn":
            return None, sizes[0]
        return per_round[r] * 1e9 * (1e-6 if key == "int8" else 1), sizes[0]

    monkeypatch.setattr(calibration, "_matmuls", matmuls)
    monkeypatch.setattr(calibration, "_best_rate", best_rate)


def test_calibration_reports_its_spread_and_what_it_left_out(monkeypatch):
    from dispatch_flops import DeviceSpec
    from dispatch_flops.results.calibration import CalibrationWarning

    _fake_rates(monkeypatch, [100.0, 90.0, 95.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", CalibrationWarning)  # 10 %: no warning
        spec = DeviceSpec.calibrate("cpu", budget_s=1)
    c = spec.calibration
    assert spec.peak_flops("float32") == 100e9 and c.rounds == 3
    assert c.spread["float32"] == pytest.approx(0.1)
    assert set(c.left_out) == {"float8_e4m3fn", "int8"}
    assert "raised" in c.left_out["float8_e4m3fn"] and "emulated" in c.left_out["int8"]
    assert "int8" not in spec.peak_flops_by_dtype
    assert "(spread 10 % over 3 rounds)" in _timed_profile().mfu_text(spec)


def test_a_busy_machines_calibration_warns(monkeypatch):
    from dispatch_flops import DeviceSpec
    from dispatch_flops.results.calibration import CalibrationWarning

    _fake_rates(monkeypatch, [100.0, 20.0, 60.0])
    with pytest.warns(CalibrationWarning, match="80%"):
        spec = DeviceSpec.calibrate("cpu", budget_s=1)
    assert spec.calibration.largest_spread == pytest.approx(0.8)


def _timed_profile():
    model = nn.Linear(64, 64)
    with FlopCounter(model, timing=True) as fc:
        model(torch.randn(32, 64))
    return fc.to_profile()


# -- the README's install and the docs' figures ----------------------------------------------
ROOT = __import__("pathlib").Path(__file__).resolve().parent.parent


def test_readme_install_has_a_cpu_line_and_the_quickstart_two_commands():
    text = (ROOT / "README.md").read_text()
    install = text[text.index("## Install"):text.index("## Quickstart")]
    assert "pip install torch --index-url\nhttps://download.pytorch.org/whl/cpu" in install \
        or "pip install torch --index-url https://download.pytorch.org/whl/cpu" in install
    assert '-m "not slow"' in install
    quick = text[text.index("## Quickstart"):]
    commands = quick[quick.index("```bash\n") + 8:quick.index("```", quick.index("```bash\n") + 8)]
    assert len(commands.strip().splitlines()) == 2


def test_the_device_count_the_docs_quote_is_the_tables():
    from dispatch_flops import DEVICES

    for page in ("README.md", "docs/timing.md"):
        counts = re.findall(r"(\d+)\s+accelerators", (ROOT / page).read_text())
        assert counts and {int(n) for n in counts} == {len(DEVICES)}, page


def test_exports_sum_the_exclusive_column_per_phase():
    """docs/exports.md: rows are inclusive; exclusive_flops per phase is by_phase()'s."""
    pytest.importorskip("pandas")
    fc = _trained()
    df = fc.to_dataframe()
    sums = df.groupby("phase").exclusive_flops.sum()
    for phase, stats in fc.by_phase().items():
        assert sums.get(phase, 0) == stats.flops, phase
    assert df.flops.sum() > fc.total.flops  # the inclusive column counts ops repeatedly
