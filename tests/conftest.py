"""Shared fixtures: the CPU kernel sets this machine can run (the cross-backend harness runs each op
on every one of them against the numpy oracle), and seeded synthetic test models, written once per
session into a temporary directory (never downloaded)."""

from __future__ import annotations

import os

import pytest


def available_cpu_kernels() -> list[str]:
    from pyspecla import _native

    kernels = ["scalar"]
    if _native.cpu_best_kernels() == _native.CPU_AVX2:
        kernels.append("avx2")
    return kernels


def pytest_generate_tests(metafunc):
    if "cpu_kernels" in metafunc.fixturenames:
        metafunc.parametrize("cpu_kernels", available_cpu_kernels())


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return  # pure-Python test files need no native library at collection time
    from pyspecla import _native

    if _native.cuda_device_count() == 0:
        skip = pytest.mark.skip(reason="no CUDA device on this machine")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def test_model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


_MODEL_CACHE: dict = {}


@pytest.fixture(scope="session")
def tiny_model_path(test_model_dir):
    """tiny_model_path(quant, seed=0) -> path of a tiny synthetic qwen35 GGUF (written once)."""
    from pyspecla.testmodels import write_test_model

    def get(quant: str = "f32", seed: int = 0, preset: str = "tiny") -> str:
        key = (preset, quant, seed)
        if key not in _MODEL_CACHE:
            path = os.path.join(test_model_dir, f"{preset}-{quant}-{seed}.gguf")
            write_test_model(path, preset=preset, quant=quant, seed=seed)
            _MODEL_CACHE[key] = path
        return _MODEL_CACHE[key]

    return get
