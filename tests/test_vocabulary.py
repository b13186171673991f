"""The package's closed vocabularies (``Phase``, ``Category``, ``Bound``) as string enums, the
old constants as their members, ``measure`` and its deprecated name ``profile``, and the
names ``__all__`` exports."""

import csv
import enum
import io
import json
import warnings

import pytest
import torch

import dispatch_flops
from dispatch_flops import (
    Bound,
    Category,
    DeviceSpec,
    FlopCounter,
    Phase,
    Profile,
    measure,
)
from dispatch_flops.formulas import REGISTRY
from dispatch_flops.results import roofline, stats
from dispatch_flops.results.torch_figures import TORCH_GLOBAL
from helpers import step, tiny_gpt, tiny_ids

OLD_NAMES = {
    "FORWARD": Phase.FORWARD, "BACKWARD": Phase.BACKWARD, "OPTIMIZER": Phase.OPTIMIZER,
    "RECOMPUTE": Phase.RECOMPUTE, "OTHER": Phase.OTHER,
    "EXACT": Category.EXACT, "NO_ARITHMETIC": Category.NO_ARITHMETIC,
    "ESTIMATED": Category.ESTIMATED, "UNSUPPORTED": Category.UNSUPPORTED,
    "COMMUNICATION": Category.COMMUNICATION,
    "COMPUTE_BOUND": Bound.COMPUTE, "MEMORY_BOUND": Bound.MEMORY,
    "COMM_BOUND": Bound.COMMUNICATION,
}
VALUES = {
    Phase: ["forward", "backward", "optimizer", "recompute", "other"],
    Category: ["exact", "no_arithmetic", "estimated", "unsupported", "communication"],
    Bound: ["compute-bound", "memory-bound", "communication-bound"],
}
MEMBERS: list[enum.Enum] = [*Phase, *Category, *Bound]


def test_values_are_the_strings_reports_and_saved_files_use():
    """The values, in order, are the strings every report and docs/schema.md name."""
    assert {v: [m.value for m in v] for v in VALUES} == VALUES


@pytest.mark.parametrize("member", MEMBERS, ids=str)
def test_a_member_is_its_string(member):
    """Equal to its value, hashed as it (dict keys read with plain strings), ordered as
    strings, and its value wherever it is printed, formatted, written to CSV or JSON."""
    value = member.value
    assert isinstance(member, str) and member == value and value == member
    assert hash(member) == hash(value)
    assert {member: 1}[value] == 1 and {value: 1}[member] == 1
    assert sorted([member, "zzz", "a"]) == sorted([value, "zzz", "a"])
    assert str(member) == f"{member}" == "{}".format(member) == "%s" % member == value
    assert f"{member:>22}|{member:<22}" == f"{value:>22}|{value:<22}"
    assert json.dumps({member: [member]}) == json.dumps({value: [value]})
    buffer = io.StringIO()
    csv.writer(buffer).writerow([member])
    assert buffer.getvalue() == value + "\r\n"
    assert "|".join([member, member]) == f"{value}|{value}"
    assert repr(member) == repr(value) and type(str(member)) is str


def _strings(data, where="data"):
    """Every key and string in ``data`` whose type is not exactly ``str``."""
    if isinstance(data, dict):
        for k, v in data.items():
            if isinstance(k, str) and type(k) is not str:
                yield f"{where} key {k!r}"
            yield from _strings(v, f"{where}[{k!r}]")
    elif isinstance(data, (list, tuple)):
        for i, v in enumerate(data):
            yield from _strings(v, f"{where}[{i}]")
    elif isinstance(data, str) and type(data) is not str:
        yield f"{where} {data!r}"


def test_saved_data_holds_plain_strings():
    """to_dict() and the CSV rows are plain data: writers that take only exact str (orjson,
    yaml.safe_dump) take them, and a live run reads as a loaded one (records, reprs)."""
    model = tiny_gpt()
    with FlopCounter(model) as fc:
        step(model, tiny_ids())
    assert list(_strings(fc.to_dict())) == []
    from dispatch_flops import export

    assert list(_strings(export.rows(fc))) == []
    loaded = Profile.from_dict(json.loads(json.dumps(fc.to_dict())))
    assert repr(fc.records()) == repr(loaded.records())
    assert repr(fc.by_phase()) == repr(loaded.by_phase())


def test_the_registrys_old_category_name_reads_as_the_new_one():
    from dispatch_flops.formulas import Category as FormulaCategory

    assert FormulaCategory.FORMULA is FormulaCategory.EXACT is Category.EXACT
    assert FormulaCategory("formula") is FormulaCategory.EXACT
    with pytest.raises(ValueError):
        FormulaCategory("no such category")


@pytest.mark.parametrize("name", sorted(OLD_NAMES))
def test_the_old_constants_are_the_members(name):
    """``FORWARD is Phase.FORWARD``: from dispatch_flops and from the module defining it."""
    home = roofline if name.endswith("_BOUND") else stats
    assert getattr(dispatch_flops, name) is getattr(home, name) is OLD_NAMES[name]


def test_phases_and_categories_stay_tuples_of_members_in_report_order():
    assert dispatch_flops.PHASES == stats.PHASES == tuple(Phase)
    assert all(type(p) is Phase for p in stats.PHASES)
    assert stats.MODEL_PHASES == (Phase.FORWARD, Phase.BACKWARD)
    assert stats.CATEGORIES == tuple(Category)


