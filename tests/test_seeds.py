"""Random test inputs are reproducible: SPECLA_TEST_SEED fixes the session seed, each test's seed
follows from it and the test's id, and a failing test's report says how to rerun it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

TWO_TESTS = '''
def test_first(seed):
    print("SEED", seed)
    assert False

def test_second(seed):
    print("SEED", seed)
    assert False
'''


def run_pytest(directory: Path, session_seed: str) -> subprocess.CompletedProcess:
    # the tests' directory (conftest) and the checkout (pyspecla, which conftest's oracle probe uses
    # when llama-cpp-python is installed) on the path, as for the suite itself
    env = dict(os.environ, SPECLA_TEST_SEED=session_seed,
               PYTHONPATH=os.pathsep.join([str(TESTS), str(TESTS.parent), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-rA",
                           str(directory)], capture_output=True, text=True, env=env, cwd=directory, timeout=300)


def test_session_seed_reproduces_each_tests_inputs(tmp_path):
    (tmp_path / "test_two.py").write_text(TWO_TESTS)
    runs = [run_pytest(tmp_path, seed) for seed in ("123", "123", "124")]
    seeds = [re.findall(r"^SEED (\d+)$", run.stdout, re.M) for run in runs]
    assert len(seeds[0]) == 2 and seeds[0][0] != seeds[0][1], runs[0].stdout
    assert seeds[1] == seeds[0], "the same SPECLA_TEST_SEED must give the same inputs"
    assert seeds[2][0] != seeds[0][0] and seeds[2][1] != seeds[0][1]
    assert "random inputs: SPECLA_TEST_SEED=123" in runs[0].stdout
    assert "rerun with the same inputs: SPECLA_TEST_SEED=123 python -m pytest 'test_two.py::test_first'" in runs[0].stdout


def test_bad_session_seed_is_a_one_line_usage_error(tmp_path):
    (tmp_path / "test_two.py").write_text(TWO_TESTS)
    run = run_pytest(tmp_path, "twelve")
    assert run.returncode == 4, run.stdout + run.stderr
    assert "SPECLA_TEST_SEED must be an integer, got 'twelve'" in run.stderr
    assert "Traceback" not in run.stderr
