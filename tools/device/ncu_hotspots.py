#!/usr/bin/env python3
"""Where one kernel's warps wait, instruction by instruction: Nsight Compute's warp-state sampling
(the SourceCounters section) of one launch, read back as its SASS source page, and the instructions
that hold most of the samples printed with the instructions just before them.

    python3 tools/device/ncu_hotspots.py --kernel '^mm_tile_bulk_kernel' --skip 4 -- \\
        python3 tools/device/ncu_step.py --model 27b.gguf --batch 23

The kernel-wide stall reasons (cycles per issued instruction) say what a kernel waits for; they
do not say where. A sample names the instruction the warp was about to issue, so the top rows
say which load, barrier, shuffle or MMA the waiting is attached to (a stall shows at the
instruction that waits, not at the one that produced the late value). Rows: address, samples
(all / not issued), share of the kernel's samples, the SASS. Needs ncu on PATH (the device has it);
writes nothing but its report under --workdir."""

from __future__ import annotations

import argparse
import csv
import io
import os
import shutil
import subprocess
import sys


def column(header: list[str], *names: str) -> int:
    for name in names:
        for i, h in enumerate(header):
            if h.strip().lower() == name.lower():
                return i
    for name in names:  # a prefix (ncu versions add units or qualifiers)
        for i, h in enumerate(header):
            if h.strip().lower().startswith(name.lower()):
                return i
    return -1


def number(text: str) -> float:
    try:
        return float(text.replace(",", "").strip() or 0)
    except ValueError:
        return 0.0


def hotspot_lines(page_csv: str, top: int, context: int) -> list[str]:
    """The source page (CSV, SASS) as printed lines: the column names, then the `top` instructions
    by warp samples in address order, each after its `context` predecessors ('*' marks a top one)."""
    rows = list(csv.reader(io.StringIO(page_csv)))
    start = next((i for i, r in enumerate(rows) if column(r, "Source") >= 0 and column(r, "# Address", "Address") >= 0),
                 None)
    if start is None:
        return ["ncu_hotspots: the source page has no Address / Source header; its first lines:",
                *(",".join(r) for r in rows[:5])]
    header, body = rows[start], rows[start + 1:]
    a, s = column(header, "# Address", "Address"), column(header, "Source")
    all_samples = column(header, "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (All")
    not_issued = column(header, "Warp Stall Sampling (Not-issued Samples)", "Warp Stall Sampling (Not-issued")
    if all_samples < 0:
        return ["ncu_hotspots: no warp stall sampling column; the header: " + " | ".join(header)]
    body = [r for r in body if len(r) > max(a, s, all_samples, not_issued)]
    total = sum(number(r[all_samples]) for r in body) or 1.0
    lines = ["columns: " + " | ".join(h.strip() for h in header),
             f"{len(body)} SASS instructions, {total:.0f} warp samples; address, samples (all, not issued), share"]
    order = sorted(range(len(body)), key=lambda i: -number(body[i][all_samples]))[:top]
    shown: set[int] = set()
    for i in sorted(order):
        for j in range(max(0, i - context), i + 1):
            if j in shown:
                continue
            shown.add(j)
            r = body[j]
            ni = number(r[not_issued]) if not_issued >= 0 else 0.0
            lines.append(f"{'*' if j == i else ' '} {r[a]:>6} {number(r[all_samples]):7.0f} {ni:7.0f} "
                         f"{100 * number(r[all_samples]) / total:5.1f}%  {r[s].strip()[:110]}")
        lines.append("  ...")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernel", required=True, help="ncu's -k regex:... (a kernel name's regular expression)")
    parser.add_argument("--skip", type=int, default=0, help="launches of that kernel to skip first")
    parser.add_argument("--top", type=int, default=30, help="instructions to print")
    parser.add_argument("--context", type=int, default=3, help="instructions printed before each top one")
    parser.add_argument("--workdir", default=os.path.expanduser("~/ncu-hotspots"))
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the program to profile")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the program to profile after --")
    if shutil.which("ncu") is None:
        print("ncu_hotspots: ncu (Nsight Compute's command line) is not on PATH")
        return 2
    os.makedirs(args.workdir, exist_ok=True)
    report = os.path.join(args.workdir, "hotspots")
    collect = ["ncu", "--clock-control", "none", "-f", "-o", report, "-k", f"regex:{args.kernel}",
               "--launch-skip", str(args.skip), "-c", "1", "--section", "SourceCounters", "--section",
               "WarpStateStats", "--section", "SchedulerStats", "--section", "LaunchStats", "--section",
               "Occupancy", "--metrics", r"regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio",
               *command]
    run = subprocess.run(collect, capture_output=True, text=True)
    if run.returncode != 0 or not os.path.exists(report + ".ncu-rep"):
        print(f"ncu_hotspots: ncu failed (rc {run.returncode})\n{(run.stdout + run.stderr)[-3000:]}")
        return 1
    details = subprocess.run(["ncu", "-i", report + ".ncu-rep", "--page", "details"], capture_output=True, text=True)
    keep = ("Duration", "Registers", "Block Size", "Grid Size", "Issued Warp", "Active Warps", "Eligible Warps",
            "No Eligible", "Warp Cycles Per Issued", "Achieved Occupancy", "Theoretical Occupancy")
    for line in details.stdout.splitlines():
        # the kernel's name, its launch and occupancy figures, and the stall reasons it has at all
        stalled = "warps_issue_stalled" in line and number(line.split()[-1]) > 0
        if line.strip().startswith(keep) or "  void " in line or stalled:
            print(line.rstrip())
    source = subprocess.run(["ncu", "-i", report + ".ncu-rep", "--page", "source", "--csv", "--print-source", "sass"],
                            capture_output=True, text=True)
    if source.returncode != 0 or not source.stdout.strip():
        print(f"ncu_hotspots: no source page (rc {source.returncode})\n{source.stderr[-2000:]}")
        return 1
    lines = hotspot_lines(source.stdout, args.top, args.context)
    print("\n".join(lines))
    return 0 if lines and not lines[0].startswith("ncu_hotspots:") else 1


if __name__ == "__main__":
    sys.exit(main())
