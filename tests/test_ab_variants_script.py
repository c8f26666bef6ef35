"""tools/device/ab_variants.sh's plumbing on the CPU (no GPU, no build): library variants carried in
(lib:PATH, gzipped or not) run in interleaved rounds under their own SPECLA_LIBRARY, and
BENCH_GPU_ARGS "-" runs only AB_EXTRA (what ab_draft_propose.sh relies on)."""

from __future__ import annotations

import gzip
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_library_variants_run_in_interleaved_rounds_without_bench_gpu(tmp_path):
    (tmp_path / "main.so").write_text("main\n")
    with gzip.open(tmp_path / "packed.so.gz", "wt") as f:
        f.write("packed\n")
    env = dict(os.environ, HOME=str(tmp_path), SPECLA_LIBRARY=str(tmp_path / "main.so"), MODEL="/absent.gguf",
               ROWS=str(tmp_path / "rows.jsonl"), AB_PYTEST="0", AB_EXTRA='echo "extra $AB_LABEL $(cat "$SPECLA_LIBRARY")"')
    proc = subprocess.run(["bash", "tools/device/ab_variants.sh", "c0", "2", "-", f"packed=lib:{tmp_path}/packed.so.gz",
                           f"gone=lib:{tmp_path}/gone.so"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    extras = [line for line in proc.stdout.splitlines() if line.startswith("extra ")]
    assert extras == ["extra c0+main main", "extra c0+packed packed"] * 2
    assert "variant gone: no library at" in proc.stdout
    assert "bench_gpu" not in proc.stdout + proc.stderr and not (tmp_path / "rows.jsonl").exists()
