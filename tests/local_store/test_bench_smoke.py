"""Smoke runs of the store and embedder benchmarks, end to end with small counts (no timing is
asserted: timing goals live in the printed tables)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_bench(*args: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNCD_")}
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.splitlines()


def test_bench_store_quick_prints_its_table() -> None:
    lines = run_bench("bench/store.py", "--quick")
    rows = {line.split("|")[0].strip(): line for line in lines if "|" in line}
    for metric in ("save @ 1k memories", "save @ 10k memories", "save p50 ratio 10k / 1k",
                   "HashingEmbedder.embed, 1 text", "baseline: sqlite3 INSERT+COMMIT",
                   "apply fresh, 384-d embeddings", "baseline: bare bulk INSERT+COMMIT",
                   "apply fresh, no embeddings",
                   "re-apply same rows (all skipped)"):
        assert metric in rows, "\n".join(lines)
    # Every size got the same number of timed saves (they are taken in turns).
    assert rows["save @ 1k memories"].split("|")[1].strip() == "100"
    assert rows["save @ 10k memories"].split("|")[1].strip() == "100"
    assert lines[-1].startswith("run time:"), "\n".join(lines)


def test_bench_embed_small_prints_both_graphs() -> None:
    lines = run_bench("bench/embed.py", "--queries", "30", "--batches", "1", "--loads", "1")
    text = "\n".join(lines)
    fused = next(line for line in lines if line.startswith("single query embed, fused (ms)"))
    exported = next(line for line in lines
                    if line.startswith("single query embed, exported (ms)"))
    assert fused.split()[5] == "30" and exported.split()[5] == "30", text
    assert "×1.00 of exported" in exported, text
    for label in ("memory texts", "short queries"):
        for graph in ("fused", "exported"):
            assert any(line.startswith(f"batch of 64 {label}, {graph} (ms)") for line in lines), text
    assert any(line.startswith("load, fresh process (ms)") for line in lines), text


def test_bench_recall_speed_quick_prints_its_table() -> None:
    lines = run_bench("bench/recall_speed.py", "--quick")
    rows = [[cell.strip() for cell in line.split("|")] for line in lines if "|" in line]
    found = {(row[0], row[1]) for row in rows}
    for size in ("1,000", "10,000"):
        for metric in ("recall syncd", "recall plane", "baseline numpy top-50",
                       "recall syncd, 15,000-word query"):
            assert (metric, size) in found, "\n".join(lines)
    for metric in ("open + index load", "default model load + first",
                   "default model query embed"):
        assert any(row[0] == metric for row in rows), "\n".join(lines)


def test_bench_recall_eval_prints_both_tiers() -> None:
    lines = run_bench("bench/recall_eval.py", "--embedder", "hashing", "--by-kind", "--stress")
    at = lines.index("explicit search") + 2
    modes = {line.split()[0]: line.split()[1:] for line in lines[at:at + 4]}
    assert sorted(modes) == ["keyword", "plane", "syncd", "vector"], "\n".join(lines)
    for values in modes.values():  # recall@5, recall@10, MRR, p50, p95
        assert len(values) == 5 and all(0.0 <= float(v) <= 1.0 for v in values[:3]), values
        assert 0.0 <= float(values[3]) <= float(values[4]), values
    # The confident tier: the answerable queries, then one group per set of queries with no
    # answer (the tuning set, the first held-out set, each blind set), then all of those.
    corpus = json.loads((ROOT / "bench/data/recall_corpus.json").read_text())
    queries = corpus["queries"]
    blind = sorted({q["set"] for q in queries if q["kind"] == "heldout" and "set" in q})
    groups = {"nonsense": [q for q in queries if q["kind"] == "nonsense"],
              "held-out": [q for q in queries if q["kind"] == "heldout" and "set" not in q]}
    groups |= {f"blind-{n}": [q for q in queries if q["kind"] == "heldout" and q.get("set") == n]
               for n in blind}
    at = lines.index("syncd confident tier (what is injected unasked; the first 2 confident "
                     "memories)") + 2
    rows = {line.rsplit(None, 2)[0]: (int(line.split()[-2]), float(line.split()[-1]))
            for line in lines[at:at + len(groups) + 2]}
    assert rows["answerable: answer injected"][0] == sum(bool(q["relevant"]) for q in queries)
    for name, members in groups.items():
        assert rows[f"{name}: false injection"][0] == len(members), name
    n_all, share_all = rows["all no-answer: false injection"]
    assert n_all == sum(len(m) for m in groups.values())
    weighted = sum(rows[f"{name}: false injection"][0] * rows[f"{name}: false injection"][1]
                   for name in groups)
    assert abs(weighted / n_all - share_all) < 1.5e-3
    assert all(0.0 <= share <= 1.0 for _, share in rows.values())
    # --by-kind: each kind's MRR per mode and syncd's injected share.
    at = lines.index("MRR by query kind (injected: syncd's confident tier)") + 2
    kinds = {q["kind"] if "set" not in q else f"{q['kind']} set {q['set']}"
             for q in queries if q["relevant"]}
    by_kind = {line.rsplit(None, 6)[0]: line.split()[-6:] for line in lines[at:at + len(kinds)]}
    assert set(by_kind) == kinds, by_kind
    assert all(0.0 <= float(v) <= 1.0 for row in by_kind.values() for v in row[:-1])
    # --by-kind: syncd's false injections per kind of blind held-out query (its note after
    # " — "), every such query counted once, under its own set and kind.
    expected: dict[str, int] = {}
    for q in corpus["queries"]:
        if q["kind"] == "heldout" and "set" in q and " — " in q.get("note", ""):
            kind = f"set {q['set']}: {q['note'].partition(' — ')[2].strip()}"
            expected[kind] = expected.get(kind, 0) + 1
    # --by-kind: each set's MRR over its answered queries, whose n-weighted mean is the MRR of
    # the mode table.
    answered: dict[int, int] = {}
    for q in corpus["queries"]:
        if q["relevant"]:
            answered[q.get("set", 1)] = answered.get(q.get("set", 1), 0) + 1
    at = lines.index("MRR by set (answered queries; set 1 tuned the old gates)") + 2
    by_set = {int(line.split()[0]): line.split()[1:] for line in lines[at:at + len(answered)]}
    assert {number: int(row[-1]) for number, row in by_set.items()} == answered, by_set
    for index, mode in enumerate(("keyword", "vector", "plane", "syncd")):
        cells = [float(row[index]) for row in by_set.values()]
        assert all(0.0 <= cell <= 1.0 for cell in cells), by_set
        weighted = sum(cell * answered[n] for cell, n in zip(cells, by_set, strict=True))
        assert abs(weighted / sum(answered.values()) - float(modes[mode][2])) < 1.5e-3, mode
    start = lines.index("syncd false injections by kind of blind held-out query") + 1
    printed: dict[str, int] = {}
    for line in lines[start:start + len(expected)]:
        *kind, hits, of, total, rate = line.split()
        assert of == "of" and 0 <= int(hits) <= int(total), line
        assert abs(float(rate) - int(hits) / int(total)) < 1e-3, line
        printed[" ".join(kind)] = int(total)
    assert len(expected) >= 20 and printed == expected, (printed, expected)
    # --stress: each composition's row; no (query, memory) pair changes its confident flag.
    start = next(i for i, line in enumerate(lines) if line.startswith("store composition")) + 2
    stores = [line.split() for line in lines[start:start + 5]]
    assert [row[0] for row in stores] == ["corpus", "80%", "one", "tiny", "large"], stores
    assert [float(row[-1]) for row in stores] == [1.0] * 5, stores


def test_bench_recall_eval_refuses_a_corpus_it_cannot_read(tmp_path: Path) -> None:
    """A missing file, text that is not JSON, and JSON that is not a corpus: usage errors
    naming ``--corpus`` (exit 2), no traceback."""
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    other = tmp_path / "other.json"
    other.write_text("[1, 2]")
    for path in (tmp_path / "missing.json", broken, other):
        proc = subprocess.run([sys.executable, "bench/recall_eval.py", "--embedder", "hashing",
                               "--corpus", str(path)], cwd=ROOT, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "--corpus" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_bench_purge_prints_its_table_and_finds_no_marker_left() -> None:
    lines = run_bench("bench/purge.py", "--memories", "200", "--deletes", "5")
    assert any(line.startswith("hard delete, WAL scrubbed before it returns") for line in lines)
    assert "hard deletes whose marker was on disk after the call: 0 of 5" in lines
    assert lines[-1].endswith("marker gone: True"), lines[-1]


def test_bench_versions_prints_its_table() -> None:
    lines = run_bench("bench/versions.py", "--runs", "1")
    assert lines[0].split() == ["measure", "versions", "baseline", "ratio"], lines
    values = {line.split()[0]: float(line.split()[1]) for line in lines[1:]}
    assert set(values) == {"update_apply_rows_per_s", "edit_p50_ms"}, lines
    assert all(value > 0 for value in values.values()), lines
