"""Every ```python block of README.md and of the pages in docs/ runs as written: each block
in a fresh namespace, after the page's setup block when it has one (its first block, whose
first line starts ``# Setup:``, shown at the top of the page), with nothing else but the
reader's own objects the page's text names before the block (README's "`model` is your
`nn.Module`, `x` its input", the trainer's `args` and `data`): never a module, never an
import the page does not show. The torchrun block runs as a script on 2 real processes (gloo).
Blocks that build a model of their own (GPT-2, BERT-base) build it from its config, as the
text says: no download. After some blocks, a check that the block did what its comments say;
a ```text block right after a python block is what it prints, compared exactly."""

import ast
import contextlib
import io
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dispatch_flops import FlopCounter
from dispatch_flops.models import GPTConfig
from helpers import tiny_gpt

pytestmark = pytest.mark.slow  # the whole README: Trainer, Lightning, torchrun

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# README first, then the docs pages (each file's blocks share a namespace, files do not)
PAGES = [README] + sorted((ROOT / "docs").glob("*.md"))
_BLOCK = re.compile(r"```python\n(?P<code>.*?)```(?:\s*```text\n(?P<shown>.*?)```)?", re.S)
TORCHRUN = "# torchrun --nproc-per-node 2 train.py\n"


def name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def blocks(page: Path = README) -> list[tuple[int, str, "str | None"]]:
    """``(line, code, shown)`` of every python block of ``page``; ``shown``: the output a
    ```text block right after it says it prints (else None)."""
    text = page.read_text()
    return [(text.count("\n", 0, m.start("code")) + 1, m.group("code"), m.group("shown"))
            for m in _BLOCK.finditer(text)]


def every_block() -> list[tuple[Path, int, str, "str | None"]]:
    return [(page, *block) for page in PAGES for block in blocks(page)]


READER_GPT = GPTConfig(n_layer=4, d_model=32, n_head=2, vocab_size=64, max_seq_len=16)


def _user_objects() -> dict:
    """The reader's own objects a page may name instead of building them: a tiny model and
    its input. No module (``torch``): a block imports what it uses."""
    return {"model": tiny_gpt(READER_GPT), "x": torch.randint(0, 64, (2, 8))}


SETUP = "# Setup:"  # the first line of a page's setup block


def _free_names(code: str) -> set:
    """Names ``code`` reads that it never binds (assigns, imports, defines)."""
    tree = ast.parse(code)
    read, bound = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    return read - bound


def _prose_before(page: Path, line: int) -> str:
    """The page's text above ``line``, code blocks left out."""
    text = "\n".join(page.read_text().splitlines()[:line])
    return re.sub(r"```.*?```", "", text, flags=re.S)


def _tiny_gpt2():
    import transformers

    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=32))


def _token_rows(n=6, tokens=16) -> list[dict]:
    torch.manual_seed(1)
    return [{"input_ids": (ids := torch.randint(0, 64, (tokens,))), "labels": ids.clone()}
            for _ in range(n)]


def _transformers_trainer() -> dict:
    """The reader's Trainer inputs: a tiny GPT-2, 3 steps logged each, no reporter, on CPU."""
    import transformers

    args = transformers.TrainingArguments(
        output_dir="trainer", max_steps=3, per_device_train_batch_size=2, logging_steps=1,
        report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True)
    return {"model": _tiny_gpt2(), "args": args, "data": _token_rows()}


