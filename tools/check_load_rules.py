#!/usr/bin/env python3
"""The CUDA matmul's load rule, checked on its sources: read-only (non-coherent) loads -- __ldg and
ld.global.nc -- read the weights only, never what the previous kernel wrote.

Why: every matmul kernel is launched with programmatic dependent launch (native/backends/cuda/launch.h)
and issues its first weight loads before griddepcontrol.wait. The compiler treats a non-coherent load
as an invariant load and may issue it before that wait; for the weights that is the point, for the
activations it reads the previous call's values (branch f16-ring did: cuobjdump showed an activation
LDG.CONSTANT ahead of ACQBULK, and the GPU check caught it). Activations therefore go through plain
loads (mm_load16_act, mm_ld_act_u32), which no compiler moves across the wait's memory clobber.

The check: (1) __ldg / ld.global.nc appear only in the bodies of the weight-load helpers named in
WEIGHT_LOADERS; (2) no call of those helpers names an activation buffer (act., sa., codes, bsums,
split, scales, minops, inv_scale) in its arguments. Exit status 1 with each violation named
(file:line), 0 when the sources keep the rule.

    python tools/check_load_rules.py [FILE ...]     (default: native/backends/cuda/matmul*)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WEIGHT_LOADERS = ("mm_load", "mm_ld_stream_u32", "mm_ld_stream_16", "mm_ld_stream_8", "mm_ld_u32", "mm_ld_u16",
                  "mm_load16")
NON_COHERENT = re.compile(r"__ldg\s*\(|ld\.global\.nc")
ACTIVATION_WORDS = re.compile(r"\b(act|sa)\s*\.|\b(codes|bsums|split|scales|minops|inv_scale)\b")
# a function definition starts at column 0 (the sources' style) and names itself before its '('
DEFINITION = re.compile(r"^(?:template\s*<[^>]*>\s*)?(?:MM_HD|static|__device__|__global__|inline|[A-Za-z_][\w:<>, *&]*)"
                        r"[^;{]*?\b(\w+)\s*\(")


def _strip_comments(text: str) -> str:
    """Comments blanked (line count kept), so that prose about __ldg is not code."""
    text = re.sub(r"/\*.*?\*/", lambda m: re.sub(r"[^\n]", " ", m.group(0)), text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def _enclosing_function(lines: list[str], index: int) -> str | None:
    for i in range(index, -1, -1):
        line = lines[i]
        if line[:1] in ("", " ", "\t", "}", "#", "{"):
            continue
        m = DEFINITION.match(line)
        if m:
            return m.group(1)
    return None


def _call_arguments(text: str, start: int) -> str:
    """The text between the '(' at start and its matching ')'."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return text[start + 1:i]
    return text[start + 1:]


def check_source(name: str, text: str) -> list[str]:
    problems = []
    code = _strip_comments(text)
    lines = code.splitlines()
    for i, line in enumerate(lines):
        if NON_COHERENT.search(line):
            owner = _enclosing_function(lines, i)
            if owner not in WEIGHT_LOADERS:
                problems.append(f"{name}:{i + 1}: a non-coherent load in {owner or 'an unnamed scope'}(), "
                                f"which is not a weight loader ({', '.join(WEIGHT_LOADERS)})")
    for helper in WEIGHT_LOADERS:
        for m in re.finditer(rf"\b{helper}\s*\(", code):
            line_no = code.count("\n", 0, m.start()) + 1
            if DEFINITION.match(lines[line_no - 1]) and _enclosing_function(lines, line_no - 1) == helper:
                continue  # the helper's own definition
            args = _call_arguments(code, m.end() - 1)
            hit = ACTIVATION_WORDS.search(args)
            if hit:
                problems.append(f"{name}:{line_no}: {helper}() reads '{hit.group(0).strip()}', an activation "
                                f"buffer, through a non-coherent load (use mm_load16_act / mm_ld_act_u32)")
    return problems


def main(argv: list[str]) -> int:
    files = [Path(a) for a in argv] or sorted((ROOT / "native" / "backends" / "cuda").glob("matmul*"))
    problems = []
    for f in files:
        try:
            shown = f.resolve().relative_to(ROOT) if f.resolve().is_relative_to(ROOT) else f
            problems += check_source(str(shown), f.read_text())
        except OSError as e:
            print(f"check_load_rules: cannot read {f}: {e.strerror}", file=sys.stderr)
            return 2
    for p in problems:
        print(p)
    if not problems:
        print(f"check_load_rules: {len(files)} files keep the rule (non-coherent loads read weights only)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
