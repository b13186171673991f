from pathlib import Path

import pytest
import torch
from hypothesis import settings

settings.register_profile("ci", max_examples=25, deadline=None)
settings.load_profile("ci")
torch.manual_seed(0)

GOLDEN = Path(__file__).parent / "golden"


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite the expected outputs in tests/golden/ from the current ones")


@pytest.fixture
def golden(request):
    """``golden(name, text)``: ``text`` must equal ``tests/golden/<name>``; with
    ``--update-golden`` the file is rewritten instead."""
    update = request.config.getoption("--update-golden")

    def check(name: str, text: str) -> None:
        path = GOLDEN / name
        if update:
            GOLDEN.mkdir(exist_ok=True)
            path.write_text(text)
            return
        assert path.exists(), f"no golden {name}: run pytest --update-golden"
        assert text == path.read_text()

    return check
