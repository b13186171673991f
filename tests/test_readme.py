"""Every ```python block of README.md runs as written: in order, in one namespace, on the
reader's own objects (a tiny GPT as ``model``, its input ``x``, ...), except the torchrun
block, which runs as a script on 2 real processes (gloo). Blocks that build a model of their
own (BERT-base, GPT-2) build it from its config, as the README says: no download. After some
blocks, a check that the block did what its comments say."""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dispatch_flops import FlopCounter
from dispatch_flops.models import GPT, GPTConfig

pytestmark = pytest.mark.slow  # the whole README: Trainer, Lightning, torchrun

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
_BLOCK = re.compile(r"```python\n(?P<code>.*?)```", re.S)
TORCHRUN = "# torchrun --nproc-per-node 2 train.py\n"


def blocks() -> list[tuple[int, str]]:
    """``(line, code)`` of every python block."""
    text = README.read_text()
    return [(text.count("\n", 0, m.start("code")) + 1, m.group("code"))
            for m in _BLOCK.finditer(text)]


def tiny_gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(n_layer=4, d_model=32, n_head=2, vocab_size=64, max_seq_len=16))


def _user_objects() -> dict:
    """What the blocks take as the reader's own: a tiny model, its input, a training step."""
    model = tiny_gpt()
    x = torch.randint(0, 64, (2, 8))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    logged = []

    def train_step(batch=x):
        model(batch).sum().backward()
        optimizer.step()
        optimizer.zero_grad()

    return {"torch": torch, "model": model, "x": x, "optimizer": optimizer,
            "train_step": train_step, "loader": [x, x], "log": lambda **kw: logged.append(kw),
            "_logged": logged}


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


def test_every_python_block_is_run():
    """Each block runs in one of the two tests below; each given object and check names
    exactly one block."""
    found = blocks()
    assert len(found) == README.read_text().count("```python") >= 14
    assert sum(code.startswith(TORCHRUN) for _, code in found) == 1
    for key in [*GIVEN, *CHECKS]:
        assert sum(key in code for _, code in found) == 1, key
    assert "<!-- not run" not in README.read_text()


def test_code_fits_a_100_column_terminal():
    """Code blocks do not wrap (prose does): each of their lines fits 100 columns."""
    text = README.read_text()
    long = [(text.count("\n", 0, m.start()) + 1 + i, line)
            for m in re.finditer(r"```\w*\n(.*?)```", text, re.S)
            for i, line in enumerate(m.group(1).splitlines(), 1) if len(line) > 100]
    assert not long


def test_readme_python_blocks_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # blocks write run.json, run.csv, trace.json, trainer logs
    import matplotlib
    matplotlib.use("Agg")
    own = _user_objects()
    namespace = dict(own)
    ran = 0
    for line, code in blocks():
        if code.startswith(TORCHRUN):
            continue
        namespace.update(own)  # a block that builds its own model shadows the reader's in it
        for key, given in GIVEN.items():
            if key in code:
                namespace.update(given())
        try:
            exec(compile(code, f"README.md:{line}", "exec"), namespace)
            for key, check in CHECKS.items():
                if key in code:
                    check(namespace, code)
        except Exception as e:
            raise AssertionError(f"README.md block at line {line} failed: "
                                 f"{type(e).__name__}: {e}") from e
        ran += 1
    assert ran == len(blocks()) - 1
    # the blocks did what they say: the logger loop logged each step, files were written
    assert len(own["_logged"]) == 2 and own["_logged"][0]["flops"] > 0
    assert namespace["run"].steps == 2
    assert (tmp_path / "run.json").exists() and (tmp_path / "trace.json").exists()
    assert namespace["fc"].mfu_text(namespace["spec"]).startswith("MFU ")


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
    (code,) = [code for _, code in blocks() if code.startswith(TORCHRUN)]
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
