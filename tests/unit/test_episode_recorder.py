"""The episode recorder (episode/recorder.py): the four response arrays line up token by token, context
tokens are masked out with a 0.0 logprob and the version of the generated token before them, and a
trailing context tail is trimmed."""

from __future__ import annotations

from asyncrl_workloads.episode import recorder


def _episode() -> recorder.Episode:
    return recorder.Episode(prompt_ids=[1, 2], messages=[{"role": "user", "content": "q"}])


def _columns(ep: recorder.Episode) -> tuple[list[int], list[float], list[int], list[int]]:
    return ep.response_ids, ep.logprobs, ep.versions, ep.mask


def test_a_generated_turn_is_trained_on_with_the_engines_logprobs_and_versions() -> None:
    ep = _episode()
    ep.add_generated([10, 11], [-0.5, -1.5], [3, 4])
    assert _columns(ep) == ([10, 11], [-0.5, -1.5], [3, 4], [1, 1])
    assert (ep.assistant_turns, ep.generated_tokens) == (1, 2)


def test_context_tokens_are_masked_with_zero_logprobs_and_the_last_generated_version() -> None:
    ep = _episode()
    ep.add_generated([10, 11], [-0.5, -1.5], [3, 4])
    ep.add_context([20, 21, 22])
    ep.add_generated([12], [-0.25], [6])
    ep.add_context([23])
    assert _columns(ep) == (
        [10, 11, 20, 21, 22, 12, 23],
        [-0.5, -1.5, 0.0, 0.0, 0.0, -0.25, 0.0],
        [3, 4, 4, 4, 4, 6, 6],
        [1, 1, 0, 0, 0, 1, 0],
    )
    assert (ep.assistant_turns, ep.generated_tokens) == (2, 3)


def test_the_oldest_version_is_that_of_the_oldest_generated_token() -> None:
    """The trainer's staleness rule reads min(versions): context tokens must never lower it."""
    ep = _episode()
    ep.add_generated([10], [-0.1], [7])
    ep.add_context([20, 21])
    ep.add_generated([11, 12], [-0.1, -0.2], [8, 9])
    generated = [v for v, m in zip(ep.versions, ep.mask, strict=True) if m]
    assert min(ep.versions) == min(generated) == 7


def test_the_next_turn_is_generated_from_the_prompt_and_everything_since() -> None:
    ep = _episode()
    ep.add_generated([10], [-0.1], [0])
    ep.add_context([20])
    assert ep.context_ids == [1, 2, 10, 20]
    assert ep.prompt_ids == [1, 2]


def test_a_trailing_context_tail_is_trimmed_from_every_column() -> None:
    ep = _episode()
    ep.add_generated([10], [-0.1], [1])
    ep.add_context([20, 21])
    ep.add_generated([11], [-0.2], [2])
    ep.add_context([22, 23])
    ep.trim_context_tail()
    assert _columns(ep) == ([10, 20, 21, 11], [-0.1, 0.0, 0.0, -0.2], [1, 1, 1, 2], [1, 0, 0, 1])


def test_trimming_an_episode_that_ends_on_a_generated_token_changes_nothing() -> None:
    ep = _episode()
    ep.add_generated([10, 11], [-0.1, -0.2], [1, 1])
    ep.trim_context_tail()
    assert _columns(ep) == ([10, 11], [-0.1, -0.2], [1, 1], [1, 1])


def test_trimming_an_episode_that_generated_nothing_leaves_it_empty() -> None:
    ep = _episode()
    ep.add_context([20, 21])
    ep.trim_context_tail()
    assert _columns(ep) == ([], [], [], [])
    assert ep.generated_tokens == 0
