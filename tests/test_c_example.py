"""The embedding surface for native hosts, end to end: the library configured, built and installed
with `cmake --install` into a temporary prefix, examples/c built against the installed CMake package
(find_package(specla CONFIG)) and, separately, with the installed pkg-config file; the example run on
tiny synthetic models and its printed argmax, top-5 logits and speculative step compared with the
Python API's; bad arguments and files exit 1 with a message."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pyspecla.model import Model
from pyspecla.testing.models import write_test_model

ROOT = Path(__file__).resolve().parent.parent
CMAKE = shutil.which("cmake")
NINJA = shutil.which("ninja")
CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")

pytestmark = pytest.mark.skipif(CMAKE is None or CC is None, reason="needs cmake and a C compiler "
                                "(pip install '.[test]' brings cmake)")


def _run(cmd, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=1200, **kwargs)
    assert result.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def _generator() -> list[str]:
    return ["-G", "Ninja"] if NINJA else []


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The library built from this checkout (CPU backend) and installed under a fresh prefix."""
    tmp = tmp_path_factory.mktemp("install")
    build, prefix = tmp / "build", tmp / "prefix"
    _run([CMAKE, "-S", ROOT, "-B", build, *_generator(), "-DSPECLA_CUDA=OFF", "-DCMAKE_BUILD_TYPE=Release"])
    _run(["nice", CMAKE, "--build", build])
    _run([CMAKE, "--install", build, "--prefix", prefix])
    return prefix


@pytest.fixture(scope="module")
def example(installed, tmp_path_factory) -> Path:
    """examples/c built with its own CMakeLists.txt against the installed package."""
    build = tmp_path_factory.mktemp("example")
    _run([CMAKE, "-S", ROOT / "examples" / "c", "-B", build, *_generator(), f"-DCMAKE_PREFIX_PATH={installed}",
          "-DCMAKE_COMPILE_WARNING_AS_ERROR=ON"])
    _run([CMAKE, "--build", build])
    return build / "specla_example"


def test_install_tree_holds_the_library_header_package_and_pkg_config(installed):
    libdir = next(p.parent for p in installed.rglob("libspecla.so"))
    assert (installed / "include" / "specla.h").read_text() == (ROOT / "native" / "include" / "specla.h").read_text()
    package = libdir / "cmake" / "specla"
    assert {"speclaConfig.cmake", "speclaConfigVersion.cmake", "speclaTargets.cmake"} <= {p.name for p in
                                                                                         package.iterdir()}
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    pc = (libdir / "pkgconfig" / "specla.pc").read_text()
    assert f"Version: {version}" in pc  # the CMake project's version is pyproject's
    assert f'set(PACKAGE_VERSION "{version}")' in (package / "speclaConfigVersion.cmake").read_text()
    assert not any(p.suffix == ".h" and p.name != "specla.h" for p in installed.rglob("*.h")), "private headers"


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("models")
    return {
        "qwen35-q8_0": str(write_test_model(tmp / "qwen35.gguf", preset="tiny", quant="q8_0", seed=5)),
        "qwen2-f32": str(write_test_model(tmp / "qwen2.gguf", preset="tiny", quant="f32", arch="qwen2", seed=6)),
    }


def _parse(stdout: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in stdout.strip().splitlines())


def _python_reference(path: str, prompt: list[int], n_tokens: int):
    """Logits of the prompt's last token and the greedy continuation, from the Python API."""
    with Model.load(path, device="cpu") as model:
        ctx = model.new_context(n_ctx=64)
        logits = ctx.eval(prompt)
        ctx.close()
        return logits, model.generate(prompt, n_tokens)


def _top5(logits: np.ndarray) -> list[tuple[int, np.float32]]:
    order = sorted(range(len(logits)), key=lambda i: (-logits[i], i))[:5]  # highest first, ties to the lower id
    return [(i, logits[i]) for i in order]


