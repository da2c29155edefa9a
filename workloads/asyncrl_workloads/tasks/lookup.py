"""A tiny agentic task: the answer is a secret letter that only a tool returns.

Used by ``examples/agent-cpu.yaml`` and the agent-loop e2e: a randomly initialised tiny chat model
(``model.create.chat: true``) learns to call the tool and to copy its answer, on 2 CPU cores.

Every record asks the same question ("secret?") and hides a different letter in its ``secret`` field,
which the prompt does not show. The tool ``lookup`` returns it (it takes the record: a ``record``
parameter is filled by the agent loop, not by the model). So calling the tool is the only way to score:

    1.0  the tool answered and the final answer's first non-space character is the secret
    0.3  the tool answered and the answer starts with another letter of the alphabet
    0.2  the tool answered
    0.0  no successful tool call (whatever the answer: a guess scores nothing)

The call format is one token: ``<tool_call>`` calls the sample's only tool with no arguments
(``lookup_parser.CompactParser``, a vLLM ``ToolParser`` named by import path in
spec.agent.toolParser). A random character-level model emits that token within 8 tokens ~7% of the
time; Hermes JSON (~40 exact characters) it would never find by chance. Real models use ``hermes``.

Referenced in a job as ``data.prompts: builtin:lookup``,
``agent.tools: [asyncrl_workloads.tasks.lookup:lookup]``,
``agent.toolParser: asyncrl_workloads.tasks.lookup_parser:CompactParser`` and
``agent.stopTokens: ["<tool_call>"]``; its reward comes with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

ALPHABET = "abcdefgh"
RECORDS = 32


def records() -> list[dict[str, Any]]:
    """``{"prompt": "secret?", "secret": <letter>}``, the letters cycling through the alphabet."""
    return [{"prompt": "secret?", "secret": ALPHABET[i % len(ALPHABET)]} for i in range(RECORDS)]


def lookup(record: Mapping[str, Any]) -> str:
    """Return the secret letter of this question."""
    return str(record["secret"])


def called(episode: Any) -> bool:
    """Whether any tool call of the episode succeeded (its output reached the model). The agent loop records
    each call's outcome; a gateway session's tools ran in the agent, so there a tool message in the
    conversation whose content is not an error (``error: ...``, as the loop words failures) counts."""
    results = getattr(episode, "tool_calls", ())
    if results:
        return any(r.outcome == "ok" for r in results)
    return any(
        m.get("role") == "tool" and not str(m.get("content") or "").startswith("error")
        for m in getattr(episode, "messages", ())
    )


def reward(record: Mapping[str, Any], response: str, episode: Any = None) -> float:
    """Graded reward (see the module docstring); ``episode`` is the agent loop's recorder."""
    if episode is None or not called(episode):
        return 0.0
    text = response.lstrip()
    if text[:1] == record["secret"]:
        return 1.0
    if text[:1] and text[0] in ALPHABET:
        return 0.3
    return 0.2
