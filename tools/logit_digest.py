"""Digest of the logits a build computes on seeded synthetic models, to show that a refactor left
every bit as it was: run it at two commits (each with its own library) and compare the lines.

    SPECLA_LIBRARY=build/dev/native/libspecla.so python tools/logit_digest.py --out digest.txt

Each line names a model, a mode and the SHA-256 of the float32 logits (and argmax ids) it gave:
prefill, token-by-token decode, a verified tree with a side-branch accept and the next verify
(SpecLA's deferred fold), for qwen35 F32 / Q4_K_M and qwen2 / qwen3 Q8_0, on every CPU kernel set
this machine has. The model files are written once into --dir (default a temporary folder)."""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def _writer():
    try:
        from pyspecla.testing.models import write_test_model  # the package layout after issue 12
    except ImportError:
        from pyspecla.testmodels import write_test_model  # (before the package moved)
    return write_test_model


def _digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


MODELS = [("qwen35", "f32"), ("qwen35", "q4_k_m"), ("qwen2", "q8_0"), ("qwen3", "q8_0")]
TOKENS = [3, 17, 5, 99, 42, 7, 120, 64, 11, 2, 250, 31]
TREE_TOKENS = [9, 14, 15, 23, 8, 40, 41]
TREE_PARENTS = [-1, 0, 0, 1, 2, 4, 4]
SIDE_PATH = [0, 2, 4, 6]  # through the second child of the root


def lines_for(path: str, kernels: str) -> list[str]:
    from pyspecla import Model

    out = []
    model = Model.load(path, cpu_kernels=kernels)
    name = os.path.basename(path)
    out.append(f"{name} {kernels} prefill {_digest(model.logits(TOKENS))}")
    ctx = model.new_context(n_ctx=64, max_batch=16, max_tree_nodes=8)
    steps = [ctx.eval([t]) for t in TOKENS]
    out.append(f"{name} {kernels} decode {_digest(*steps)}")
    ctx.reset()
    ctx.eval(TOKENS[:6], logits_all=True)
    argmax, logits = ctx.verify_tree(TREE_TOKENS, TREE_PARENTS, want_logits=True)
    ctx.accept(SIDE_PATH)
    argmax2, logits2 = ctx.verify_tree([TREE_TOKENS[6], 5, 6], [-1, 0, 1], want_logits=True)
    out.append(f"{name} {kernels} tree {_digest(argmax, logits, argmax2, logits2)}")
    ctx.close()
    model.close()
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=None, help="where the synthetic models are written (default: a temp dir)")
    parser.add_argument("--kernels", default="scalar,avx2,avx512", help="CPU kernel sets to run (those present)")
    parser.add_argument("--out", default="-", help="digest file ('-' = stdout)")
    args = parser.parse_args(argv)
    from pyspecla import _native

    best = _native.cpu_best_kernels()
    present = {"scalar": True, "avx2": best >= _native.CPU_AVX2, "avx512": best >= _native.CPU_AVX512}
    folder = args.dir or tempfile.mkdtemp(prefix="digest-")
    write = _writer()
    lines = []
    for arch, quant in MODELS:
        path = os.path.join(folder, f"tiny-{arch}-{quant}.gguf")
        if not os.path.exists(path):
            write(path, preset="tiny", quant=quant, seed=0, arch=arch)
        for kernels in args.kernels.split(","):
            if present.get(kernels):
                lines.extend(lines_for(path, kernels))
    text = "\n".join(lines) + "\n"
    if args.out == "-":
        sys.stdout.write(text)
    else:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
