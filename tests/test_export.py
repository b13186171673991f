"""Exports: JSON and back, CSV and pandas rows, and the Chrome trace."""

import csv
import json
from dataclasses import replace
from decimal import Decimal

import pytest
import torch
from torch import nn

from dispatch_flops import ROOT, CountingWarning, FlopCounter, Profile, Stats, measure
from dispatch_flops.engine.timing import trace as _trace
from dispatch_flops.export import COLUMNS, rows
from dispatch_flops.results.stats import PHASES
from helpers import step, tiny_gpt, tiny_ids


def gpt_run(**options):
    model = tiny_gpt()
    with FlopCounter(model, **options) as fc:
        step(model, tiny_ids())
    return fc


def no_model_run():
    with FlopCounter() as fc:
        torch.randn(4, 8) @ torch.randn(8, 3)
    return fc


def empty_run():
    with FlopCounter(nn.Linear(2, 2)) as fc:
        pass
    with pytest.warns(CountingWarning, match="counted nothing"):  # said once: on first read
        fc.to_profile()
    return fc


def reused_module_run():
    """A module called twice and a container never called itself (ModuleList)."""
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])

        def forward(self, x):
            for layer in list(self.layers) + [self.layers[0]]:
                x = layer(x)
            return x

    model = Net()
    with FlopCounter(model, timing=True) as fc:
        model(torch.randn(3, 4, requires_grad=True)).sum().backward()
    return fc


RUNS = {
    "gpt": gpt_run,
    "gpt_timed": lambda: gpt_run(timing=True),
    "no_model": no_model_run,
    "empty": empty_run,
    "reused_module": reused_module_run,
}


# ---- JSON ----------------------------------------------------------------------------------


@pytest.mark.parametrize("run", sorted(RUNS))
def test_json_round_trip(run, tmp_path):
    """A run read back from JSON gives the same dict, table, module and operator views, and
    CSV rows, as the live counter."""
    fc = RUNS[run]()
    path = tmp_path / "run.json"
    fc.to_json(path)
    loaded = FlopCounter.from_json(path)
    assert isinstance(loaded, Profile)
    assert loaded.to_dict() == fc.to_dict()
    assert loaded.table(depth=3) == fc.table(depth=3)
    assert loaded.total == fc.total and loaded.by_phase() == fc.by_phase()
    for phase in (None,) + PHASES:
        assert loaded.by_module(phase=phase) == fc.by_module(phase=phase)
        assert loaded.by_operator(phase=phase) == fc.by_operator(phase=phase)
    assert loaded.unsupported_ops() == fc.unsupported_ops()
    assert loaded.records() == fc.records()
    assert loaded.module_names() == fc.module_names()
    assert rows(loaded) == rows(fc)


def test_json_schema(tmp_path):
    """The file is plain JSON with schema_version 2 and the fields docs/schema.md lists."""
    model = tiny_gpt()
    with FlopCounter(model) as fc:
        step(model, tiny_ids())
    fc.to_json(tmp_path / "run.json")
    data = json.loads((tmp_path / "run.json").read_text())
    assert data["schema_version"] == 2
    for key in ("model", "attention", "timing", "repeats", "wall_s", "dtype", "device",
                "device_name", "has_model", "steps", "rank", "world_size", "saved", "modules",
                "total", "by_phase", "by_module",
                "by_operator", "unsupported_ops", "records"):
        assert key in data, key
    assert data["dtype"] == "float32" and data["device"] == "cpu" and data["has_model"]
    assert [m["name"] for m in data["modules"]] == [n for n, _ in model.named_modules()]
    modules = {m["name"]: m for m in data["modules"]}
    assert modules["blocks"]["calls"] == 0 and modules["blocks.0"]["calls"] == 1
    assert modules[ROOT]["params"] == sum(p.numel() for p in model.parameters())
    assert all(m["forward_span_ns"] is None for m in data["modules"])  # untimed
    record = data["records"][0]
    assert set(record) == {"module", "stack", "phase", "operator", "overload", "category",
                           "stats", "dtype"}
    assert set(record["stats"]) == set(Stats().to_dict())


