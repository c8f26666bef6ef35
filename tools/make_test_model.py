#!/usr/bin/env python3
"""Write a deterministic synthetic qwen35 GGUF (see pyspecla/testmodels.py).

    python tools/make_test_model.py --preset tiny --quant q4_k_m --seed 0 --out tiny.gguf
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyspecla.testmodels import PRESETS, QUANTS, write_test_model  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output", type=Path, nargs="?", default=None, help="path of the .gguf to write (or --out)")
    parser.add_argument("--out", type=Path, default=None, help="path of the .gguf to write")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny", help="model shape (default tiny)")
    parser.add_argument("--quant", choices=QUANTS, default="f32", help="tensor type mix (default f32)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--n-layer", type=int, default=None, help="override the preset's layer count")
    args = parser.parse_args(argv)
    if (args.output is None) == (args.out is None):
        parser.error("give the output path once: --out FILE.gguf (or as the positional argument)")
    args.output = args.output or args.out

    overrides = {} if args.n_layer is None else {"n_layer": args.n_layer}
    start = time.perf_counter()
    try:
        path = write_test_model(args.output, args.preset, args.quant, args.seed, **overrides)
    except ValueError as exc:
        print(f"make_test_model: {exc}", file=sys.stderr)
        return 2
    size = path.stat().st_size
    print(f"{path}: {args.preset} {args.quant} seed {args.seed}, {size / 2**20:.1f} MiB "
          f"in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
