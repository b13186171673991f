"""What enters a Profile is checked (issue 31, class 7): counts from a formula, a file or
another rank are integers from 0 to 2**100 - 1, times finite and >= 0, names from their
vocabularies; anything else is a ValueError naming the field, never a wrong total or a view
that raises. docs/limits.md states the bounds."""

import copy
import json
import math
import os
import tempfile
import tracemalloc
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from dispatch_flops import Cost, FlopCounter, Profile
from dispatch_flops.formulas import Registry
from dispatch_flops.results.facts import ModuleFacts, RunFacts
from dispatch_flops.results.roofline import DeviceSpec
from strategies import mutated


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Sequential(nn.Linear(16, 4)))


def _run() -> dict:
    """A timed training step with saved activations: every kind of field a file holds, and
    the optional lists filled in by hand (a compiled graph, a DTensor op)."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with FlopCounter(model, timing=True, saved_activations=True) as fc:
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()
    data = fc.to_dict()
    data["graph_runs"] = [{"stack": ["", "2"], "runs": 2, "forward_ns": 10, "backward_ns": 20}]
    data["in_graphs"] = ["2.0"]
    data["dtensor_ops"] = [{"overload": "aten.mm.default", "shapes": [[4, 8], [8, 16]],
                            "calls": 1, "flops": 1024, "macs": 512}]
    data["pricing_errors"] = ["a formula failed"]
    data["rank"], data["world_size"] = 0, 2
    return data


RUN = _run()
CPU = DeviceSpec.cpu(1e12, 1e11)


def from_text(text: str) -> Profile:
    """``Profile.from_json`` of a file holding ``text``."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "run.json")
        with open(path, "w") as f:
            f.write(text)
        return Profile.from_json(path)


def views(p: Profile, tmp_path=None) -> None:
    """Every view a loaded run answers, each made to run whole."""
    repr(p), str(p), p.table(), p.table(depth=1, ops=3, width=60)
    p.by_module(), p.by_operator(), p.by_phase(), p.coverage(), p.records()
    p.unsupported_ops(), p.estimated_ops(), p.flops_by_dtype(), p.logical
    p.get_flop_counts(), p.get_total_flops(), p.get_table()
    p.mfu_text(CPU), p.hfu_text(CPU), p.roofline_by_operator(CPU), p.roofline_by_module(CPU)
    p.model_flops(), p.hardware_flops()
    if p.timing:
        p.top_ops_by_time(), p.top_modules_by_time()
    p.per_step().table(), Profile.merge([p, p]).table()
    json.dumps(p.to_dict(), allow_nan=False)
    if tmp_path is not None:
        p.to_csv(tmp_path / "run.csv")


def damaged(**fields):
    """RUN with ``fields`` (dotted paths: ``records.0.stats.flops``) set."""
    data = copy.deepcopy(RUN)
    for path, value in fields.items():
        *parents, last = path.split(".")
        place = data
        for part in parents:
            place = place[int(part) if part.isdigit() else part]
        place[int(last) if last.isdigit() else last] = value
    return data


# ---- every field, named when wrong --------------------------------------------------------

BAD = [
    ("records.0.stats.flops", -5, r"records\[0\]\.stats\.flops is -5, below 0"),
    ("records.0.stats.flops", 10**400, r"records\[0\]\.stats\.flops is an integer of 1329 bits"),
    ("records.0.stats.macs", 2**100, r"records\[0\]\.stats\.macs .*not below 2\*\*100"),
    ("records.0.stats.calls", True, r"records\[0\]\.stats\.calls is True, not an integer"),
    ("records.0.stats.bytes_read", 1.0, r"records\[0\]\.stats\.bytes_read is 1\.0"),
    ("records.1.stats.latency_s", -math.inf, r"records\[1\]\.stats\.latency_s is -inf"),
    ("records.1.stats.latency_s", math.nan, r"records\[1\]\.stats\.latency_s is nan"),
    ("records.1.stats.latency_s", -1e-9, r"records\[1\]\.stats\.latency_s is -1e-09"),
    ("records.1.stats.latency_s", 1e300, r"records\[1\]\.stats\.latency_s is 1e\+300"),
    ("records.0.phase", "later", r"records\[0\]\.phase is 'later', not a phase"),
    ("records.0.category", "free", r"records\[0\]\.category is 'free', not a category"),
    ("records.0.dtype", "load", r"records\[0\]\.dtype is 'load', not the name of a dtype"),
    ("records.0.stack", [], r"records\[0\]\.stack is empty"),
    ("records.0.stack", ["", 3], r"records\[0\]\.stack\[1\] is 3, not a string"),
    ("records.0.operator", ["aten", "mm"], r"records\[0\]\.operator is a list of 2"),
    ("records.0", "aten.mm", r"records\[0\] is 'aten.mm', not a JSON object"),
    ("dtype", "load", r"dtype is 'load', not the name of a dtype"),
    ("steps", 0, r"steps is 0, below 1"),
    ("repeats", -1, r"repeats is -1, below 0"),
    ("wall_s", math.inf, r"wall_s is inf"),
    ("rank", "0", r"rank is '0', not an integer"),
    ("saved_activations", 1, r"saved_activations is 1, not true or false"),
    ("modules.1.params", -1, r"modules\[1\]\.params is -1, below 0"),
    ("modules.1.forward_span_ns", 2**63, r"modules\[1\]\.forward_span_ns is 9223372036854775808"),
    ("saved.0.bytes", -8, r"saved\[0\]\.bytes is -8, below 0"),
    ("saved.0", {"stack": [""]}, r"saved\[0\]\.bytes is missing"),
    ("graph_runs.0.forward_ns", -1, r"graph_runs\[0\]\.forward_ns is -1"),
    ("dtensor_ops.0.shapes", [[4, -8]], r"dtensor_ops\[0\]\.shapes\[0\]\[1\] is -8, below 0"),
    ("dtensor_ops.0", 7, r"dtensor_ops\[0\] is 7, not a JSON object"),
    ("pricing_errors", "one", r"pricing_errors is 'one', not a list"),
    ("in_graphs", [1], r"in_graphs\[0\] is 1, not a string"),
]


