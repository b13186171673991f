"""Exports write the file a user would expect (issue 31, class 8): whole or not at all, with
the mode ``open`` would give a new file (or the mode of the file replaced), through a
symlink to its target, and never leaving a temporary file behind."""

import contextlib
import os
import stat

import pytest
import torch
from torch import nn

from dispatch_flops import FlopCounter

posix = pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")


@pytest.fixture(scope="module")
def run():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
    with FlopCounter(model, trace=True) as fc:
        model(torch.randn(2, 4))
    return fc.to_profile()


EXPORTS = {
    "json": lambda p, path: p.to_json(path),
    "csv": lambda p, path: p.to_csv(path),
    "trace": lambda p, path: p.to_chrome_trace(path),
}


@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def leftovers(folder) -> list:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))


@posix
@pytest.mark.parametrize("export", sorted(EXPORTS))
def test_a_new_file_gets_the_umask_mode(tmp_path, run, export):
    """0o666 less the umask, as ``open`` makes it (mkstemp's 0o600 made every export
    private to its writer)."""
    for mask, expected in ((0o022, 0o644), (0o077, 0o600), (0o002, 0o664)):
        path = tmp_path / f"{mask:o}.{export}"
        with umask(mask):
            EXPORTS[export](run, path)
        assert mode(path) == expected


@posix
@pytest.mark.parametrize("export", sorted(EXPORTS))
def test_a_replaced_file_keeps_its_mode(tmp_path, run, export):
    path = tmp_path / f"run.{export}"
    for kept in (0o644, 0o640, 0o600, 0o666):
        path.write_text("old")
        os.chmod(path, kept)
        with umask(0o077):
            EXPORTS[export](run, path)
        assert mode(path) == kept and path.read_text() != "old"


@pytest.mark.parametrize("export", sorted(EXPORTS))
def test_a_symlink_is_followed_and_kept(tmp_path, run, export):
    """Writing to a link writes the file it names (in another folder, by a relative link);
    the link stays a link."""
    (tmp_path / "data").mkdir()
    (tmp_path / "links").mkdir()
    target = tmp_path / "data" / f"run.{export}"
    target.write_text("old")
    link = tmp_path / "links" / f"latest.{export}"
    try:
        os.symlink(os.path.join("..", "data", f"run.{export}"), link)
    except (OSError, NotImplementedError):
        pytest.skip("no symlinks here")
    EXPORTS[export](run, link)
    assert link.is_symlink() and os.readlink(link) == os.path.join("..", "data",
                                                                    f"run.{export}")
    assert target.read_text() != "old" and link.read_text() == target.read_text()
    assert leftovers(tmp_path / "links") == leftovers(tmp_path / "data") == []
    dangling = tmp_path / "links" / "new.json"  # a link to a file not yet written: made
    os.symlink(os.path.join("..", "data", "new.json"), dangling)
    run.to_json(dangling)
    assert dangling.is_symlink() and (tmp_path / "data" / "new.json").stat().st_size


def test_a_rename_onto_a_folder_leaves_no_temporary_file(tmp_path, run):
    (tmp_path / "run.json").mkdir()  # a folder where the file would go
    with pytest.raises(OSError):
        run.to_json(tmp_path / "run.json")
    assert leftovers(tmp_path) == []


def full(*args, **kwargs):
    raise OSError(28, "No space left on device")


@pytest.mark.parametrize("where", ["write", "rename"])
def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path, run, monkeypatch,
                                                                   where):
    path = tmp_path / "run.csv"
    path.write_text("old")
    import dispatch_flops.results.schema as schema

    if where == "rename":
        monkeypatch.setattr(schema.os, "replace", full)
    else:
        opened = os.fdopen

        def fdopen(*args, **kwargs):
            f = opened(*args, **kwargs)
            f.write = full
            return f

        monkeypatch.setattr(schema.os, "fdopen", fdopen)
    with pytest.raises(OSError, match="No space left"):
        run.to_csv(path)
    assert path.read_text() == "old" and leftovers(tmp_path) == []


def test_a_failed_cleanup_does_not_hide_the_error(tmp_path, run, monkeypatch):
    """When the temporary file cannot be removed either, the error raised is the one that
    stopped the write, not the cleanup's."""
    import dispatch_flops.results.schema as schema

    def locked(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(schema.os, "replace", full)
    monkeypatch.setattr(schema.os, "unlink", locked)
    with pytest.raises(OSError, match="No space left"):
        run.to_json(tmp_path / "run.json")


def test_a_name_no_encoding_holds_is_escaped_not_fatal(tmp_path):
    """A module may be named with a lone surrogate; the CSV writes its escape instead of
    failing the whole file."""
    model = nn.Sequential()
    model.add_module("\ud800", nn.Linear(2, 2))
    with FlopCounter(model) as fc:
        model(torch.randn(1, 2))
    fc.to_csv(tmp_path / "run.csv")
    assert "\\ud800" in (tmp_path / "run.csv").read_text(encoding="utf-8")
    fc.to_json(tmp_path / "run.json")
    assert FlopCounter.from_json(tmp_path / "run.json").module_names()[1] == "\ud800"
