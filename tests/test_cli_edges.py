"""The command line never answers with a traceback: every error is one line on stderr (no
usage in front of it: that is ``--help``'s) and a non-zero exit, 2 for the command line, 1
for the model, its run or a file. Cases found by hand, then hypothesis over the arguments."""

import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dispatch_flops.__main__ import main

TESTS = Path(__file__).parent
CNN = f"{TESTS / 'cli_models.py'}:small_cnn"
ERROR = "dispatch-flops: error: "


def run(argv: list, capsys) -> tuple:
    """``main(argv)`` in this process: (exit code, stdout, stderr), ``sys.exit(message)``'s
    message written to stderr as the interpreter would. Anything else raised escapes."""
    try:
        main(argv)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
        if not isinstance(e.code, int) and e.code is not None:
            print(e.code, file=sys.stderr)
    out, err = capsys.readouterr()
    return code, out, err


def _one_error_line(err: str) -> str:
    """The error line: the last line on stderr, the only one that says error (warnings may
    come before it; argparse's usage never does)."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines and lines[-1].startswith(ERROR), err
    assert sum(ERROR in line for line in lines) == 1, err
    assert "Traceback" not in err and "usage:" not in err, err
    return lines[-1]


@pytest.fixture
def module_file(tmp_path):
    """``module_file(source)``: a model module written to a file of its own name."""
    count = iter(range(100))

    def write(source: str) -> str:
        path = tmp_path / f"cli_edges_model_{next(count)}.py"
        path.write_text(source)
        return str(path)
    return write


EXITS_AT_IMPORT = "import sys\nsys.exit(0)\n"
EXITS_IN_FACTORY = "def build():\n    import sys\n    sys.exit(0)\n"
EXITS_IN_FORWARD = ("import torch\n"
                    "class M(torch.nn.Module):\n"
                    "    def forward(self, x):\n"
                    "        import sys\n"
                    "        sys.exit(0)\n"
                    "def build():\n"
                    "    return M()\n")


@pytest.mark.parametrize("source, code, message", [
    (EXITS_AT_IMPORT, 2, "it called sys.exit(0)"),
    (EXITS_IN_FACTORY, 1, "building the model with"),
    (EXITS_IN_FORWARD, 1, "failed: it called sys.exit(0)"),
])
def test_a_model_that_exits_is_an_error_not_a_success(source, code, message, module_file,
                                                      capsys):
    got, out, err = run([f"{module_file(source)}:build", "--input-shape", "1,2"], capsys)
    assert got == code, (out, err)
    assert message in _one_error_line(err)
    assert out == ""  # nothing profiled, nothing printed as if it were


@pytest.mark.parametrize("argv, code, message", [
    (["--dtype", "int64", "--seq-len", "8"], 2, "--dtype int64: a model's dtype is floating"),
    ([CNN, "--input-shape", "1,3,8,8", "--dtype", "int32"], 2, "an integer dtype is for"),
    ([CNN, "--input-shape", "1,3,8,8", "--input-dtype", "complex64"], 1,
     "RuntimeError: Input type"),
    ([CNN, "--input-shape", "100000,100000,100000,3"], 1,
     "cannot make an input of shape 100000,100000,100000,3 and dtype float32"),
    ([CNN, "--input-shape", "99999999999999999999999,3"], 1, "cannot make an input"),
    ([CNN, "--input-shape", "1,3,8,8", "--input-dtype", "qint8"], 1, "cannot make an input"),
    ([CNN, "--input-shape", "1,3,8,8", "--json", ""], 2, "--json: the path is empty"),
    ([CNN, "--input-shape", "1,3,8,8", "--csv", " "], 2, "--csv: the path is empty"),
])
def test_each_error_is_one_line_and_a_non_zero_exit(argv, code, message, capsys):
    got, out, err = run(argv + ["--depth", "0"], capsys)
    assert got == code, (out, err)
    assert message in _one_error_line(err)


# ---- hypothesis over the arguments -----------------------------------------------------------
_OUT = Path(tempfile.mkdtemp(prefix="dispatch_flops_cli_edges_"))
SHAPED = {CNN: ["1,3,4,4", "2,3,8,8", "1,3,1,1"], "tests.cli_models:TinyLM": ["1,3", "2,5"],
          "tests.cli_models:with_dropout": ["2,8", "1,8"]}
MODELS = [None, *SHAPED]
WRONG_MODELS = [f"{TESTS / 'cli_models.py'}:broken", f"{TESTS / 'cli_models.py'}:not_a_model",
                "no_such_module:build", "tests.cli_models:nope", "tests.cli_models", ":",
                str(TESTS / "no_such_file.py") + ":build"]
DTYPES = ["bf16", "fp32", "fp64", "float16", "complex64"]
INPUT_DTYPES = ["int64", "int32", "bool", "uint8", "fp32", "bf16"]
WRONG_DTYPES = ["int64", "qint8", "float8_e4m3fn", "complex128", "load", "Size", "fp7", ""]
WRONG_SHAPES = ["", "x", "1,,2", "-1", "0", "1.5", "2**3", "1,3,8", "10000000000,3,8,8",
                "99999999999999999999999,3"]
PATHS = [str(_OUT / "run.out")]
WRONG_PATHS = ["", " ", str(_OUT), "/no/such/folder/run.out"]


def _either(draw, valid: list, wrong: list):
    """A value users type (four times in five) or one they mistype."""
    return draw(st.sampled_from(wrong if draw(st.integers(0, 4)) == 0 else valid))


@st.composite
def arguments(draw) -> list:
    """A command line: a model (or the demo), its inputs, dtypes, device, flags, numbers
    and output paths, each drawn from what users type and, now and then, what they
    mistype."""
    argv = []
    model = _either(draw, MODELS, WRONG_MODELS)
    if model is not None:
        argv.append(model)
    for _ in range(draw(st.integers(0 if model is None else 1, 2))):
        argv += ["--input-shape", _either(draw, SHAPED.get(model, ["1,3"]), WRONG_SHAPES)]
    if draw(st.integers(0, 3)) == 0:
        argv += ["--dtype", _either(draw, DTYPES, WRONG_DTYPES)]
    if draw(st.integers(0, 2)) == 0:
        argv += ["--input-dtype", _either(draw, INPUT_DTYPES, WRONG_DTYPES)]
    if draw(st.integers(0, 3)) == 0:
        argv += ["--device", _either(draw, ["cpu", "meta"], ["cuda:7", "", "gpu", "cuda"])]
    for flag in ("--backward", "--train", "--timing", "--deepspeed"):
        if draw(st.integers(0, 3)) == 0:
            argv.append(flag)
    for option, valid, wrong in (("--warmup", [0, 1], [-1]), ("--repeat", [1, 2], [0, -3]),
                                 ("--depth", [0, 1, 5], [-1]),
                                 ("--width", [40, 100, 10**6], [-5, 39]),
                                 ("--seq-len", [1, 8], [0, -1, 10**9]),
                                 ("--attention", ["dense", "causal"], ["sparse"])):
        if draw(st.integers(0, 4)) == 0:
            argv += [option, str(_either(draw, valid, wrong))]
    if model is None and "--seq-len" not in argv:
        argv += ["--seq-len", "4"]  # the demo at its default 128 tokens is slow to fuzz
    for option in ("--json", "--csv", "--trace"):
        if draw(st.integers(0, 5)) == 0:
            argv += [option, _either(draw, PATHS, WRONG_PATHS)]
    return argv


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(arguments())
def test_any_command_line_exits_cleanly_or_with_one_error_line(capsys, argv):
    """Every command line either runs (exit 0) or fails with one error line and exit 1 or
    2; never a traceback, never an exception out of main."""
    capsys.readouterr()
    code, out, err = run(argv, capsys)
    event(f"exit {code}")
    assert code in (0, 1, 2), (argv, code, err)
    if code:
        _one_error_line(err)
    else:
        assert "Traceback" not in err and out
