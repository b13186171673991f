"""Packaging: one version string."""

import importlib.metadata

import pytest

import dispatch_flops


def test_installed_version_is_the_modules():
    """pyproject.toml reads its version from ``dispatch_flops.__version__`` (setuptools'
    dynamic ``attr``), so the installed metadata says what the module says. A mismatch is a
    second version string, or an install older than the tree (reinstall)."""
    try:
        installed = importlib.metadata.version("dispatch_flops")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("dispatch_flops is not installed: run from a source tree")
    assert installed == dispatch_flops.__version__
