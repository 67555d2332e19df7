"""A schedule step's rollout-side metrics, from the summaries of its groups.

A group's summary is small (it travels through a GroupByKey to the step's last stage); the step's
row is written beside the rollout store (``RolloutStore.write_step_metrics``) and joined with the
trainer's by ``rlax launch``.
"""

from __future__ import annotations

import json
import math

# Rewards a model gives (rlax_core.rewards.reward_model, judge): beside a verifier's pass, each step
# logs their mean and their correlation with pass, so a policy that raises the learned score without
# passing more (reward hacking) shows in the step's row.
LEARNED_TERMS = ("reward_model", "judge")


def group_summary(group: dict, *, written: bool) -> dict:
    """What the step's metrics need of one group (small: it travels through a GroupByKey)."""
    rows = group["rows"]
    infos = [json.loads(row["reward_info"]) for row in rows]
    learned = {name: [info.get("terms", {}).get(name, {}).get("score") for info in infos] for name in LEARNED_TERMS}
    return {
        "slot": group["key"][1],
        "written": written,
        "rewards": [row["reward"] for row in rows],
        "passes": [bool(info.get("pass", False)) for info in infos],
        "learned": {name: scores for name, scores in learned.items() if any(s is not None for s in scores)},
        # Judge answers where nothing parsed (scored by the judge's stated default).
        "judge_unparsed": sum(info.get("terms", {}).get("judge", {}).get("judge_parsed") is False for info in infos),
        # On-policy distillation (rewards.distillation): the group's reverse-KL estimate to the teacher, summed over tokens.
        "distillation": [sum(info["distillation"][key] for info in infos) for key in ("reverse_kl_sum", "tokens")]
        if infos and all("distillation" in info for info in infos) else None,
        "lengths": [len(row["completion_ids"]) for row in rows],
        "versions": [row["policy_version"] for row in rows],
        "generate_seconds": group["generate_seconds"],
        "worker": group["worker"],
        "timeline": group.get("timeline", {}),  # a group made outside GenerateRollouts may carry none
    }


def step_metrics(step: int, summaries: list[dict]) -> dict:
    """Rollout-side metrics of one schedule step from its groups' summaries."""
    rewards = [r for s in summaries for r in s["rewards"]]
    passes = [p for s in summaries for p in s["passes"]]
    lengths = [n for s in summaries for n in s["lengths"]]
    seconds = sum(s["generate_seconds"] for s in summaries)
    return {
        "step": step,
        "policy_version": min(v for s in summaries for v in s["versions"]),
        "groups": len(summaries),
        "groups_dropped_uniform": sum(not s["written"] for s in summaries),
        "workers": len({s["worker"] for s in summaries}),  # SDK processes that generated the step
        # Engine calls that generated it (one clock per call): more than one per worker splits its batch.
        "engine_calls": len({(s["worker"], s["timeline"].get("generate_call_t")) for s in summaries}),
        "reward_mean": sum(rewards) / len(rewards),
        "pass_rate": sum(passes) / len(passes),
        "response_length_mean": sum(lengths) / len(lengths),
        "rollout_seconds": seconds,
        "rollout_tokens_per_s": sum(lengths) / seconds if seconds > 0 else None,
        **step_timeline_clocks([s["timeline"] for s in summaries]),
        **learned_reward_metrics(summaries),
        **distillation_metrics(summaries),
    }


def distillation_metrics(summaries: list[dict]) -> dict:
    """``distill_reverse_kl``: the step's mean per-token reverse KL of the student to the teacher
    (student log-prob minus teacher log-prob of each sampled token), when the run distills."""
    parts = [s["distillation"] for s in summaries if s.get("distillation")]
    tokens = sum(count for _, count in parts)
    return {"distill_reverse_kl": sum(total for total, _ in parts) / tokens} if tokens else {}


def learned_reward_metrics(summaries: list[dict]) -> dict:
    """Per learned term: ``<term>_mean`` and ``<term>_pass_correlation`` (Pearson, over the step's
    samples; None where either side is constant)."""
    row = {}
    for name in LEARNED_TERMS:
        pairs = [(score, float(passed)) for s in summaries
                 for score, passed in zip(s.get("learned", {}).get(name, ()), s["passes"]) if score is not None]
        if pairs:
            row[f"{name}_mean"] = sum(score for score, _ in pairs) / len(pairs)
            row[f"{name}_pass_correlation"] = pearson([score for score, _ in pairs], [p for _, p in pairs])
    if "judge_mean" in row:
        row["judge_parse_failures"] = sum(s.get("judge_unparsed", 0) for s in summaries)
    return row


def pearson(xs: list[float], ys: list[float]) -> float | None:
    """The correlation of two equally long lists, or None when either is constant."""
    n = len(xs)
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    cov = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys))
    var_x, var_y = sum((x - mean_x) ** 2 for x in xs), sum((y - mean_y) ** 2 for y in ys)
    return cov / math.sqrt(var_x * var_y) if var_x > 0 and var_y > 0 else None


# How a step's groups' clocks combine into the step's: it starts with its first group and ends with its last.
_FIRST = ("version_seen_t", "scheduled_t", "generate_call_t")
_LAST = ("swap_s", "generated_t", "scored_t", "written_t")


def step_timeline_clocks(clocks: list[dict]) -> dict:
    """The step's ``timeline/...`` metrics from its groups' clocks (format: rlax_core.utils.timeline);
    clocks a group lacks are left out."""
    row = {}
    scheduled = [c["scheduled_version"] for c in clocks if c.get("scheduled_version") is not None]
    if scheduled:
        row["timeline/scheduled_version"] = min(scheduled)
    swapped = [c["swap_version"] for c in clocks if c.get("swap_version") is not None]
    if swapped:
        row["timeline/swap_version"] = max(swapped)
    for name in _FIRST + _LAST:
        values = [c[name] for c in clocks if c.get(name) is not None]
        if values:
            row[f"timeline/{name}"] = (min if name in _FIRST else max)(values)
    return row
