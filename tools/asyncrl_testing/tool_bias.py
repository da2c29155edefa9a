"""A tool-calling agent's turns that a tiny model can produce: a vLLM logits processor that makes the
model call the tool a test's task names, then answer.

Why: a tiny random model never calls a tool by itself, yet the gateway's client tests need real agent
frameworks (the OpenAI Agents SDK, LangGraph, Claude Code) to see a well-formed call of one of their own
tools, run it and send the result back. So the rollout's engine gets this processor
(``spec.rollout.engine.args.logits_processors: ["asyncrl_testing.tool_bias:ScriptedToolCall"]``) and
the test's task carries ``CALL[<tool name>][<JSON arguments>]``. For a request whose prompt holds the
marker, every logit but the next token of the scripted turn is set to -inf:

- no tool result in the conversation yet: ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``
  (the Hermes format the job's ``toolParser: hermes`` reads), then the end-of-turn token;
- after a tool result: ``ANSWER`` and the end-of-turn token.

Chat template, gateway, the clients and their tool loops are the real ones; only which tokens are sampled
comes from the script. Requests without the marker are left alone. As ``rule_judge``, the processor
works on the tiny character-level chat model (one token per character, ``<tool_call>`` one token).
"""

from __future__ import annotations

import json
import re
from typing import Any

import torch
import transformers
from vllm.v1.sample.logits_processor import builtin, interface

MARKER = re.compile(r"CALL\[([A-Za-z0-9_-]+)\]\[(\{.*?\})\]", re.DOTALL)
TOOL_TURN = "<|im_start|>tool"
ANSWER = "done"


def task(tool: str, arguments: dict[str, Any], text: str = "") -> str:
    """A task text that makes the scripted model call ``tool`` with ``arguments``."""
    return f"CALL[{tool}][{json.dumps(arguments)}] {text}".strip()


def script(prompt: str) -> str | None:
    """The scripted reply to a rendered prompt, or None when it carries no marker."""
    found = MARKER.search(prompt)
    if found is None:
        return None
    if TOOL_TURN in prompt[found.end() :]:
        return ANSWER
    name, arguments = found.groups()
    return f'<tool_call>{{"name": {json.dumps(name)}, "arguments": {arguments}}}</tool_call>'


class ScriptedToolCall(interface.LogitsProcessor):
    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(vllm_config.model_config.tokenizer)
        self.eos = int(self.tokenizer.eos_token_id)
        self.targets: dict[int, tuple[list[int], list[int]]] = {}
        """Batch index -> (the reply's token ids, the request's live output ids)."""

    def is_argmax_invariant(self) -> bool:
        return False

    def _add(self, params: Any, prompt_ids: list[int] | None, output_ids: list[int]) -> Any:
        reply = script(str(self.tokenizer.decode(prompt_ids or [], skip_special_tokens=False)))
        if reply is None:
            return None
        ids = [int(i) for i in self.tokenizer(reply, add_special_tokens=False)["input_ids"]]
        return [*ids, self.eos], output_ids

    def update_state(self, batch_update: interface.BatchUpdate | None) -> None:
        builtin.process_dict_updates(self.targets, batch_update, self._add)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, (target, output_ids) in self.targets.items():
            token = target[min(len(output_ids), len(target) - 1)]
            logits[index].fill_(float("-inf"))
            logits[index, token] = 0.0
        return logits
