"""Atomic writes go through symbolic links and refuse what is not a file."""

import os
from pathlib import Path

import pytest

from autoconfig.atomic import write_atomic
from autoconfig.figures import save, subplots


def test_a_symbolic_link_is_written_through(tmp_path: Path) -> None:
    """The rename replaces the link's target, not the link: a user who points
    config.yaml at a versioned file keeps the link and gets the new text there."""
    target = tmp_path / "v2.yaml"
    target.write_text("old\n")
    link = tmp_path / "config.yaml"
    link.symlink_to(target.name)
    write_atomic(link, "new\n")
    assert link.is_symlink()
    assert target.read_text() == "new\n"


def test_a_dangling_link_creates_its_target(tmp_path: Path) -> None:
    link = tmp_path / "out.md"
    link.symlink_to("reports/out.md")
    write_atomic(link, "x\n")
    assert link.is_symlink() and (tmp_path / "reports" / "out.md").read_text() == "x\n"


def test_a_path_that_is_not_a_regular_file_is_refused(tmp_path: Path) -> None:
    """A folder (or a device such as /dev/full) would be replaced by the rename,
    or not written through at all: an OSError naming the path instead."""
    folder = tmp_path / "plans.csv"
    folder.mkdir()
    with pytest.raises(IsADirectoryError) as caught:
        write_atomic(folder, "a\n")
    assert caught.value.filename == str(folder)
    assert folder.is_dir()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes here")
def test_a_figure_is_not_saved_over_a_pipe(tmp_path: Path) -> None:
    pipe = tmp_path / "front.png"
    os.mkfifo(pipe)
    fig, _ = subplots()
    with pytest.raises(OSError, match="not a regular file"):
        save(fig, pipe)
    assert not any(p.name.endswith(".tmp.png") for p in tmp_path.iterdir())


def test_a_file_in_the_folder_path_is_named(tmp_path: Path) -> None:
    """mkdir says only "File exists" when a part of the folder is a file."""
    (tmp_path / "runs").write_text("x\n")
    with pytest.raises(NotADirectoryError) as caught:
        write_atomic(tmp_path / "runs" / "best.yaml", "a\n")
    assert caught.value.filename == str(tmp_path / "runs" / "best.yaml")