@pytest.mark.parametrize("path, value, message", BAD, ids=[f"{p}={v!r:.12}" for p, v, _ in BAD])
def test_a_bad_field_is_named_in_a_value_error(tmp_path, path, value, message):
    """Negative and huge counts, bools and floats for ints, infinite and NaN times, unknown
    names, wrong types: each a ValueError naming the file and the field, from the file and
    from the data alike."""
    data = damaged(**{path: value})
    with pytest.raises(ValueError, match=f"^data: {message}"):
        Profile.from_dict(data)
    file = tmp_path / "run.json"
    file.write_text(json.dumps(data))  # NaN and Infinity as Python writes them
    with pytest.raises(ValueError, match=f"^{file}: {message}"):
        Profile.from_json(file)


def test_a_negative_count_no_longer_lowers_the_total():
    data = damaged(**{"records.0.stats.flops": -(10**12)})
    with pytest.raises(ValueError, match="below 0"):
        Profile.from_dict(data)


def test_text_that_is_not_a_run_is_a_value_error(tmp_path):
    """Deep nesting (the parser's RecursionError), an integer too long to convert, bytes
    that are not UTF-8, trailing data, a truncated file: ValueError, saying why."""
    cases = {
        "deep": '{"schema_version": 2, "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
        "deep records": '{"schema_version": 2, "records": [' + "[" * 100_000,
        "digits": '{"schema_version": 2, "steps": ' + "9" * 5000 + "}",
        "trailing": json.dumps(RUN) + " []",
        "truncated": json.dumps(RUN)[:-100],
        "array": "[1, 2]",
        "empty": "",
    }
    expected = {"deep": "nests deeper", "deep records": "nests deeper", "digits": "not JSON",
                "trailing": "Extra data", "truncated": "not JSON", "array": "not a dispatch",
                "empty": "not JSON"}
    for name, text in cases.items():
        path = tmp_path / f"{name.replace(' ', '_')}.json"
        path.write_text(text)
        with pytest.raises(ValueError, match=expected[name]):
            Profile.from_json(path)
    path = tmp_path / "latin1.json"
    path.write_bytes(json.dumps(RUN).replace('"model": "Sequential"',
                                             '"model": "S\xe9quential"').encode("latin-1"))
    with pytest.raises(ValueError, match="UTF-8"):
        Profile.from_json(path)


def test_any_key_order_and_a_repeated_key_read_as_json_reads_them():
    """A file written with sorted keys (records before schema_version) reads the same; a
    key given twice counts once, the last, as ``json.loads`` has it."""
    text = json.dumps(RUN)
    expected = Profile.from_dict(json.loads(text)).to_dict()
    assert from_text(json.dumps(RUN, sort_keys=True)).to_dict() == expected
    twice = text[:-1] + ', "records": ' + json.dumps(RUN["records"][:1]) + "}"
    once = from_text(twice)
    assert once.to_dict() == Profile.from_dict(json.loads(twice)).to_dict()
    assert once.total.calls == RUN["records"][0]["stats"]["calls"]


def test_a_file_round_trips_exactly(tmp_path):
    p = Profile.from_dict(RUN)
    p.to_json(tmp_path / "run.json")
    assert Profile.from_json(tmp_path / "run.json").to_dict() == p.to_dict()


# ---- names a file holds are data, never looked up on torch ------------------------------------


def test_the_run_dtype_is_a_known_name_never_an_attribute_of_torch():
    assert Profile.from_dict(damaged(dtype="bfloat16")).dtype is torch.bfloat16
    # a Profile made in code with any string: the default, not torch.load
    made = Profile([], ModuleFacts(), RunFacts(dtype="load"))
    assert made.dtype is torch.float32


