"""tools/top1_agreement_backends.py on the CPU: rows per pair, a runtime against itself agrees at every
position with identical logits, and a bad --pairs, --models or --preset names the flag."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

import top1_agreement_backends as tool  # noqa: E402


def test_rows_per_pair_and_a_runtime_against_itself(tmp_path):
    out = tmp_path / "rows.jsonl"
    assert tool.main(["--models", "qwen35:q8_0", "--pairs", "scalar:cpu,cpu:cpu", "--prompts", "2",
                      "--tokens", "12", "--out", str(out), "--commit", "abc"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["a"], r["b"]) for r in rows] == [("scalar", "cpu"), ("cpu", "cpu")]
    for row in rows:
        assert row["mode"] == "top1-agreement-backends" and row["commit"] == "abc" and row["device"] == "cpu"
        assert row["model"] == "tiny8-qwen35-q8_0-seed3" and row["positions"] == 24
        assert row["top1_agreement"] == round(row["agree"] / 24, 4)
        assert len(row["b_margins_at_mismatches"]) == 24 - row["agree"]
        assert row["b_margin_median"] > 0
    same = rows[1]
    assert same["agree"] == 24 and same["max_rel_logit_diff"] == 0.0


@pytest.mark.parametrize("flag, value", [("--pairs", "cpu:rocm"), ("--pairs", "cpu"), ("--models", "qwen35:q9"),
                                         ("--preset", "huge")])
def test_bad_flags_are_named(flag, value):
    with pytest.raises(SystemExit) as err:
        tool.main([flag, value])
    assert flag in str(err.value)
