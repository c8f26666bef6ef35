"""`pyspecla serve`: an HTTP server speaking OpenAI's, llama-server's and Anthropic's APIs over one
loaded model (docs/server.md). Its dependencies are the optional extra `server`:

    pip install 'pyspecla[server]'

Modules: app (the ASGI app, API key, error rendering), engine (the worker thread and its queue),
session (tokens to text, stop strings, disconnects), text (thinking / tool-call parsing),
prompts (chat template, sampling defaults, context budget), schemas (request bodies),
openai_api / llama_api / anthropic_api (the endpoints), run (the command)."""

from __future__ import annotations

REQUIRED_MODULES = ("fastapi", "uvicorn", "pydantic")
INSTALL_HINT = "pip install 'pyspecla[server]'  (or: pip install fastapi uvicorn)"


def missing_dependencies() -> list[str]:
    """The server's dependencies that cannot be imported here."""
    import importlib.util

    return [name for name in REQUIRED_MODULES if importlib.util.find_spec(name) is None]