def _lightning_trainer() -> dict:
    """The reader's LightningModule (a tiny GPT-2) and a loader of 3 batches: 3 steps."""
    import lightning

    class Module(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = _tiny_gpt2()

        def training_step(self, batch, batch_idx):
            return self.model(**batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    return {"module": Module(),
            "loader": torch.utils.data.DataLoader(_token_rows(), batch_size=2)}


# Objects a block takes as the reader's own besides _user_objects(), by a line of the block.
GIVEN = {"trainer = Trainer(model=model, args=args, train_dataset=data,": _transformers_trainer,
         "trainer.fit(module, loader)": _lightning_trainer}


def _deepspeed(ns, code):
    # the figures the block quotes are the ones it computes
    assert repr((ns["flops"], ns["macs"], ns["params"])) in code
    assert ns["prof"].flops > 0 and not ns["model"]._forward_hooks


def _torch_counter(ns, code):
    assert ns["mode"].flop_counts["GPT.blocks.0"][torch.ops.aten.addmm] > 0


def _compiled(ns, code):
    with FlopCounter(ns["model"]) as eager:
        ns["model"](ns["x"]).sum().backward()
    assert ns["fc"].by_module()["blocks.0.attn"].macs == \
        eager.by_module()["blocks.0.attn"].macs > 0


def _generation(ns, code):
    gp = ns["gp"]
    assert len(gp.decode) == 15 and gp.kv_cache_bytes[-1] > gp.kv_cache_bytes[0]


def _transformers_logs(ns, code):
    logs = [h for h in ns["trainer"].state.log_history if "loss" in h]
    # step 0 is the warm-up; step 1 is counted (every=100 counts 1, 101, ...), step 2 timed:
    # the figures come from the timed step
    assert ["model_flops" in h for h in logs] == [False, False, True]
    assert logs[2]["hardware_flops"] > logs[2]["model_flops"] > 0 and logs[2]["step_s"] > 0


def _lightning_logs(ns, code):
    metrics = ns["trainer"].callback_metrics
    assert ns["trainer"].global_step == 3 and float(metrics["model_flops"]) > 0


# What a block must have done, checked right after it, by a line of the block.
CHECKS = {"flops, macs, params = get_model_profile(bert": _deepspeed,
          "with FlopCounterMode(display=False) as mode:": _torch_counter,
          "compiled = torch.compile(model)": _compiled,
          "gp = profile_generate(llm, input_ids": _generation,
          "trainer = Trainer(model=model": _transformers_logs,
          "trainer.fit(module, loader)": _lightning_logs}


def _readme_log_line(ns, code):
    """The README's logged line has the keys a counted step's log has (``mfu_all_ops``,
    ``hfu_all_ops`` and ``peak_flop_s`` need a device with a peak: the README's line was made with
    ``DeviceSpec.cpu``)."""
    text = README.read_text()
    shown = text[text.index("```text\n{'loss'") + 8:]
    shown = ast.literal_eval(shown[:shown.index("```")].strip())
    logged = next(h for h in ns["trainer"].state.log_history if "model_flops" in h)
    peaked = {"mfu_all_ops", "hfu_all_ops", "peak_flop_s"}
    assert set(shown) - peaked <= set(logged), (shown, logged)
    assert {"model_flops", "hardware_flops", "tokens_per_s"} <= set(shown)


# After the last block of a page: what its blocks left behind.
def _counting_done(ns, tmp_path):
    assert ns["run"].steps == 2 and ns["run"].total.flops > 0  # the logger loop


def _exports_done(ns, tmp_path):
    assert (tmp_path / "run.json").exists() and (tmp_path / "trace.json").exists()


def _timing_done(ns, tmp_path):
    assert ns["fc"].mfu_text(ns["spec"]).startswith("MFU ")


def _plots_done(ns, tmp_path):
    assert (tmp_path / "icicle.png").stat().st_size > 0


def _readme_done(ns, tmp_path):
    _readme_log_line(ns, "")


DONE = {"docs/counting.md": _counting_done, "docs/exports.md": _exports_done,
        "docs/timing.md": _timing_done, "docs/plots.md": _plots_done,
        "README.md": _readme_done}


def test_every_python_block_is_run():
    """Each block runs in one of the tests below; each given object and check names at least
    one block; README.md stays a page a newcomer reads (200 lines at most)."""
    found = every_block()
    assert len(found) == sum(p.read_text().count("```python") for p in PAGES) >= 14
    assert sum(code.startswith(TORCHRUN) for _, _, code, _ in found) == 1
    for key in [*GIVEN, *CHECKS]:
        assert any(key in code for _, _, code, _ in found), key
    assert set(DONE) <= {name(p) for p in PAGES}
    assert all("<!-- not run" not in p.read_text() for p in PAGES)
    assert len(README.read_text().splitlines()) <= 200


def test_code_fits_a_100_column_terminal():
    """Code blocks do not wrap (prose does): each of their lines fits 100 columns."""
    long = []
    for page in PAGES:
        text = page.read_text()
        long += [(name(page), text.count("\n", 0, m.start()) + 1 + i, line)
                 for m in re.finditer(r"```\w*\n(.*?)```", text, re.S)
                 for i, line in enumerate(m.group(1).splitlines(), 1) if len(line) > 100]
    assert not long


def test_docs_index_links_every_page():
    """docs/README.md links every page of docs/, and every link in these pages to a file of
    the repository names one that exists."""
    index = (ROOT / "docs" / "README.md").read_text()
    for page in (ROOT / "docs").glob("*.md"):
        if page.name != "README.md":
            assert f"]({page.name}" in index, page.name
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", page.read_text()):
            assert (page.parent / target).exists(), (name(page), target)


@pytest.mark.parametrize("page", [name(p) for p in PAGES if blocks(p)])
def test_python_blocks_run(page, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # blocks write run.json, run.csv, trace.json, trainer logs
    monkeypatch.delenv("COLUMNS", raising=False)  # shown tables are 100 columns wide
    import matplotlib
    matplotlib.use("Agg")
    from dispatch_flops.formulas import ELEMENT_COSTS

    costs = dict(ELEMENT_COSTS)  # conventions.md shows how to change them: set back after
    found = [b for b in blocks(ROOT / page) if not b[1].startswith(TORCHRUN)]
    setup = found[0][1] if found and found[0][1].startswith(SETUP) else ""
    merged: dict = {}  # every block's names, for the page's last check
    ran = 0
    try:
        for line, code, shown in found[1 if setup else 0:]:
            given = _user_objects()
            for key, make in GIVEN.items():
                if key in code:
                    given.update(make())
            # only what the page names as the reader's own, and the block does not build
            wanted = {n for n in _free_names(setup + code) if n in given}
            prose = _prose_before(ROOT / page, line)
            undeclared = [n for n in sorted(wanted) if f"`{n}`" not in prose]
            assert not undeclared, f"{page}:{line} uses {undeclared}: the page never names them"
            namespace = {"__name__": "__main__"}
            printed = io.StringIO()
            try:
                if setup:
                    exec(compile(setup, f"{page}:setup", "exec"), namespace)
                namespace.update({n: given[n] for n in wanted})
                with contextlib.redirect_stdout(printed) if shown is not None \
                        else contextlib.nullcontext():
                    exec(compile(code, f"{page}:{line}", "exec"), namespace)
                for key, check in CHECKS.items():
                    if key in code:
                        check(namespace, code)
            except Exception as e:
                raise AssertionError(f"{page} block at line {line} failed: "
                                     f"{type(e).__name__}: {e}") from e
            if shown is not None:
                assert printed.getvalue() == shown, (
                    f"{page} block at line {line} prints, now:\n{printed.getvalue()}")
            merged.update(namespace)
            ran += 1
        if page in DONE:
            DONE[page](merged, tmp_path)
    finally:
        ELEMENT_COSTS.clear()
        ELEMENT_COSTS.update(costs)
    assert ran == len(found) - bool(setup)


def test_a_setup_block_is_the_first_block_and_shown():
    """A setup block is a page's first python block (its first line ``# Setup:``), before any
    other; no other block is one."""
    for page in PAGES:
        codes = [code for _, code, _ in blocks(page)]
        assert all(not c.startswith(SETUP) for c in codes[1:]), name(page)


def test_no_block_leans_on_a_module_the_page_does_not_import():
    """What the runner may hand a block is the reader's objects, never a module: a block that
    reads ``torch`` imports it (or its page's setup does)."""
    assert not any(isinstance(v, type(torch)) for v in _user_objects().values())
    for page in PAGES:
        found = [b for b in blocks(page) if not b[1].startswith(TORCHRUN)]
        setup = found[0][1] if found and found[0][1].startswith(SETUP) else ""
        for line, code, _ in found:
            assert "torch" not in _free_names(setup + code), f"{name(page)}:{line}"


PRELUDE = '''\
import torch
from dispatch_flops.models import GPT, GPTConfig

torch.manual_seed(0)  # the reader's model, the same on every rank; each rank's own batch
model = GPT(GPTConfig(n_layer=4, d_model=32, n_head=2, vocab_size=64, max_seq_len=16))
torch.manual_seed(int(__import__("os").environ["RANK"]))
x = torch.randint(0, 64, (2, 8))
'''


def test_torchrun_block_runs_on_two_processes(tmp_path):
    """The distributed block, run as it says: torchrun, 2 ranks (gloo on CPU)."""
    (code,) = [code for _, _, code, _ in every_block() if code.startswith(TORCHRUN)]
    (tmp_path / "train.py").write_text(PRELUDE + code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
        str(ROOT), os.environ.get("PYTHONPATH")])), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", "train.py"]
    with subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True) as p:
        try:
            out, _ = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)  # torchrun and its ranks
            out, _ = p.communicate()
            pytest.fail(f"torchrun did not finish in 240 s:\n{out[-3000:]}")
    assert p.returncode == 0, out[-3000:]
    assert "Gathered from 2 ranks" in out and "\n· 0 " in out, out[-3000:]
