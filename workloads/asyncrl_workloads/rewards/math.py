"""Math answer rewards for GSM8K- and MATH-style data: `asyncrl_workloads.rewards.math:boxed_answer`.

Referenced from a job's ``spec.reward.function`` (examples/job.yaml) and called by the rollout's scorer
(rewards/scorer.py) once per sample as ``boxed_answer(record, response)``. The record's reference answer is
``record["answer"]``: a bare answer ("42", "\\frac{1}{2}") or a GSM8K solution ending in ``#### 42``.

The response's answer is the content of its last ``\\boxed{...}`` (or ``\\fbox{...}``; nested braces
followed); a response without one scores 0. Two answers are equal when their normal forms are (see
``normalize``: LaTeX wrappers and spacing, ``\\frac``/``\\dfrac``, thousands separators, units of dollars
and percent, a trailing period) or, when both parse as numbers (integers, decimals, ``a/b`` fractions), when
the numbers are equal within 1e-6 relative. Left out on purpose: symbolic equivalence (``x+1`` vs ``1+x``,
``\\sqrt{8}`` vs ``2\\sqrt{2}``), which needs a CAS such as sympy and is what a judge (reward.type judge)
is for; intervals and matrices compare as normalised text.
"""

from __future__ import annotations

import fractions
import re
from collections.abc import Mapping
from typing import Any

_BOXED = ("\\boxed", "\\fbox")
_WRAPPERS = re.compile(r"\\(?:text|textbf|mathrm|mathbf|mbox)\{([^{}]*)\}")
_FRAC = re.compile(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}")
_FRAC_SHORT = re.compile(r"\\[dt]?frac(\d)(\d)")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?:\D|$))")
_REPLACE = (
    *((latex, "") for latex in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\$", "$", "\\%", "%")),
    *((degrees, "") for degrees in ("^{\\circ}", "^\\circ")),
    ("\\cdot", "*"),
    ("\\times", "*"),
)
"""LaTeX spacing, sizing, currency, percent and degree marks dropped; products written as *."""
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:/[-+]?\d+)?")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` / ``\\fbox{...}`` in ``text`` (braces balanced), or None."""
    start = max(text.rfind(marker) for marker in _BOXED)
    if start < 0:
        return None
    brace = text.find("{", start)
    if brace < 0:
        return None
    depth = 0
    for i in range(brace, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[brace + 1 : i]
    return None  # unbalanced: the response was cut off inside the box


def reference_answer(answer: Any) -> str:
    """The reference as text: a GSM8K solution's part after ``####``, else the value itself."""
    text = str(answer)
    return text.rsplit("####", 1)[1] if "####" in text else text


def normalize(answer: str) -> str:
    """A canonical text form: no LaTeX spacing or text wrappers, ``\\frac{a}{b}`` as ``a/b``, no
    thousands separators, dollars, percent signs, surrounding ``$``, spaces or trailing period."""
    s = answer.strip()
    for _ in range(3):  # nested wrappers
        s = _WRAPPERS.sub(r"\1", s)
    for old, new in _REPLACE:
        s = s.replace(old, new)
    s = _FRAC.sub(r"(\1)/(\2)", s)
    s = _FRAC_SHORT.sub(r"\1/\2", s)
    s = _THOUSANDS.sub("", s)
    s = re.sub(r"\s+", "", s).rstrip(".")
    s = re.sub(r"^\((-?\d+(?:\.\d+)?)\)/\((-?\d+(?:\.\d+)?)\)$", r"\1/\2", s)  # (1)/(2) -> 1/2
    return s.removeprefix("x=").removeprefix("y=")


def as_number(answer: str) -> fractions.Fraction | None:
    """The normalised answer as an exact number when it is one (``3``, ``-0.5``, ``7/2``), else None."""
    if not _NUMBER.fullmatch(answer):
        return None
    try:
        return fractions.Fraction(answer)
    except (ValueError, ZeroDivisionError):
        return None


def equivalent(given: str, reference: str) -> bool:
    """Whether two answers are the same (see the module docstring)."""
    a, b = normalize(given), normalize(reference)
    if a == b:
        return bool(a)
    x, y = as_number(a), as_number(b)
    if x is None or y is None:
        return False
    scale = max(fractions.Fraction(1), abs(y))
    return bool(abs(x - y) <= fractions.Fraction(1, 10**6) * scale)


def boxed_answer(record: Mapping[str, Any], response: str) -> float:
    """1.0 when the response's last boxed answer equals the record's ``answer``, else 0.0. KeyError for a
    record without ``answer``: the sample is dropped as reward_error, never scored 0 for the data's fault."""
    if "answer" not in record:
        raise KeyError("the record has no 'answer' field for rewards.math:boxed_answer")
    given = last_boxed(response)
    if given is None:
        return 0.0
    return 1.0 if equivalent(given, reference_answer(record["answer"])) else 0.0
