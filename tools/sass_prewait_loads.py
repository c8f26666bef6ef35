"""The global loads each kernel issues before its grid dependency wait, from `cuobjdump -sass`
output. Under programmatic dependent launch (native/backends/cuda/launch.h) griddepcontrol.wait
(SASS ACQBULK) is where the previous kernel's writes become visible: a matmul may issue its weight
loads before it, nothing else. The weights are the only data read with non-coherent loads
(LDG...CONSTANT; tools/check_load_rules.py keeps the sources so) and asynchronous copies (LDGSTS)
and bulk copies (UBLKCP, the staged tensor-core kernel's cp.async.bulk) before the wait carry
weights too, so a plain LDG before ACQBULK reads something a previous kernel may still be writing,
and is reported.

    nvcc -O3 -std=c++20 -arch=sm_90 -cubin -Inative/backends/cuda -Inative/common -Inative/include \\
        native/backends/cuda/matmul.cu -o matmul.cubin
    cuobjdump -sass matmul.cubin | python3 tools/sass_prewait_loads.py [--list]

Prints one line per kernel that waits (its pre-wait loads by kind; --list adds each load) and exits 1
when a kernel issues a plain (coherent) global load before its wait, 0 otherwise, 2 when the input
holds no kernel that waits. cuobjdump comes with a full CUDA toolkit or from the registry's
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels. What this cannot see: a non-coherent load of
activations (an __ldg in the wrong place) looks like a weight load here, which is why the source
rule exists."""
from __future__ import annotations

import argparse
import re
import sys
from collections import Counter

FUNCTION = re.compile(r"Function : (\S+)")
LOAD = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P[T0-9]+\s+)?((?:LDGSTS|LDG|UBLKCP)[A-Z0-9_.]*)\s*([^;]*);")


def prewait_loads(sass: str) -> dict[str, list[tuple[str, str]]]:
    """{mangled kernel name: [(opcode, operands) of each global load before its first ACQBULK]} for
    every kernel that has an ACQBULK."""
    out: dict[str, list[tuple[str, str]]] = {}
    name, loads, waited = None, [], False
    for line in sass.splitlines() + ["Function : <end>"]:
        m = FUNCTION.search(line)
        if m:
            if name is not None and waited:
                out[name] = loads
            name, loads, waited = m.group(1), [], False
            continue
        if name is None or waited:
            continue
        if re.search(r"\bACQBULK\b", line):
            waited = True
            continue
        lm = LOAD.search(line)
        if lm:
            loads.append((lm.group(2), lm.group(3).strip()))
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="print every pre-wait load")
    args = ap.parse_args(argv)
    kernels = prewait_loads(sys.stdin.read())
    if not kernels:
        print("sass_prewait_loads: no kernel with a grid dependency wait (ACQBULK) in the input", file=sys.stderr)
        return 2
    plain = 0
    for name, loads in kernels.items():
        kinds = Counter("weight (non-coherent)" if "CONSTANT" in op else "async copy" if op.startswith("LDGSTS")
                        else "bulk copy" if op.startswith("UBLKCP") else "PLAIN" for op, _ in loads)
        bad = kinds.get("PLAIN", 0)
        plain += bad
        summary = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) or "none"
        print(f"{name}: {len(loads)} loads before the wait ({summary}){'  <- reads before the wait' if bad else ''}")
        if args.list:
            for op, operands in loads:
                print(f"    {op} {operands}")
    return 1 if plain else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
