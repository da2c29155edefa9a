"""Resolve a reward function reference (``"package.module:function"``) into a callable.

Called by the rollout worker at start-up, before the engine starts, so a typo in
``spec.reward.function`` fails in the first second with one clear line instead of
after a 30 s engine start.

A reward function has the signature ``fn(record: Mapping, response: str) -> float`` (as
``asyncrl_api.task.RewardSpec`` documents), where ``record`` is the prompt record from the data
source (e.g. ``{"prompt": "say a:", "answer": "a"}``) and ``response`` the decoded completion (with
the agent loop: the last assistant turn's text). A function that takes a third parameter
``episode`` also gets the agent loop's recorder (``episode.recorder.Episode``: ``messages``, the whole
conversation in OpenAI form, ``tool_calls`` with their outcomes, ``assistant_turns``, ``ended``); it
is None for single-turn samples.
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

RewardFn = Callable[[Mapping[str, Any], str], float]


class RewardLoadError(ValueError):
    """The reference in ``spec.reward.function`` does not name a usable function."""


def load_reward(reference: str, field: str = "spec.reward.function") -> RewardFn:
    """Import ``module:function`` and check that it takes (record, response)."""
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
        inspect.signature(fn).bind({}, "response")
    except TypeError:
        raise RewardLoadError(f"{field}: {reference!r} must accept (record, response)") from None
    except ValueError:  # builtins without a signature: accept and let the call tell
        pass
    return fn


def takes_episode(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` accepts a third argument (the agent loop's episode)."""
    try:
        inspect.signature(fn).bind({}, "response", None)
    except (TypeError, ValueError):
        return False
    return True


def score(fn: RewardFn, record: Mapping[str, Any], response: str, episode: Any = None) -> float:
    """Call a reward function and coerce its result to a finite float (NaN/inf -> ValueError);
    ``episode`` is passed when the function takes it."""
    value = float(fn(record, response, episode) if takes_episode(fn) else fn(record, response))  # type: ignore[call-arg]
    if not math.isfinite(value):
        raise ValueError(f"reward function returned {value} for response {response[:40]!r}")
    return value


def resolve(function: str | None, prompts: str) -> RewardFn:
    """The job's reward: ``spec.reward.function``, or the builtin task's own reward for
    ``data.prompts: builtin:<task>`` when no function is given."""
    if function:
        return load_reward(function)
    if prompts.startswith("builtin:"):
        task = prompts.removeprefix("builtin:")
        return load_reward(f"asyncrl_workloads.tasks.{task}:reward", field="spec.data.prompts")
    raise RewardLoadError("spec.reward.function: required unless data.prompts is builtin:<task>")
