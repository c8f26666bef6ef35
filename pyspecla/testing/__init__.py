"""Synthetic test models, for the tests, the tools and `pyspecla demo` only; nothing the runtime
imports (tests/test_layout.py checks that):

  models   qwen35 / qwen2 / qwen3 target GGUFs at any shape and quant (write_test_model)
  drafts   DFlash draft GGUFs that fit such a target (write_test_draft)
  quant    the numpy GGML block encoder the writers quantize with
  vocab    the synthetic byte-level BPE vocabulary and chat template the writers embed
"""