def test_a_custom_op_read_in_a_fresh_process_keys_torch_figures_by_name():
    """No ``torch.ops.mylib`` here: torch's getters key the op by its name, and every view
    still works."""
    data = damaged(**{"records.0.operator": "mylib.fused", "records.0.overload":
                      "mylib.fused.default", "records.0.category": "exact",
                      "records.0.phase": "forward", "records.0.stats.macs": 7,
                      "records.0.stats.flops": 14})
    p = Profile.from_dict(data)
    counts = p.get_flop_counts()
    assert counts["Global"]["mylib.fused"] == 14
    assert "mylib.fused" in p.get_table()
    for name in ("__class__.__name__", "aten.no_such_op", "load_library.x", "", "."):
        data["records"][0]["operator"] = name
        views(Profile.from_dict(data))


# ---- a formula's Cost -------------------------------------------------------------------------


@pytest.mark.parametrize("value", [10**400, 2**100, True, 1.0, -1],
                         ids=["10**400", "2**100", "True", "1.0", "-1"])
def test_a_formula_out_of_bounds_is_reported_unsupported(value):
    """A formula's counts meet the file's bounds: beyond them the call is reported
    unsupported with the error, and every view still works."""
    reg = Registry()
    reg.formula(torch.ops.aten.cos)(lambda x, *, out_shape: Cost(value, 0))
    with pytest.warns(RuntimeWarning, match="aten.cos.default .*flops is"):
        with FlopCounter(registry=reg) as fc:
            torch.randn(3).cos()
        p = fc.to_profile()
    assert p.unsupported_ops()["aten.cos"] == 1 and p.by_operator()["aten.cos"].flops == 0
    views(p)


def test_a_formula_at_the_bound_is_counted():
    reg = Registry()
    reg.formula(torch.ops.aten.cos)(lambda x, *, out_shape: Cost(2**100 - 1, 0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with FlopCounter(registry=reg) as fc:
            torch.randn(3).cos()
    assert fc.total.flops == 2**100 - 1
    views(fc.to_profile())
    assert Profile.from_dict(fc.to_dict()).total.flops == 2**100 - 1


# ---- another rank's payload -------------------------------------------------------------------


def test_a_peer_payload_is_checked_as_a_file_is(tmp_path, monkeypatch):
    """``gather`` reads each rank's payload through the same check: a rank sending a negative
    count is named, not summed."""
    import torch.distributed as dist

    from dispatch_flops.distributed import gather

    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    try:
        p = Profile.from_dict(RUN)
        assert gather(p).total == p.total
        monkeypatch.setattr(Profile, "to_dict", lambda self: damaged(
            **{"records.2.stats.bytes_written": -4096}))
        with pytest.raises(ValueError, match=r"^rank 0: records\[2\]\.stats\.bytes_written "
                                             r"is -4096, below 0"):
            gather(p)
    finally:
        dist.destroy_process_group()


# ---- size -------------------------------------------------------------------------------------


def test_a_large_file_never_stands_whole_in_memory_as_objects(tmp_path):
    """The file is parsed as it is read: the records become rows one by one and the views
    are dropped as soon as they are parsed, so the peak is about twice the file (its text,
    and its bytes while they are decoded), not the text and every parsed object (3.5x)."""
    model = nn.Sequential(*[nn.Sequential(nn.Linear(4, 4), nn.ReLU()) for _ in range(150)])
    with FlopCounter(model, timing=True) as fc:
        model(torch.randn(2, 4)).sum().backward()
    path = tmp_path / "run.json"
    fc.to_json(path)
    size = os.path.getsize(path)
    assert size > 1_000_000
    expected = fc.total
    tracemalloc.start()
    try:
        loaded = Profile.from_json(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert loaded.total == expected
    assert peak < 2.5 * size, f"peak {peak / size:.2f}x the file's {size} bytes"


# ---- fuzz -------------------------------------------------------------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_a_damaged_file_is_a_value_error_or_a_run_whose_views_all_work(data):
    """From a valid run with up to three fields damaged: ``from_dict`` raises ValueError and
    nothing else, and so does reading its JSON text; or both give the same run, on which
    every view works and which writes and reads back exactly."""
    damaged_run = data.draw(mutated(RUN))
    text = json.dumps(damaged_run)
    try:
        p = Profile.from_dict(damaged_run)
    except ValueError:
        with pytest.raises(ValueError):
            from_text(text)
        return
    assert from_text(text).to_dict() == p.to_dict()
    views(p)
    assert from_text(json.dumps(p.to_dict())).to_dict() == p.to_dict()


def test_a_time_past_a_floats_range_is_refused_not_an_overflow():
    """An int too large for a float (a damaged file's seconds) is a problem named, where
    math.isfinite would raise OverflowError (found by the fuzz test above)."""
    from dispatch_flops.results import validate

    assert "not a finite number of seconds" in validate.seconds(10**400)
    assert validate.seconds(3) is None
