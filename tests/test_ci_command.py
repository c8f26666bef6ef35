"""The README's test command, `.ci/run` and the oracle check's advice stay the same command: one
install with the portable llama.cpp build options, then the whole suite."""

from __future__ import annotations

import re
from pathlib import Path

import llama_oracle

ROOT = Path(__file__).resolve().parent.parent


def readme_test_command() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("Install and run the tests", 1)[1]
    block = re.search(r"```bash\n(.*?)\n```", section, re.S).group(1)
    lines = [line for line in block.splitlines() if line.strip()]
    assert len(lines) == 1, f"the README's test command must be one line, got {lines}"
    return lines[0]


def ci_commands() -> str:
    lines = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
             if line.strip() and not line.startswith("#") and not line.startswith(("set ", "cd "))]
    return " && ".join(lines).replace("python3 -m pip", "pip").replace("python3 ", "python ")


def test_ci_runs_the_readme_command():
    assert ci_commands() == readme_test_command()


def test_the_install_is_portable_and_the_check_advises_the_same_options():
    command = readme_test_command()
    assert command.startswith(f'CMAKE_ARGS="{llama_oracle.PORTABLE_CMAKE_ARGS}" pip install ".[test]" && ')
    assert "-DGGML_NATIVE=OFF" in llama_oracle.PORTABLE_CMAKE_ARGS
