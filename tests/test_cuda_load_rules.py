"""tools/check_load_rules.py: in the CUDA matmul sources, non-coherent loads (__ldg, ld.global.nc) read
the weights only, never the previous kernel's output, which a programmatic dependent launch could
then read before the grid dependency wait (the tool's docstring says how that happened)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "check_load_rules.py"
CUDA = ROOT / "native" / "backends" / "cuda"


def run(*files):
    return subprocess.run([sys.executable, str(TOOL), *map(str, files)], capture_output=True, text=True, timeout=60)


def test_the_sources_keep_the_rule():
    proc = run()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "files keep the rule" in proc.stdout


def test_an_activation_read_through_a_weight_loader_is_named(tmp_path):
    src = (CUDA / "matmul_mma.cuh").read_text()
    assert "mm_ld_act_u32(act.codes" in src
    bad = tmp_path / "matmul_mma.cuh"
    bad.write_text(src.replace("mm_ld_act_u32(act.codes", "mm_ld_u32(act.codes", 1))
    proc = run(bad)
    assert proc.returncode == 1
    line = next(i + 1 for i, text in enumerate(bad.read_text().splitlines()) if "mm_ld_u32(act.codes" in text)
    assert f"matmul_mma.cuh:{line}: mm_ld_u32() reads 'act.'" in proc.stdout


def test_a_non_coherent_load_outside_the_weight_loaders_is_named(tmp_path):
    src = (CUDA / "matmul_blocks.h").read_text()
    marker = "MM_HD uint32_t mm_ld_act_u32(const void *p) {\n#if MM_DEVICE_CODE\n    return *(const uint32_t *)p;"
    assert marker in src
    bad = tmp_path / "matmul_blocks.h"
    bad.write_text(src.replace(marker, marker.replace("*(const uint32_t *)p", "__ldg((const unsigned *)p)"), 1))
    proc = run(bad)
    assert proc.returncode == 1
    assert "a non-coherent load in mm_ld_act_u32(), which is not a weight loader" in proc.stdout


def test_comments_about_ldg_are_not_code(tmp_path):
    f = tmp_path / "matmul_note.cuh"
    f.write_text("/* never __ldg( here */\n// ld.global.nc neither\nMM_HD int f(void) { return 0; }\n")
    proc = run(f)
    assert proc.returncode == 0, proc.stdout


def test_an_unreadable_file_is_named(tmp_path):
    proc = run(tmp_path / "missing.cuh")
    assert proc.returncode == 2 and "missing.cuh" in proc.stderr
