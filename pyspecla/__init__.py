"""pyspecla: a GGUF-native runtime for exact speculative decoding of qwen35 hybrid models."""

from .errors import GGUFError, NativeError, SpeclaError, UsageError
from .sampling import SamplingParams

__all__ = ["GGUFError", "NativeError", "SpeclaError", "UsageError", "Model", "SamplingParams"]
__version__ = "0.1.0"


def __getattr__(name):
    # Model pulls in the native library; import it lazily so `pyspecla.reference` and the tools
    # work without a built library.
    if name == "Model":
        from .model import Model

        return Model
    raise AttributeError(name)
