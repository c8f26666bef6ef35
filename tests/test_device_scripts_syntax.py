"""The shell scripts that device calls and CI run parse (`bash -n`): a syntax error in one of them
would otherwise surface only on the lent GPU machine, after its start-up and build."""

from __future__ import annotations

import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPTS = sorted([*ROOT.glob("tools/*.sh"), *ROOT.glob("tools/device/*.sh"), *ROOT.glob("tools/device/*/*.sh"),
                  ROOT / ".ci" / "run"])


def test_the_scripts_are_found():
    names = {p.name for p in SCRIPTS}
    assert {"run_gpu.sh", "measure.sh", "ab_variants.sh", "matmul_plan_sweep.sh", "run"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_script_parses(script):
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
