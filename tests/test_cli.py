"""The command line, run as users run it: ``python -m dispatch_flops`` in a subprocess."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dispatch_flops import FlopCounter
from dispatch_flops.__main__ import main

TESTS = Path(__file__).parent
CNN = f"{TESTS / 'cli_models.py'}:small_cnn"


def cli(*args, cwd=TESTS.parent):
    env = {**{k: v for k, v in os.environ.items() if k != "COLUMNS"},  # not a terminal: 100
           "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS.parent),
                                                       os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "dispatch_flops", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def header(out: str) -> str:
    """The run's header line, unwrapped (it is wrapped to the table's width)."""
    return " ".join(line.strip() for line in out.split("\n\n")[0].splitlines())


@pytest.mark.slow
def test_no_arguments_profiles_the_demo():
    for args in ((), ("--depth", "1", "--seq-len", "16")):  # the README's command first
        done = cli(*args)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("GPT demo: 4 layers")
        assert "blocks" in done.stdout
        # not a terminal: the header and the table fit 100 characters
        assert max(map(len, done.stdout.splitlines())) <= 100


@pytest.mark.slow
def test_factory_from_a_file_with_exports(tmp_path):
    """MODULE:FACTORY as a file: the table, and JSON that reads back to the same table."""
    done = cli(CNN, "--input-shape", "2,3,8,8", "--backward", "--depth", "1",
               "--json", str(tmp_path / "run.json"), "--csv", str(tmp_path / "run.csv"))
    assert done.returncode == 0, done.stderr
    assert "input 2x3x8x8 float32 on cpu, forward + backward" in done.stdout
    loaded = FlopCounter.from_json(tmp_path / "run.json")
    assert loaded.table(depth=1) in done.stdout
    assert loaded.by_phase()["backward"].flops > 0
    data = json.loads((tmp_path / "run.json").read_text())
    assert data["schema_version"] == 2 and data["model"] == "Sequential"
    assert (tmp_path / "run.csv").read_text().startswith("module,depth,phase,operator")


def run(*args, capsys):
    """main() in this process (for the cases beyond the subprocess ones): (exit code, stdout,
    stderr)."""
    try:
        main(list(args))
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
        if not isinstance(e.code, int):
            print(e.code, file=sys.stderr)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_bad_import_bad_shape_missing_device():
    """Subprocess: the three errors users meet first, each a clear line, no traceback."""
    for args, message in (
        (["no_such_module:build", "--input-shape", "1,2"],
         "cannot import 'no_such_module': ModuleNotFoundError"),
        ([CNN, "--input-shape", "1,3,x"],
         "'1,3,x' is not a comma-separated list of positive ints"),
        ([CNN, "--input-shape", "1,3,8,8", "--device", "cuda:7"],
         "--device cuda:7: not available here"),
    ):
        done = cli(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert message in done.stderr and "Traceback" not in done.stderr


def test_factory_as_module_path_with_token_inputs(capsys):
    code, out, err = run("tests.cli_models:TinyLM", "--input-shape", "2,5", "--input-dtype",
                         "int64", "--backward", "--dtype", "fp64", "--depth", "1",
                         capsys=capsys)
    assert code == 0, err
    assert "input 2x5 int64 on cpu, forward + backward" in out
    assert "head" in out


def test_timing_shows_progress_and_writes_a_trace(tmp_path, capsys):
    code, out, err = run(CNN, "--input-shape", "1,3,8,8", "--warmup", "2", "--repeat", "3",
                         "--trace", str(tmp_path / "trace.json"), "--depth", "0",
                         capsys=capsys)
    assert code == 0, err
    assert "timed: median of 3 runs after 2 warm-up" in header(out)
    assert "Time" in out
    for line in ("warm-up 2/2", "timed run 1/3", "timed run 3/3"):
        assert line in err
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert any(e["ph"] == "X" and e["cat"] == "op" for e in trace["traceEvents"])


def test_meta_device_counts_shapes_only(capsys):
    code, out, err = run(CNN, "--input-shape", "64,3,32,32", "--device", "meta", "--dtype",
                         "bf16", "--depth", "0", capsys=capsys)
    assert code == 0, err
    assert "bfloat16 on meta" in out


@pytest.mark.parametrize("args, code, message", [
    ([f"{TESTS / 'cli_models.py'}:nope", "--input-shape", "1,2"], 2, "has no attribute 'nope'"),
    (["tests.cli_models", "--input-shape", "1,2"], 2, "is not MODULE:FACTORY"),
    ([f"{TESTS / 'cli_models.py'}:broken", "--input-shape", "1,2"], 1,
     "raised ValueError: this factory always fails"),
    ([f"{TESTS / 'cli_models.py'}:not_a_model", "--input-shape", "1,2"], 1,
     "returned int, not a torch.nn.Module"),
    ([CNN, "--input-shape", "1,0,8"], 2, "'1,0,8' is not a comma-separated list of positive"),
    ([CNN], 2, "give the input's shape"),
    ([CNN, "--input-shape", "1,5,8,8"], 1, "expected input[1, 5, 8, 8] to have 3 channels"),
    ([CNN, "--input-shape", "1,3,8,8", "--dtype", "fp7"], 2, "unknown dtype 'fp7'"),
    ([CNN, "--input-shape", "1,3,8,8", "--device", "meta", "--timing"], 2,
     "need a real device"),
    ([CNN, "--input-shape", "1,3,8,8", "--repeat", "0"], 2, "--repeat must be >= 1"),
])
def test_errors_say_what_is_wrong(args, code, message, capsys):
    got, out, err = run(*args, capsys=capsys)
    assert got == code, (out, err)
    assert message in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_missing_device_names_the_available_ones(capsys):
    code, _, err = run(CNN, "--input-shape", "1,3,8,8", "--device", "cuda", capsys=capsys)
    assert code == 2
    assert "--device cuda: not available here" in err
    assert "available: cpu, meta" in err


def test_deepspeed_flag_says_whether_the_report_is_there(capsys):
    code, _, err = run(CNN, "--input-shape", "1,3,8,8", "--deepspeed", "--depth", "0",
                       capsys=capsys)
    try:
        from dispatch_flops import get_model_profile  # noqa: F401
    except ImportError:
        assert code == 2 and "--deepspeed needs" in err
    else:
        assert code == 0, err


def test_import_errors_come_before_shape_errors(capsys):
    """A wrong MODULE:FACTORY says so even without --input-shape (there is nothing to give a
    shape to yet); the shape is asked for once the factory imports. One line each, no usage
    dump in front."""
    for spec, message in (("no_such_module:build", "cannot import 'no_such_module'"),
                          (f"{TESTS / 'cli_models.py'}:nope", "has no attribute 'nope'"),
                          (CNN, "give the input's shape")):
        code, _, err = run(spec, capsys=capsys)
        assert code == 2 and message in err, err
        assert err.count("\n") == 1 and err.startswith("dispatch-flops: error: "), err


def test_argparse_errors_are_one_line_and_point_at_help(capsys):
    code, _, err = run("--no-such-option", capsys=capsys)
    assert code == 2 and "usage:" not in err and err.count("\n") == 1
    assert "unrecognized arguments: --no-such-option" in err and "--help" in err


def test_version(capsys):
    import dispatch_flops

    code, out, _ = run("--version", capsys=capsys)
    assert code == 0 and out.strip() == (f"dispatch-flops {dispatch_flops.__version__} "
                                         f"(torch {torch.__version__})")


def test_token_models_get_token_ids_by_default(capsys):
    """A model whose first layer is an Embedding (the built-in GPT, transformers' LMs) gets
    int64 ids below its vocabulary size without --input-dtype; the header says so. An
    explicit float dtype into an embedding fails with a hint."""
    code, out, err = run("dispatch_flops.models:GPT", "--input-shape", "1,128", "--depth", "0",
                         capsys=capsys)
    assert code == 0, err
    assert "input 1x128 int64 token ids on cpu, forward" in header(out)
    code, _, err = run("dispatch_flops.models:GPT", "--input-shape", "1,16", "--input-dtype",
                       "fp32", capsys=capsys)
    assert code == 1 and "add --input-dtype int64" in err, err


@pytest.mark.parametrize("width", [60, 80, 100])
def test_header_wraps_between_its_parts(width, capsys):
    code, out, err = run("dispatch_flops.models:GPT", "--input-shape", "1,16", "--depth", "0",
                         "--timing", "--repeat", "1", "--width", str(width), capsys=capsys)
    assert code == 0, err
    lines = out.split("\n\n")[0].splitlines()
    assert len(lines) > 1 and max(map(len, lines)) <= width
    for line in lines:  # no parenthesis, "1 x 16" or "forward + backward" cut in two
        assert line.count("(") == line.count(")") and not line.rstrip().endswith((" x", "+"))


@pytest.mark.slow
def test_columns_is_honoured_when_piped():
    """``COLUMNS=80 dispatch-flops | cat``: not a terminal, yet 80 columns wide; and
    ``| head`` ends quietly."""
    done = subprocess.run(
        [sys.executable, "-m", "dispatch_flops", "--seq-len", "16", "--depth", "2"],
        env={**os.environ, "COLUMNS": "80", "PYTHONPATH": str(TESTS.parent)},
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert max(map(len, done.stdout.splitlines())) <= 80 < max(
        map(len, cli("--seq-len", "16", "--depth", "2").stdout.splitlines()))
    piped = subprocess.run(f"{sys.executable} -m dispatch_flops --seq-len 16 | head -1",
                           shell=True, env={**os.environ, "PYTHONPATH": str(TESTS.parent)},
                           capture_output=True, text=True, timeout=120)
    assert piped.stdout.startswith("GPT demo") and not piped.stderr, piped.stderr


def test_help_shows_examples(capsys):
    code, out, _ = run("--help", capsys=capsys)
    assert code == 0
    assert "examples:" in out and "dispatch_flops.models:GPT --input-shape 1,128" in out


def test_timed_runs_count_what_one_run_counts(tmp_path, capsys):
    """With --backward, warm-ups and repeats leave no gradients behind: a timed run counts
    the same ops as a single untimed one (no gradient accumulation)."""
    args = (CNN, "--input-shape", "2,3,8,8", "--backward", "--depth", "0")
    assert run(*args, "--json", str(tmp_path / "once.json"), capsys=capsys)[0] == 0
    assert run(*args, "--timing", "--repeat", "2", "--json", str(tmp_path / "timed.json"),
               capsys=capsys)[0] == 0
    once = FlopCounter.from_json(tmp_path / "once.json")
    timed = FlopCounter.from_json(tmp_path / "timed.json")
    assert timed.by_operator().keys() == once.by_operator().keys()
    assert timed.total.flops == once.total.flops and timed.total.calls == once.total.calls


DROPOUT = f"{TESTS / 'cli_models.py'}:with_dropout"


@pytest.mark.parametrize("flags, mode", [((), "eval"), (("--train",), "train"),
                                         (("--backward",), "train")])
def test_one_mode_for_table_and_deepspeed_stated_in_the_header(flags, mode, tmp_path, capsys):
    """Eval unless --train / --backward, said in the header; DeepSpeed's printout reports
    the same run: its forward MACs are the table's."""
    path = tmp_path / "run.json"
    code, out, err = run(DROPOUT, "--input-shape", "4,8", *flags, "--deepspeed", "--json",
                         str(path), capsys=capsys)
    assert code == 0, err
    assert header(out).split(" (")[0].endswith(f", {mode} mode")
    loaded = FlopCounter.from_json(path)
    dropped = any(r.operator in ("aten.bernoulli_", "aten.native_dropout", "aten.bernoulli")
                  for r in loaded.records())
    assert dropped == (mode == "train")  # the model really ran in that mode
    from dispatch_flops import human
    forward = loaded.by_phase()["forward"].macs
    line = next(s for s in out.splitlines() if s.startswith("fwd MACs per device:"))
    assert line.split(":")[1].strip() == human(forward, "MACs", compact=True)


def test_seq_len_with_a_model_and_unwritable_outputs_are_one_line_errors(tmp_path, capsys):
    for args, message in (
        ([CNN, "--input-shape", "1,3,8,8", "--seq-len", "8"], "--seq-len sets the demo's"),
        (["--seq-len", "8", "--json", str(tmp_path / "no" / "run.json")], "cannot write"),
        (["--seq-len", "8", "--csv", str(tmp_path)], "it is a directory"),
    ):
        code, out, err = run(*args, capsys=capsys)
        assert code == 2, (args, err)
        assert message in err.splitlines()[-1] and "Traceback" not in err


MY_MODELS = '''
from dispatch_flops.models import GPT, GPTConfig, LLAMA2_70B, Llama

def build():
    return GPT(GPTConfig(n_layer=1, d_model=32, n_head=2, vocab_size=64, max_seq_len=128))

def llama_70b():
    return Llama(LLAMA2_70B)
'''


def help_examples():
    from dispatch_flops.__main__ import EXAMPLES

    lines, joined = EXAMPLES.split("\n\n")[0].splitlines()[1:], []
    for line in lines:
        if line.startswith("  dispatch-flops"):
            joined.append(line.strip())
        elif joined and joined[-1].endswith("\\"):
            joined[-1] = joined[-1][:-1] + line.strip()
    return joined


def readme_examples():
    """The ``dispatch-flops`` commands of the shell blocks of README.md and docs/cli.md,
    comments dropped."""
    text = "".join((TESTS.parent / page).read_text() for page in ("README.md", "docs/cli.md"))
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", "").splitlines():
            if line.startswith("dispatch-flops"):
                commands.append(" ".join(line.split("#")[0].split()))
    return commands


def test_readme_and_help_examples_are_found():
    assert len(readme_examples()) >= 3 and len(help_examples()) >= 3


@pytest.mark.slow
@pytest.mark.parametrize("example", sorted(set(help_examples()) | set(readme_examples())))
def test_every_help_example_runs(example, tmp_path):
    """Each example of --help, README and docs/cli.md runs as written (my_models.py: a small
    stand-in for the user's file; CUDA examples on the CPU where there is none), with no
    package the extras lack."""
    (tmp_path / "my_models.py").write_text(MY_MODELS)
    args = example.split()[1:]
    if not torch.cuda.is_available():
        args = ["cpu" if a == "cuda" else a for a in args]
    done = cli(*args, "--width", "120", cwd=tmp_path)
    assert done.returncode == 0, (example, done.stderr[-2000:])
    assert "Module" in done.stdout
