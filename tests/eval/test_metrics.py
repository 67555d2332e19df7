"""pass@k against the exact combinatorial formula and brute-force enumeration; maj@k and mean@n."""

import itertools
from fractions import Fraction
from math import comb

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlax_core.eval import maj_at_k, mean_at_n, pass_at_k, summarize_prompts


def exact_pass_at_k(n, c, k):
    return 1 - Fraction(comb(n - c, k), comb(n, k))


def brute_force_pass_at_k(n, c, k):
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(samples[i] for i in subset) for subset in subsets), len(subsets))


@pytest.mark.parametrize("n", range(1, 11))
def test_pass_at_k_matches_brute_force_enumeration(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            expected = brute_force_pass_at_k(n, c, k)
            assert expected == exact_pass_at_k(n, c, k)
            assert pass_at_k(n, c, k) == pytest.approx(float(expected), abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 400).flatmap(lambda n: st.tuples(st.just(n), st.integers(0, n), st.integers(1, n))))
def test_pass_at_k_matches_exact_formula_for_large_n(args):
    n, c, k = args
    assert pass_at_k(n, c, k) == pytest.approx(float(exact_pass_at_k(n, c, k)), rel=1e-9, abs=1e-12)


def test_pass_at_k_edge_values():
    assert pass_at_k(10, 0, 5) == 0.0
    assert pass_at_k(10, 10, 1) == 1.0
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(10, 1, 10) == 1.0


@pytest.mark.parametrize("n,c,k", [(5, 2, 0), (5, 2, 6), (5, 6, 1), (5, -1, 1)])
def test_pass_at_k_rejects_impossible_arguments(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_mean_at_n():
    assert mean_at_n([True, False, False, True]) == 0.5
    with pytest.raises(ValueError):
        mean_at_n([])


def test_maj_at_k_votes_in_disjoint_groups():
    answers = ["4", "4", "5", "5", "5", "4", None, None]
    correct = [True, True, False, False, False, True, False, False]
    # groups of 2: (4,4)->4 right, (5,5)->5 wrong, (5,4)->5 first wins the tie, wrong, (None,None) wrong
    assert maj_at_k(answers, correct, 2) == 0.25
    # groups of 4: (4,4,5,5) tie -> 4 first -> right; (5,4,None,None) -> 5 appears first with count 1 -> wrong
    assert maj_at_k(answers, correct, 4) == 0.5
    assert maj_at_k(answers, correct, 1) == 3 / 8  # maj@1 is mean@n


def test_maj_at_k_counts_a_majority_of_an_equivalent_right_answer():
    # the majority answer "5" is right even where that particular sample was not flagged (same canonical answer)
    assert maj_at_k(["5", "5", "6"], [True, False, False], 3) == 1.0


def test_summarize_prompts_averages_and_skips_large_k():
    summary = summarize_prompts(
        [
            {"correct": [True, False, False, False], "answers": ["1", "2", "2", "3"]},
            {"correct": [True, True], "answers": ["7", "7"]},
        ],
        ks=[1, 4],
    )
    assert summary["pass@1"] == pytest.approx((0.25 + 1.0) / 2)
    assert summary["pass@4"] == pytest.approx(1.0)  # only the first prompt has 4 samples
    assert summary["maj@4"] == 0.0
    assert summary["mean@n"] == pytest.approx(0.625)
