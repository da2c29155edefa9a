"""A judge for tests that a tiny model can serve: a vLLM logits processor that makes the model answer
the say_char task's grade.

Why: a tiny random model cannot judge anything, yet the judge's learning test needs a judge whose score
means something. So the test's judge is vLLM's own OpenAI server (``python -m
vllm.entrypoints.openai.api_server ... --logits-processors asyncrl_testing.rule_judge:SayCharJudge``)
on a tiny chat model, and this processor steers its sampling: for a request whose prompt contains
``JUDGE[<reference>][<response>]`` (the job's ``reward.judge.template``), every logit but the next
character of ``str(round(10 * say_char.reward))`` and then the end-of-turn token is set to -inf. Server,
HTTP, chat template, the ``openai`` SDK, the prompt template and the score parser are all the real ones;
only the judgment comes from the rule. Requests without the marker (the preflight's "ping") are left
alone.
"""

from __future__ import annotations

import re
from typing import Any

import torch
import transformers
from asyncrl_workloads.tasks import say_char
from vllm.v1.sample.logits_processor import builtin, interface

MARKER = re.compile(r"JUDGE\[(.)\]\[(.*)\]", re.DOTALL)
TEMPLATE = "JUDGE[{reference}][{response}]"
"""The reward.judge.template that goes with this processor (reference = the record's answer)."""


def grade(text: str) -> str | None:
    """The judge's reply to a rendered prompt, or None when the prompt carries no marker."""
    found = MARKER.search(text)
    if found is None:
        return None
    reference, response = found.groups()
    return str(round(10 * say_char.reward({"answer": reference}, response)))


class SayCharJudge(interface.LogitsProcessor):
    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(vllm_config.model_config.tokenizer)
        self.eos = int(self.tokenizer.eos_token_id)
        self.targets: dict[int, tuple[list[int], list[int]]] = {}
        """Batch index -> (the reply's token ids, the request's live output ids)."""

    def is_argmax_invariant(self) -> bool:
        return False

    def _add(self, params: Any, prompt_ids: list[int] | None, output_ids: list[int]) -> Any:
        reply = grade(str(self.tokenizer.decode(prompt_ids or [], skip_special_tokens=False)))
        if reply is None:
            return None
        vocab = self.tokenizer.get_vocab()
        ids = [int(vocab[ch]) for ch in reply]
        return [*ids, self.eos], output_ids

    def update_state(self, batch_update: interface.BatchUpdate | None) -> None:
        builtin.process_dict_updates(self.targets, batch_update, self._add)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, (target, output_ids) in self.targets.items():
            token = target[min(len(output_ids), len(target) - 1)]
            logits[index].fill_(float("-inf"))
            logits[index, token] = 0.0
        return logits
