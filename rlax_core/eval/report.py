"""Evaluation reports: per-prompt verdicts -> metrics by model, dataset, subject and level.

A text-to-SQL dataset (task ``sql``) also gets its execution accuracy (the share of samples whose
query's results match the gold query's), overall and by difficulty level.

A per-prompt result is a dict ``{model, dataset, task, subject, level, correct: [bool], answers: [str|None],
lengths: [int]}`` (one entry per sample). :func:`build_report` aggregates them, :func:`to_markdown`
renders the tables (models side by side), :func:`plot_report` draws the PNGs.
"""

from __future__ import annotations

import io
from collections import defaultdict
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from rlax_core.eval.metrics import summarize_prompts


def _metrics(results: Sequence[Mapping[str, Any]], ks: Sequence[int]) -> dict[str, Any]:
    # maj@k needs answers to vote on: math has them (even when a model gives none), stories do not
    voting = any(r.get("task") == "math" or any(a is not None for a in r["answers"]) for r in results)
    summary = summarize_prompts(results, ks)
    if not voting:  # a task without comparable answers (story) has no majority vote
        summary = {name: value for name, value in summary.items() if not name.startswith("maj@")}
    if any(r.get("task") == "sql" for r in results):  # text-to-SQL: the share of samples whose results match
        correct = [bool(c) for r in results for c in r["correct"]]
        summary["execution_accuracy"] = float(np.mean(correct)) if correct else 0.0
    lengths = np.asarray([n for r in results for n in r["lengths"]], dtype=np.float64)
    summary.update({"prompts": len(results), "samples": int(lengths.size),
                    "length_mean": float(lengths.mean()) if lengths.size else 0.0,
                    "length_p50": float(np.percentile(lengths, 50)) if lengths.size else 0.0,
                    "length_p90": float(np.percentile(lengths, 90)) if lengths.size else 0.0})
    return summary


def build_report(results: Iterable[Mapping[str, Any]], ks: Sequence[int]) -> dict[str, Any]:
    """``{"ks": ks, "models": {model: {dataset: {"overall", "by_subject", "by_level", "lengths"}}}}``."""
    grouped: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for result in results:
        grouped[result["model"]][result["dataset"]].append(result)
    models: dict[str, Any] = {}
    for model, datasets in sorted(grouped.items()):
        models[model] = {}
        for dataset, rows in sorted(datasets.items()):
            by_subject, by_level = defaultdict(list), defaultdict(list)
            for row in rows:
                if row.get("subject"):
                    by_subject[str(row["subject"])].append(row)
                if row.get("level") is not None:
                    by_level[str(row["level"])].append(row)
            models[model][dataset] = {
                "overall": _metrics(rows, ks),
                "by_subject": {s: _metrics(r, ks) for s, r in sorted(by_subject.items())},
                "by_level": {lv: _metrics(r, ks) for lv, r in sorted(by_level.items())},
                "lengths": sorted(n for r in rows for n in r["lengths"]),
            }
    return {"ks": list(ks), "models": models}


def _metric_names(report: Mapping[str, Any]) -> list[str]:
    names = {name for datasets in report["models"].values() for d in datasets.values() for name in d["overall"]
             if "@" in name}
    order = {"mean": 0, "pass": 1, "maj": 2}
    return sorted(names, key=lambda n: (order.get(n.split("@")[0], 3), int(n.split("@")[1]) if n[-1].isdigit() else 0))


