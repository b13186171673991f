"""Every ```python block of README.md runs, in order, in one namespace, except those marked
``<!-- not run: why -->`` on the line before (a GPU, several processes, a download)."""

import re
from pathlib import Path

import torch

from dispatch_flops.models import GPT, GPTConfig

README = Path(__file__).resolve().parent.parent / "README.md"
_BLOCK = re.compile(r"(?:<!-- not run: (?P<why>[^>]*) -->\n)?```python\n(?P<code>.*?)```",
                    re.S)


def blocks() -> list[tuple]:
    """``(line, code, why not run or None)`` of every python block."""
    text = README.read_text()
    return [(text.count("\n", 0, m.start("code")) + 1, m.group("code"), m.group("why"))
            for m in _BLOCK.finditer(text)]


def _user_objects() -> dict:
    """What the blocks take as the reader's own: a tiny model, its input, a training step."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=4, d_model=32, n_head=2, vocab_size=64, max_seq_len=16))
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


def test_every_python_block_is_found_and_few_are_skipped():
    found = blocks()
    assert len(found) == README.read_text().count("```python")
    skipped = [why for _, _, why in found if why]
    assert all(why.strip() for why in skipped)
    assert len(found) - len(skipped) >= 7


def test_readme_python_blocks_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # blocks write run.json, run.csv, trace.json
    import matplotlib
    matplotlib.use("Agg")
    namespace = _user_objects()
    ran = 0
    for line, code, why in blocks():
        if why:
            continue
        try:
            exec(compile(code, f"README.md:{line}", "exec"), namespace)
        except Exception as e:
            raise AssertionError(f"README.md block at line {line} failed: "
                                 f"{type(e).__name__}: {e}") from e
        ran += 1
    assert ran >= 4
    # the blocks did what they say: the logger loop logged each step, files were written
    assert len(namespace["_logged"]) == 2 and namespace["_logged"][0]["flops"] > 0
    assert namespace["run"].steps == 2
    assert (tmp_path / "run.json").exists() and (tmp_path / "trace.json").exists()
    assert namespace["fc"].mfu_text(namespace["spec"]).startswith("MFU ")
