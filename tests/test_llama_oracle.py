"""The session check of the llama.cpp oracle (llama_oracle.py): fake probe results read the right
way, and end to end a llama_cpp whose import dies with SIGILL fails the session with an
explanation instead of killing it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import llama_oracle
from llama_oracle import ProbeResult, diagnose

TESTS = Path(__file__).resolve().parent
X86_FLAGS = {"pni", "ssse3", "avx", "avx2", "f16c", "fma", "bmi2", "avx512f", "avx512_vnni", "amx_int8"}
PORTABLE = ("SYSTEM CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
            "LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 | \nEVAL_OK\n")


def test_portable_build_that_evaluates_passes():
    assert diagnose(ProbeResult(0, PORTABLE, ""), "site/llama_cpp", X86_FLAGS, "x86_64") is None


def test_sigill_is_explained_with_the_fix():
    why = diagnose(ProbeResult(-4, "SYSTEM CPU : AVX2 = 1 | \n", ""), "site/llama_cpp", X86_FLAGS, "x86_64")
    assert "site/llama_cpp" in why and "SIGILL" in why and "-march=native" in why
    assert llama_oracle.REINSTALL in why


def test_native_build_is_refused_before_it_crashes():
    native = PORTABLE.replace("BMI2 = 1 |", "BMI2 = 1 | AVX512 = 1 | AVX512_VNNI = 1 | AMX_INT8 = 1 |")
    why = diagnose(ProbeResult(0, native, ""), "site/llama_cpp", X86_FLAGS, "x86_64")
    assert "AMX_INT8, AVX512, AVX512_VNNI" in why and "native" in why and llama_oracle.REINSTALL in why


def test_build_for_features_this_cpu_lacks_is_refused():
    why = diagnose(ProbeResult(0, PORTABLE, ""), "site/llama_cpp", X86_FLAGS - {"f16c"}, "x86_64")
    assert "F16C" in why and "does not have" in why


def test_other_architectures_are_not_held_to_the_x86_set():
    arm = "SYSTEM CPU : NEON = 1 | ARM_FMA = 1 | DOTPROD = 1 | \nEVAL_OK\n"
    assert diagnose(ProbeResult(0, arm, ""), "site/llama_cpp", set(), "aarch64") is None


def test_errors_timeouts_and_silent_exits_are_reported():
    failed = diagnose(ProbeResult(1, "", "Traceback\nOSError: libllama.so: cannot open\n"), "x", X86_FLAGS, "x86_64")
    assert "status 1" in failed and "libllama.so" in failed
    assert "did not finish" in diagnose(ProbeResult(None, "", ""), "x", X86_FLAGS, "x86_64")
    assert "no CPU backend features" in diagnose(ProbeResult(0, "", ""), "x", X86_FLAGS, "x86_64")
    no_eval = PORTABLE.replace("EVAL_OK\n", "")
    assert "without finishing its eval" in diagnose(ProbeResult(0, no_eval, ""), "x", X86_FLAGS, "x86_64")


def test_probe_turns_a_real_signal_into_a_result(tmp_path):
    dies = "import os, signal; os.kill(os.getpid(), signal.SIGILL)"
    assert llama_oracle.run_probe(str(tmp_path / "unused.gguf"), dies).returncode == -4


def test_refused_import_raises_the_explanation():
    finder = llama_oracle.refuse_import("no_such_oracle_pkg", "built natively: reinstall")
    try:
        with pytest.raises(ImportError, match="built natively: reinstall"):
            import no_such_oracle_pkg  # noqa: F401
    finally:
        sys.meta_path.remove(finder)


def test_session_with_a_crashing_oracle_fails_with_the_explanation(tmp_path):
    """The real conftest and a real llama.cpp test file, with a llama_cpp on the path whose import
    dies with SIGILL: the run must end (not die), say why and exit 1."""
    fake = tmp_path / "site" / "llama_cpp"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGILL)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-m", "pytest", str(TESTS / "test_llama_parity.py"), "-q", "-ra",
                           "-p", "no:cacheprovider"], capture_output=True, text=True, env=env, cwd=TESTS.parent,
                          timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert "llama.cpp oracle" in out and "killed the child process with SIGILL" in out, out
    assert "SKIPPED" in out and "could not import 'llama_cpp'" in out, out
