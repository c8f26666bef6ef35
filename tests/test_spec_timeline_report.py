"""tools/spec_timeline_report.py on a hand-made timeline: busy time is the union of GPU activities
clipped to each range, gaps and API times are attributed to the range they start in."""

import io
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

import spec_timeline_report as report  # noqa: E402


def timeline():
    ev = [
        {"kind": "phase", "name": "phase:draft", "start": 0.0, "end": 100.0},
        {"kind": "gpu", "name": "a", "start": 10.0, "end": 30.0},
        {"kind": "gpu", "name": "b", "start": 20.0, "end": 40.0},   # overlaps a: busy 10..40
        {"kind": "gpu", "name": "c", "start": 90.0, "end": 120.0},  # clipped at the range's end
        {"kind": "api", "name": "cudaLaunchKernelExC", "start": 1.0, "end": 4.0},
        {"kind": "api", "name": "cudaMemcpyAsync", "start": 50.0, "end": 95.0},
        {"kind": "phase", "name": "phase:verify", "start": 150.0, "end": 250.0},
        {"kind": "gpu", "name": "d", "start": 200.0, "end": 260.0},
    ]
    return ev


def test_merged_intervals_and_coverage():
    merged = report.merged_intervals([(20, 40), (10, 30), (90, 120)])
    assert merged == [[10, 40], [90, 120]]
    assert report.covered(merged, 0, 100) == 40
    assert report.covered(merged, 35, 95) == 10
    assert report.covered(merged, 40, 90) == 0


def test_phase_stats():
    stats = report.phase_stats(report.Timeline(timeline()))
    draft, = stats["phase:draft"]
    assert draft["wall_us"] == 100 and draft["gpu_busy_us"] == 40
    assert draft["gpu_activities"] == 3 and draft["first_gpu_after_us"] == 10
    assert draft["launch_api_us"] == 3 and draft["wait_api_us"] == 45
    verify, = stats["phase:verify"]
    assert verify["gpu_busy_us"] == 50 and verify["gpu_activities"] == 1 and verify["launch_api_us"] == 0


def test_report_marks_gaps(tmp_path):
    out = io.StringIO()
    report.report(report.Timeline(timeline()), out=out)
    text = out.getvalue()
    assert "gap 50.0 us" in text  # b ends at 40, c starts at 90
    assert "GPU busy 110 us" in text  # 10..40, 90..120, 200..250 over the span 0..250
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(e) for e in timeline()))
    assert report.main([str(path)]) == 0


def test_bad_file_is_a_clear_error(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text("{not json\n")
    assert report.main([str(path)]) == 2
    assert "bad.jsonl" in capsys.readouterr().err


def test_profile_timeline_needs_the_speculative_mode(capsys):
    """profile_gpu_step.py's --timeline labels speculative steps: without --spec-draft it is refused
    before anything loads (no GPU needed to check)."""
    import profile_gpu_step

    with pytest.raises(SystemExit) as e:
        profile_gpu_step.main(["--model", "absent.gguf", "--timeline", "t.jsonl"])
    assert e.value.code == 2
    assert "--timeline goes with --spec-draft" in capsys.readouterr().err


def test_against_compares_the_draft_ranges_kernel_by_kernel(tmp_path, capsys):
    """--against: per draft range, each kernel's calls and GPU time in both timelines (the argument
    list dropped from the name), their difference, and the totals; verify ranges stay out."""
    def events(*rows):
        return [{"kind": kind, "name": name, "start": start, "end": end} for kind, name, start, end in rows]

    ours = events(("phase", "phase:draft", 0.0, 100.0), ("gpu", "k(int)", 10.0, 30.0), ("gpu", "k(int)", 40.0, 50.0),
                  ("phase", "phase:verify", 150.0, 250.0), ("gpu", "v(float)", 160.0, 240.0))
    base = events(("phase", "phase:draft", 0.0, 100.0), ("gpu", "k(int)", 10.0, 30.0),
                  ("gpu", "split(float*)", 30.0, 45.0), ("phase", "phase:draft", 200.0, 300.0),
                  ("gpu", "k(int)", 210.0, 250.0), ("gpu", "split(float*)", 250.0, 255.0))
    n, kernels = report.draft_kernels(report.Timeline(base))
    assert n == 2 and kernels == {"k": (1.0, 30.0), "split": (1.0, 10.0)}
    paths = []
    for name, events in (("ours", ours), ("base", base)):
        paths.append(tmp_path / f"{name}.jsonl")
        paths[-1].write_text("\n".join(json.dumps(e) for e in events))
    assert report.main([str(paths[0]), "--against", str(paths[1])]) == 0
    text = capsys.readouterr().out
    k_row = next(line for line in text.splitlines() if line.strip().startswith("k "))
    assert k_row.split()[1:] == ["2.0", "30.0", "|", "base", "1.0", "30.0", "|", "+0.0"]
    split_row = next(line for line in text.splitlines() if line.strip().startswith("split "))
    assert split_row.split()[1:] == ["0.0", "0.0", "|", "base", "1.0", "10.0", "|", "-10.0"]
    assert "v " not in text.split("draft ranges, per range")[1]
    assert "all: 2.0 activities, 30.0 us | base 2.0, 40.0 us | -10.0 us (-25.0%)" in text
    assert report.main([str(paths[0]), "--against", str(tmp_path / "absent.jsonl")]) == 2
    assert "absent.jsonl" in capsys.readouterr().err
