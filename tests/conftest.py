"""Shared fixtures: the CPU kernel sets this machine can run (the cross-backend harness runs each op
on every one of them against the numpy oracle), and seeded synthetic test models, written once per
session into a temporary directory (never downloaded), and the seed of each test's random inputs.
Before collection, the llama.cpp oracle is
probed in a child process (llama_oracle.py): a build that would crash the run fails it with an
explanation instead."""

from __future__ import annotations

import os
from dataclasses import dataclass
import zlib

import numpy as np
import pytest


_LLAMA_ORACLE_PROBLEM: str | None = None


def _write_probe_model(path: str) -> None:
    from pyspecla.testing.models import write_test_model

    write_test_model(path, preset="tiny", quant="q8_0", seed=0)


# Random inputs are fresh in every session and reproducible: the session seed is SPECLA_TEST_SEED
# when set, else drawn from entropy; the pytest header and every failing test's report show it, and
# each test draws from its own seed, derived from the session seed and the test's id (the same
# inputs whether the test runs alone or in the whole suite).
SESSION_SEED: int = 0


def _session_seed() -> int:
    text = os.environ.get("SPECLA_TEST_SEED", "").strip()
    if not text:
        return int(np.random.SeedSequence().entropy % 2**32)
    try:
        return int(text) % 2**32
    except ValueError:
        raise pytest.UsageError(f"SPECLA_TEST_SEED must be an integer, got {text!r}") from None


def seed_for(test_id: str) -> int:
    """The seed of one test's random inputs in this session."""
    return zlib.crc32(f"{SESSION_SEED}:{test_id}".encode())


@pytest.fixture
def seed(request) -> int:
    return seed_for(request.node.nodeid)


def pytest_report_header(config):
    return f"random inputs: SPECLA_TEST_SEED={SESSION_SEED} (set it to rerun with the same inputs)"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        report.sections.append(("random inputs", f"rerun with the same inputs: SPECLA_TEST_SEED={SESSION_SEED} "
                                                 f"python -m pytest '{item.nodeid}'"))
    return report


def pytest_configure(config):
    global _LLAMA_ORACLE_PROBLEM, SESSION_SEED
    import llama_oracle

    SESSION_SEED = _session_seed()

    _LLAMA_ORACLE_PROBLEM = llama_oracle.check_oracle(_write_probe_model)
    if _LLAMA_ORACLE_PROBLEM is not None:
        llama_oracle.refuse_import("llama_cpp", _LLAMA_ORACLE_PROBLEM)


def pytest_sessionfinish(session, exitstatus):
    if _LLAMA_ORACLE_PROBLEM is not None and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if _LLAMA_ORACLE_PROBLEM is not None:
        terminalreporter.section("llama.cpp oracle", red=True, bold=True)
        terminalreporter.line(_LLAMA_ORACLE_PROBLEM)


def available_cpu_kernels() -> list[str]:
    from pyspecla import _native

    kernels = ["scalar"]
    best = _native.cpu_best_kernels()
    if best >= _native.CPU_AVX2:
        kernels.append("avx2")
    if best >= _native.CPU_AVX512:
        kernels.append("avx512")
    return kernels


@dataclass(frozen=True)
class Backend:
    """One value of the cross-backend axis: where an op or a model runs. `kw` goes to pyspecla.ops
    calls and Model.load as keyword arguments."""

    name: str
    device: str
    cpu_kernels: str = "auto"

    @property
    def kw(self) -> dict:
        return {"device": self.device, "cpu_kernels": self.cpu_kernels}


def available_backends() -> list:
    """Every CPU kernel set of this machine, then the GPU (marked `gpu`: skipped with a reason where
    this build or machine has none)."""
    cpus = [pytest.param(Backend(f"cpu-{k}", "cpu", k), id=f"cpu-{k}") for k in available_cpu_kernels()]
    return cpus + [pytest.param(Backend("cuda", "cuda"), id="cuda", marks=pytest.mark.gpu)]


def pytest_generate_tests(metafunc):
    if "cpu_kernels" in metafunc.fixturenames:
        metafunc.parametrize("cpu_kernels", available_cpu_kernels())
    if "backend" in metafunc.fixturenames:
        metafunc.parametrize("backend", available_backends())


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return  # pure-Python test files need no native library at collection time
    from pyspecla import _native

    if _native.cuda_device_count() == 0:
        skip = pytest.mark.skip(reason="no CUDA device visible to this build (GPU tests run where one is)")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _cpu_unless_gpu_test(request, monkeypatch):
    """Tests not marked gpu run on the CPU backend even on a machine with a GPU (where 'auto' would
    pick it): they check the CPU oracle. gpu tests name their device themselves."""
    if "gpu" not in request.keywords:
        monkeypatch.setenv("SPECLA_DEVICE", "cpu")


@pytest.fixture(scope="session")
def test_model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


_MODEL_CACHE: dict = {}


@pytest.fixture(scope="session")
def tiny_model_path(test_model_dir):
    """tiny_model_path(quant, seed=0) -> path of a tiny synthetic qwen35 GGUF (written once)."""
    from pyspecla.testing.models import write_test_model

    def get(quant: str = "f32", seed: int = 0, preset: str = "tiny") -> str:
        key = (preset, quant, seed)
        if key not in _MODEL_CACHE:
            path = os.path.join(test_model_dir, f"{preset}-{quant}-{seed}.gguf")
            write_test_model(path, preset=preset, quant=quant, seed=seed)
            _MODEL_CACHE[key] = path
        return _MODEL_CACHE[key]

    return get


def assert_close_up_to_code_flips(ours, expected, what, n_exact_min=1):
    """Quantized weights meet 8-bit activations (activation_q8.h). Two computations of the same
    model that differ by float rounding anywhere upstream (float64 reference vs our float32, or two
    kernel sets) can round an activation that lies within an ulp of a code boundary to the
    neighbouring code: one step of one activation, ~1e-2 of the logits on these random weights,
    carried on by the recurrent state. So per sequence: either no flip happened (agreement to 1e-5,
    which shows the arithmetic itself is the same) or the logits are within 5e-2 with the same
    argmax; at least n_exact_min sequences must show no flip."""
    exact = 0
    for i, (a, b) in enumerate(zip(ours, expected)):
        rel = np.abs(a - b).max() / np.abs(b).max()
        exact += rel <= 1e-5
        assert rel <= 5e-2, f"{what} sequence {i}: max relative logit error {rel:.2e}"
        assert np.mean(a.argmax(-1) == b.argmax(-1)) >= 0.9, f"{what} sequence {i}: argmax differs"
    assert exact >= n_exact_min, f"{what}: every sequence differs by more than 1e-5"
