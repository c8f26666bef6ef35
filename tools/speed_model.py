#!/usr/bin/env python3
"""Speed-only synthetic Q4_K_M (or Q5_K_M, or Q8_0) GGUF: the shapes, names, metadata and tokenizer of
pyspecla.testing.models' writer for a preset, with valid random quant blocks written directly.

    python tools/speed_model.py --preset 27b --seed 0 --out 27b-speed.gguf [--jobs 16] [--quant q5_k_m|q8_0]
    python tools/make_test_model.py --preset 27b --quant q4_k_m --speed-only --out 27b-speed.gguf

The normal writer draws Gaussian weights and encodes them through the Python quantizer (hours
for 27 G weights). A kernel's speed does not depend on the weight values, so this writer skips
the encoding: each Q4_K / Q5_K / Q6_K / Q8_0 block gets random quant bits and scale bytes and a finite,
small positive f16 super-block scale `d` chosen so the block's values have the standard deviation
the normal writer would give that tensor (activations stay O(1) and a forward gives finite
logits). The F32 tensors (norms ~1, ssm_a < 0, dt bias, conv1d, biases) are the normal writer's
own values. The file records the mode under MODE_KEY; `pyspecla inspect` prints it and
`synthetic_mode` reads it for benchmark rows. Its logits carry no meaning: never use it for
accuracy or acceptance figures.

Type placement is the normal writer's q4_k_m (or q5_k_m, or q8_0) rule (testmodels.tensor_type:
llama-quantize's mixes). Tensors are cut into pieces of about PIECE_BYTES; piece k of tensor `name` draws from
np.random.default_rng([seed, crc32(name), k]), so the bytes depend on the seed only, not on the
number of processes. Worker processes write their pieces in place (os.pwrite) into a file
pre-sized to its final length; memory stays a few pieces per process whatever the model size.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import os
import sys
import time
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyspecla.testing import models as testmodels  # noqa: E402

MODE_KEY = "pyspecla.synthetic.mode"
SPEED_ONLY = "speed-only"
QUANT = "q4_k_m"  # the default mix
QUANTS = ("q4_k_m", "q5_k_m", "q8_0")  # the mixes this writer makes
PIECE_BYTES = 8 << 20  # bytes per work item; part of the file format: changing it changes the bytes

Q = GGMLQuantizationType

# Standard deviation of one block's values in units of its d, for random quant and scale bytes:
# Q4_K: x = d*sc*q - dmin*m with q uniform on 0..15 and sc, m uniform on 0..63 (every byte pattern
#   of the 12 packed scale bytes is valid). With dmin = 7.5 d the mean is 0 and
#   Var(x/d) = Var(sc*q) + 7.5^2 Var(m) = (1333.5*77.5 - 236.25^2) + 56.25*341.25.
# Q6_K: x = d*sc*(q - 32) with q uniform on 0..63 and sc a uniform int8:
#   E[(x/d)^2] = E[sc^2] E[(q-32)^2] = 5461.5 * 341.5 (mean -0.25 d*sc, negligible).
# Q5_K: as Q4_K with q uniform on 0..31 (every qh bit pattern is valid): with dmin = 15.5 d the mean
#   is 0 and Var(x/d) = (1333.5*325.5 - 488.25^2) + 15.5^2*341.25.
# Q8_0: x = d*q with q a uniform int8: E[(x/d)^2] = E[q^2] = 5460 (mean -0.5 d, negligible).
Q4_K_DMIN_OVER_D = 7.5
Q4_K_UNIT_STD = math.sqrt((1333.5 * 77.5 - 236.25**2) + Q4_K_DMIN_OVER_D**2 * 341.25)
Q5_K_DMIN_OVER_D = 15.5
Q5_K_UNIT_STD = math.sqrt((1333.5 * 325.5 - 488.25**2) + Q5_K_DMIN_OVER_D**2 * 341.25)
Q6_K_UNIT_STD = math.sqrt(5461.5 * 341.5)
Q8_0_UNIT_STD = math.sqrt(5460.0)
D_SPREAD = (0.5, 1.5)  # d of each block = the tensor's d times a uniform factor in this range,
D_SPREAD_RMS = math.sqrt((D_SPREAD[0] ** 2 + D_SPREAD[0] * D_SPREAD[1] + D_SPREAD[1] ** 2) / 3)  # whose rms this is
F16_TINY = np.float16(2.0**-24)  # the smallest positive f16: no block gets d = 0


def resolve_preset(preset, arch: str | None = None, **overrides) -> testmodels.Preset:
    """A preset name of `arch` (default qwen35) or a Preset, with Preset-field overrides."""
    if isinstance(preset, str):
        table = testmodels.presets_for(testmodels.ARCH if arch is None else arch)
        if preset not in table:
            raise ValueError(f"unknown {arch or testmodels.ARCH} preset {preset!r}; choose one of {', '.join(table)}")
        preset = table[preset]
    return replace(preset, **overrides) if overrides else preset


def _piece_rows(row_bytes: int) -> int:
    return max(1, PIECE_BYTES // row_bytes)


def _work_items(path: str, plan, types, offsets, seed: int) -> list[tuple]:
    """(path, spec, qtype, file offset, first row, rows, piece index, seed) for every piece."""
    items = []
    for spec in plan:
        qtype = types[spec.name]
        if qtype == Q.F32:
            items.append((path, spec, qtype, offsets[spec.name], 0, 0, 0, seed))
            continue
        rows, n = spec.shape
        row_bytes = testmodels._tensor_nbytes((1, n), qtype)
        step = _piece_rows(row_bytes)
        for k, r0 in enumerate(range(0, rows, step)):
            r1 = min(rows, r0 + step)
            items.append((path, spec, qtype, offsets[spec.name] + r0 * row_bytes, r0, r1 - r0, k, seed))
    # largest first: the pool's last items are small, so the processes finish together
    items.sort(key=lambda it: -(it[5] or 1) * testmodels._tensor_nbytes((1, it[1].shape[-1]), it[2]))
    return items


def random_blocks(qtype: GGMLQuantizationType, n_blocks: int, std: float, rng: np.random.Generator) -> np.ndarray:
    """n_blocks valid random Q4_K, Q5_K, Q6_K or Q8_0 blocks (uint8 (n_blocks, block_bytes)) whose values
    have about standard deviation `std`: random quant and scale bytes, f16 d > 0 (and dmin = 7.5 d
    for Q4_K, 15.5 d for Q5_K)."""
    block_bytes = GGML_QUANT_SIZES[qtype][1]
    words = -(-n_blocks * block_bytes // 8)
    raw = rng.integers(0, 2**64, words, dtype=np.uint64, endpoint=False).view(np.uint8)
    blocks = raw[: n_blocks * block_bytes].reshape(n_blocks, block_bytes)
    if qtype == Q.Q4_K:
        unit, d_at, dmin_over_d = Q4_K_UNIT_STD, 0, Q4_K_DMIN_OVER_D
    elif qtype == Q.Q5_K:
        unit, d_at, dmin_over_d = Q5_K_UNIT_STD, 0, Q5_K_DMIN_OVER_D
    elif qtype == Q.Q6_K:
        unit, d_at, dmin_over_d = Q6_K_UNIT_STD, 208, None  # ql[128], qh[64], scales[16], then d
    elif qtype == Q.Q8_0:
        unit, d_at, dmin_over_d = Q8_0_UNIT_STD, 0, None  # d, then qs[32]
    else:
        raise ValueError(f"speed-only blocks are Q4_K, Q5_K, Q6_K or Q8_0, not {qtype.name}")
    d = (std / (unit * D_SPREAD_RMS)) * rng.uniform(*D_SPREAD, n_blocks)
    d16 = np.maximum(d.astype(np.float16), F16_TINY).view(np.uint16)
    if dmin_over_d is not None:
        # d then dmin: one little-endian 32-bit word per block
        dmin16 = np.maximum((d16.view(np.float16) * np.float16(dmin_over_d)), F16_TINY).view(np.uint16)
        blocks.view(np.uint32)[:, 0] = d16.astype(np.uint32) | (dmin16.astype(np.uint32) << 16)
    else:
        blocks.view(np.uint16)[:, d_at // 2] = d16
    return blocks


def _write_piece(item) -> int:
    path, spec, qtype, offset, r0, rows, k, seed = item
    if qtype == Q.F32:
        # the normal writer's own values: norms ~1, ssm_a < 0, dt bias, conv1d, biases
        data = b"".join(chunk.tobytes() for chunk in testmodels._encoded_chunks(spec, qtype, seed))
    else:
        n = spec.shape[-1]
        rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, zlib.crc32(spec.name.encode()), k])
        data = random_blocks(qtype, rows * (n // GGML_QUANT_SIZES[qtype][0]), spec.params["std"], rng).data
    view = memoryview(data).cast("B")
    nbytes = view.nbytes
    fd = os.open(path, os.O_WRONLY)
    try:
        while view:
            done = os.pwrite(fd, view, offset)
            view, offset = view[done:], offset + done
    finally:
        os.close(fd)
    return nbytes


def write_speed_model(path, preset="27b", seed: int = 0, *, jobs: int | None = None, arch: str | None = None,
                      log=None, quant: str = QUANT, **overrides) -> Path:
    """Write a speed-only file of mix `quant` (q4_k_m, q5_k_m or q8_0; see the module doc) with `jobs`
    processes (default: every core). Same preset, mix and seed → identical bytes. Written to
    PATH.tmp, then renamed. Returns the path."""
    if quant not in QUANTS:
        raise ValueError(f"the speed-only writer makes {' or '.join(QUANTS)}, not {quant!r}")
    p = resolve_preset(preset, arch, **overrides)
    if not any(not r for r in p.layer_is_recurrent):
        raise ValueError("llama.cpp needs at least one full-attention layer (n_layer >= full_attention_interval)")
    path = Path(path)
    plan = testmodels.tensor_plan(p)
    types = testmodels._tensor_types(p, quant)
    for spec in plan:
        block = GGML_QUANT_SIZES[types[spec.name]][0]
        if spec.shape[-1] % block:
            raise ValueError(f"{spec.name}: row length {spec.shape[-1]} is not a multiple of the "
                             f"{types[spec.name].name} block {block}; pick another shape")

    tmp = path.with_name(path.name + ".tmp")
    writer = GGUFWriter(tmp, p.arch)
    try:
        if p.arch in testmodels.ATTENTION_ONLY_ARCHS:
            testmodels._add_metadata_attention_only(writer, p, quant)
        else:
            testmodels._add_metadata(writer, p, quant)
        testmodels._add_tokenizer(writer, p.n_vocab, pre="qwen35" if p.arch == testmodels.ARCH else "qwen2")
        writer.add_string(MODE_KEY, SPEED_ONLY)
        offsets, at, payload = {}, 0, 0
        for spec in plan:
            qtype = types[spec.name]
            nbytes = testmodels._tensor_nbytes(spec.shape, qtype)
            byte_shape = (*spec.shape[:-1], nbytes // max(1, int(np.prod(spec.shape[:-1]))))
            writer.add_tensor_info(spec.name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=qtype)
            offsets[spec.name] = at
            at += GGUFWriter.ggml_pad(nbytes, writer.data_alignment)
            payload += nbytes
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        data_start = GGUFWriter.ggml_pad(writer.fout[0].tell(), writer.data_alignment)
    finally:
        writer.close()
    os.truncate(tmp, data_start + at)  # the padding between tensors stays zero
    offsets = {name: data_start + off for name, off in offsets.items()}

    items = _work_items(str(tmp), plan, types, offsets, seed)
    jobs = jobs or os.cpu_count() or 1
    written, start, shown = 0, time.perf_counter(), 0.0
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        for n in pool.imap_unordered(_write_piece, items):
            written += n
            now = time.perf_counter() - start
            if log is not None and now - shown >= 5.0:
                shown = now
                log(f"{written / 1e9:.1f} / {payload / 1e9:.1f} GB of tensor data, {now:.0f} s")
    if written != payload:
        raise AssertionError(f"{tmp}: wrote {written} bytes of tensor data, planned {payload}")
    tmp.replace(path)
    return path


def synthetic_mode(metadata) -> str | None:
    """Which writer made a file, for benchmark rows: 'speed-only' (this module: random blocks, the
    logits mean nothing), 'values' (pyspecla.testing.models' seeded weights), None (not synthetic)."""
    mode = metadata.get(MODE_KEY)
    if mode is not None:
        return str(mode)
    name = metadata.get("general.name")
    return "values" if isinstance(name, str) and name.startswith("pyspecla-test-") else None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="path of the .gguf to write")
    parser.add_argument("--preset", default="27b", help="a qwen35 preset of pyspecla.testing.models (default 27b)")
    parser.add_argument("--arch", choices=testmodels.ARCHS, default=None, help="preset table (default qwen35)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--n-layer", type=int, default=None, help="override the preset's layer count")
    parser.add_argument("--jobs", type=int, default=None, help="worker processes (default: every core)")
    parser.add_argument("--quant", choices=QUANTS, default=QUANT, help=f"tensor type mix (default {QUANT})")
    args = parser.parse_args(argv)
    return run(args.out, args.preset, args.seed, args.arch, args.n_layer, args.jobs, args.quant)


