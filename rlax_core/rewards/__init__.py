"""Verifiers: math answers, sandboxed code and format, selected by name in config.

    from rlax_core.rewards import Rewarder, RewardConfig, math_equal

    math_equal("\\frac{1}{2}", "0.5")                       # True; never hangs (hard 10 s timeout)
    config = from_dict(RewardConfig, {"terms": {"task": 1.0, "format_boxed": 0.1}})
    with Rewarder(config) as rewarder:
        reward, info = rewarder(example, completion_text)    # example: an Example row (answer / tests / task)

Modules: ``answers`` (final-answer extraction), ``math_verifier`` (equivalence in a killable process
pool), ``code_verifier`` (HumanEval / MBPP / assert tests, per-test verdicts, parallel pool) with
``code_driver`` (the program's side), ``code_judge`` (the tests' side, which decides) and
``plain_data`` (the only values that cross between them), ``terms``
(the built-in reward terms), ``registry`` (names -> terms), ``config``, ``scorer`` (``Rewarder``),
``custom`` (a user's terms and functions), ``reward_model`` and ``judge`` (learned rewards,
docs/reward_models.md). The sandbox that runs code is ``rlax_core.sandbox``.
"""

from rlax_core.rewards.answers import EXTRACTION_METHODS, ExtractedAnswer, extract_answer, last_boxed
from rlax_core.rewards.code_verifier import CodeResult, CodeTests, CodeVerifier, TestVerdict, run_tests
from rlax_core.rewards.config import CodeRewardConfig, FormatConfig, RewardConfig
from rlax_core.rewards.math_verifier import MathResult, MathVerifier, MathVerifierConfig, math_equal
from rlax_core.rewards.registry import (REWARDS, RewardResult, RewardTerm, RewardUnavailable, Sample, register_reward,
                                       reward_names, scoring_failure)
import rlax_core.rewards.terms  # noqa: F401,E402 - registers the built-in terms before any RewardConfig is made
import rlax_core.rewards.judge  # noqa: F401,E402 - the learned terms: judge and reward_model
import rlax_core.rewards.reward_model  # noqa: F401,E402
from rlax_core.rewards.scorer import Rewarder, failed_samples

__all__ = [
    "EXTRACTION_METHODS", "ExtractedAnswer", "extract_answer", "last_boxed",
    "CodeResult", "CodeTests", "CodeVerifier", "TestVerdict", "run_tests",
    "CodeRewardConfig", "FormatConfig", "RewardConfig",
    "MathResult", "MathVerifier", "MathVerifierConfig", "math_equal",
    "REWARDS", "RewardResult", "RewardTerm", "RewardUnavailable", "Sample", "register_reward", "reward_names",
    "scoring_failure",
    "Rewarder", "failed_samples",
]
