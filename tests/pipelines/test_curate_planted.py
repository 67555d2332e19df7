"""`rlax curate` end to end on a file with planted duplicates, near duplicates, test-set leaks and bad rows."""

import json

import pyarrow.parquet as pq
import pytest

from pipelines.cli import main
from rlax_core.data.records import example_id

CLEAN = [
    "A baker makes 48 muffins and sells them in boxes of 6. How many boxes does she fill?",
    "Lena reads 12 pages every evening. How many pages has she read after 3 weeks?",
    "A train travels 60 miles per hour for 2.5 hours, then 40 miles per hour for 1 hour. How far does it go?",
    "Sam has twice as many marbles as Ana, and together they have 45 marbles. How many does Sam have?",
    "The perimeter of a rectangle is 30 cm and its length is 9 cm. What is its width in centimetres?",
    "Omar saves 15 dollars a week for a bicycle that costs 180 dollars. After how many weeks can he buy it?",
]
LONG = ("A school orchestra has 24 violinists, 10 cellists and 6 bass players. For the spring concert the "
        "conductor wants to seat the players in rows so that every row holds the same number of people and "
        "each row mixes at least one of each instrument. What is the largest number of rows she can use?")


def _line(question, answer="#### 7"):
    return json.dumps({"question": question, "answer": f"Work.\n{answer}"})


@pytest.fixture
def planted(tmp_path, data_dir):
    gsm8k_test = json.loads((data_dir / "gsm8k/test.jsonl").read_text().splitlines()[5])["question"]
    math500 = json.loads((data_dir / "math/math500_test.jsonl").read_text().splitlines()[7])["problem"]
    lines = [_line(q) for q in CLEAN] + [_line(LONG)]
    lines += [
        _line(CLEAN[0]),  # exact duplicate
        _line("  " + CLEAN[1].upper().replace(" ", "   ") + " "),  # surface duplicate: case and spaces
        _line(CLEAN[2].replace("60", "６０")),  # surface duplicate: full-width digits (NFKC)
        _line(LONG.replace("spring concert", "winter concert")),  # near duplicate
        _line("Read carefully. " + gsm8k_test),  # GSM8K test leak, reworded opening
        _line(math500.replace("$", "")),  # MATH-500 leak with the LaTeX dollars stripped
        '{"question": "broken',  # malformed JSON
        json.dumps({"question": "Where is the answer?"}),  # missing field
        _line("How many?", answer="no marker here"),  # unparseable answer
    ]
    path = tmp_path / "train.jsonl"
    path.write_bytes("\n".join(lines).encode() + b"\n" + b'{"question": "\xff\xfe bad bytes", "answer": "#### 1"}\n')
    return path, [str(data_dir / "gsm8k/test.jsonl"), str(data_dir / "math/math500_test.jsonl")]


@pytest.mark.slow
def test_planted_duplicates_and_leaks_are_removed_clean_rows_kept(planted, tmp_path, capsys):
    path, eval_sets = planted
    out = tmp_path / "curated"
    argv = ["curate", "--input", str(path), "--format", "gsm8k", "--output", str(out), "near_duplicate_threshold=0.7"]
    for eval_set in eval_sets:
        argv += ["--decontaminate-against", eval_set]
    assert main(argv) == 0

    stats = json.loads((out / "stats.json").read_text())
    assert {k: stats[k] for k in ("input", "kept", "duplicate", "near_duplicate", "contaminated", "dead_lettered")} == {
        "input": 17, "kept": 7, "duplicate": 3, "near_duplicate": 1, "contaminated": 2, "dead_lettered": 4}
    assert stats["consistent"]
    assert stats["contaminated_by"] == {"gsm8k/test": 1, "math/math500_test": 1}

    table = pq.ParquetDataset(sorted(out.glob("examples-*.parquet"))).read()
    # of the near-duplicate pair the row with the smaller id is the canonical one, whichever was planted
    near_pair = [example_id("gsm8k", LONG), example_id("gsm8k", LONG.replace("spring concert", "winter concert"))]
    assert sorted(table.column("id").to_pylist()) == sorted([example_id("gsm8k", q) for q in CLEAN] + [min(near_pair)])
    assert set(table.column("answer").to_pylist()) == {"7"}

    dead = [json.loads(line) for f in sorted(out.glob("dead_letter-*.jsonl")) for line in f.read_text().splitlines()]
    assert sorted(d["reason"] for d in dead) == sorted(
        ["duplicate"] * 3 + ["near_duplicate", "contaminated", "contaminated", "malformed_json", "missing_field",
                             "unparseable_answer", "non_utf8"])
    assert all(d["raw"] for d in dead)
    assert "counts add up: True" in capsys.readouterr().out


def test_curate_without_inputs_is_a_clear_error(tmp_path, capsys):
    assert main(["curate", "--output", str(tmp_path)]) == 2
    assert "--input" in capsys.readouterr().err
