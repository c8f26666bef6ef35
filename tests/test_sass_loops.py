"""tools/sass_loops.py on hand-written `cuobjdump -sass` text: it finds loops by their backward
branches, reports the innermost one holding a given opcode with its instruction mix, and names a
missing function or loop with exit status 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "sass_loops.py"

SASS = """
        Function : _Z6otherv
        /*0000*/                   EXIT ;
        Function : _Z9mm_kernelILi12ELi1EEv14mm_launch_args
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDG.E.128 R4, [R2.64] ;
        /*0020*/                   LOP3.LUT R8, R4, 0xf0f0f0f, RZ, 0xc0, !PT ;
        /*0030*/                   IDP.4A.S8.S8 R9, R8, R5, R9 ;
        /*0040*/                   LOP3.LUT R8, R6, 0xf0f0f0f, RZ, 0xc0, !PT ;
        /*0050*/              @!P0 BRA 0x20 ;
        /*0060*/                   IADD3 R3, R3, 0x1, RZ ;
        /*0070*/               @P1 BRA 0x10 ;
        /*0080*/                   BRA 0x80 ;
        /*0090*/                   EXIT ;
"""


def run(*args, sass=SASS):
    return subprocess.run([sys.executable, str(TOOL), *args], input=sass, capture_output=True, text=True, timeout=60)


def test_the_innermost_loop_holding_the_dot_products():
    proc = run("mm_kernelILi12ELi1E", "--holding", "IDP")
    assert proc.returncode == 0, proc.stderr
    # instructions 2..5 (0x20..0x50): two LOP3, one IDP and the branch back
    assert proc.stdout.strip() == "loop [2, 5]: 4 instructions; LOP3.LUT 2, IDP.4A.S8.S8 1, BRA 1"


def test_every_loop_innermost_first():
    proc = run("mm_kernelILi12ELi1E")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    # the self-branch at 0x80 is a one-instruction loop; then 0x20..0x50; then 0x10..0x70
    assert [line.split(":")[0] for line in lines] == ["loop [8, 8]", "loop [2, 5]", "loop [1, 7]"]


def test_a_missing_function_or_loop_is_named():
    proc = run("no_such_kernel")
    assert proc.returncode == 2 and "no function containing 'no_such_kernel'" in proc.stderr
    proc = run("mm_kernelILi12ELi1E", "--holding", "IMMA")
    assert proc.returncode == 2 and "no loop of 'mm_kernelILi12ELi1E' holds an instruction starting IMMA" in proc.stderr
