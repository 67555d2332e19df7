"""The records that flow between pipelines: one module owns their schemas.

``Example``  a prompt with its reference answer (curation -> filtering -> RL -> evaluation).
``SftExample``      a supervised target: a prompt and its completion, or a whole chat (post-training).
``PreferencePair``  one prompt's chosen and rejected completions (DPO, reward models).
``Rollout``  one sampled completion, stamped with the weight version that generated it; or one
             multi-turn episode (docs/multi_turn.md): its completion is every turn with the
             observations between them, and three more fields say which tokens the policy sampled,
             which version sampled each turn, and what each turn returned.

Rows travel through Beam as plain ``dict``s (cheap to pickle, easy to test) and are written to
parquet with the schemas below, so a reader of any stage sees the same columns and types.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from typing import Any

import numpy as np
import pyarrow as pa

EXAMPLE_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),  # stable hash of source + normalised prompt
        pa.field("source", pa.string(), nullable=False),  # e.g. "gsm8k", "math", "humaneval"
        pa.field("split", pa.string()),
        pa.field("prompt", pa.string(), nullable=False),  # text; chat messages are JSON-encoded
        pa.field("answer", pa.string()),  # reference answer (math), canonical solution (code) or null
        pa.field("task", pa.string(), nullable=False),  # "math", "code", "story", ...
        pa.field("tests", pa.string()),  # code tasks: JSON of the test program / assert list
        pa.field("meta", pa.string()),  # JSON object: subject, level, original ids, ...
        # Set by difficulty filtering; null before it.
        pa.field("pass_rate", pa.float64()),
        pa.field("n_samples", pa.int32()),
        pa.field("filter_model_version", pa.string()),
    ]
)

ROLLOUT_SCHEMA = pa.schema(
    [
        pa.field("example_id", pa.string(), nullable=False),
        pa.field("group_id", pa.string(), nullable=False),  # (run, step, prompt): the G samples of one prompt
        pa.field("sample_idx", pa.int32(), nullable=False),
        pa.field("policy_version", pa.int64(), nullable=False),  # weight version (trainer step) of its oldest token
        pa.field("seed", pa.int64(), nullable=False),
        pa.field("prompt_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("completion_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("behavior_logprobs", pa.list_(pa.float32()), nullable=False),
        pa.field("finish_reason", pa.string(), nullable=False),  # "stop" or "length" (an episode: also "error")
        pa.field("reward", pa.float32()),
        pa.field("reward_info", pa.string()),  # JSON object from the verifier
        # Multi-turn episodes; null for a single-turn rollout (every completion token is the policy's).
        pa.field("policy_mask", pa.list_(pa.int8())),  # per completion token: 1 sampled, 0 observation
        pa.field("turn_versions", pa.list_(pa.int64())),  # weight version of each turn (policy_version: the oldest)
        pa.field("episode", pa.string()),  # JSON: per turn its token span, reward, observation and tool calls
        # Per completion token, the weight version that sampled it: a weight swap that does not drain
        # the engine (engine.on_new_version) moves a running sample on to the new version. Null: all
        # of them policy_version.
        pa.field("token_versions", pa.list_(pa.int64())),
        # A mixture of experts: the experts each token of prompt + completion ran in each sparse layer,
        # what the trainer replays (algorithm.router_replay). Raw bytes of a row-major [tokens,
        # moe_layers, k] array of little-endian uint8 (uint16 beyond 256 experts): 2 bytes per token
        # and sparse layer at top 2, where a list column would add offsets and validity per value.
        # An episode's record covers its whole transcript (observations too). Null for a dense model.
        pa.field("routed_experts", pa.binary()),
        # Per completion token, a reward of its own (on-policy distillation's negative reverse KL to a
        # teacher, rlax_core.rewards.distillation), added to that token's advantage. Null: none.
        pa.field("token_rewards", pa.list_(pa.float32())),
    ]
)
# Fields a row may leave out (they are null then): rollouts written before episodes existed, and
# every single-turn rollout, need not name them.
OPTIONAL_ROLLOUT_FIELDS = ("policy_mask", "turn_versions", "episode", "token_versions", "routed_experts",
                           "token_rewards")

# Post-training (docs/post_training.md). Written by the rejection-sampling pipeline (verified samples
# of the filter, or a teacher's) or brought by users; read by the SFT, DPO and reward-model jobs.
SFT_EXAMPLE_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),  # stable: the source example's id + the completion's hash
        pa.field("source", pa.string()),
        # Either a prompt (text; chat messages JSON-encoded) with its completion (text) ...
        pa.field("prompt", pa.string()),
        pa.field("completion", pa.string()),
        # ... or a whole conversation: JSON list of {"role": "system"|"user"|"assistant"|"tool", "content"}.
        pa.field("messages", pa.string()),
        pa.field("example_id", pa.string()),  # the Example it came from, when it came from one
        pa.field("pass_rate", pa.float64()),  # that prompt's pass rate when it was generated
        pa.field("generator", pa.string()),  # the model (and version) that wrote the completion
        pa.field("meta", pa.string()),  # JSON object
    ]
)
PREFERENCE_PAIR_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("source", pa.string()),
        pa.field("prompt", pa.string(), nullable=False),  # text; chat messages JSON-encoded
        pa.field("chosen", pa.string(), nullable=False),  # the preferred completion (e.g. verified)
        pa.field("rejected", pa.string(), nullable=False),  # the other one (e.g. failed), same prompt
        pa.field("example_id", pa.string()),
        pa.field("pass_rate", pa.float64()),
        pa.field("generator", pa.string()),
        pa.field("meta", pa.string()),  # JSON object: the two samples' rewards, ...
    ]
)
SFT_EXAMPLE_FIELDS = tuple(SFT_EXAMPLE_SCHEMA.names)
PREFERENCE_PAIR_FIELDS = tuple(PREFERENCE_PAIR_SCHEMA.names)

EXAMPLE_FIELDS = tuple(EXAMPLE_SCHEMA.names)
ROLLOUT_FIELDS = tuple(ROLLOUT_SCHEMA.names)


def normalize_text(text: str) -> str:
    """The form used for ids and exact dedup: NFKC, lower case, white space collapsed."""
    return " ".join(unicodedata.normalize("NFKC", text).lower().split())


def example_id(source: str, prompt: str) -> str:
    """Stable id of an example: the same source and (normalised) prompt always give the same id."""
    digest = hashlib.sha256(f"{source}\x00{normalize_text(prompt)}".encode("utf-8")).hexdigest()
    return f"{source}-{digest[:16]}"


def make_example(*, source: str, prompt: str, task: str, answer: str | None = None, split: str | None = None,
                 tests: Any = None, meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """An Example row with every schema field present (filter fields null)."""
    return {
        "id": example_id(source, prompt),
        "source": source,
        "split": split,
        "prompt": prompt,
        "answer": answer,
        "task": task,
        "tests": None if tests is None else json.dumps(tests, sort_keys=True),
        "meta": json.dumps(meta or {}, sort_keys=True),
        "pass_rate": None,
        "n_samples": None,
        "filter_model_version": None,
    }


def rollout_row(completion: Any, *, example_id: str, group_id: str) -> dict[str, Any]:
    """The Rollout row of one engine sample (``rlax_core.inference.Completion``), not yet scored."""
    return {
        "example_id": example_id,
        "group_id": group_id,
        "sample_idx": completion.sample_index,
        "policy_version": completion.weight_version,
        "seed": completion.seed,
        "prompt_ids": list(completion.prompt_ids),
        "completion_ids": list(completion.completion_ids),
        "behavior_logprobs": list(completion.logprobs),
        "finish_reason": completion.finish_reason,
        "reward": None,
        "reward_info": None,
        "token_versions": list(completion.token_versions) if len(set(completion.token_versions)) > 1 else None,
        "routed_experts": routed_experts_bytes(completion.routed_experts),
    }


def routed_experts_bytes(expert_ids: np.ndarray | None) -> bytes | None:
    """A ``routed_experts`` value: the ids [tokens, moe_layers, k] as little-endian row-major bytes."""
    if expert_ids is None:
        return None
    return np.ascontiguousarray(expert_ids, dtype=np.dtype(expert_ids.dtype).newbyteorder("<")).tobytes()


def routed_experts_array(value: bytes, moe_layers: int, experts_per_token: int, dtype: str) -> np.ndarray:
    """The inverse of :func:`routed_experts_bytes`: [tokens, moe_layers, k] of ``dtype``."""
    flat = np.frombuffer(value, np.dtype(dtype).newbyteorder("<"))
    return flat.astype(dtype).reshape(-1, moe_layers, experts_per_token)


def oldest_policy_version(table: pa.Table) -> int:
    """The oldest weight version any token of these rollouts was sampled under: what the trainer's
    staleness bound reads (``rlax_core.weights.is_fresh_enough``)."""
    oldest = min(table.column("policy_version").to_pylist())
    if "token_versions" in table.column_names:
        oldest = min([oldest, *(v for versions in table.column("token_versions").to_pylist() if versions
                                for v in versions)])
    return int(oldest)


def scored_row(row: dict[str, Any], reward: float, info: dict[str, Any]) -> dict[str, Any]:
    """A Rollout row with its reward and the verifier's details (JSON, keys sorted)."""
    return {**row, "reward": float(reward), "reward_info": json.dumps(info, sort_keys=True)}


def to_table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """Rows (dicts) as a table of ``schema``; a missing column or a wrong type raises with its name.

    Only the rollout's optional fields (``OPTIONAL_ROLLOUT_FIELDS``) may be missing: they are null then.
    """
    if schema.equals(ROLLOUT_SCHEMA) and any(name not in row for row in rows for name in OPTIONAL_ROLLOUT_FIELDS):
        rows = [{**dict.fromkeys(OPTIONAL_ROLLOUT_FIELDS), **row} for row in rows]
    missing = [name for name in schema.names if any(name not in row for row in rows)]
    if missing:
        raise ValueError(f"rows lack field(s) {missing} of schema {schema.names}")
    return pa.Table.from_pylist(rows, schema=schema)
