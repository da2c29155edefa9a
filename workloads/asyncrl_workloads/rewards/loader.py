"""Resolve a reward function reference (``"package.module:function"``) into a callable, and call it.

Called by the rollout worker at start-up, before the engine starts, so a typo in
``spec.reward.function`` fails in the first second with one clear line instead of
after a 30 s engine start. Two signatures, told apart by the parameters' names:

    fn(record, response[, episode])                                   asyncrl's
    compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)       verl's

asyncrl's: ``record`` is the prompt record from the data source (every field, e.g. ``{"prompt": "say
a:", "answer": "a"}``) and ``response`` the decoded completion (with the agent loop: the last assistant
turn's text). A function that takes a third parameter ``episode`` also gets the agent loop's recorder
(``episode.recorder.Episode``: ``messages``, the whole conversation in OpenAI form, ``tool_calls`` with
their outcomes, ``assistant_turns``, ``ended``); it is None for single-turn samples.

verl's (a function with a ``solution_str`` parameter, as verl's ``custom_reward_function`` and
``verl.utils.reward_score`` modules have): called with keywords, as verl's reward managers call it:
``data_source`` (the record's field, None without one), ``solution_str`` (the response),
``ground_truth`` (the record's ``reward.groundTruthKey``, default ``reward_model.ground_truth``: a dotted
key into verl's row layout) and ``extra_info`` (the record's ``extra_info``, ``{}`` without one); each
only if the function names it or takes ``**kwargs``.

Either may return a number or, as verl's may, a dict whose ``score`` is the reward and whose other
numeric entries are the sample's extra metrics (``Scored.extras``: verl's ``reward_extra_info``, here
``asyncrl_reward_extra{key}``). Either may be ``async def`` (``rewards/scorer.py`` awaits it).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

from asyncrl_workloads.data import fields

RewardFn = Callable[..., Any]
"""A reward function of either signature (see the module docstring)."""

DEFAULT_GROUND_TRUTH_KEY = "reward_model.ground_truth"
"""Where verl's data preprocessing puts the answer (``reward.groundTruthKey`` unset)."""
VERL_PARAMETERS = ("data_source", "solution_str", "ground_truth", "extra_info")
_MAX_EXTRAS = 32
"""Extra metrics kept per sample: a dict result is a handful of named scores, not a payload."""


class RewardLoadError(ValueError):
    """The reference in ``spec.reward.function`` does not name a usable function."""


@dataclasses.dataclass(frozen=True)
class Scored:
    """A reward function's result: the reward and the numeric extras of a dict result."""

    value: float
    extras: Mapping[str, float] = dataclasses.field(default_factory=dict)


def load_reward(reference: str, field: str = "spec.reward.function") -> RewardFn:
    """Import ``module:function`` and check that it takes (record, response) or verl's parameters."""
    module_name, sep, attr = reference.partition(":")
    if not sep or not module_name or not attr:
        raise RewardLoadError(f"{field}: {reference!r} is not of the form 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise RewardLoadError(f"{field}: cannot import module {module_name!r} ({exc})") from None
    fn = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise RewardLoadError(f"{field}: module {module_name!r} has no attribute {attr!r}")
        fn = getattr(fn, part)
    if not callable(fn):
        raise RewardLoadError(f"{field}: {reference!r} is not callable")
    try:
        if is_verl_style(fn):
            inspect.signature(fn).bind(**_verl_arguments(fn, None, {}, ""))
        else:
            inspect.signature(fn).bind({}, "response")
    except TypeError as exc:
        want = f"verl's ({', '.join(VERL_PARAMETERS)}) ({exc})" if is_verl_style(fn) else "(record, response)"
        raise RewardLoadError(f"{field}: {reference!r} must accept {want}") from None
    except ValueError:  # builtins without a signature: accept and let the call tell
        pass
    return fn


def is_verl_style(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` has verl's ``solution_str`` parameter (then it is called the verl way)."""
    try:
        return "solution_str" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def takes_episode(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` accepts a third argument (the agent loop's episode)."""
    try:
        inspect.signature(fn).bind({}, "response", None)
    except (TypeError, ValueError):
        return False
    return not is_verl_style(fn)


def _verl_arguments(
    fn: Callable[..., Any], ground_truth: Any, record: Mapping[str, Any], response: str
) -> dict[str, Any]:
    params = inspect.signature(fn).parameters
    every = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    extra_info = record.get("extra_info")
    values = {
        "data_source": record.get("data_source"),
        "solution_str": response,
        "ground_truth": ground_truth,
        "extra_info": dict(extra_info) if isinstance(extra_info, Mapping) else {},
    }
    return {k: v for k, v in values.items() if every or k in params}


def call(
    fn: RewardFn,
    record: Mapping[str, Any],
    response: str,
    episode: Any = None,
    ground_truth_key: str = DEFAULT_GROUND_TRUTH_KEY,
) -> Any:
    """Call ``fn`` the way its signature asks; its raw result (an awaitable for ``async def``)."""
    if is_verl_style(fn):
        return fn(**_verl_arguments(fn, fields.get(record, ground_truth_key), record, response))
    return fn(record, response, episode) if takes_episode(fn) else fn(record, response)


def scored(result: Any, response: str) -> Scored:
    """A function's result as a ``Scored`` (ValueError: no finite ``score``)."""
    extras: dict[str, float] = {}
    if isinstance(result, Mapping):
        if "score" not in result:
            raise ValueError(f"reward function returned a dict without 'score' (keys: {sorted(result)})")
        for key, item in result.items():
            if key != "score" and isinstance(item, int | float) and len(extras) < _MAX_EXTRAS:
                extras[str(key)] = float(item)
        result = result["score"]
    value = float(result)
    if not math.isfinite(value):
        raise ValueError(f"reward function returned {value} for response {response[:40]!r}")
    return Scored(value, extras)


def score(
    fn: RewardFn,
    record: Mapping[str, Any],
    response: str,
    episode: Any = None,
    ground_truth_key: str = DEFAULT_GROUND_TRUTH_KEY,
) -> float:
    """Call a (sync) reward function and coerce its result to a finite float (NaN/inf -> ValueError);
    ``episode`` is passed when the function takes it."""
    return scored(call(fn, record, response, episode, ground_truth_key), response).value


def resolve(function: str | None, prompts: str) -> RewardFn:
    """The job's reward: ``spec.reward.function``, or the builtin task's own reward for
    ``data.prompts: builtin:<task>`` when no function is given."""
    if function:
        return load_reward(function)
    if prompts.startswith("builtin:"):
        task = prompts.removeprefix("builtin:")
        return load_reward(f"asyncrl_workloads.tasks.{task}:reward", field="spec.data.prompts")
    raise RewardLoadError("spec.reward.function: required unless data.prompts is builtin:<task>")
