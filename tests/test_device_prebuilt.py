"""The stamp that lets a device call use a library prebuilt here (tools/device/source_stamp.sh, read
by run_gpu.sh): it names the build and follows every source file the library is built from, so a
library built before an edit is never taken for the edited sources."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent


def stamp(tree: pathlib.Path) -> str:
    result = subprocess.run(["bash", str(tree / "tools" / "device" / "source_stamp.sh")], capture_output=True,
                            text=True, timeout=60, check=True)
    return result.stdout.strip()


def test_the_stamp_follows_the_library_sources(tmp_path):
    tree = tmp_path / "repo"
    shutil.copytree(ROOT / "native", tree / "native")
    shutil.copy(ROOT / "CMakeLists.txt", tree / "CMakeLists.txt")
    (tree / "tools" / "device").mkdir(parents=True)
    shutil.copy(ROOT / "tools" / "device" / "source_stamp.sh", tree / "tools" / "device")
    first = stamp(tree)
    assert first.startswith("cuda sm_90 Release ") and len(first.split()[-1]) == 64
    assert stamp(tree) == first  # the same sources, the same line
    source = tree / "native" / "backends" / "cuda" / "attention.cu"
    text = source.read_text()
    source.write_text(text + "\n")  # any edit, even white space
    assert stamp(tree) != first
    source.write_text(text)
    assert stamp(tree) == first
    (tree / "native" / "src" / "new_file.c").write_text("/* a new source */\n")  # a file added
    assert stamp(tree) != first
    (tree / "native" / "src" / "new_file.c").unlink()
    (tree / "CMakeLists.txt").write_text((ROOT / "CMakeLists.txt").read_text() + "# edited\n")
    assert stamp(tree) != first
    # files outside the library's sources do not count
    (tree / "tools" / "device" / "notes.txt").write_text("not a source\n")
    (tree / "CMakeLists.txt").write_text((ROOT / "CMakeLists.txt").read_text())
    assert stamp(tree) == first
