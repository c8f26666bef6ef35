"""Static instruction counts of a kernel's loops, from `cuobjdump -sass` output: each loop is a
backward branch and the instructions from its target to it. For a matmul kernel the per-block loop
is the innermost one that holds the MMAs or dot products (--holding), and its count over the bytes a
warp streams per block is the instruction cost per weight byte (docs/cuda-matmul.md, "Instructions
per weight byte").

    nvcc -O3 -std=c++20 -arch=sm_90 -cubin -Inative/backends/cuda -Inative/common -Inative/include \\
        native/backends/cuda/matmul.cu -o matmul.cubin
    cuobjdump -sass matmul.cubin | python3 tools/sass_loops.py mm_tile_bulk_kernelILi12ELi3E --holding IMMA

cuobjdump and nvdisasm (which it runs) come with a full CUDA toolkit or from the registry's
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels. FUNCTION is a substring of the mangled name;
the first function that contains it is read."""
from __future__ import annotations

import argparse
import re
import sys
from collections import Counter

INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
BRANCH_TARGET = re.compile(r"0x([0-9a-f]+)")


def function_instructions(sass: str, name: str) -> list[tuple[int, str, str]]:
    """(address, opcode, operands) of each instruction of the first function whose mangled name
    contains `name`; [] when there is none."""
    out: list[tuple[int, str, str]] = []
    inside = False
    for line in sass.splitlines():
        if "Function :" in line:
            if inside:
                break
            inside = name in line.split("Function :", 1)[1]
            continue
        if inside:
            m = INSTRUCTION.search(line)
            if m:
                out.append((int(m.group(1), 16), m.group(2), m.group(3)))
    return out


def loops(instructions: list[tuple[int, str, str]]) -> list[tuple[int, int]]:
    """(first, last) instruction indices of every backward branch's loop, innermost (shortest) first."""
    index = {addr: i for i, (addr, _, _) in enumerate(instructions)}
    found = []
    for i, (addr, op, operands) in enumerate(instructions):
        if op.startswith("BRA"):
            m = BRANCH_TARGET.search(operands)
            if m and int(m.group(1), 16) <= addr and int(m.group(1), 16) in index:
                found.append((index[int(m.group(1), 16)], i))
    return sorted(found, key=lambda span: span[1] - span[0])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("function", help="a substring of the kernel's mangled name")
    parser.add_argument("--holding", default=None,
                        help="report the innermost loop with an opcode starting so (IMMA, IDP, IGMMA), else every loop")
    parser.add_argument("--sass", default="-", help="cuobjdump -sass output (default: standard input)")
    args = parser.parse_args(argv)
    sass = sys.stdin.read() if args.sass == "-" else open(args.sass).read()
    instructions = function_instructions(sass, args.function)
    if not instructions:
        print(f"sass_loops: no function containing '{args.function}' in the SASS", file=sys.stderr)
        return 2
    spans = loops(instructions)
    if args.holding:
        spans = [s for s in spans if any(op.startswith(args.holding) for _, op, _ in instructions[s[0]:s[1] + 1])][:1]
        if not spans:
            print(f"sass_loops: no loop of '{args.function}' holds an instruction starting {args.holding}", file=sys.stderr)
            return 2
    for first, last in spans:
        mix = Counter(op for _, op, _ in instructions[first:last + 1])
        print(f"loop [{first}, {last}]: {last - first + 1} instructions; "
              + ", ".join(f"{op} {n}" for op, n in mix.most_common()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
