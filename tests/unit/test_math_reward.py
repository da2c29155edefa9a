"""rewards.math: boxed-answer extraction and equivalence on hand cases (GSM8K and MATH styles)."""

from __future__ import annotations

import pytest
from asyncrl_workloads.rewards import loader, math


@pytest.mark.parametrize(
    ("response", "boxed"),
    [
        ("so the answer is \\boxed{42}.", "42"),
        ("\\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # the last box
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\fbox{7}", "7"),
        ("\\boxed{x^{2}+1}", "x^{2}+1"),  # nested braces
        ("no box here: 42", None),
        ("cut off \\boxed{\\frac{1}{", None),
    ],
)
def test_the_last_boxed_answer_is_extracted(response: str, boxed: str | None) -> None:
    assert math.last_boxed(response) == boxed


@pytest.mark.parametrize(
    ("given", "reference"),
    [
        ("42", "42"),
        ("1,234", "1234"),
        ("\\$18", "18"),
        ("18.00", "18"),
        ("50\\%", "50"),
        ("\\frac{1}{2}", "0.5"),
        ("\\dfrac{3}{4}", "3/4"),
        ("\\frac12", "1/2"),
        ("\\text{ 5 }", "5"),
        ("-3", "-3.0"),
        ("x = 7", "7"),
        ("\\left( 1, 2 \\right)", "(1,2)"),
        ("10^\\circ", "10"),
    ],
)
def test_equivalent_answers(given: str, reference: str) -> None:
    assert math.equivalent(given, reference)


@pytest.mark.parametrize(
    ("given", "reference"),
    [("41", "42"), ("1/3", "0.33"), ("", "0"), ("x+1", "x+2"), ("\\frac{1}{2}", "2")],
)
def test_different_answers(given: str, reference: str) -> None:
    assert not math.equivalent(given, reference)


def test_gsm8k_solutions_are_graded_by_their_final_answer() -> None:
    record = {"prompt": "...", "answer": "Natalia sold 48/2 = 24 clips in May.\n#### 72"}
    assert math.boxed_answer(record, "48 + 24 = 72, so \\boxed{72}") == 1.0
    assert math.boxed_answer(record, "\\boxed{24}") == 0.0
    assert math.boxed_answer(record, "72") == 0.0  # no box, no credit: the format is part of the task


def test_a_record_without_an_answer_is_an_error_not_a_zero() -> None:
    with pytest.raises(KeyError, match="answer"):
        math.boxed_answer({"prompt": "p"}, "\\boxed{1}")


def test_the_example_jobs_reference_loads() -> None:
    fn = loader.load_reward("asyncrl_workloads.rewards.math:boxed_answer")
    assert loader.score(fn, {"answer": "\\frac{1}{2}"}, "\\boxed{0.5}") == 1.0
