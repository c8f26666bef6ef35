"""tools/device/bench_matrices.sh refuses malformed variants before it builds anything (the build and
the timings need a GPU machine; the argument checks run anywhere)."""
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "tools" / "device" / "bench_matrices.sh"


def run(*args):
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("args, message", [
    (["draft_q", "1,16", "2"], "no variant (NAME=VAR=VALUE)"),
    (["draft_q", "1,16", "2", "ring=1"], "'ring=1' is not NAME=VAR=VALUE"),
    (["draft_q", "1,16", "2", "ring"], "'ring' is not NAME=VAR=VALUE"),
])
def test_malformed_variants_are_refused(args, message):
    r = run(*args)
    assert r.returncode == 2
    assert message in r.stderr


def test_missing_arguments_are_named():
    r = run("draft_q")
    assert r.returncode != 0
    assert "BATCHES" in r.stderr
