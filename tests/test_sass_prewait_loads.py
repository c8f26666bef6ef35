"""tools/sass_prewait_loads.py on hand-written `cuobjdump -sass` text: per kernel, the global loads
before the grid dependency wait (ACQBULK) by kind, exit 1 when a plain load precedes the wait, 2 when
no kernel waits."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parent.parent / "tools" / "sass_prewait_loads.py"

GOOD = """
        Function : _Z9mm_kernelILi12ELi1EEv14mm_launch_args
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDG.E.128.CONSTANT R4, desc[UR6][R2.64] ;
        /*0020*/               @P0 LDGSTS.E.BYPASS.128 [R108], desc[UR6][R8.64] ;
        /*0028*/                   UBLKCP.S.G [UR36], [UR16], UR18 ;
        /*0030*/                   ACQBULK ;
        /*0040*/                   LDG.E.128 R8, desc[UR6][R12.64] ;
        /*0050*/                   EXIT ;
        Function : _Z9no_wait_kernelv
        /*0000*/                   LDG.E R4, desc[UR6][R2.64] ;
        /*0010*/                   EXIT ;
"""


def run(sass, *args):
    return subprocess.run([sys.executable, str(TOOL), *args], input=sass, capture_output=True, text=True, timeout=60)


def test_weight_loads_and_copies_before_the_wait_pass():
    proc = run(GOOD, "--list")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    # the kernel without a wait is not reported; the plain load after the wait is not counted
    assert lines[0] == ("_Z9mm_kernelILi12ELi1EEv14mm_launch_args: 3 loads before the wait "
                        "(async copy 1, bulk copy 1, weight (non-coherent) 1)")
    assert lines[1].strip() == "LDG.E.128.CONSTANT R4, desc[UR6][R2.64]"


def test_a_plain_load_before_the_wait_fails():
    bad = GOOD.replace("/*0010*/                   LDG.E.128.CONSTANT R4", "/*0010*/                   LDG.E.128 R4")
    proc = run(bad)
    assert proc.returncode == 1
    assert "mm_kernelILi12ELi1E" in proc.stdout and "PLAIN 1" in proc.stdout and "<- reads before the wait" in proc.stdout


def test_no_waiting_kernel_is_an_error():
    proc = run("        Function : _Z1fv\n        /*0000*/                   EXIT ;\n")
    assert proc.returncode == 2 and "no kernel with a grid dependency wait" in proc.stderr
