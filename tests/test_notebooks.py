"""The notebooks run top to bottom in a real kernel, and are committed with outputs cleared."""

import json
import sys
import time
from pathlib import Path

import pytest

from dispatch_flops import FlopCounter

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

pytestmark = pytest.mark.slow  # a Jupyter kernel per notebook

NOTEBOOKS = Path(__file__).parent.parent / "notebooks"
# training_and_roofline.ipynb uses the optimizer/recompute phases, hfu() and saved
# activations (issue 6); until they are in the package it must fail, and then it must pass
TRAINING_PHASES = hasattr(FlopCounter, "model_flops")


@pytest.fixture
def kernel(tmp_path, monkeypatch):
    """A "python3" kernel spec running this interpreter, found before any other: the
    notebook must run against the package under test, not whatever a user's kernel has."""
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (tests)", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return "python3"


def _machine_load(text: str) -> bool:
    """Whether every warning in ``text`` is one a loaded machine causes: a calibration whose
    rounds disagree, or utilisation above a calibrated peak."""
    warned = [line for line in text.splitlines() if "Warning:" in line]
    return bool(warned) and all(
        "CalibrationWarning" in line or ("UtilisationWarning" in line and "calibrated" in line)
        for line in warned)


def execute(name, kernel, workdir):
    raw = json.loads((NOTEBOOKS / name).read_text())  # as committed: nbformat.read fills ids
    assert all("id" in cell for cell in raw["cells"]), f"{name}: cells without an id"
    book = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(book)
    for cell in book.cells:  # committed clean: no outputs, no execution counts
        if cell.cell_type == "code":
            assert not cell.outputs and cell.execution_count is None, (name, cell.source[:60])
    client = nbclient.NotebookClient(book, kernel_name=kernel, timeout=180,
                                     resources={"metadata": {"path": str(workdir)}})
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    # a reader sees what the cells print: no warnings (deprecations, missing peaks) among it
    # (but tqdm's "IProgress not found": ipywidgets, which the notebooks extra's jupyter
    # brings, is not among the test extra's packages)
    # (nor the calibration's own verdict on a busy machine, which the notebook cannot help:
    # rounds that disagree, or a step that beat the peak a busy minute measured)
    printed = [(cell.source[:60], output.get("text", "")) for cell in book.cells
               if cell.cell_type == "code" for output in cell.outputs
               if (output.get("name") == "stderr" or "Warning" in output.get("text", ""))
               and "IProgress not found" not in output.get("text", "")
               and not _machine_load(output.get("text", ""))]
    assert not printed, (name, printed)
    return book, seconds


def images(book) -> int:
    return sum("image/png" in output.get("data", {})
               for cell in book.cells if cell.cell_type == "code" for output in cell.outputs)


def test_quickstart(kernel, tmp_path):
    book, seconds = execute("quickstart.ipynb", kernel, tmp_path)
    assert images(book) == 3  # by_module, icicle, roofline: figures shown, not just made
    text = "".join(o.get("text", "") for c in book.cells if c.cell_type == "code"
                   for o in c.outputs)
    assert "Unsupported ops" in text and "before: {'quickstart.scaled_matmul': 1}" in text
    print(f"quickstart.ipynb ran in {seconds:.1f} s")


@pytest.mark.xfail(not TRAINING_PHASES, raises=nbclient.exceptions.CellExecutionError,
                   strict=True, reason="needs the training phases of issue 6")
def test_training_and_roofline(kernel, tmp_path):
    book, seconds = execute("training_and_roofline.ipynb", kernel, tmp_path)
    assert images(book) == 2
    print(f"training_and_roofline.ipynb ran in {seconds:.1f} s")


def test_llm_inference(kernel, tmp_path):
    pytest.importorskip("transformers")
    book, seconds = execute("llm_inference.ipynb", kernel, tmp_path)
    assert images(book) == 2  # flops and bytes per position; prefill vs decode roofline
    text = "".join(o.get("text", "") for c in book.cells if c.cell_type == "code"
                   for o in c.outputs)
    assert "decode 5." in text and "(memory-bound)" in text and "tokens/s" in text
    print(f"llm_inference.ipynb ran in {seconds:.1f} s")


def test_no_development_notes_left_in_cells():
    """Cells hold what a reader needs: no '# needs issue ...' or TODO notes."""
    import json
    import re

    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            text = "".join(cell["source"])
            assert not re.search(r"needs issue|TODO|FIXME|XXX", text), (path.name, text[:80])
