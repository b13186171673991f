"""What pyproject.toml declares is what CI tests: each declared floor (torch, transformers)
has a leg in .ci/run that reads it from pyproject.toml, and docs/development.md names it."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("package", ["torch", "transformers"])
def test_every_declared_floor_has_a_ci_leg(package):
    pyproject = (ROOT / "pyproject.toml").read_text()
    floors = set(re.findall(rf'"{package}>=([0-9.]+)"', pyproject))
    assert len(floors) == 1, f"{package} is declared with different floors: {floors}"
    floor = floors.pop()
    ci = (ROOT / ".ci" / "run").read_text()
    # the leg's own expression finds the floor in pyproject.toml
    expressions = [line for line in ci.splitlines()
                   if f'\\"{package}>=' in line and "pyproject.toml" in line]
    assert expressions, f".ci/run has no leg for the {package} floor"
    for line in expressions:
        command = line.split("$(", 1)[1].rsplit(")", 1)[0]
        found = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.strip()
        assert found == floor
    assert f"{package} ≥ {floor}" in (ROOT / "docs" / "development.md").read_text()