def run(out: Path, preset: str, seed: int, arch: str | None, n_layer: int | None, jobs: int | None,
        quant: str = QUANT) -> int:
    """The command line's work (shared with tools/make_test_model.py --speed-only): write, then print
    size, time and throughput; a bad argument is a message naming it and exit status 2."""
    if jobs is not None and jobs < 1:
        print(f"speed_model: --jobs must be >= 1, got {jobs}", file=sys.stderr)
        return 2
    overrides = {} if n_layer is None else {"n_layer": n_layer}
    start = time.perf_counter()
    try:
        path = write_speed_model(out, preset, seed, jobs=jobs, arch=arch, quant=quant,
                                 log=lambda s: print(s, file=sys.stderr, flush=True), **overrides)
    except (ValueError, OSError) as exc:
        print(f"speed_model: {out}: {exc}", file=sys.stderr)
        return 2
    seconds = time.perf_counter() - start
    size = path.stat().st_size
    jobs = jobs or os.cpu_count() or 1
    print(f"{path}: {arch or testmodels.ARCH} {preset} {quant} {SPEED_ONLY} seed {seed}, {size / 1e9:.2f} GB in "
          f"{seconds:.1f} s ({size / 1e6 / seconds:.0f} MB/s, {jobs} processes, "
          f"{size / 1e6 / seconds / jobs:.0f} MB/s per process)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
