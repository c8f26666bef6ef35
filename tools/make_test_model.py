#!/usr/bin/env python3
"""Write a deterministic synthetic qwen35 (or qwen2) GGUF, or a DFlash draft for one (see pyspecla/testing/models.py).

    python tools/make_test_model.py --preset tiny --quant q4_k_m --seed 0 --out tiny.gguf
    python tools/make_test_model.py --arch qwen2 --preset tiny --quant q4_k_m --out tiny-qwen2.gguf
    python tools/make_test_model.py --kind dflash-draft --target tiny.gguf --out tiny-draft.gguf
    python tools/make_test_model.py --preset 27b --quant q4_k_m --speed-only --out 27b-speed.gguf
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyspecla.errors import SpeclaError  # noqa: E402
from pyspecla.testing.drafts import DRAFT_ARCHS, write_test_draft  # noqa: E402
from pyspecla.testing.models import ARCHS, QUANTS, presets_for, write_test_model  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output", type=Path, nargs="?", default=None, help="path of the .gguf to write (or --out)")
    parser.add_argument("--out", type=Path, default=None, help="path of the .gguf to write")
    preset_names = sorted({name for arch in ARCHS for name in presets_for(arch)})
    parser.add_argument("--preset", choices=preset_names, default="tiny",
                        help="model shape (default tiny); "
                        + "; ".join(f"{arch}: {', '.join(presets_for(arch))}" for arch in ARCHS))
    parser.add_argument("--quant", choices=QUANTS, default="f32", help="tensor type mix (default f32)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--n-layer", type=int, default=None,
                        help="override the preset's layer count (dflash-draft: draft layers, default 2)")
    parser.add_argument("--kind", choices=("target", "dflash-draft"), default="target",
                        help="a qwen35 target (default) or a DFlash draft for --target")
    parser.add_argument("--target", type=Path, default=None,
                        help="dflash-draft: the qwen35 GGUF the draft is made for (required)")
    parser.add_argument("--arch", choices=(*ARCHS, *DRAFT_ARCHS), default=None,
                        help=f"target: the architecture, {' or '.join(ARCHS)} (default qwen35); dflash-draft: "
                        f"which spelling of the format to write, {', '.join(DRAFT_ARCHS)} "
                        "(default qwen35-dflash-draft)")
    parser.add_argument("--speed-only", action="store_true",
                        help="q4_k_m targets: valid random quant blocks written directly, in parallel "
                        "(tools/speed_model.py; for speed measurements only, the logits mean nothing)")
    parser.add_argument("--jobs", type=int, default=None,
                        help="--speed-only: worker processes (default: every core)")
    args = parser.parse_args(argv)
    if (args.output is None) == (args.out is None):
        parser.error("give the output path once: --out FILE.gguf (or as the positional argument)")
    args.output = args.output or args.out
    if args.kind == "dflash-draft" and args.target is None:
        parser.error("--kind dflash-draft needs --target FILE.gguf (the qwen35 model it drafts for)")
    if args.kind == "target" and args.target is not None:
        parser.error("--target only goes with --kind dflash-draft")
    if args.kind == "target":
        args.arch = args.arch or ARCHS[0]
        if args.arch not in ARCHS:
            parser.error(f"--arch {args.arch} is a draft spelling; a target is one of {', '.join(ARCHS)}")
        if args.preset not in presets_for(args.arch):
            parser.error(f"--preset {args.preset} is not a {args.arch} preset "
                         f"(choose one of {', '.join(presets_for(args.arch))})")
    else:
        args.arch = args.arch or DRAFT_ARCHS[0]
        if args.arch not in DRAFT_ARCHS:
            parser.error(f"--arch {args.arch} is a target architecture; a draft is one of {', '.join(DRAFT_ARCHS)}")

    if args.jobs is not None and not args.speed_only:
        parser.error("--jobs only goes with --speed-only")
    if args.speed_only:
        import speed_model

        mixes = " or ".join(speed_model.QUANTS)
        if args.kind != "target" or args.quant not in speed_model.QUANTS:
            parser.error(f"--speed-only writes {mixes} targets: give --quant {mixes} (and no --kind dflash-draft)")
        return speed_model.run(args.output, args.preset, args.seed, args.arch, args.n_layer, args.jobs, args.quant)

    start = time.perf_counter()
    try:
        if args.kind == "dflash-draft":
            n_layer = 2 if args.n_layer is None else args.n_layer
            path = write_test_draft(args.output, args.target, args.seed, args.quant, n_layer, args.arch)
            what = f"DFlash draft ({args.arch}, {n_layer} layers) for {args.target}"
        else:
            overrides = {} if args.n_layer is None else {"n_layer": args.n_layer}
            path = write_test_model(args.output, args.preset, args.quant, args.seed, arch=args.arch, **overrides)
            what = f"{args.arch} {args.preset}"
    except (ValueError, SpeclaError) as exc:
        print(f"make_test_model: {exc}", file=sys.stderr)
        return 2
    size = path.stat().st_size
    print(f"{path}: {what} {args.quant} seed {args.seed}, {size / 2**20:.1f} MiB "
          f"in {time.perf_counter() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
