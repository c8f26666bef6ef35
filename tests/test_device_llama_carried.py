"""build_llama_bench.sh with a carried llama-bench (prebuild_llama_bench.sh's .device/llama-bench.gz):
it runs the carried binary only when the stamp names the carried pack and the binary starts, and
says why and falls back to the build from the pack otherwise. The binaries here are shell scripts
that stand in for llama-bench; the device check of the real one is its start there."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pathlib
import shutil
import subprocess
import tarfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "device" / "build_llama_bench.sh"

pytestmark = pytest.mark.skipif(shutil.which("gunzip") is None or shutil.which("sha256sum") is None,
                                reason="needs gunzip and sha256sum")


def _tree(tmp_path: pathlib.Path, binary: str, stamp_of_pack: bool | None) -> pathlib.Path:
    """A repository-like folder holding the script, a pack without CMakeLists.txt (so that a build
    from it fails at once), the gzipped stand-in binary and its stamp."""
    repo = tmp_path / "repo"
    (repo / "tools" / "device").mkdir(parents=True)
    shutil.copy(SCRIPT, repo / "tools" / "device" / SCRIPT.name)
    device = repo / ".device"
    device.mkdir()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"not llama.cpp\n"
        info = tarfile.TarInfo("llama.cpp/README")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    pack = device / "llama.cpp.tar.gz"
    pack.write_bytes(buf.getvalue())
    if stamp_of_pack is not None:  # None: no stamp at all
        digest = hashlib.sha256(pack.read_bytes()).hexdigest() if stamp_of_pack else "0" * 64
        (device / "llama-bench.stamp").write_text(f"pack {digest} cuda 13 arch 90-real\n")
    (device / "llama-bench.gz").write_bytes(gzip.compress(binary.encode()))
    return repo


def _run(repo: pathlib.Path, home: pathlib.Path) -> subprocess.CompletedProcess:
    home.mkdir(exist_ok=True)
    env = {**os.environ, "HOME": str(home)}
    return subprocess.run(["bash", str(repo / "tools" / "device" / SCRIPT.name)], capture_output=True,
                          text=True, env=env, timeout=120)


STARTS = "#!/bin/sh\necho 'Available devices:'; echo \"  CUDA0: NVIDIA H200 ($*)\"\nexit 0\n"
SEES_NO_GPU = "#!/bin/sh\necho 'Available devices:'; echo '  (none)'\nexit 0\n"
FAILS = "#!/bin/sh\necho 'error while loading shared libraries: libcublas.so.13' >&2\nexit 127\n"


def test_a_carried_binary_of_this_pack_that_starts_is_used(tmp_path):
    repo = _tree(tmp_path, STARTS, stamp_of_pack=True)
    result = _run(repo, tmp_path / "home")
    assert result.returncode == 0, result.stderr
    wrapper = pathlib.Path(result.stdout.strip().splitlines()[-1])
    assert wrapper == tmp_path / "home" / "llama-bench-carried" / "llama-bench.sh"
    assert "the carried llama-bench starts" in result.stderr
    # the printed path runs the carried binary with the arguments it is given
    ran = subprocess.run([str(wrapper), "-m", "x.gguf"], capture_output=True, text=True, timeout=30)
    assert ran.returncode == 0 and ran.stdout == "Available devices:\n  CUDA0: NVIDIA H200 (-m x.gguf)\n"


@pytest.mark.parametrize("binary, stamp_of_pack, reasons", [
    (STARTS, False, ["built from another pack"]),
    (STARTS, None, ["has no stamp"]),
    (FAILS, True, ["does not start here", "libcublas.so.13"]),
    (SEES_NO_GPU, True, ["does not start here", "(none)"]),
], ids=["another-pack", "no-stamp", "does-not-start", "sees-no-gpu"])
def test_a_binary_that_cannot_be_used_falls_back_to_the_build(tmp_path, binary, stamp_of_pack, reasons):
    repo = _tree(tmp_path, binary, stamp_of_pack=stamp_of_pack)
    result = _run(repo, tmp_path / "home")
    for reason in reasons:
        assert reason in result.stderr, result.stderr
    # the fallback builds from the pack, which here has no CMakeLists.txt: the script fails
    assert result.returncode != 0
    assert "llama-bench-carried" not in result.stdout


def test_a_carried_binary_without_its_pack_is_used(tmp_path):
    repo = _tree(tmp_path, STARTS, stamp_of_pack=True)
    (repo / ".device" / "llama.cpp.tar.gz").unlink()
    result = _run(repo, tmp_path / "home")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("llama-bench-carried/llama-bench.sh")


def test_no_pack_and_no_binary_is_named(tmp_path):
    repo = _tree(tmp_path, STARTS, stamp_of_pack=True)
    (repo / ".device" / "llama.cpp.tar.gz").unlink()
    (repo / ".device" / "llama-bench.gz").unlink()
    result = _run(repo, tmp_path / "home")
    assert result.returncode != 0 and "no " in result.stderr and "llama.cpp.tar.gz" in result.stderr
