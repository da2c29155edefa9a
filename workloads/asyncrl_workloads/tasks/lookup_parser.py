"""The builtin ``lookup`` task's tool-call format, as a vLLM ``ToolParser`` (spec.agent.toolParser:
``asyncrl_workloads.tasks.lookup_parser:CompactParser``). Kept apart from ``tasks/lookup.py`` because
it imports vLLM, which the rollout's entry point loads only after the job's tools were checked."""

from __future__ import annotations

from typing import Any

from vllm.entrypoints.generate.base.protocol import ExtractedToolCallInformation, FunctionCall, ToolCall
from vllm.tool_parsers import ToolParser


class CompactParser(ToolParser):
    """``<tool_call>`` (one token) calls the request's first tool with no arguments; the text before it
    is the turn's content. For single-tool tasks a character-level model can find by chance."""

    tool_call_start_token = "<tool_call>"

    def extract_tool_calls(self, model_output: str, request: Any) -> ExtractedToolCallInformation:
        head, marker, _ = model_output.partition(self.tool_call_start_token)
        if not marker or not request.tools:
            return ExtractedToolCallInformation(tools_called=False, tool_calls=[], content=model_output)
        name = request.tools[0].function.name
        call = ToolCall(type="function", function=FunctionCall(name=name, arguments="{}"))
        return ExtractedToolCallInformation(tools_called=True, tool_calls=[call], content=head or None)
