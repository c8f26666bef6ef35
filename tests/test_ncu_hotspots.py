"""tools/device/ncu_hotspots.py's reading of Nsight Compute's source page (no GPU, no ncu): the
instructions with the most warp samples come out in address order after their predecessors, and a
page it cannot read is named, not guessed at."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools" / "device"))

import ncu_hotspots  # noqa: E402

PAGE = '''"Kernel Name","mm_tile_bulk_kernel"
"# Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","Instructions Executed"
"0x0","MOV R1, c[0x0][0x28]","1","1","520"
"0x10","LDS.64 R4, [R2]","5","4","9000"
"0x20","IMMA.16832.S8.S8 R8, R12, R4, R8","2","1","9000"
"0x30","BAR.SYNC.DEFER_BLOCKING 0x0","1,200","1,100","9000"
"0x40","IMAD R9, R8, R3, R9","40","30","9000"
"0x50","EXIT","0","0","520"
'''


def test_the_top_instructions_in_address_order_with_context():
    lines = ncu_hotspots.hotspot_lines(PAGE, top=2, context=1)
    assert lines[0].startswith("columns: # Address | Source")
    assert "6 SASS instructions, 1248 warp samples" in lines[1]
    body = [line for line in lines[2:] if line.strip() != "..."]
    # the barrier (1200 samples, 96.2 %) and the IMAD (40) are the top two; the IMMA is the
    # barrier's predecessor, and the barrier is also the IMAD's, so it is printed once
    assert [line[2:].split()[0] for line in body] == ["0x20", "0x30", "0x40"]
    assert body[1].startswith("*") and body[2].startswith("*") and not body[0].startswith("*")
    assert "96.2%" in body[1] and "BAR.SYNC" in body[1] and " 1100 " in body[1]


def test_a_page_without_the_columns_is_named():
    assert ncu_hotspots.hotspot_lines('"a","b"\n"1","2"\n', 5, 1)[0].startswith("ncu_hotspots: the source page has no")
    page = '"# Address","Source","Instructions Executed"\n"0x0","EXIT","1"\n'
    assert ncu_hotspots.hotspot_lines(page, 5, 1)[0].startswith("ncu_hotspots: no warp stall sampling column")
