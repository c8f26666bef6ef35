"""tools/device/matmul_trace_report.py on hand-made launch timelines (the GPU writes the real ones:
cuda_matmul_check --trace in a -DMM_TRACE build)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools" / "device"))

import matmul_trace_report as report  # noqa: E402


def two_waves():
    """2 SMs x 2 slots: units 0-3 run 0-10 us, units 4-5 run 10-20 us on SM 0 only; each unit waits
    1 us, loops 8 us and finishes in 1 us."""
    recs = []
    for u in range(6):
        sm = 0 if u in (0, 1, 4, 5) else 1
        t0 = 0 if u < 4 else 10_000
        recs.append([sm, t0, t0 + 1_000, t0 + 9_000, t0 + 10_000])
    return {"matrix": "m", "type": "Q4_K", "n_batch": 1, "kernel": "dp4a", "weight_bytes": 42_000_000,
            "records": recs}


def test_two_waves_show_their_tail_peak_and_parts():
    row = report.analyse(two_waves(), copy_gbps=4200)
    assert row["span_us"] == pytest.approx(20.0)
    assert row["peak"] == 4
    assert row["ramp_us"] == pytest.approx(0.0)
    assert row["tail_us"] == pytest.approx(10.0)  # the second wave fills 2 of the 4 slots
    assert row["unit_us"] == pytest.approx(8.0)
    assert row["wait_us"] == pytest.approx(1.0)
    assert row["finish_us"] == pytest.approx(1.0)
    assert (row["per_sm_min"], row["per_sm_max"]) == (2, 4)
    assert row["sm_end_spread_us"] == pytest.approx(10.0)
    assert row["ideal_us"] == pytest.approx(10.0)
    assert row["span_over_ideal"] == pytest.approx(2.0)


def test_loop_ends_are_grouped_by_the_units_their_sm_ran():
    row = report.analyse(two_waves())
    # SM 0 ran 4 units (loop ends 9, 9, 19, 19 us), SM 1 ran 2 (9, 9)
    assert row["loop_end_by_load"] == {"2": [2, pytest.approx(9.0), pytest.approx(9.0)],
                                       "4": [4, pytest.approx(14.0), pytest.approx(19.0)]}
    assert row["finish_max_us"] == pytest.approx(1.0)


def test_a_launch_whose_last_quarter_runs_alone_has_that_tail():
    line = two_waves()
    line["records"] = [[0, 0, 500, 9_000, 10_000]] * 3 + [[1, 0, 500, 19_000, 20_000]]
    row = report.analyse(line)
    assert row["peak"] == 4 and row["tail_us"] == pytest.approx(10.0)
    assert "ideal_us" not in row


def test_the_command_prints_a_row_and_appends_json(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text(json.dumps(two_waves()) + "\n")
    out = tmp_path / "rows.jsonl"
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "device" / "matmul_trace_report.py"), str(trace),
                          "--copy-gbps", "4200", "--out", str(out)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "dp4a" in run.stdout
    rows = [json.loads(s) for s in out.read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["tail_us"] == pytest.approx(10.0)
    assert "4 per SM: 14.0 / 19.0 (4)" in run.stdout


def test_a_gzipped_trace_reads_as_the_plain_one(tmp_path):
    trace = tmp_path / "trace.jsonl.gz"
    with gzip.open(trace, "wt") as f:
        f.write(json.dumps(two_waves()) + "\n")
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "device" / "matmul_trace_report.py"), str(trace)],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "2 per SM: 9.0 / 9.0 (2)" in run.stdout


def test_a_file_without_records_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"matrix": "m", "records": []}) + "\n")
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "device" / "matmul_trace_report.py"), str(bad)],
                         capture_output=True, text=True)
    assert run.returncode == 2
    assert "bad.jsonl" in run.stderr and "Traceback" not in run.stderr
    missing = subprocess.run([sys.executable, str(ROOT / "tools" / "device" / "matmul_trace_report.py"),
                              str(tmp_path / "none.jsonl")], capture_output=True, text=True)
    assert missing.returncode == 2 and "cannot read" in missing.stderr