def to_markdown(report: Mapping[str, Any], title: str = "Evaluation") -> str:
    """Markdown tables: one row per (dataset, model), models side by side for each dataset."""
    names = _metric_names(report)
    datasets = sorted({d for m in report["models"].values() for d in m})
    lines = [f"# {title}", "", "| dataset | model | prompts | " + " | ".join(names) + " | mean length |",
             "|---" * (len(names) + 4) + "|"]
    for dataset in datasets:
        for model, per_dataset in report["models"].items():
            if dataset in per_dataset:
                o = per_dataset[dataset]["overall"]
                cells = " | ".join(f"{o[n]:.3f}" if n in o else "-" for n in names)
                lines.append(f"| {dataset} | {model} | {o['prompts']} | {cells} | {o['length_mean']:.1f} |")
    for breakdown, label in (("by_subject", "subject"), ("by_level", "level")):
        rows = []
        for dataset in datasets:
            for model, per_dataset in report["models"].items():
                for key, o in per_dataset.get(dataset, {}).get(breakdown, {}).items():
                    rows.append(f"| {dataset} | {label} {key} | {model} | {o['prompts']} | "
                                + " | ".join(f"{o[n]:.3f}" if n in o else "-" for n in names) + " |")
        if rows:
            lines += ["", f"## By {label}", "", f"| dataset | {label} | model | prompts | " + " | ".join(names) + " |",
                      "|---" * (len(names) + 4) + "|", *rows]
    return "\n".join(lines + _execution_accuracy(report, datasets)) + "\n"


def _execution_accuracy(report: Mapping[str, Any], datasets: Sequence[str]) -> list[str]:
    """Text-to-SQL datasets: execution accuracy overall and by difficulty level, models side by side."""
    rows = []
    for dataset in datasets:
        for model, per_dataset in report["models"].items():
            found = per_dataset.get(dataset, {})
            if "execution_accuracy" not in found.get("overall", {}):
                continue
            for level, o in [("all", found["overall"]), *found.get("by_level", {}).items()]:
                rows.append(f"| {dataset} | {level} | {model} | {o['prompts']} | {o['execution_accuracy']:.3f} |")
    if not rows:
        return []
    return ["", "## Execution accuracy (text-to-SQL)", "", "| dataset | level | model | prompts | execution accuracy |",
            "|---|---|---|---|---|", *rows]


def plot_report(report: Mapping[str, Any]) -> dict[str, bytes]:
    """PNG images: ``pass_at_k.png`` (pass@k curves per dataset and model) and ``lengths.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = sorted({d for m in report["models"].values() for d in m})
    images: dict[str, bytes] = {}
    if not datasets:
        return images
    fig, axes = plt.subplots(1, len(datasets), figsize=(4.5 * len(datasets), 3.5), squeeze=False)
    for ax, dataset in zip(axes[0], datasets):
        for model, per_dataset in report["models"].items():
            overall = per_dataset.get(dataset, {}).get("overall", {})
            ks = [k for k in report["ks"] if f"pass@{k}" in overall]
            ax.plot(ks, [overall[f"pass@{k}"] for k in ks], marker="o", label=model)
        ax.set(title=dataset, xlabel="k", ylabel="pass@k", ylim=(0, 1.02), xscale="log", xticks=report["ks"])
        ax.set_xticklabels([str(k) for k in report["ks"]])
        ax.minorticks_off()
        ax.legend(fontsize=8)
    images["pass_at_k.png"] = _png(fig, plt)
    fig, axes = plt.subplots(1, len(datasets), figsize=(4.5 * len(datasets), 3.5), squeeze=False)
    for ax, dataset in zip(axes[0], datasets):
        for model, per_dataset in report["models"].items():
            lengths = per_dataset.get(dataset, {}).get("lengths", [])
            if lengths:
                ax.hist(lengths, bins=20, alpha=0.5, label=model)
        ax.set(title=dataset, xlabel="response length (tokens)", ylabel="samples")
        ax.legend(fontsize=8)
    images["lengths.png"] = _png(fig, plt)
    return images


def pass_rate_histogram(pass_rates: Sequence[float], band: tuple[float, float], title: str) -> bytes:
    """PNG histogram of per-prompt pass rates with the kept band shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.hist(pass_rates, bins=np.linspace(0, 1, 21), color="tab:blue", edgecolor="white")
    ax.axvspan(band[0], band[1], color="tab:green", alpha=0.15, label=f"kept [{band[0]:g}, {band[1]:g}]")
    ax.set(title=title, xlabel="pass rate", ylabel="prompts", xlim=(0, 1))
    ax.legend(fontsize=8)
    return _png(fig, plt)


def _png(fig, plt) -> bytes:
    buffer = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()
