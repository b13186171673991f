"""Output safety: names the user did not choose to print (a model's module names, a received
JSON file's) never act on a terminal in a text view, and never run as a formula in the CSV
file a spreadsheet opens; JSON keeps them as they are."""

import csv
import json
import unicodedata

import pytest
import torch
from hypothesis import given, settings
from torch import nn

from dispatch_flops import FlopCounter, Profile
from dispatch_flops.compat.deepspeed import FlopsProfiler
from dispatch_flops.views.escape import cell, printable
from strategies import module_names

ACTED_ON = {"Cc", "Cf", "Cs", "Zl", "Zp"}  # controls, format (bidi), surrogates, separators


def acted_on(text: str) -> list:
    """The characters of ``text`` a terminal would act on, its own line breaks aside."""
    return [c for c in text if c != "\n" and unicodedata.category(c) in ACTED_ON]


def named_model(names) -> nn.Module:
    model = nn.Sequential()
    for i, name in enumerate(names):
        model.add_module(name, nn.Linear(4, 4) if i % 2 == 0 else nn.ReLU())
    return model


def counted(names):
    model = named_model(names)
    with FlopCounter(model) as fc:
        model(torch.randn(2, 4))
    return model, fc.to_profile()


def text_views(profile: Profile) -> dict:
    return {"table": profile.table(depth=3, ops=2, columns=["type", "flops"]),
            "str": str(profile), "get_table": profile.get_table(),
            "experts_table": profile.experts_table(),
            "mfu_text": profile.mfu_text(), "conventions": str(profile.conventions(tokens=2))}


def test_terminal_escapes_in_module_names_are_shown_escaped():
    """The issue's names: cursor-up and erase-line escapes and an RLO override reach the
    table as their escapes, whole and visible; the model runs as before."""
    evil = "\x1b[1A\x1b[2Kevil\u202eRLO"
    _, profile = counted([evil, "line\nbreak"])
    table = profile.table(depth=2, columns=["flops"])
    assert not acted_on(table)
    assert "\\x1b[1A\\x1b[2Kevil\\u202eRLO" in table and "line\\nbreak" in table
    assert len(table.splitlines()) == len(profile.table(depth=2, columns=["flops"])
                                           .splitlines())
    assert printable("plain name") == "plain name"


@settings(max_examples=40, deadline=None)
@given(names=module_names(count=2))
def test_no_text_view_prints_a_character_a_terminal_acts_on(names):
    """Whatever the module names, every text view of a live run and of its JSON read back
    holds no control character, escape or bidi override, and shows each name escaped;
    JSON keeps the names as they are."""
    model, profile = counted(names)
    loaded = Profile.from_dict(json.loads(json.dumps(profile.to_dict())))
    assert set(loaded.module_names()) == set(profile.module_names()) >= set(names)
    for source in (profile, loaded):
        for view, text in text_views(source).items():
            assert not acted_on(text), (view, text)
        table = text_views(source)["table"]
        assert all(cell(name) in table for name in names)
    ds = FlopsProfiler(model)
    ds.start_profile()
    model(torch.randn(2, 4))
    ds.stop_profile()
    assert not acted_on(ds.model_profile())
    ds.end_profile()


def test_a_received_json_file_prints_no_escape():
    """A saved profile is any text: its model name, module names and op names (an unsupported
    op's name in the notes) print escaped."""
    _, profile = counted(["a", "b"])
    data = profile.to_dict()
    data["model"] = "\x1b]0;pwned\x07Model"
    for record in data["records"]:
        if record["operator"] == "aten.addmm":
            record["operator"] = record["overload"] = "evil\x1b[2J.op"
            record["category"] = "unsupported"
    loaded = Profile.from_dict(data)
    table = loaded.table(ops=1)
    assert "evil\\x1b[2J.op" in table and "\\x1b]0;pwned\\x07Model" in table
    for text in text_views(loaded).values():
        assert not acted_on(text)


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def read_csv(path) -> list:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("name", ["=1+1", "@SUM(A1)", "=cmd|' /C calc'!A0", "+1+1", "-x",
                                  "\tTAB", "\rCR"])
def test_a_csv_cell_a_spreadsheet_would_run_is_text(tmp_path, name):
    """The issue's names: written after a single quote (OWASP); the DataFrame and JSON keep
    them as they are."""
    _, profile = counted([name, "relu"])
    profile.to_csv(tmp_path / "run.csv")
    modules = {row["module"] for row in read_csv(tmp_path / "run.csv")}
    assert "'" + name in modules and name not in modules
    assert name in {row["module"] for row in profile.to_dict()["records"]}


def test_numbers_in_a_csv_stay_numbers(tmp_path):
    """A negative number, or a name that is one, is not quoted: a spreadsheet reads a
    number."""
    from dispatch_flops.views.export import spreadsheet_safe
    assert [spreadsheet_safe(v) for v in (-5, -1.5, "-5", "+2.5e3", "-.5", "-", "-5x")] == \
        [-5, -1.5, "-5", "+2.5e3", "-.5", "'-", "'-5x"]
    _, profile = counted(["-5", "relu"])
    profile.to_csv(tmp_path / "run.csv")
    rows = read_csv(tmp_path / "run.csv")
    assert "-5" in {row["module"] for row in rows}
    assert all(float(row["flops"]) >= 0 for row in rows)


@settings(max_examples=40, deadline=None)
@given(names=module_names(count=2))
def test_every_csv_cell_reads_back_and_none_is_a_formula(tmp_path_factory, names):
    """Whatever the names: the CSV reads back row for row, every text cell that would start a
    formula is the name after one quote, and numbers stay numbers."""
    _, profile = counted(names)
    path = tmp_path_factory.mktemp("csv") / "run.csv"
    profile.to_csv(path)
    from dispatch_flops.views.export import rows as csv_rows
    expected = csv_rows(profile)
    written = read_csv(path)
    assert len(written) == len(expected)
    for want, got in zip(expected, written):
        cell = got["module"]
        # the file is UTF-8: a lone surrogate is written as its escape (docs/limits.md)
        name = want["module"].encode("utf-8", "backslashreplace").decode()
        if cell.startswith(FORMULA_STARTS):
            float(cell)  # only a number may start so
            assert cell == name
        else:
            assert cell in (name, "'" + name)
            assert (cell != name) == name.startswith(FORMULA_STARTS)
        assert int(got["flops"]) == want["flops"]
