#!/usr/bin/env python3
"""Where a matmul launch's time goes, from its timeline: the JSON lines of
`cuda_matmul_check --trace PATH` (a checker built with EXTRA_NVCC_FLAGS=-DMM_TRACE; matmul_launch.h),
one line per (matrix, n_batch) with a record per warp unit (the per-warp kernels) or per CTA (the
staged kernel): [SM, start, past the wait, main loop done, finish done], ns from the launch's first
start.

    python3 tools/device/matmul_trace_report.py trace.jsonl [--copy-gbps 4250] [--out rows.jsonl]

Per launch it prints and (with --out) writes:
  span_us        first start to last end
  ideal_us       the weight bytes at --copy-gbps (when given), and span / ideal
  peak           most units (or CTAs) running at once
  ramp_us        first start until the running count first reaches 90 % of the peak
  tail_us        from where the running count last drops below 90 % of the peak to the end
  unit_us        median main loop of a unit (past the wait to loop done)
  finish_us      median and largest split-K finish (loop done to end)
  per_sm         fewest and most records an SM ran, and the spread of the SMs' last ends (us)
  loop_end_by_load  per count of records an SM ran: how many records, and the median and last
                 main-loop end (us from the launch's first start) of the records on such SMs; a
                 second printed line. An SM's units share its issue slots, so where the SMs with
                 one unit more end last, that extra unit sets the launch's end.
The trace may be gzipped (.gz). The units' work is equal within a launch (one chunk of one row
group), so a long tail with a short unit means waves (more units than run at once), a long finish
means the split-K arrival, and a ramp close to a unit means the first loads wait on memory."""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench_cpu import append_rows  # noqa: E402


def running_counts(records):
    """[(time_ns, units running from then on)] over the launch, from +1 at each start and -1 at each end."""
    events = sorted([(r[1], 1) for r in records] + [(r[4], -1) for r in records], key=lambda e: (e[0], e[1]))
    out, n = [], 0
    for t, d in events:
        n += d
        if out and out[-1][0] == t:
            out[-1] = (t, n)
        else:
            out.append((t, n))
    return out


def analyse(line: dict, copy_gbps: float | None = None) -> dict:
    records = [r for r in line["records"] if r[4] >= r[1]]
    if not records:
        raise ValueError(f"{line.get('matrix')} n={line.get('n_batch')}: no complete record")
    start = min(r[1] for r in records)
    end = max(r[4] for r in records)
    counts = running_counts(records)
    peak = max(n for _, n in counts)
    ramp_end = next(t for t, n in counts if n >= 0.9 * peak)
    # the tail starts where the count last drops below 90 % of the peak for good
    last_full = max(t for t, n in counts if n >= 0.9 * peak)
    tail_start = next((t for t, n in counts if t > last_full), end)
    per_sm: dict[int, list] = {}
    for r in records:
        per_sm.setdefault(r[0], []).append(r)
    sm_last_ends = [max(x[4] for x in rs) for rs in per_sm.values()]
    by_load: dict[int, list] = {}  # records an SM ran -> the loop ends of the records on such SMs
    for rs in per_sm.values():
        by_load.setdefault(len(rs), []).extend((x[3] - start) / 1e3 for x in rs)
    row = {
        "matrix": line.get("matrix"), "type": line.get("type"), "n_batch": line.get("n_batch"),
        "kernel": line.get("kernel"), "records": len(records), "sms": len(per_sm),
        "span_us": (end - start) / 1e3, "peak": peak, "ramp_us": (ramp_end - start) / 1e3,
        "tail_us": (end - tail_start) / 1e3,
        "unit_us": statistics.median((r[3] - r[2]) / 1e3 for r in records),
        "wait_us": statistics.median((r[2] - r[1]) / 1e3 for r in records),
        "finish_us": statistics.median((r[4] - r[3]) / 1e3 for r in records),
        "finish_max_us": max((r[4] - r[3]) / 1e3 for r in records),
        "per_sm_min": min(by_load), "per_sm_max": max(by_load),
        "sm_end_spread_us": (max(sm_last_ends) - min(sm_last_ends)) / 1e3,
        "loop_end_by_load": {str(k): [len(v), statistics.median(v), max(v)] for k, v in sorted(by_load.items())},
    }
    if copy_gbps and line.get("weight_bytes"):
        row["ideal_us"] = line["weight_bytes"] / (copy_gbps * 1e9) * 1e6
        row["span_over_ideal"] = row["span_us"] / row["ideal_us"]
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", help="the JSON lines of cuda_matmul_check --trace")
    ap.add_argument("--copy-gbps", type=float, default=None, help="the device's copy rate, for ideal_us")
    ap.add_argument("--out", default=None, help="append one JSON row per launch here")
    args = ap.parse_args(argv)
    try:
        opener = gzip.open if args.trace.endswith(".gz") else open
        with opener(args.trace, "rt") as f:
            lines = [json.loads(s) for s in f if s.strip()]
    except (OSError, EOFError, json.JSONDecodeError) as e:
        print(f"matmul_trace_report: cannot read {args.trace}: {e}", file=sys.stderr)
        return 2
    rows = []
    print(f"{'matrix':<12}{'type':<6}{'n':>3} {'kernel':<16}{'units':>6}{'span':>8}{'ideal':>7}{'peak':>6}"
          f"{'ramp':>7}{'tail':>7}{'unit':>7}{'finish':>8}{'per SM':>8}")
    for line in lines:
        try:
            row = analyse(line, args.copy_gbps)
        except (KeyError, ValueError, IndexError, TypeError) as e:
            print(f"matmul_trace_report: {args.trace}: a line without usable records ({e})", file=sys.stderr)
            return 2
        rows.append(row)
        ideal = f"{row['ideal_us']:7.1f}" if "ideal_us" in row else f"{'':>7}"
        print(f"{row['matrix']:<12}{row['type']:<6}{row['n_batch']:>3} {row['kernel']:<16}{row['records']:>6}"
              f"{row['span_us']:8.1f}{ideal}{row['peak']:>6}{row['ramp_us']:7.1f}{row['tail_us']:7.1f}"
              f"{row['unit_us']:7.1f}{row['finish_us']:8.2f}{row['per_sm_min']:>4}-{row['per_sm_max']:<3}")
        loads = ", ".join(f"{k} per SM: {v[1]:.1f} / {v[2]:.1f} ({v[0]})" for k, v in row["loop_end_by_load"].items())
        print(f"{'':<12}loop ends (median / last): {loads}; finish at most {row['finish_max_us']:.1f}")
    append_rows(rows, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
