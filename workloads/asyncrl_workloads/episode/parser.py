"""Tool calls read from generated text through vLLM's own tool parsers (``spec.agent.toolParser``).

Called by the agent loop once per assistant turn. The parser is vLLM's (``vllm.tool_parsers``, the
same classes its OpenAI server uses for ``--tool-call-parser``): ``hermes`` by default
(``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``), any other registered name, or a
``ToolParser`` subclass given as ``"package.module:Class"`` (a custom format; the builtin ``lookup``
task ships one). We do not write the formats again; this module only adapts the result:

- arguments are decoded from the JSON string the parser returns (a call whose arguments are not JSON
  is kept, with ``error`` set, and answered as ``bad_arguments``);
- a turn that holds the parser's start marker (``tool_call_start_token``) but yields no call is
  ``malformed`` (vLLM's parser returns "no call" for a broken JSON body, and logs a stack trace for
  each, which this module filters out: the loop counts them instead).
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any


class ParserLoadError(ValueError):
    """spec.agent.toolParser names no usable parser."""


class ParseError(RuntimeError):
    """The tool parser itself raised on a turn's text (the loop ends that episode ``error``)."""


@dataclasses.dataclass(frozen=True)
class ParsedCall:
    id: str
    name: str
    arguments: Any
    error: str | None = None
    """Why the arguments could not be decoded (the call is answered as bad_arguments)."""

    def openai(self) -> dict[str, Any]:
        """The call as an OpenAI assistant message's ``tool_calls`` entry."""
        args = self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": args}}


@dataclasses.dataclass(frozen=True)
class ParsedTurn:
    content: str
    """The turn's text without tool-call markup."""
    calls: list[ParsedCall]
    malformed: bool
    """The model started a call that could not be parsed."""


class _DropParseTraces(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "extracting tool call" not in record.getMessage()


def parser_class(reference: str, field: str = "spec.agent.toolParser") -> type[Any]:
    from vllm.tool_parsers import ToolParser, ToolParserManager

    if ":" in reference:
        module_name, _, attr = reference.partition(":")
        try:
            cls = getattr(importlib.import_module(module_name), attr)
        except Exception as exc:  # ImportError, AttributeError, or the module's own error at import
            raise ParserLoadError(f"{field}: cannot import {reference!r} ({exc})") from None
    else:
        try:
            cls = ToolParserManager.get_tool_parser(reference)
        except KeyError:
            known = ", ".join(sorted(ToolParserManager.list_registered()))
            raise ParserLoadError(f"{field}: unknown tool parser {reference!r} (vLLM has: {known})") from None
    if not (isinstance(cls, type) and issubclass(cls, ToolParser)):
        raise ParserLoadError(f"{field}: {reference!r} is not a vllm.tool_parsers.ToolParser subclass")
    return cls


class ToolCallParser:
    def __init__(self, reference: str | type[Any], tokenizer: Any) -> None:
        """``reference``: spec.agent.toolParser, or a ToolParser subclass itself."""
        cls = parser_class(reference) if isinstance(reference, str) else reference
        self.tokenizer = tokenizer
        self._parser = cls(tokenizer)
        self._start = getattr(cls, "tool_call_start_token", None)
        logging.getLogger(cls.__module__).addFilter(_DropParseTraces())
        self._requests: dict[tuple[str, ...], Any] = {}

    def decode(self, token_ids: Sequence[int]) -> str:
        """Generated tokens as the parser reads them: special tokens kept (tool-call markers often are
        special tokens), the end-of-turn token dropped."""
        ids = list(token_ids)
        if ids and ids[-1] == self.tokenizer.eos_token_id:
            ids.pop()
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    def _request(self, tools: Sequence[Mapping[str, Any]]) -> Any:
        key = tuple(t["function"]["name"] for t in tools)
        if key not in self._requests:
            from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

            self._requests[key] = ChatCompletionRequest(
                messages=[], model="policy", tools=list(tools) or None
            )
        return self._requests[key]

    def parse(self, text: str, tools: Sequence[Mapping[str, Any]], turn: int = 0) -> ParsedTurn:
        """Calls in ``text``; their ids are ``call_<turn>_<i>`` (vLLM's are random: a template that
        renders ids would make the tokens between turns differ from run to run under one seed)."""
        try:
            info = self._parser.extract_tool_calls(text, self._request(tools))
        except Exception as exc:
            raise ParseError(f"spec.agent.toolParser: the parser raised on a turn: {exc!r}") from exc
        calls: list[ParsedCall] = []
        for i, call in enumerate(info.tool_calls if info.tools_called else []):
            raw = call.function.arguments
            try:
                arguments, error = (json.loads(raw) if raw else {}), None
            except (TypeError, ValueError) as exc:
                arguments, error = raw, f"arguments are not JSON ({exc})"
            calls.append(ParsedCall(f"call_{turn}_{i}", call.function.name, arguments, error))
        malformed = not calls and self._start is not None and self._start in text
        content = info.content if info.content is not None else ""
        if malformed or not info.tools_called:
            content = text
        return ParsedTurn(content, calls, malformed)
