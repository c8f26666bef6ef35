"""Summarise a timeline of speculative steps (tools/profile_gpu_step.py --spec-draft ... --timeline):
for each phase kind (draft, verify, accept: host ranges), the median host wall, the GPU busy time
inside it (the union of GPU activities, clipped to the range), the GPU activities that start
inside it and the runtime API time spent in it (launches; copies and synchronisations); then the
whole span's GPU busy share, and one draft range activity by activity with its GPU idle gaps.
With --against, a second timeline's draft ranges beside the first's, kernel by kernel: calls and
GPU microseconds per range in each and the difference (two libraries, each profiled with
SPECLA_CUDA_PDL=0, so that the kernels' times add up to the draft's GPU time).

    python tools/spec_timeline_report.py timeline.jsonl[.gz] [--against BASE.jsonl[.gz]]"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from collections import defaultdict

GAP_US = 5.0  # GPU idle gaps listed in the detailed draft range


def read_timeline(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def merged_intervals(spans: list[tuple[float, float]]) -> list[list[float]]:
    """The union of [start, end) spans as sorted disjoint intervals."""
    merged: list[list[float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def covered(intervals: list[list[float]], a: float, b: float) -> float:
    """How much of [a, b) the disjoint sorted intervals cover."""
    total = 0.0
    for start, end in intervals:
        if end <= a:
            continue
        if start >= b:
            break
        total += min(end, b) - max(start, a)
    return total


class Timeline:
    """A timeline's events sorted once: GPU activities (start, end, name), their busy intervals,
    the phase ranges (start, end, name) and the runtime API calls."""

    def __init__(self, events: list[dict]):
        self.gpu = sorted((e["start"], e["end"], e["name"]) for e in events if e["kind"] == "gpu")
        self.busy = merged_intervals([(s, t) for s, t, _ in self.gpu])
        self.phases = sorted((e["start"], e["end"], e["name"]) for e in events if e["kind"] == "phase")
        self.api = [e for e in events if e["kind"] == "api"]

    def gpu_starting_in(self, a: float, b: float) -> list[tuple[float, float, str]]:
        return [g for g in self.gpu if a <= g[0] < b]


def phase_stats(tl: Timeline) -> dict[str, list[dict]]:
    """Per phase name, one dict of figures per range."""
    per_phase: dict[str, list[dict]] = defaultdict(list)
    for a, b, name in tl.phases:
        starts = [s for s, _, _ in tl.gpu_starting_in(a, b)]
        inside = [x for x in tl.api if a <= x["start"] < b]
        per_phase[name].append({
            "wall_us": b - a,
            "gpu_busy_us": covered(tl.busy, a, b),
            "gpu_activities": len(starts),
            "launch_api_us": sum(x["end"] - x["start"] for x in inside if "Launch" in x["name"]),
            "wait_api_us": sum(x["end"] - x["start"] for x in inside
                               if "Synchronize" in x["name"] or "Memcpy" in x["name"]),
            "first_gpu_after_us": (starts[0] - a) if starts else None,
        })
    return per_phase


def report(tl: Timeline, out=None) -> None:
    out = out or sys.stdout  # looked up per call (a test's capture replaces it)
    for name, ranges in phase_stats(tl).items():
        def median(key):
            values = [r[key] for r in ranges if r[key] is not None]
            return statistics.median(values) if values else float("nan")
        print(f"{name}: {len(ranges)} ranges; median wall {median('wall_us'):.1f} us, GPU busy inside "
              f"{median('gpu_busy_us'):.1f}, GPU activities started inside {median('gpu_activities'):.0f}, "
              f"launch API {median('launch_api_us'):.1f} us, copy / sync API {median('wait_api_us'):.1f} us, "
              f"first GPU start {median('first_gpu_after_us'):.1f} us after the range's", file=out)
    if not tl.phases:
        return
    a, b = tl.phases[0][0], tl.phases[-1][1]
    busy = covered(tl.busy, a, b)
    print(f"span {b - a:.0f} us: GPU busy {busy:.0f} us ({busy / (b - a):.1%})", file=out)
    drafts = [p for p in tl.phases if p[2] == "phase:draft"]
    if not drafts:
        return
    a, b, _ = drafts[len(drafts) // 2]
    print(f"one draft range ({b - a:.0f} us): GPU activities (start after the range's, duration, name), "
          f"idle gaps over {GAP_US:.0f} us marked", file=out)
    last_end = a
    for start, end, name in tl.gpu_starting_in(a, b):
        if start - last_end > GAP_US:
            print(f"   ---- gap {start - last_end:.1f} us", file=out)
        print(f"   {start - a:8.1f} {end - start:7.1f} {name[:70]}", file=out)
        last_end = max(last_end, end)
    print(f"   the range ends at {b - a:.1f}; the last GPU activity at {last_end - a:.1f}", file=out)


def draft_kernels(tl: Timeline) -> tuple[int, dict[str, tuple[float, float]]]:
    """(draft ranges, {kernel name without its argument list: (calls, GPU us) per range}) over the
    GPU activities that start inside each draft range, copies included."""
    drafts = [(a, b) for a, b, name in tl.phases if name == "phase:draft"]
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for a, b in drafts:
        for start, end, name in tl.gpu_starting_in(a, b):
            entry = totals[name.split("(")[0].strip()]
            entry[0] += 1
            entry[1] += end - start
    n = len(drafts)
    return n, {k: (c / n, us / n) for k, (c, us) in totals.items()} if n else {}


def compare_drafts(tl: Timeline, base: Timeline, out=None) -> None:
    out = out or sys.stdout
    n, ours = draft_kernels(tl)
    n_base, theirs = draft_kernels(base)
    if not n or not n_base:
        print("no draft ranges to compare (profile_gpu_step.py --spec-draft writes them)", file=out)
        return
    print(f"draft ranges, per range: this timeline ({n} ranges) against the base ({n_base}): calls, GPU us", file=out)
    names = sorted(set(ours) | set(theirs), key=lambda k: -max(ours.get(k, (0, 0))[1], theirs.get(k, (0, 0))[1]))
    for name in names:
        (c, us), (cb, usb) = ours.get(name, (0.0, 0.0)), theirs.get(name, (0.0, 0.0))
        print(f"   {name[:60]:60s} {c:6.1f} {us:8.1f} | base {cb:6.1f} {usb:8.1f} | {us - usb:+8.1f}", file=out)
    total, total_base = sum(v[1] for v in ours.values()), sum(v[1] for v in theirs.values())
    calls, calls_base = sum(v[0] for v in ours.values()), sum(v[0] for v in theirs.values())
    print(f"   all: {calls:.1f} activities, {total:.1f} us | base {calls_base:.1f}, {total_base:.1f} us | "
          f"{total - total_base:+.1f} us ({(total - total_base) / total_base:+.1%})", file=out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("timeline", help="JSON lines from profile_gpu_step.py --timeline (optionally .gz)")
    parser.add_argument("--against", default=None, metavar="BASE.jsonl",
                        help="a second timeline: compare the draft ranges' kernels with its")
    args = parser.parse_args(argv)
    timelines = []
    for path in [args.timeline] + ([args.against] if args.against else []):
        try:
            timelines.append(Timeline(read_timeline(path)))
        except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
            print(f"spec_timeline_report: {path}: {e!r}", file=sys.stderr)
            return 2
    report(timelines[0])
    if args.against:
        compare_drafts(timelines[0], timelines[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
