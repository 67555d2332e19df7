"""``Rewarder``: the weighted sum of the configured reward terms, for one sample or a batch."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from rlax_core.rewards.config import RewardConfig
from rlax_core.rewards.custom import import_reward_modules
from rlax_core.rewards.registry import REWARDS, RewardResult, Sample


class Rewarder:
    """Scores completions with ``config.terms``; info holds each term's score and info, and ``pass``.

    ``pass`` is true when every correctness term (one that reports ``pass``) passed. Called as
    ``rewarder(example, text, finish_reason)`` it has the shape of ``rlax_core.tasks`` scorers.
    """

    def __init__(self, config: RewardConfig = RewardConfig()):
        # The built-in terms and the config's own modules and functions: a config unpickled on a Beam
        # worker names them but has not imported them there (seqio's modules_to_import).
        import_reward_modules(config.modules, config.functions)
        self.config = config
        self.terms = {name: REWARDS[name](config) for name in config.terms}

    def score_many(self, samples: Sequence[Sample]) -> list[RewardResult]:
        per_term = {name: term.score_many(samples) for name, term in self.terms.items()}
        results = []
        for index in range(len(samples)):
            total, info, passes = 0.0, {}, []
            for name, weight in self.config.terms.items():
                score, term_info = per_term[name][index]
                total += weight * score
                info[name] = {"score": score, **term_info}
                if "pass" in term_info:
                    passes.append(bool(term_info["pass"]))
            results.append(RewardResult(total, {"pass": bool(passes) and all(passes), "terms": info}))
        return results

    def __call__(self, example: Mapping[str, Any], completion: str, finish_reason: str = "stop",
                 num_tokens: int | None = None) -> RewardResult:
        return self.score_many([Sample(example, completion, finish_reason, num_tokens)])[0]

    def close(self) -> None:
        for term in self.terms.values():
            term.close()

    def __enter__(self) -> "Rewarder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
