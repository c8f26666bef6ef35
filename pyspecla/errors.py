"""Exceptions pyspecla raises. Every message names the file, tensor, key or flag at fault.

The CLI turns any SpeclaError into one line on stderr and exit status 2 (no traceback)."""


class SpeclaError(Exception):
    """Base class of every error pyspecla reports to a user."""


class GGUFError(SpeclaError, ValueError):
    """A GGUF file that cannot be used: not a GGUF, truncated, wrong architecture, missing or
    malformed key or tensor, unsupported tensor type. The message starts with the file path."""


class NativeError(SpeclaError, RuntimeError):
    """A call into libspecla failed; carries the library's status code and message."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class UsageError(SpeclaError, ValueError):
    """A bad flag or argument value (CLI or API)."""
