"""Offline evaluation: verified samples -> per-prompt results -> one report (JSON, Markdown, PNG)."""

from __future__ import annotations

import json

import apache_beam as beam

from rlax_core.eval.report import build_report, plot_report, to_markdown


def per_prompt_result(result) -> dict:
    """The record one prompt contributes to the report (and to ``samples-*.jsonl``)."""
    example = result["example"]
    meta = json.loads(example.get("meta") or "{}")
    return {"model": result["model"], "dataset": example["source"], "id": example["id"],
            "task": example["task"], "subject": meta.get("subject"), "level": meta.get("level"), "answer": example.get("answer"),
            "correct": result["correct"], "answers": result["answers"], "lengths": result["lengths"],
            "finish_reasons": result["finish_reasons"], "texts": result["texts"], "skipped": result["skipped"]}


class BuildReport(beam.PTransform):
    """Per-prompt results -> ``(file name, bytes)`` for report.json, report.md and the PNG plots."""

    def __init__(self, ks, title: str):
        super().__init__()
        self.ks, self.title = tuple(ks), title

    def expand(self, results):
        ks, title = self.ks, self.title

        def files(rows):
            report = build_report([r for r in rows if not r["skipped"]], ks)
            report["skipped"] = sorted(f"{r['model']}:{r['id']}" for r in rows if r["skipped"])
            yield "report.json", json.dumps(report, indent=2, sort_keys=True).encode("utf-8")
            yield "report.md", to_markdown(report, title).encode("utf-8")
            yield from plot_report(report).items()

        return results | "AllResults" >> beam.combiners.ToList() | "Render" >> beam.FlatMap(files)
