"""Numpy oracles: single ops with the native signatures (ops) and the whole qwen35 forward
(forward). Slow, obviously correct, float64 inside; every fast kernel is tested against them."""

from . import ops
from .ops import (
    attention,
    causal_conv,
    dequantize,
    gated_delta_rule,
    l2_norm,
    matmul,
    rms_norm,
    rope_neox,
    sigmoid,
    silu,
    softplus,
)

__all__ = [
    "ops",
    "attention",
    "causal_conv",
    "dequantize",
    "gated_delta_rule",
    "l2_norm",
    "matmul",
    "rms_norm",
    "rope_neox",
    "sigmoid",
    "silu",
    "softplus",
]
