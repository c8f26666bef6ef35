"""The llama.cpp oracle (llama-cpp-python) is checked once per test session, in a child process,
before any test module imports it. A llama.cpp built with `-march=native` on a CPU that advertises
AMX contains AMX code that runs without asking Linux for the AMX tile state (arch_prctl
ARCH_REQ_XCOMP_PERM), and the first such instruction kills the process with SIGILL — in the middle
of the suite, with no word of why. So the child imports llama_cpp, reports the instruction sets the
library was compiled for (llama_print_system_info) and evaluates a few tokens of a tiny quantized
model; the parent turns a signal, an error or a build outside the README's portable instruction set
into one explanation. When the check fails, `import llama_cpp` in the test process raises
ImportError with that explanation (the llama.cpp tests skip with it instead of crashing the run),
the explanation is printed again at the end, and the session exits non-zero."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import platform
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

# The instruction sets the README's CMAKE_ARGS compile llama.cpp for on x86-64, and the
# /proc/cpuinfo flag of every x86 feature llama_print_system_info can report.
PORTABLE_X86_FEATURES = frozenset({"SSE3", "SSSE3", "AVX", "AVX2", "F16C", "FMA", "BMI2"})
CPUINFO_FLAG = {
    "SSE3": "pni", "SSSE3": "ssse3", "AVX": "avx", "AVX_VNNI": "avx_vnni", "AVX2": "avx2",
    "F16C": "f16c", "FMA": "fma", "BMI2": "bmi2", "AVX512": "avx512f", "AVX512_VBMI": "avx512vbmi",
    "AVX512_VNNI": "avx512_vnni", "AVX512_BF16": "avx512_bf16", "AMX_INT8": "amx_int8",
}
PORTABLE_CMAKE_ARGS = ("-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON "
                       "-DGGML_BMI2=ON -DLLAVA_BUILD=OFF")
REINSTALL = (f'CMAKE_ARGS="{PORTABLE_CMAKE_ARGS}" pip install --force-reinstall --no-cache-dir '
             "--no-deps llama-cpp-python==0.3.36")

# Run by the child: argv[1] is a tiny GGUF the parent wrote. Prints one SYSTEM line, then EVAL_OK.
PROBE_CODE = r"""
import sys
import llama_cpp
print("SYSTEM", llama_cpp.llama_print_system_info().decode(), flush=True)
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=32, n_batch=32, n_threads=1, verbose=False)
llm.eval([1, 2, 3, 4])
llm.close()
print("EVAL_OK", flush=True)
"""

PROBE_TIMEOUT_S = 120


@dataclass(frozen=True)
class ProbeResult:
    returncode: int | None  # None: timed out
    stdout: str
    stderr: str


def oracle_location() -> str | None:
    """Where llama_cpp would be imported from, or None when it is not installed (found without
    importing it)."""
    spec = importlib.util.find_spec("llama_cpp")
    return None if spec is None else (spec.origin or "llama_cpp")


def run_probe(model_path: str, code: str = PROBE_CODE) -> ProbeResult:
    try:
        done = subprocess.run([sys.executable, "-c", code, model_path], capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        return ProbeResult(None, e.stdout or "", e.stderr or "")
    return ProbeResult(done.returncode, done.stdout, done.stderr)


def compiled_features(stdout: str) -> dict[str, str]:
    """The CPU backend's entries of the SYSTEM line ("CPU : SSE3 = 1 | AVX2 = 1 | ..."); {} when the
    child printed none."""
    for line in stdout.splitlines():
        if line.startswith("SYSTEM "):
            info = line[len("SYSTEM "):]
            cpu = info.split("CPU :", 1)[1] if "CPU :" in info else ""
            pairs = (item.split("=", 1) for item in cpu.split("|") if "=" in item)
            return {name.strip(): value.strip() for name, value in pairs}
    return {}


def cpu_flags(cpuinfo_path: str = "/proc/cpuinfo") -> set[str]:
    try:
        with open(cpuinfo_path) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def diagnose(result: ProbeResult, where: str, flags: set[str], machine: str) -> str | None:
    """None when the oracle is usable, else why not and what to do, in a few lines."""
    head = f"llama-cpp-python at {where} cannot serve as the test oracle:"
    fix = f"Reinstall it portably (see the README):\n  {REINSTALL}"
    tail = (result.stderr.strip().splitlines() or ["(no output)"])[-5:]
    if result.returncode is None:
        return f"{head} the probe (import, one 4-token eval) did not finish in {PROBE_TIMEOUT_S} s."
    if result.returncode < 0:
        sig = -result.returncode
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        why = (" It executed an instruction this process may not run: most likely a native "
               "(-march=native) build whose AMX or AVX-512 code the CPU advertises but Linux has "
               "not enabled for this process." if sig == signal.SIGILL else "")
        return f"{head} importing it and evaluating 4 tokens killed the child process with {name}.{why}\n{fix}"
    if result.returncode != 0:
        return f"{head} the probe exited with status {result.returncode}:\n  " + "\n  ".join(tail)
    features = compiled_features(result.stdout)
    if not features:
        return f"{head} llama_print_system_info reported no CPU backend features."
    if machine in ("x86_64", "AMD64"):
        on = sorted(name for name, value in features.items() if value == "1" and name in CPUINFO_FLAG)
        missing = [name for name in on if CPUINFO_FLAG[name] not in flags]
        if missing:
            return (f"{head} it was compiled for {', '.join(missing)}, which this CPU does not have "
                    f"(/proc/cpuinfo).\n{fix}")
        extra = [name for name in on if name not in PORTABLE_X86_FEATURES]
        if extra:
            return (f"{head} it was compiled for {', '.join(extra)}, beyond the portable set "
                    f"({', '.join(sorted(PORTABLE_X86_FEATURES))}): a native or otherwise non-portable "
                    f"build. AMX code in such a build dies with SIGILL where Linux has not enabled the "
                    f"tile state for the process, and the parity tests would not compare against the "
                    f"same oracle on every machine.\n{fix}")
    if "EVAL_OK" not in result.stdout:
        return f"{head} the probe exited cleanly without finishing its eval:\n  " + "\n  ".join(tail)
    return None


def check_oracle(write_model, code: str = PROBE_CODE) -> str | None:
    """Probe the installed oracle (None when none is installed or it is usable, else the
    explanation). `write_model(path)` writes the tiny GGUF the child evaluates."""
    where = oracle_location()
    if where is None:
        return None
    with tempfile.TemporaryDirectory(prefix="llama-oracle-") as tmp:
        path = os.path.join(tmp, "probe.gguf")
        write_model(path)
        result = run_probe(path, code)
    return diagnose(result, where, cpu_flags(), platform.machine())


class RefuseImport(importlib.abc.MetaPathFinder):
    """Makes `import <name>` raise ModuleNotFoundError(message) in this process (pytest.importorskip
    skips on that error class without a warning)."""

    def __init__(self, name: str, message: str):
        self.name, self.message = name, message

    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.name or fullname.startswith(self.name + "."):
            raise ModuleNotFoundError(self.message, name=fullname)
        return None


def refuse_import(name: str, message: str) -> RefuseImport:
    finder = RefuseImport(name, message)
    sys.meta_path.insert(0, finder)
    return finder
