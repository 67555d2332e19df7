"""On-policy distillation: a teacher scores the student's own samples token by token.

    rewards:
      terms: {story_word: 0.0}                 # a verifier at weight 0: logged beside the distillation
      distillation: {teacher: runs/teacher/hf, weight: 1.0}

For each sampled token ``x_t`` of a completion, the teacher's log-prob of it given the same prefix is
read from one forward of the teacher over prompt + completion, and the token's reward is the negative
reverse KL estimate (as prime-rl's and NeMo-RL's on-policy distillation, and TRL's GKD with its
student-generated data)::

    token_reward_t = -weight * (log pi_student(x_t | x_<t) - log pi_teacher(x_t | x_<t))

with the student's log-prob the one the engine sampled with (``behavior_logprobs``: float32, of the
untempered logits). Its mean over a step's tokens is the sample estimate of KL(student || teacher),
which falls as the student learns. The rows carry the rewards (``token_rewards``) and the trainer
adds each token's to that token's advantage, undiscounted (``rl_objective``): the teacher's verdict
on a token is its own credit, as Thinking Machines' on-policy distillation uses it.

The teacher is read where the reward model is (``reward_model.py``'s placement: on the rollout
worker beside the policy's engine, or ``placement: own_stage`` with its resource hints), once per
process (``process_shared``). It must share the student's tokenizer: the token ids are scored as
they are, so a teacher whose tokenizer differs would score other text; ``check_teacher`` refuses that
in one line before the run starts.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Literal, Sequence

import numpy as np

from rlax_core.config import ConfigError, require
from rlax_core.rewards.registry import RewardUnavailable
from rlax_core.rewards.reward_model import check_placement, length_bucket, process_shared


@dataclasses.dataclass(frozen=True)
class DistillationConfig:
    teacher: str = ""  # the teacher: a Hugging Face folder or a llama2.c .bin (local or gs://); empty: off
    tokenizer: str = ""  # the teacher's tokenizer, when not beside its weights
    weight: float = 1.0  # token_reward = -weight * (student log-prob - teacher log-prob)
    dtype: str = "float32"
    batch_size: int = 16  # sequences per teacher forward (padded to it: one compiled shape per length bucket)
    max_length: int = 2048  # prompt + completion tokens; a longer sample stops the job (raise it)
    # As rewards.reward_model's: "rollout_worker" (beside the policy's engine) or "own_stage" (a
    # scoring stage of its own, on workers with Beam's resource_hints).
    placement: Literal["rollout_worker", "own_stage"] = "rollout_worker"
    resource_hints: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        check_placement(self.placement, self.resource_hints)
        require(self.weight > 0 and np.isfinite(self.weight), "weight", "must be a finite number > 0")
        require(self.batch_size >= 1, "batch_size", "must be >= 1")
        require(self.max_length >= 2, "max_length", "must be >= 2")

    @property
    def enabled(self) -> bool:
        return bool(self.teacher)


def tokenizer_fingerprint(tokenizer) -> tuple[int, str]:
    """(vocabulary size, a digest of every id's text and the special ids): equal for one tokenizer."""
    digest = hashlib.sha256(repr((tokenizer.bos_id, tokenizer.eos_id)).encode())
    for token in range(tokenizer.vocab_size):
        digest.update(tokenizer.decode([token]).encode("utf-8", "surrogatepass") + b"\x00")
    return tokenizer.vocab_size, digest.hexdigest()


def _first_difference(student, teacher) -> str:
    if student.vocab_size != teacher.vocab_size:
        return f"{student.vocab_size} tokens against the teacher's {teacher.vocab_size}"
    for token in range(student.vocab_size):
        mine, theirs = student.decode([token]), teacher.decode([token])
        if mine != theirs:
            return f"id {token} is {mine!r} for the student, {theirs!r} for the teacher"
    return "their special tokens differ"


def check_teacher(student_model: str, settings: DistillationConfig, key: str = "rewards.distillation.teacher") -> None:
    """Refuse (``ConfigError``, one line) a teacher whose tokenizer is not the student's."""
    if not settings.enabled:
        return
    from rlax_core.models.export import tokenizer_source_of
    from rlax_core.models.tokenizer import load_tokenizer

    student = load_tokenizer(tokenizer_source_of(student_model))
    teacher = load_tokenizer(settings.tokenizer or tokenizer_source_of(settings.teacher))
    if tokenizer_fingerprint(student) != tokenizer_fingerprint(teacher):
        raise ConfigError(key, f"{settings.teacher}: its tokenizer is not the student's ({_first_difference(student, teacher)}); "
                               "on-policy distillation scores the student's own token ids, so the teacher must share its tokenizer")


def teacher_token_logprobs(params, config, tokens, attention_mask):
    """[B, T-1] float32: log pi_teacher(token t+1 | tokens <= t), the policy's own log-prob function."""
    from rlax_core.training.logprobs import token_logprobs

    return token_logprobs(params, config, tokens, attention_mask)[0]


class Teacher:
    """The teacher's log-probs of samples' completion tokens, ``batch_size`` sequences per forward."""

    def __init__(self, settings: DistillationConfig, student_model: str):
        import jax

        from rlax_core.models.checkpoint import from_pretrained

        check_teacher(student_model, settings)
        self.settings = settings
        model = process_shared(("teacher", settings.teacher, settings.dtype),
                               lambda: from_pretrained(settings.teacher, dtype=settings.dtype))
        if model.config.score_head:
            raise RewardUnavailable(f"rewards.distillation.teacher {settings.teacher}: a reward model, not a causal "
                                    "language model (a teacher gives log-probs of tokens)")
        self.model_config, self.params = model.config, model.params
        self.pad_id = self.model_config.pad_token_id or 0
        shape = self.model_config
        self._forward = process_shared(("teacher_forward", shape), lambda: jax.jit(
            lambda params, tokens, mask: teacher_token_logprobs(params, shape, tokens, mask)))

    def completion_logprobs(self, samples: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[np.ndarray]:
        """Per (prompt ids, completion ids): the teacher's log-prob of each completion token [n] float32."""
        limit = self.settings.max_length
        for prompt, completion in samples:
            if len(prompt) + len(completion) > limit:
                raise RewardUnavailable(f"a sample of {len(prompt)} + {len(completion)} tokens is longer than "
                                        f"rewards.distillation.max_length={limit}; raise it")
        size, out = self.settings.batch_size, []
        for start in range(0, len(samples), size):
            chunk = samples[start:start + size]
            width = length_bucket(max(len(p) + len(c) for p, c in chunk), limit)
            tokens = np.full((size, width), self.pad_id, np.int32)
            mask = np.zeros((size, width), np.int32)
            mask[len(chunk):, 0] = 1  # filler rows read one pad token
            for row, (prompt, completion) in enumerate(chunk):
                ids = [*prompt, *completion]
                tokens[row, :len(ids)], mask[row, :len(ids)] = ids, 1
            logprobs = np.asarray(self._forward(self.params, tokens, mask))
            # Completion token k sits at position len(prompt) + k, predicted at the position before it.
            out.extend(logprobs[row, len(p) - 1:len(p) - 1 + len(c)].astype(np.float32)
                       for row, (p, c) in enumerate(chunk))
        return out


def distill_rows(teacher: Teacher, rows: list[dict]) -> list[dict]:
    """Scored Rollout rows with their ``token_rewards`` (0 at an episode's observation tokens) and, in
    ``reward_info``, the sample's ``distillation``: its tokens and summed reverse-KL estimate."""
    import json

    teacher_logprobs = teacher.completion_logprobs([(row["prompt_ids"], row["completion_ids"]) for row in rows])
    weight, out = teacher.settings.weight, []
    for row, theirs in zip(rows, teacher_logprobs):
        policy = np.ones(len(theirs), np.float32) if row.get("policy_mask") is None else \
            np.asarray(row["policy_mask"], np.float32)
        reverse_kl = (np.asarray(row["behavior_logprobs"], np.float32) - theirs) * policy
        info = json.loads(row["reward_info"] or "{}")
        info["distillation"] = {"tokens": int(policy.sum()), "reverse_kl_sum": float(reverse_kl.sum()),
                                "reverse_kl": float(reverse_kl.sum() / max(policy.sum(), 1.0))}
        out.append({**row, "token_rewards": (-weight * reverse_kl).tolist(),
                    "reward_info": json.dumps(info, sort_keys=True)})
    return out
