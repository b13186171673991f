"""Each optional package's absence says which package to install (pip's name for it, and the
extra to use from a clone), never a bare ``No module named ...`` from inside our code. The
package is blocked for the test (``sys.modules[name] = None``: Python's own way to make an
import fail), whether or not it is installed here."""

import importlib
import sys

import pytest
import torch

from dispatch_flops import FlopCounter


def block(monkeypatch, *names: str) -> None:
    """``import name`` (and of its submodules) raises ImportError until the test ends; our
    modules that import it are imported afresh."""
    for name in names:  # a submodule imported before is found in sys.modules: block it too
        for loaded in [m for m in sys.modules if m.startswith(name + ".")]:
            monkeypatch.setitem(sys.modules, loaded, None)
        monkeypatch.setitem(sys.modules, name, None)
    for name in [m for m in sys.modules if m.startswith("dispatch_flops.integrations.")]:
        monkeypatch.delitem(sys.modules, name)


@pytest.mark.parametrize("module, blocked, install", [
    ("dispatch_flops.integrations.lightning", ("lightning", "pytorch_lightning"),
     "pip install lightning"),
    ("dispatch_flops.integrations.transformers", ("transformers",),
     "pip install transformers"),
])
def test_callbacks_name_the_package_to_install(monkeypatch, module, blocked, install):
    block(monkeypatch, *blocked)
    with pytest.raises(ImportError) as raised:
        importlib.import_module(module)
    message = str(raised.value)
    assert install in message and "pip install -e '.[" in message, message
    assert "pytorch_lightning" not in message


def small_run():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    with FlopCounter(model) as fc:
        model(torch.randn(2, 4))
    return fc


def test_plots_name_matplotlib(monkeypatch):
    from dispatch_flops.views import plot

    monkeypatch.setattr(plot, "_FIGURE", [])  # the Figure class is made on first use
    block(monkeypatch, "matplotlib")
    with pytest.raises(ImportError, match=r"pip install matplotlib .*pip install -e '\.\[plot\]'"):
        plot.by_module(small_run())


def test_dataframe_names_pandas(monkeypatch):
    block(monkeypatch, "pandas")
    with pytest.raises(ImportError, match=r"pip install pandas .*to_csv"):
        small_run().to_dataframe()


def test_profile_pipeline_names_diffusers_and_bad_input(monkeypatch):
    """profile_pipeline imports nothing from diffusers: an object with no denoiser is told
    which modules it has and how to install diffusers; a loop that never calls the denoiser,
    or an fn that is no loop, is named."""
    from types import SimpleNamespace

    from dispatch_flops import profile_pipeline

    block(monkeypatch, "diffusers")
    with pytest.raises(ValueError) as raised:
        profile_pipeline(SimpleNamespace(text_encoder=torch.nn.Linear(2, 2)), fn=print)
    message = str(raised.value)
    assert "pip install diffusers" in message and "pip install -e '.[diffusers]'" in message
    assert "['text_encoder']" in message and "unet" in message, message
    pipe = SimpleNamespace(unet=torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match="fn must be callable"):
        profile_pipeline(pipe, fn=3)
    with pytest.raises(ValueError, match="never called"):
        profile_pipeline(pipe, fn=lambda: None)
    linear = pipe.unet
    pp = profile_pipeline(pipe, torch.ones(3, 2), fn=lambda x: [linear(x) for _ in range(2)][-1])
    assert len(pp.steps) == 2 and pp.images == 3  # no timestep: each call a step
    assert pp.steps[0].total.macs == 3 * 2 * 2
