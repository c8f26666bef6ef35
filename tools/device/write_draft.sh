#!/usr/bin/env bash
# Writes the synthetic DFlash draft of the 27B shape (5 layers, 32 heads, 8 KV heads, head_dim 128,
# F16: the published draft's shape) for the speed-only target $MODEL under $HOME/models, unless it is
# there, and prints its path (about 30 s). Used by the device scripts that measure the draft's cost.
set -euo pipefail
: "${MODEL:?the target GGUF (run_gpu.sh sets MODEL)}"
cd "$(dirname "$0")/../.."
draft=$HOME/models/27b-dflash-draft-L5-h32-kv8-d128-f16.gguf
if [ ! -f "$draft" ]; then
  python3 -c "from pyspecla.testing.drafts import write_test_draft; write_test_draft('$draft.part', '$MODEL', seed=1, quant='f16', n_layer=5, n_head=32, n_head_kv=8, head_dim=128)" >&2
  mv "$draft.part" "$draft"
fi
echo "$draft"