def test_loaded_run_rejects_what_it_cannot_do(tmp_path):
    fc = gpt_run()
    fc.to_json(tmp_path / "run.json")
    loaded = FlopCounter.from_json(tmp_path / "run.json")
    with pytest.raises(RuntimeError, match="cannot count"):
        with loaded:
            pass
    with pytest.raises(ValueError, match="trace=True"):
        loaded.to_chrome_trace(tmp_path / "trace.json")
    data = json.loads((tmp_path / "run.json").read_text())
    (tmp_path / "v9.json").write_text(json.dumps({**data, "schema_version": 9}))
    with pytest.raises(ValueError, match="schema_version 9"):
        FlopCounter.from_json(tmp_path / "v9.json")
    (tmp_path / "other.json").write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(ValueError, match="not a dispatch_flops run"):
        FlopCounter.from_json(tmp_path / "other.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="not JSON"):
        FlopCounter.from_json(tmp_path / "bad.json")


# ---- CSV and pandas ------------------------------------------------------------------------


def test_csv_rows_add_up(tmp_path):
    """One row per module x phase x operator: exclusive columns sum to the run's totals, the
    root's inclusive rows to each phase's, and the file reads back as the rows."""
    fc = gpt_run(timing=True)
    fc.to_csv(tmp_path / "run.csv")
    with open(tmp_path / "run.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert tuple(table[0]) == COLUMNS
    assert len(table) == len(rows(fc))
    assert len({(r["module"], r["phase"], r["operator"]) for r in table}) == len(table)
    for field in ("calls", "flops", "macs", "bytes_read", "bytes_written"):
        assert sum(int(r[f"exclusive_{field}"]) for r in table) == getattr(fc.total, field)
        for phase, stats in fc.by_phase().items():
            root = [r for r in table if r["module"] == ROOT and r["phase"] == phase]
            assert sum(int(r[field]) for r in root) == getattr(stats, field)
    modules = fc.by_module(phase="forward")
    for r in table:
        if r["phase"] == "forward":
            assert int(r["flops"]) == modules[r["module"]].by_operator[r["operator"]].flops
    assert {r["depth"] for r in table if r["module"] == "blocks.0.attn"} == {"3"}


def test_csv_leaves_latency_empty_untimed(tmp_path):
    gpt_run().to_csv(tmp_path / "run.csv")
    with open(tmp_path / "run.csv", newline="") as f:
        assert {r["latency_s"] for r in csv.DictReader(f)} == {""}


def test_dataframe_is_the_csv_rows(tmp_path):
    pd = pytest.importorskip("pandas")
    fc = gpt_run()
    df = fc.to_dataframe()
    assert list(df.columns) == list(COLUMNS) and len(df) == len(rows(fc))
    assert df["exclusive_flops"].sum() == fc.total.flops
    fc.to_csv(tmp_path / "run.csv")
    from_csv = pd.read_csv(tmp_path / "run.csv", keep_default_na=False)
    assert from_csv["flops"].tolist() == df["flops"].tolist()
    assert from_csv["module"].tolist() == df["module"].tolist()
    assert df[df.module == ROOT].groupby("phase")["flops"].sum().to_dict() == {
        p: s.flops for p, s in fc.by_phase().items() if s.calls}


def test_dataframe_without_pandas_says_what_to_install(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pandas(name, *args, **kwargs):
        if name == "pandas":
            raise ImportError("no pandas")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pandas)
    with pytest.raises(ImportError, match=r"pip install pandas .*'\.\[pandas\]'"):
        no_model_run().to_dataframe()


# ---- Chrome trace --------------------------------------------------------------------------


def load_trace(path):
    """The trace, with ts/dur read as exact decimals (ns are whole)."""
    with open(path) as f:
        return json.load(f, parse_float=Decimal)


def check_trace_event_format(trace):
    """The Trace Event Format's rules for what we write: a ``traceEvents`` list; "X" events
    with name, ph, ts, dur, pid, tid and args; ts and dur numbers >= 0 in µs; on each
    (pid, tid) track, slices nest (each one inside the last one still open, or after it);
    "M" metadata events name the process and tracks. Returns the X events."""
    assert isinstance(trace, dict) and isinstance(trace["traceEvents"], list)
    slices = []
    for event in trace["traceEvents"]:
        assert event["ph"] in ("X", "M"), event
        assert isinstance(event["pid"], int) and isinstance(event["tid"], int)
        assert isinstance(event["name"], str) and isinstance(event["args"], dict)
        if event["ph"] == "M":
            assert event["name"] in ("process_name", "thread_name", "thread_sort_index")
            continue
        for key in ("ts", "dur"):
            assert isinstance(event[key], (int, Decimal)) and event[key] >= 0, event
            assert (event[key] * 1000) % 1 == 0  # whole ns
        slices.append(event)
    tracks = {}
    for event in slices:
        tracks.setdefault((event["pid"], event["tid"]), []).append(event)
    for track in tracks.values():
        track.sort(key=lambda e: (e["ts"], -e["dur"]))
        open_ends = []
        for event in track:
            end = event["ts"] + event["dur"]
            while open_ends and open_ends[-1] <= event["ts"] and open_ends[-1] < end:
                open_ends.pop()  # ended before this one starts
            assert not open_ends or end <= open_ends[-1], ("slices overlap", event)
            open_ends.append(end)
    named = {e["tid"] for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert {e["tid"] for e in slices} <= named
    return slices


def traced_step(tmp_path):
    """A tiny GPT's training step counted with trace=True, its trace written, read back and
    checked against the Trace Event Format: (counter, trace, its slices)."""
    model = tiny_gpt()
    with FlopCounter(model, trace=True) as fc:
        step(model, tiny_ids())
    fc.to_chrome_trace(tmp_path / "trace.json")
    trace = load_trace(tmp_path / "trace.json")
    return fc, trace, check_trace_event_format(trace)


def test_chrome_trace_is_valid_and_adds_up(tmp_path):
    """Valid Trace Event Format; forward and backward on their own tracks; the op slices'
    flops and bytes sum to the run's, and their count per track to each phase's calls."""
    fc, trace, slices = traced_step(tmp_path)
    tracks = {e["args"]["name"]: e["tid"] for e in trace["traceEvents"]
              if e["name"] == "thread_name"}
    assert set(tracks) == {"step", "forward", "backward", "other"}  # other: the loss
    ops = [e for e in slices if e["cat"] == "op"]
    for phase, stats in fc.by_phase().items():
        on_track = [e for e in ops if e["tid"] == tracks.get(phase)]
        assert len(on_track) == stats.calls
        for field in ("flops", "macs", "bytes_read", "bytes_written"):
            assert sum(e["args"][field] for e in on_track) == getattr(stats, field), field
    forward_modules = [e for e in slices if e["cat"] == "module" and e["tid"] == tracks["forward"]]
    called = {name for name, m in fc.by_module().items() if m.calls}
    assert {e["args"]["module"] for e in forward_modules} == called
    assert all("synthesized" not in e["args"] for e in forward_modules)
    backward_modules = [e for e in slices if e["cat"] == "module"
                        and e["tid"] == tracks["backward"]]
    assert backward_modules and all(e["args"]["synthesized"] for e in backward_modules)
    # a module call's args are the sums of the ops inside it
    attn = [e for e in forward_modules if e["args"]["module"] == "blocks.0.attn"]
    assert len(attn) == 1
    assert attn[0]["args"]["flops"] == fc.by_module(phase="forward")["blocks.0.attn"].flops
    block = [e for e in slices if e["cat"] == "block"]
    assert len(block) == 1 and block[0]["args"]["flops"] == fc.total.flops
    assert trace["otherData"]["dropped_events"] == 0


def test_trace_op_slices_sit_inside_their_module():
    """Every forward op slice lies inside a slice of the module that ran it (the innermost
    module on its stack), on the same track."""
    from dispatch_flops.export import chrome_trace

    model = tiny_gpt()
    with FlopCounter(model, trace=True) as fc:
        step(model, tiny_ids())
    slices = [e for e in chrome_trace(fc)["traceEvents"] if e["ph"] == "X"]
    forward_tid = min(e["tid"] for e in slices if e["cat"] == "op")
    spans = {}
    for e in slices:
        if e["cat"] == "module" and e["tid"] == forward_tid:
            spans.setdefault(e["args"]["module"], []).append((e["ts"], e["ts"] + e["dur"]))
    for e in slices:
        if e["cat"] == "op" and e["tid"] == forward_tid and e["args"]["module"] != ROOT:
            assert any(s <= e["ts"] and e["ts"] + e["dur"] <= t
                       for s, t in spans[e["args"]["module"]]), e


def test_trace_changes_no_count():
    """trace=True times (it implies timing) and changes no count or record."""
    plain, traced = gpt_run(), gpt_run(trace=True)
    assert traced.timing and traced.wall_s > 0
    untimed = [replace(r, stats=replace(r.stats, latency_s=None)) for r in traced.records()]
    assert untimed == plain.records()
    with pytest.raises(TypeError):
        FlopCounter(trace="yes")


def test_trace_needs_the_flag(tmp_path):
    for fc in (gpt_run(), gpt_run(timing=True)):
        with pytest.raises(ValueError, match="trace=True"):
            fc.to_chrome_trace(tmp_path / "trace.json")
    model = tiny_gpt()
    with FlopCounter(model, trace=True) as fc:
        with pytest.raises(ValueError, match="after the with block"):
            fc.to_chrome_trace(tmp_path / "trace.json")
        step(model, tiny_ids())


def test_trace_past_its_limit_drops_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(_trace, "TRACE_LIMIT", 40)
    fc, trace, slices = traced_step(tmp_path)
    assert trace["otherData"]["dropped_events"] > 0
    kept = [e for e in slices if e["cat"] != "module" or "synthesized" not in e["args"]]
    assert len(kept) == 40  # the first 40 ops and module calls; the block's own span is later
    assert fc.total.calls > 40  # counting itself is not limited


def test_measure_keeps_the_first_timed_run_as_trace(tmp_path):
    model = tiny_gpt()
    idx = tiny_ids()
    fc = measure(model, (idx,), warmup=0, repeat=2, fn=lambda i: step(model, i), trace=True)
    fc.to_chrome_trace(tmp_path / "trace.json")
    slices = check_trace_event_format(load_trace(tmp_path / "trace.json"))
    assert len([e for e in slices if e["cat"] == "op"]) == fc.total.calls
