"""Drafters, one file each: what proposes candidate tokens for a speculative step. Each returns, for depths
1..n_depths after the root, the top_k candidate tokens and their log-probabilities, best first:
arrays [n_depths][top_k]. The DDTree builder turns them into a tree; the target decides.

- DFlashDrafter: the DFlash block-diffusion draft model (pyspecla.dflash_draft), reading the target
  context's captured feature rows.
- OracleDrafter: a BENCHMARK TOOL, not a model. It knows the target's own greedy continuation
  (from a prior autoregressive pass) and corrupts each proposed token with probability 1 − p, so
  speed can be measured at a chosen acceptance rate on synthetic weights.
- NgramDrafter: prompt lookup over the token history (no model); may return zero depths (a miss),
  which the loop verifies as the root alone.
- ModelDrafter: an ordinary small language model (qwen2, or qwen35 with its recurrent layers) with
  the target's vocabulary, decoding greedily ahead of the target in its own context, rolled back
  exactly (KV truncation, or a saved recurrent state) to what the target committed before each
  proposal."""

from .dflash import DFlashDrafter
from .model import ModelDrafter, check_same_vocabulary
from .ngram import NgramDrafter
from .oracle import OracleDrafter

__all__ = ["DFlashDrafter", "ModelDrafter", "NgramDrafter", "OracleDrafter", "check_same_vocabulary"]