@pytest.mark.parametrize("which", ["qwen35-q8_0", "qwen2-f32"])
def test_example_agrees_with_the_python_api(example, models, which):
    path = models[which]
    prompt = [3, 141, 59, 26, 535, 89, 79]
    logits, greedy = _python_reference(path, prompt, 4)
    # guesses: the first two greedy tokens right, the third wrong -> 2 accepted, then the model's own
    wrong = (greedy[3] + 1) % len(logits)
    result = _run([example, path, *prompt, "--draft", f"{greedy[1]},{greedy[2]},{wrong}"])
    out = _parse(result.stdout)

    assert out["model"].startswith(f"arch {which.split('-')[0]}, 4 layers, n_vocab {len(logits)}, backend cpu")
    assert int(out["argmax"]) == int(np.argmax(logits)) == greedy[0]
    printed = [(int(i), np.float32(v)) for i, v in (item.split(":") for item in out["top5"].split())]
    assert printed == _top5(logits)  # ids and logits exactly (%.9g round-trips a float32)
    assert out["chain"].split() == [str(t) for t in (greedy[0], greedy[1], greedy[2], wrong)]
    assert out["verify argmax"].split()[:3] == [str(t) for t in greedy[1:4]]
    assert out["accepted"] == "2 of 3 guesses"
    assert out["emitted"].split() == [str(t) for t in greedy[1:4]]
    assert int(out["n_past"]) == len(prompt) + 3


def test_example_default_guesses_are_the_prompts_first_tokens(example, models):
    path = models["qwen35-q8_0"]
    prompt = [7, 8, 9, 10, 11]
    logits, greedy = _python_reference(path, prompt, 2)
    out = _parse(_run([example, path, *prompt]).stdout)
    assert out["chain"].split() == [str(t) for t in (greedy[0], 7, 8, 9)]
    accepted = int(out["accepted"].split()[0])
    assert out["emitted"].split()[-1] == out["verify argmax"].split()[accepted]
    assert int(out["n_past"]) == len(prompt) + 1 + accepted


@pytest.mark.parametrize(
    "args, words",
    [
        ([], "usage: specla_example"),
        (["{model}"], "usage: specla_example"),
        (["{missing}", "1"], "{missing}: cannot open file"),
        (["{readme}", "1"], "{readme}: not a GGUF file"),
        (["{model}", "1", "x"], "token 'x' is not a token id"),
        (["{model}", "1", "-3"], "token '-3' is not a token id"),
        (["{model}", "1", "99999"], "token 99999 is outside the vocabulary [0, 1024)"),
        (["{model}", "1", "--draft"], "--draft needs a comma-separated list"),
        (["{model}", "1", "--draft", "2,y"], "--draft: 'y' is not a token id"),
        (["{model}", "1", "--draft", "5000"], "--draft token 5000 is outside the vocabulary"),
        (["{model}", "1", "--draft", ",".join(["1"] * 16)], "at most 15 guesses"),
        (["{model}", "1", "--bogus"], "unknown option '--bogus'"),
    ],
)
def test_bad_arguments_and_files_exit_1_with_a_message(example, models, tmp_path, args, words):
    names = {"model": models["qwen35-q8_0"], "missing": str(tmp_path / "none.gguf"), "readme": str(ROOT / "README.md")}
    result = subprocess.run([str(example), *(a.format(**names) for a in args)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert words.format(**names) in result.stderr, result.stderr
    assert result.stdout == ""


@pytest.mark.skipif(shutil.which("pkg-config") is None, reason="needs pkg-config")
def test_example_builds_with_the_pkg_config_file(installed, models, tmp_path):
    libdir = next(p.parent for p in installed.rglob("libspecla.so"))
    env = {**os.environ, "PKG_CONFIG_PATH": str(libdir / "pkgconfig")}
    flags = _run(["pkg-config", "--cflags", "--libs", "specla"], env=env).stdout.split()
    binary = tmp_path / "specla_example"
    _run([CC, "-std=c11", "-Wall", "-Wextra", "-pedantic", "-Werror", ROOT / "examples" / "c" / "specla_example.c",
          *flags, f"-Wl,-rpath,{libdir}", "-o", binary])
    out = _parse(_run([binary, models["qwen2-f32"], "1", "2", "3"]).stdout)
    logits, greedy = _python_reference(models["qwen2-f32"], [1, 2, 3], 1)
    assert int(out["argmax"]) == greedy[0]