def test_one_category_vocabulary_from_the_registry_to_saved_files(tmp_path):
    """The registry's verdict is the Category a record carries (as its string, as a record
    read from a file carries it), and a saved file says its value ("exact", the name saved
    files have always used)."""
    assert Category is dispatch_flops.formulas.Category
    assert REGISTRY.lookup(torch.ops.aten.mm.default).category is Category.EXACT
    model, idx = tiny_gpt(), tiny_ids()
    with FlopCounter(model) as fc:
        step(model, idx)
    records = fc.records()
    assert {type(r.phase) for r in records} == {type(r.category) for r in records} == {str}
    assert {r.phase for r in records} <= set(Phase) and {r.category for r in records} <= set(
        Category)
    mm = [r for r in records if r.operator == "aten.mm"]
    assert mm and {r.category for r in mm} == {Category.EXACT}
    fc.to_json(tmp_path / "run.json")
    saved = json.loads((tmp_path / "run.json").read_text())
    assert {r["category"] for r in saved["records"] if r["operator"] == "aten.mm"} == {"exact"}
    assert set(saved["coverage"]["calls"]) == set(VALUES[Category])
    assert set(saved["by_phase"]) == set(VALUES[Phase])


def test_a_live_profile_and_its_saved_copy_meet(tmp_path):
    """Members (a live run) and plain strings (a file) are the same keys: views agree, and
    merging a run with its saved copy doubles every row rather than adding rows."""
    model, idx = tiny_gpt(), tiny_ids()
    with FlopCounter(model) as fc:
        step(model, idx)
    fc.to_json(tmp_path / "run.json")
    live, loaded = fc.to_profile(), Profile.from_json(tmp_path / "run.json")
    assert loaded.table() == live.table()
    assert loaded.by_phase() == live.by_phase()
    assert loaded.coverage() == live.coverage()
    merged = Profile.merge([live, loaded])
    assert len(merged.records()) == len(live.records())
    assert merged.total.calls == 2 * live.total.calls
    assert live.by_phase()[Phase.BACKWARD] == live.by_phase()["backward"]


def test_a_roofline_bound_is_a_member():
    spec = DeviceSpec.cpu(peak_flops=1e12, memory_bandwidth=50e9)
    assert spec.roofline(stats.Stats(flops=10**9, bytes_read=10)).bound is Bound.COMPUTE
    assert spec.roofline(stats.Stats(flops=1, bytes_read=10**9)).bound is Bound.MEMORY
    assert f"({Bound.MEMORY})" == "(memory-bound)"


def test_ours_and_torchs_root_names_are_two_constants():
    """Ours is lower case, as everything we print; torch's getters keep torch's key."""
    assert dispatch_flops.GLOBAL == "global"
    assert TORCH_GLOBAL == "Global"
    with dispatch_flops.FlopCounterMode(display=False) as mode:
        torch.ones(2, 3) @ torch.ones(3, 4)
    assert set(mode.get_flop_counts()) == {TORCH_GLOBAL}


# -- measure, and profile: its old name ----------------------------------------------------
def _counts(run):
    return [(r.stack, r.phase, r.overload, r.category, r.stats.calls, r.stats.flops)
            for r in run.records()]


def test_measure_is_exported_and_profile_is_not():
    assert "measure" in dispatch_flops.__all__ and "profile" not in dispatch_flops.__all__


def test_profile_still_works_and_warns_at_the_callers_line():
    """The old name runs ``measure`` with the same arguments; a FutureWarning (shown by
    default, wherever the call is) names ``measure`` and points at the caller."""
    model, idx = tiny_gpt(), tiny_ids()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = dispatch_flops.profile(model, (idx,), warmup=1, repeat=2)
    assert [w.category for w in caught] == [FutureWarning]
    assert "measure" in str(caught[0].message)
    assert caught[0].filename == __file__
    new = measure(model, (idx,), warmup=1, repeat=2)
    assert isinstance(old, Profile) and old.repeats == new.repeats == 2
    assert _counts(old) == _counts(new)
    with pytest.warns(FutureWarning), pytest.raises(ValueError):
        dispatch_flops.profile(model, (idx,), repeat=0)


def test_the_alias_shows_measures_parameters():
    import inspect

    assert inspect.signature(dispatch_flops.profile) == inspect.signature(measure)


def test_measure_does_not_warn():
    model = torch.nn.Linear(2, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        measure(model, (torch.randn(1, 2),), warmup=0, repeat=1)


# -- __all__ ---------------------------------------------------------------------------------
def test_all_names_what_a_user_imports():
    """Every name resolves; none is a bare constant (a string, a tuple, an enum member):
    classes, functions, the vocabularies, and DEVICES, the table of device specs."""
    names = dispatch_flops.__all__
    assert len(names) == len(set(names))
    for name in names:
        value = getattr(dispatch_flops, name)
        assert not isinstance(value, (str, tuple, enum.Enum)), name
        assert isinstance(value, type) or callable(value) or name == "DEVICES", name
    assert {"Phase", "Category", "Bound", "FlopCounter", "Profile", "measure"} <= set(names)


def test_star_import_gives_exactly_all():
    namespace: dict = {}
    exec("from dispatch_flops import *", namespace)
    namespace.pop("__builtins__")
    assert set(namespace) == set(dispatch_flops.__all__)


@pytest.mark.parametrize("name", sorted(OLD_NAMES) + ["PHASES", "ROOT", "GLOBAL", "ENCODER",
                                                      "PREFILL", "DECODE", "profile"])
def test_the_constants_stay_importable_outside_all(name):
    namespace: dict = {}
    exec(f"from dispatch_flops import {name}", namespace)
    assert namespace[name] is getattr(dispatch_flops, name)
    assert name not in dispatch_flops.__all__
