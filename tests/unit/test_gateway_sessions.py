"""Gateway session rules (gateway/sessions.py) on hand-built calls: which earlier call a request continues,
what a session exports in each mode, and how rewards reach its trajectories. The same rules run behind the
HTTP API in tests/dataplane/test_gateway.py."""

from __future__ import annotations

from typing import Any

import pytest
from asyncrl_workloads.episode import recorder
from asyncrl_workloads.gateway import sessions


def new_session() -> sessions.Session:
    group = sessions.Group(id="g0", record=None, size=1)
    return sessions.Session("sess-1", "sk-sess-x", group, 0.0, 0.0)


def chat_call(
    session: sessions.Session, call_id: str, parent: sessions.Call | None, messages: list[dict[str, Any]],
    generated: list[int], between: list[int] = (), reply: dict[str, Any] | None = None,
) -> sessions.Call:  # fmt: skip
    """A call as the gateway records it: the parent's episode + ``between`` (mask 0) + ``generated``."""
    if parent is None:
        ep = recorder.Episode(prompt_ids=[1, 2, 3], messages=[])
    else:
        src = parent.episode
        ep = recorder.Episode(
            list(src.prompt_ids),
            [],
            list(src.response_ids),
            list(src.logprobs),
            list(src.versions),
            list(src.mask),
        )
        ep.add_context(list(between))
    start = len(ep.response_ids)
    ep.add_generated(generated, [-0.5] * len(generated), [len(session.calls)] * len(generated))
    ep.final_text = f"text of {call_id}"
    assistant = reply or {"role": "assistant", "content": f"text of {call_id}"}
    ep.messages = [*sessions.normalise_messages(messages), assistant]
    call = sessions.Call(
        call_id,
        parent,
        ep,
        start,
        chat=True,
        tools_key="[]",
        assistant=sessions.normalise_assistant(assistant),
    )
    session.add(call)
    return call


USER = {"role": "user", "content": "q"}


def test_a_request_that_extends_a_call_with_its_reply_continues_it_the_deepest_one() -> None:
    s = new_session()
    reply = {"role": "assistant", "content": None,
             "tool_calls": [{"id": "call_0_0", "type": "function",
                             "function": {"name": "lookup", "arguments": '{"k": 1}'}}]}  # fmt: skip
    a = chat_call(s, "a", None, [USER], [10, 11], reply=reply)
    tool = {"role": "tool", "tool_call_id": "call_0_0", "content": "x"}
    # the agent sends the reply back as its SDK renders it: content "" and other JSON spacing
    respaced = {"name": "lookup", "arguments": '{ "k" : 1 }'}
    echoed = {
        **reply,
        "content": "",
        "tool_calls": [{**reply["tool_calls"][0], "id": "other-id", "function": respaced}],
    }
    msgs = sessions.normalise_messages([USER, echoed, tool])
    assert s.parent_for_chat(msgs, "[]") is a
    b = chat_call(s, "b", a, [USER, echoed, tool], [12], between=[20, 21])
    deeper = sessions.normalise_messages(
        [USER, echoed, tool, {"role": "assistant", "content": "text of b"}, USER]
    )
    assert s.parent_for_chat(deeper, "[]") is b
    # a different reply, other tools, or only a prefix of a call's own messages start a new root
    assert (
        s.parent_for_chat(sessions.normalise_messages([USER, {"role": "assistant", "content": "no"}]), "[]")
        is None
    )
    assert s.parent_for_chat(msgs, '[{"other": 1}]') is None
    assert s.parent_for_chat(sessions.normalise_messages([USER]), "[]") is None


def test_a_continued_call_keeps_no_copy_of_its_chain_and_still_reads_it() -> None:
    s = new_session()
    a = chat_call(s, "a", None, [USER], [10, 11])
    a_before = (list(a.episode.response_ids), list(a.episode.mask), a.messages)
    b = chat_call(s, "b", a, [USER, {"role": "assistant", "content": "text of a"}, USER], [12], between=[20])
    c = chat_call(s, "c", b, [USER], [13], between=[21])
    assert a.own is None and b.own is None and c.own is not None  # one copy: the leaf's
    assert (a.episode.response_ids, a.episode.mask, a.messages) == a_before
    assert b.episode.response_ids == [10, 11, 20, 12] and b.full_ids == [1, 2, 3, 10, 11, 20, 12]
    assert a.episode.final_text == "text of a" and b.n_messages == 3
    # a second branch from a materialises a's chain from the holder and is matched as before
    msgs = sessions.normalise_messages([USER, {"role": "assistant", "content": "text of a"}, USER])
    assert s.parent_for_chat(msgs, "[]") is a


def test_content_parts_are_joined_and_non_text_parts_refused() -> None:
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert sessions.normalise_messages([{"role": "user", "content": parts}]) == [
        {"role": "user", "content": "ab"}
    ]
    with pytest.raises(sessions.SessionError) as err:
        sessions.normalise_content([{"type": "image_url", "image_url": {"url": "x"}}])
    assert err.value.status == 400


