"""Benchmark: `rlax curate` throughput on GSM8K train + MATH train (~15k rows) on the DirectRunner.

Baseline, measured in the same run: a plain single-process Python implementation of the same steps
calling the same ``rlax_core`` functions (parse, adapt, exact dedup, MinHash + LSH near dedup,
13-gram decontamination), so the ratio is the pipeline's overhead. Also the speed-up from 1 to 2
workers (``--direct_num_workers``, ``--direct_running_mode multi_processing`` on the FnApiRunner,
the DirectRunner's batch engine). ``--with-prism`` also times Prism. The pipeline's counts must equal the baseline's, or it fails.

    .venv/bin/python benchmarks/curate.py [--shared ../shared/data] [--repeats 1] [--with-prism]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import apache_beam as beam  # noqa: E402
from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402

from pipelines.curate import build  # noqa: E402
from rlax_core.data.formats import FormatError, to_example  # noqa: E402
from rlax_core.data.curation import CurateConfig, InputSpec, eval_set_name, parse_json_line, stat_category  # noqa: E402
from rlax_core.data.dedup import (estimated_jaccard, exact_key, lsh_band_keys, lsh_params,  # noqa: E402
                                  minhash_signature, ngram_hashes)


def curate_in_process(config: CurateConfig) -> dict[str, int]:
    """The curation steps in one Python process, with the pipeline's rules; returns the counts."""
    counts: Counter = Counter()
    examples = []
    for spec in config.inputs:
        for path in sorted(glob.glob(spec.path)):
            with open(path, "rb") as handle:
                for line in handle:
                    line = line.rstrip(b"\n")
                    if not line.strip():
                        continue
                    counts["input"] += 1
                    try:
                        examples.append(to_example(spec.format, parse_json_line(line, config.max_record_bytes),
                                                   source=spec.source, split=spec.split, mapping=spec.mapping))
                    except FormatError as error:
                        counts[stat_category(error.reason)] += 1
    # exact and surface duplicates: smallest id per normalised prompt
    groups = defaultdict(list)
    for example in examples:
        groups[exact_key(example["prompt"])].append(example)
    examples = []
    for group in groups.values():
        group.sort(key=lambda e: (e["id"], e["answer"] or "", e["source"]))
        examples.append(group[0])
        counts["duplicate"] += len(group) - 1
    # near duplicates: LSH buckets, verified pairs, drop rows with a smaller near-duplicate
    bands, rows = lsh_params(config.near_duplicate_threshold, config.minhash_num_perm)
    signatures = {e["id"]: minhash_signature(e["prompt"], num_perm=config.minhash_num_perm,
                                             shingle_size=config.shingle_size, seed=config.minhash_seed)
                  for e in examples}
    buckets = defaultdict(list)
    for identifier, signature in signatures.items():
        for key in lsh_band_keys(signature, bands, rows):
            buckets[key].append(identifier)
    dropped = set()
    for members in buckets.values():
        members = sorted(set(members))
        for j in range(1, len(members)):
            for i in range(j):
                if estimated_jaccard(signatures[members[i]], signatures[members[j]]) >= config.near_duplicate_threshold:
                    dropped.add(members[j])
    counts["near_duplicate"] += len(dropped)
    examples = [e for e in examples if e["id"] not in dropped]
    # decontamination
    index = set()
    for spec in config.decontaminate_against:
        for line in Path(spec.path).read_bytes().splitlines():
            if line.strip():
                try:
                    example = to_example("auto", parse_json_line(line, config.max_record_bytes), source=eval_set_name(spec))
                except FormatError:
                    continue
                index |= ngram_hashes(example["prompt"], config.contamination_ngram)
    kept = [e for e in examples if not (ngram_hashes(e["prompt"], config.contamination_ngram) & index)]
    counts["contaminated"] += len(examples) - len(kept)
    counts["kept"] = len(kept)
    return dict(counts)


def run_pipeline(config: CurateConfig, beam_args: list[str]) -> dict:
    with beam.Pipeline(options=PipelineOptions(beam_args)) as pipeline:
        build(pipeline, config)
    return json.loads(Path(config.output, "stats.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shared", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    parser.add_argument("--with-prism", action="store_true", help="also time the pipeline on Prism")
    parser.add_argument("--repeats", type=int, default=1, help="runs per variant; the best is reported")
    args = parser.parse_args()
    data = Path(args.shared)
    if not (data / "gsm8k" / "train.jsonl").is_file():  # the repository's fixtures are too small to time curation
        parser.error(f"the full datasets are not at {data}: this benchmark curates all of GSM8K and MATH train; "
                     "give their folder with --shared DIR")
    config = CurateConfig(
        inputs=(InputSpec(path=str(data / "gsm8k/train.jsonl"), format="gsm8k"),
                InputSpec(path=str(data / "math/math_train_0*.jsonl"), format="math")),
        decontaminate_against=tuple(InputSpec(path=str(data / p)) for p in (
            "gsm8k/test.jsonl", "math/math500_test.jsonl", "aime24/test.jsonl", "aime25/test.jsonl", "amc23/test.jsonl")))

    def best_of(fn):
        times, result = [], None
        for _ in range(args.repeats):
            start = time.perf_counter()
            result = fn()
            times.append(time.perf_counter() - start)
        return min(times), result

    plain_s, plain_counts = best_of(lambda: curate_in_process(config))
    # The FnApiRunner is the engine of the Python DirectRunner for batch pipelines; naming it pins the
    # engine (the DirectRunner would otherwise hand the pipeline to Prism when its binary is cached).
    variants = {
        "fnapi_1_worker": ["--runner=FnApiRunner", "--direct_num_workers=1"],
        "fnapi_2_workers": ["--runner=FnApiRunner", "--direct_num_workers=2", "--direct_running_mode=multi_processing"],
    }
    if args.with_prism:
        variants["prism"] = ["--runner=PrismRunner"]
    results = {}
    for name, beam_args in variants.items():
        with tempfile.TemporaryDirectory() as out:
            seconds, stats = best_of(lambda: run_pipeline(CurateConfig(**{**config.__dict__, "output": out}), beam_args))
        mismatched = {k: (stats[k], plain_counts.get(k, 0)) for k in ("input", "kept", "duplicate", "near_duplicate",
                                                                        "contaminated", "dead_lettered")
                      if stats[k] != plain_counts.get(k, 0)}
        if mismatched:
            raise SystemExit(f"{name}: pipeline counts differ from the plain implementation: {mismatched}")
        results[name] = seconds
    rows = plain_counts["input"]
    print(json.dumps({
        "benchmark": "curate",
        "rows": rows,
        "counts": plain_counts,
        "baseline": "plain single-process Python, same rlax_core functions",
        "baseline_rows_per_s": round(rows / plain_s, 1),
        **{f"{name}_rows_per_s": round(rows / s, 1) for name, s in results.items()},
        "fnapi_1_worker_vs_baseline": round(plain_s / results["fnapi_1_worker"], 3),
        "speedup_1_to_2_workers": round(results["fnapi_1_worker"] / results["fnapi_2_workers"], 3),
        "seconds": {"baseline": round(plain_s, 2), **{k: round(v, 2) for k, v in results.items()}},
    }, indent=2))


if __name__ == "__main__":
    main()
