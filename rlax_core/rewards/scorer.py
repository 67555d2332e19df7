"""``Rewarder``: the weighted sum of the configured reward terms, for one sample or a batch.

One sample never fails a batch: whatever a term raises for it (a verifier's bug, a user function's
exception, a malformed example, a non-finite score) is that sample's reward 0, with the reason under
``reward_info["scoring_error"]`` and a count in ``Rewarder.failures``. Only a scorer that cannot
work at all (``registry.SCORER_UNAVAILABLE``: a term's ``RewardUnavailable``, a sandbox that cannot
start) goes up, once, and stops the job.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
from typing import Any, Mapping, Sequence

from rlax_core.rewards.config import RewardConfig
from rlax_core.rewards.custom import import_reward_modules
from rlax_core.rewards.registry import REWARDS, SCORER_UNAVAILABLE, RewardResult, RewardTerm, Sample, scoring_failure

log = logging.getLogger(__name__)
LOGGED_FAILURES = 20  # per Rewarder; later ones are counted, not logged


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
        self.failures: collections.Counter[str] = collections.Counter()  # term name -> samples it failed
        self._failures_lock = threading.Lock()

    def score_many(self, samples: Sequence[Sample]) -> list[RewardResult]:
        per_term = {name: self._term_results(name, term, samples) for name, term in self.terms.items()}
        results = []
        for index in range(len(samples)):
            total, info, passes, errors = 0.0, {}, [], []
            for name, weight in self.config.terms.items():
                score, term_info = per_term[name][index]
                total += weight * score
                info[name] = {"score": score, **term_info}
                if "scoring_error" in term_info:
                    errors.append(f"{name}: {term_info['scoring_error']}")
                if "pass" in term_info:
                    passes.append(bool(term_info["pass"]))
            record: dict[str, Any] = {"pass": bool(passes) and all(passes) and not errors, "terms": info}
            if errors:
                total, record["scoring_error"] = 0.0, "; ".join(errors)
            results.append(RewardResult(total, record))
        return results

    def _term_results(self, name: str, term: RewardTerm, samples: Sequence[Sample]) -> list[RewardResult]:
        """The term's results for the batch; when the batch fails, sample by sample, so one bad sample
        costs only its own reward."""
        try:
            return [self._checked(name, result) for result in self._run(term, samples)]
        except SCORER_UNAVAILABLE:
            raise
        except Exception as error:  # noqa: BLE001 - find the sample(s) at fault below
            if len(samples) == 1:
                return [self._failed(name, samples[0], f"{type(error).__name__}: {error}")]
        results = []
        for sample in samples:
            try:
                results.append(self._checked(name, self._run(term, [sample])[0]))
            except SCORER_UNAVAILABLE:
                raise
            except Exception as error:  # noqa: BLE001 - any failure of this sample is its own
                results.append(self._failed(name, sample, f"{type(error).__name__}: {error}"))
        return results

    @staticmethod
    def _run(term: RewardTerm, samples: Sequence[Sample]) -> list[RewardResult]:
        results = list(term.score_many(samples))
        if len(results) != len(samples):
            raise ValueError(f"{type(term).__name__} returned {len(results)} results for {len(samples)} samples")
        return results

    def _checked(self, name: str, result: RewardResult) -> RewardResult:
        score, info = result
        score = float(score)
        if not math.isfinite(score):
            raise ValueError(f"score is {score}")
        if "scoring_error" in info:  # the term isolated the failure itself
            self._count(name, str(info["scoring_error"]))
        return RewardResult(score, dict(info))

    def _failed(self, name: str, sample: Sample, reason: str) -> RewardResult:
        self._count(name, reason, sample)
        return scoring_failure(reason)

    def _count(self, name: str, reason: str, sample: Sample | None = None) -> None:
        with self._failures_lock:
            self.failures[name] += 1
            total = sum(self.failures.values())
        if total <= LOGGED_FAILURES:
            example = sample.example.get("id", "?") if sample is not None else "?"
            log.warning("reward %s could not score a sample of example %s (scored 0): %s%s", name, example,
                        reason[:300], "; later failures are only counted" if total == LOGGED_FAILURES else "")

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


def failed_samples(results: Sequence[RewardResult]) -> int:
    """How many of ``results`` are samples that could not be scored (what a pipeline's counter counts)."""
    return sum("scoring_error" in info for _, info in results)