def test_concat_exports_one_trajectory_per_leaf_with_its_chain_and_masks() -> None:
    s = new_session()
    a = chat_call(s, "a", None, [USER], [10, 11])
    b = chat_call(s, "b", a, [USER], [12], between=[20])
    c = chat_call(s, "c", a, [USER], [13, 14], between=[21, 22])  # a branch from a
    out = s.export("concat", 1.0)
    assert [t.episode for t in out] == [b.episode, c.episode]  # a was continued: not a leaf
    assert out[0].response_ids == [10, 11, 20, 12] and out[0].mask == [1, 1, 0, 1]
    assert out[1].response_ids == [10, 11, 21, 22, 13, 14] and out[1].mask == [1, 1, 0, 0, 1, 1]
    assert out[1].versions == [0, 0, 0, 0, 2, 2] and out[1].prompt_ids == [1, 2, 3]
    assert all(t.reward is None for t in out)  # nothing set: the job's reward function decides


def test_concat_rewards_sum_over_the_chain_plus_the_session() -> None:
    s = new_session()
    a = chat_call(s, "a", None, [USER], [10])
    chat_call(s, "b", a, [USER], [11], between=[20])
    chat_call(s, "c", a, [USER], [12], between=[21])
    assert s.set_reward(0.5, "a", False) == "a"
    assert s.set_reward(1.0, None, False) == "c"  # no call id: the last call
    assert s.set_reward(0.25, None, True) == "session"
    assert [t.reward for t in s.export("concat", 1.0)] == [0.75, 1.75]


def test_individual_exports_each_call_with_its_own_tokens_and_discounted_rewards() -> None:
    s = new_session()
    a = chat_call(s, "a", None, [USER], [10, 11])
    b = chat_call(s, "b", a, [USER], [12], between=[20])
    chat_call(s, "c", b, [USER], [13], between=[21])
    s.set_reward(1.0, None, False)  # on c
    out = s.export("individual", 0.5)
    assert [t.response_ids for t in out] == [[10, 11], [12], [13]]
    assert [t.prompt_ids for t in out] == [[1, 2, 3], [1, 2, 3, 10, 11, 20], [1, 2, 3, 10, 11, 20, 12, 21]]
    assert [t.mask for t in out] == [[1, 1], [1], [1]]
    assert [t.reward for t in out] == [0.25, 0.5, 1.0]  # AReaL's backward turn discount
    s.set_reward(2.0, None, True)  # the session's reward is each leaf's own
    assert [t.reward for t in s.export("individual", 1.0)] == [3.0, 3.0, 3.0]


def test_individual_discount_averages_branches_and_leaves_unrewarded_subtrees_unset() -> None:
    s = new_session()
    a = chat_call(s, "a", None, [USER], [10])
    chat_call(s, "b", a, [USER], [11], between=[20])
    chat_call(s, "c", a, [USER], [12], between=[21])
    d = chat_call(s, "d", None, [USER], [13])  # a second root, never rewarded
    s.set_reward(1.0, "b", False)
    s.set_reward(0.0, "c", False)
    values = {t.episode.final_text: t.reward for t in s.export("individual", 1.0)}
    assert values == {"text of a": 0.5, "text of b": 1.0, "text of c": 0.0, "text of d": None}
    assert d.children == 0


def test_reward_errors_name_what_is_wrong() -> None:
    s = new_session()
    with pytest.raises(sessions.SessionError, match="no call to reward"):
        s.set_reward(1.0, None, False)
    chat_call(s, "a", None, [USER], [10])
    with pytest.raises(sessions.SessionError) as err:
        s.set_reward(1.0, "nope", False)
    assert (err.value.status, err.value.code) == (404, "call_not_found")
    s.state = "expired"
    with pytest.raises(sessions.SessionError) as err:
        s.check_open()
    assert err.value.status == 410


def test_completions_continue_by_token_prefix() -> None:
    s = new_session()
    ep = recorder.Episode(prompt_ids=[5, 6], messages=[])
    ep.add_generated([7, 8], [-1.0, -1.0], [0, 0])
    call = sessions.Call("cmpl-a", None, ep, 0)
    s.add(call)
    assert s.parent_for_ids([5, 6, 7, 8, 9]) is call
    assert s.parent_for_ids([5, 6, 7, 8]) is call  # nothing new, still a continuation
    assert s.parent_for_ids([5, 6, 7]) is None and s.parent_for_ids([5, 9, 7, 8]) is None


def test_a_group_is_finished_when_every_session_ended_or_expired() -> None:
    group = sessions.Group(id="g", record=None, size=2)
    one = sessions.Session("s1", "k1", group, 0.0, 0.0)
    group.sessions.append(one)
    assert not group.finished()  # a member not even opened yet
    two = sessions.Session("s2", "k2", group, 0.0, 0.0)
    group.sessions.append(two)
    one.state = "ended"
    assert not group.finished()
    two.state = "expired"
    assert group.finished()
