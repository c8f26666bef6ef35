#!/usr/bin/env python3
"""How evenly a 23-token launch of the staged tensor-core matmul (matmul_tile.cuh) spreads over the
H200's 132 SMs, for the 27B shape's Q4_K / Q6_K launches, with 1, 2 (today's kernel) or 3 row
groups a CTA. A CPU estimate, no GPU: for every launch it prints the most row-group chunks any SM
holds, ceil(CTAs / 132) x row groups a CTA, over the even share (row groups x chunks summed over
the launch's matrices) / 132, assuming every CTA resident at once. The chunk counts follow
mm_plan_for (native/backends/cuda/matmul_blocks.h: about 1024 units a matrix for Q4_K, 960 for
Q6_K, a chunk never splitting a 256-block); a launch is one call's matrices of one weight type, or
its Q4_K and Q6_K matrices together (matmul.cu's pair launch, the default), as
layer_gated_deltanet.c and layer_attention.c group them.

    python3 tools/tile_balance.py
"""

from __future__ import annotations

import math

SMS = 132
TARGET = {"Q4_K": 1024, "Q6_K": 960}
E, FF, HEADS, KV_HEADS, D = 5120, 17408, 24, 4, 256
GDN_QKV, GDN_Z, GDN_HEADS = 2 * 16 * 128 + 48 * 128, 48 * 128, 48


def plan(qtype: str, ne0: int, ne1: int) -> tuple[int, int]:
    """(row groups, chunks) as mm_plan_for cuts a matrix of ne1 rows of ne0 elements"""
    n_blocks, row_groups = ne0 // 256, math.ceil(ne1 / 32)
    c = max(1, min(math.ceil(TARGET[qtype] / row_groups), n_blocks))
    chunk_blocks = math.ceil(n_blocks / c)
    return row_groups, math.ceil(n_blocks / chunk_blocks)


# one kernel each: (what, [(type, ne0, ne1), ...]); the use_more_bits layers' input groups mix
# Q6_K (attn_v, GDN qkv) with Q4_K and take one pair launch
LAUNCHES = [
    ("ffn_gate + ffn_up", [("Q4_K", E, FF), ("Q4_K", E, FF)]),
    ("ffn_down", [("Q4_K", FF, E)]),
    ("ffn_down", [("Q6_K", FF, E)]),
    ("attn_q + attn_k + attn_v", [("Q4_K", E, HEADS * 2 * D), ("Q4_K", E, KV_HEADS * D), ("Q4_K", E, KV_HEADS * D)]),
    ("attn_q + attn_k + attn_v", [("Q4_K", E, HEADS * 2 * D), ("Q4_K", E, KV_HEADS * D), ("Q6_K", E, KV_HEADS * D)]),
    ("attn_output", [("Q4_K", HEADS * D, E)]),
    ("GDN qkv + z + beta + alpha", [("Q4_K", E, GDN_QKV), ("Q4_K", E, GDN_Z), ("Q4_K", E, GDN_HEADS),
                                    ("Q4_K", E, GDN_HEADS)]),
    ("GDN qkv + z + beta + alpha", [("Q6_K", E, GDN_QKV), ("Q4_K", E, GDN_Z), ("Q4_K", E, GDN_HEADS),
                                          ("Q4_K", E, GDN_HEADS)]),
    ("ssm_out", [("Q4_K", GDN_Z, E)]),
]


def balance(mats: list[tuple[str, int, int]], per_cta: int) -> float:
    plans = [plan(*m) for m in mats]
    ctas = sum(math.ceil(rg / per_cta) * chunks for rg, chunks in plans)
    even = sum(rg * chunks for rg, chunks in plans) / SMS
    return math.ceil(ctas / SMS) * per_cta / even


def main() -> int:
    print(f"{'launch (27B, 23 tokens)':40s} {'row groups x chunks':28s} {'1 a CTA':>8s} {'2 a CTA':>8s} {'3 a CTA':>8s}")
    for what, mats in LAUNCHES:
        shape = " + ".join(f"{rg}x{c}" for rg, c in (plan(*m) for m in mats))
        figures = " ".join(f"{balance(mats, r):8.2f}" for r in (1, 2, 3))
        types = "+".join(sorted({m[0] for m in mats}))
        print(f"{what + ', ' + types:40s} {shape:28s} {figures}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
