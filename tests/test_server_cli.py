"""`pyspecla serve` as a command: it starts, answers and stops (a subprocess on a free port); bad
flags and a missing draft are one line and exit status 2; without the server's dependencies it says
how to install them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from pyspecla import cli

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_starts_answers_and_stops(tiny_model_path):
    pytest.importorskip("uvicorn")
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    server = subprocess.Popen([sys.executable, "-m", "pyspecla", "serve", tiny_model_path("f32"), "--port", str(port),
                               "--draft", "ngram", "--alias", "tiny", "-c", "300", "--log-level", "warning"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.stderr.read()
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.1)
        assert [m["id"] for m in httpx.get(url + "/v1/models").json()["data"]] == ["tiny"]
        props = httpx.get(url + "/props").json()
        assert props["n_ctx"] == 300 and props["draft"] == "ngram"
        answer = httpx.post(url + "/completion", json={"prompt": "hello", "n_predict": 5, "temperature": 0},
                            timeout=60).json()
        assert answer["tokens_predicted"] == 5 or answer["stop_type"] == "eos"
    finally:
        server.terminate()
        _, err = server.communicate(timeout=30)
    # uvicorn shuts down gracefully, then re-raises the signal (exit by SIGTERM), or returns 0
    assert server.returncode in (0, -signal.SIGTERM), err
    assert "Traceback" not in err
    assert f"serving {tiny_model_path('f32')} on http://127.0.0.1:{port} (draft ngram" in err


@pytest.mark.parametrize("argv,needle", [
    (["--port", "0"], "--port must be positive"),
    (["--port", "70000"], "--port must be at most 65535"),
    (["--parallel", "0"], "--parallel must be positive"),
    (["--queue", "-1"], "--queue must be >= 0"),
])
def test_bad_serve_flags_are_named(tiny_model_path, capsys, argv, needle):
    with pytest.raises(SystemExit) as info:
        cli.main(["serve", tiny_model_path("f32"), *argv])
    assert info.value.code == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("argv,needle", [
    (["--draft", "no/such/draft.gguf"], "--draft no/such/draft.gguf: no such file"),
    (["--draft", "ngram:n=0"], "n-gram drafter"),
    (["--draft", "oracle:p=0.5"], "benchmark tool"),
    (["--specla"], "--specla needs --draft"),
])
def test_bad_drafts_are_one_line_and_status_2(tiny_model_path, capsys, argv, needle):
    pytest.importorskip("uvicorn")
    assert cli.main(["serve", tiny_model_path("f32"), *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err


def test_a_model_whose_weights_hold_nan_fails_at_startup(tiny_model_path, tmp_path, capsys, monkeypatch):
    """serve runs one token through the model before it listens: a file whose weights hold NaN is
    one line naming it and status 2, not a server whose every request fails."""
    pytest.importorskip("uvicorn")
    import uvicorn
    from gguf_fixtures import copy_with_a_nan_weight

    served = []
    monkeypatch.setattr(uvicorn, "run", lambda *a, **k: served.append(a))  # a missed check must not block
    path = copy_with_a_nan_weight(tiny_model_path("f32"), str(tmp_path / "nan.gguf"))
    assert cli.main(["serve", path, "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert f"{path}: the logits after the prompt are not finite" in err and not served, err


def test_without_the_server_dependencies_it_says_how_to_install_them(tiny_model_path, capsys, monkeypatch):
    import pyspecla.server.run as run

    monkeypatch.setattr(run, "missing_dependencies", lambda: ["fastapi", "uvicorn"])
    assert cli.main(["serve", tiny_model_path("f32")]) == 2
    err = capsys.readouterr().err
    assert "needs fastapi, uvicorn" in err and "pip install 'pyspecla[server]'" in err
