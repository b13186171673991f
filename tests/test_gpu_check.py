"""benchmarks/gpu_check.py on the CPU: it imports, exits 3 without CUDA, its verdict table
keeps within 100 columns, its JSON round-trips, and one check's error, skip or overrun never
stops the others. Nothing here needs (or uses) a GPU: the script's checks are replaced by fakes.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gc():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # its dataclasses look their module up while made
    spec.loader.exec_module(module)
    return module


def test_without_cuda_it_says_so_and_exits_3():
    """With no CUDA device the script prints one line and exits 3, writing nothing."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    env.pop("OUT", None)
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 3, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert lines == ["CUDA is not available: no GPU check ran (exit status 3)."]


def test_help(gc, capsys):
    with pytest.raises(SystemExit) as exit_:
        gc.parse(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "--quick" in text and "--out" in text


def test_quick_defaults(gc):
    args = gc.parse(["--quick"])
    assert args.budget == gc.QUICK_BUDGET_S and args.repeat == 5
    assert gc.parse([]).budget == gc.BUDGET_S


def _rows(gc):
    long = "a figure long enough to need wrapping " * 4
    return [
        gc.Verdict("1 kernel time attributed to ops", "99.93% of 412.00 ms", ">= 99 %",
                   gc.PASS, 12.3),
        gc.Verdict("2 timed step vs eager", long, "<= 1.10x", gc.FAIL, 40.0),
        gc.Verdict("4 raw Triton kernel row", "RuntimeError: " + "x" * 150,
                   "a kernel: row, time > 0", gc.ERROR, 1.0),
        gc.Verdict("7 from_trace vs live count", "not available", "equal total flops",
                   gc.SKIP),
    ]


def test_table_within_100_columns(gc):
    """Every line of the table fits 100 columns; every row's result and name appear; the
    footer counts each result."""
    rows = _rows(gc)
    text = gc.render_table(rows)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert lines[0].split() == list(gc.WIDTHS)
    for v in rows:  # a row's first line: the start of its name, its result
        assert any(line.startswith(v.check[:20]) and v.status in line for line in lines)
    assert lines[-1].startswith("4 rows: 1 PASS, 1 FAIL, 1 SKIP, 1 ERROR")
    # a long cell wraps rather than being cut: every character of the figure is kept
    start, width = gc.WIDTHS["check"] + 1, gc.WIDTHS["figure"]
    body = "".join(line[start:start + width] for line in lines[2:-1]).replace(" ", "")
    assert ("x" * 150) in body


def test_json_round_trips(gc):
    rows = _rows(gc)
    facts = {"torch": torch.__version__, "device": "NVIDIA H100 80GB HBM3", "quick": False}
    assert gc.verdicts_from_json(gc.verdicts_to_json(rows, facts)) == (rows, facts)
    with pytest.raises(ValueError, match="unknown results"):
        gc.verdicts_from_json(gc.verdicts_to_json([gc.Verdict("a", "b", "c", "MAYBE")]))


def test_exit_status(gc):
    ok = gc.Verdict("a", "", "", gc.PASS)
    assert gc.exit_status([ok, gc.Verdict("b", "", "", gc.SKIP)]) == 0
    assert gc.exit_status([ok, gc.Verdict("b", "", "", gc.ERROR)]) == 1
    assert gc.exit_status([ok, gc.Verdict("b", "", "", gc.FAIL)]) == 1


def test_one_check_failing_never_stops_the_others(gc):
    """An exception is that check's ERROR row (its first line), a Skipped its SKIP row, an
    overrun an ERROR row; the checks after each still run, and cleanup runs after every one."""
    ran, cleaned = [], []

    def boom():
        ran.append("boom")
        raise ValueError("boom\nsecond line of the message")

    def fine():
        ran.append("fine")
        return [gc.verdict("fine a", True, "1.00x", "<= 1.10x"),
                gc.verdict("fine b", False, "2.00x", "<= 1.10x")]

    def skipped():
        ran.append("skipped")
        raise gc.Skipped("no triton")

    def slow():
        ran.append("slow")
        time.sleep(5)
        return gc.verdict("slow", True, "", "")

    def last():
        ran.append("last")
        return gc.verdict("last", True, "done", "t")

    checks = [gc.Check("boom", "tb", 10, 10, boom), gc.Check("fine", "tf", 10, 10, fine),
              gc.Check("skipped", "ts", 10, 10, skipped), gc.Check("slow", "tw", 0.3, 0.3, slow),
              gc.Check("last", "tl", 10, 10, last)]
    runner = gc.Runner(60, cleanup=lambda: cleaned.append(1), log=lambda text: None)
    start = time.monotonic()
    rows = runner.run(checks)
    assert time.monotonic() - start < 3
    assert ran == ["boom", "fine", "skipped", "slow", "last"] and len(cleaned) == 5
    assert [(v.check, v.status) for v in rows] == [
        ("boom", gc.ERROR), ("fine a", gc.PASS), ("fine b", gc.FAIL), ("skipped", gc.SKIP),
        ("slow", gc.ERROR), ("last", gc.PASS)]
    assert rows[0].figure == "ValueError: boom" and rows[0].target == "tb"
    assert rows[3].figure == "no triton"
    assert "time limit" in rows[4].figure
    assert runner.current is None
    assert max(len(line) for line in gc.render_table(rows).splitlines()) <= 100


def test_a_check_cut_by_the_budget_is_skipped(gc):
    """A check whose limit is what is left of the budget, stopped there, is a SKIP row."""

    def slow():
        time.sleep(5)

    runner = gc.Runner(0.5, log=lambda text: None, min_start_s=0.1)
    rows = runner.run([gc.Check("slow", "t", 10, 10, slow)])
    assert [v.status for v in rows] == [gc.SKIP] and "stopped at the end" in rows[0].figure


def test_gpu_timing_checks_read_from_what_they_print(gc, capsys):
    """gpu_timing.py's checks print "[PASS] label: detail": each such line is a row, its
    detail the figure; a check that prints none is one row from its return value."""

    def two():
        print("a table line")
        print("[PASS] first label: 1.02x (ours 10 ms)")
        print("[FAIL] second label: 3 synchronize calls")
        return False

    rows = gc.printed("events", ["<= 1.10x", "0 syncs"], two)()
    assert [(v.check, v.figure, v.target, v.status) for v in rows] == [
        ("events", "1.02x (ours 10 ms)", "<= 1.10x", gc.PASS),
        ("events 2", "3 synchronize calls", "0 syncs", gc.FAIL)]
    assert "a table line" in capsys.readouterr().out  # still shown in the log
    rows = gc.printed("peak", ["t"], lambda: print("no spec to compare") or True)()
    assert [(v.figure, v.status) for v in rows] == [("no spec to compare", gc.PASS)]


def test_budget_and_quick(gc):
    """Checks the budget no longer covers, and those not run with --quick, are SKIP rows."""
    called = []
    checks = [gc.Check("a", "t", 10, None, lambda: called.append("a")),
              gc.Check("b", "t", 10, 10, lambda: called.append("b"))]
    rows = gc.Runner(0, quick=True, log=lambda text: None).run(checks)
    assert called == [] and [v.status for v in rows] == [gc.SKIP, gc.SKIP]
    assert "--quick" in rows[0].figure and "no time left" in rows[1].figure


def test_trace_recorded_and_read_on_the_cpu(gc, tmp_path):
    """Check 7's recording and reading, on the CPU (no device records): the file is gzip,
    trace_file reads its ops and module calls, and the README says what it holds."""
    path, _, _ = gc.record_trace(tmp_path, "cpu", torch.float32)
    assert path.name == gc.TRACE_NAME and path.read_bytes()[:2] == b"\x1f\x8b"
    facts = gc.join_trace(path)
    assert facts["ops"] > 0 and facts["modules"] > 0 and facts["device_records"] == 0
    assert facts["record_shapes"] is True and facts["attributed_share"] == 1.0
    readme = gc.write_readme(tmp_path, "cpu", facts).read_text()
    assert torch.__version__ in readme and gc.TRACE_NAME in readme
