"""Agent tools: ``"package.module:fn"`` references (spec.agent.tools) turned into OpenAI function
schemas, and calls run under a timeout with their arguments checked against the schema.

Called by the rollout entry point at start-up (``load_tools``: a tool that does not import or whose
signature gives no usable schema fails there, in one line, before the engine starts) and by the agent
loop (``call``). What the model sees of a tool is its schema, built from the signature and docstring
(the way verl's ``@function_tool`` and the OpenAI Agents SDK infer one):

- name: the function's name; description: the docstring's first paragraph;
- one property per parameter, typed from its annotation (str, int, float, bool, list[...], dict,
  Literal[...], and ``X | None``), described by the docstring's ``Args:`` section (Google style);
  parameters without a default are required;
- a parameter named ``record`` is not shown to the model: it receives the sample's record (verl's
  per-sample tool kwargs), so a tool can answer from data the prompt does not reveal.

Every failure of a call becomes a message to the model and an outcome label, never an exception out of
the loop: ``bad_arguments`` (not matching the schema), ``unknown_tool``, ``error`` (the tool raised),
``timeout``. A synchronous tool runs in a daemon thread of its own (started when the call starts, so
the timeout times the tool, never a queue); a timed-out synchronous call cannot be killed (Python
threads cannot), so it keeps its thread until it returns, and being a daemon it never holds up the
rollout's exit (a pool's threads are joined at interpreter exit: one hung tool would have kept a
stopping pod alive until SIGKILL).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import inspect
import json
import re
import threading
import time
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

RECORD_PARAM = "record"
OUTCOMES = ("ok", "error", "timeout", "bad_arguments", "unknown_tool", "malformed")
"""Every call outcome; ``malformed`` comes from the loop (a call started that could not be parsed)."""
_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean",
                               list: "array", tuple: "array", dict: "object"}  # fmt: skip


class ToolLoadError(ValueError):
    """A spec.agent.tools entry that does not name a usable tool."""


@dataclasses.dataclass(frozen=True)
class Tool:
    name: str
    fn: Callable[..., Any]
    schema: dict[str, Any]
    """OpenAI tool schema: {"type": "function", "function": {"name", "description", "parameters"}}."""
    takes_record: bool

    @property
    def parameters(self) -> dict[str, Any]:
        params: dict[str, Any] = self.schema["function"]["parameters"]
        return params


@dataclasses.dataclass(frozen=True)
class CallResult:
    name: str
    outcome: str
    """One of OUTCOMES."""
    text: str
    """What the model is shown (the tool's output, or the error)."""
    seconds: float


def load_tools(references: Sequence[str], field: str = "spec.agent.tools") -> dict[str, Tool]:
    """Import every tool; names must be unique."""
    tools: dict[str, Tool] = {}
    for i, reference in enumerate(references):
        tool = load_tool(reference, f"{field}[{i}]")
        if tool.name in tools:
            raise ToolLoadError(f"{field}[{i}]: a second tool named {tool.name!r}")
        tools[tool.name] = tool
    return tools


def check_record_tools(
    records: Sequence[Mapping[str, Any]], tools: Mapping[str, Tool], field: str = "spec.data.prompts"
) -> None:
    """Every record's ``tools`` field (per-sample selection) is a list of names of configured tools."""
    for i, record in enumerate(records):
        names = record.get("tools")
        if names is None:
            continue
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ToolLoadError(f"{field}: record {i}: field 'tools' must be a list of tool names")
        unknown = [n for n in names if n not in tools]
        if unknown:
            raise ToolLoadError(
                f"{field}: record {i}: tools {unknown} are not in spec.agent.tools "
                f"({', '.join(tools) or 'none'})"
            )


def load_tool(reference: str, field: str) -> Tool:
    module_name, _, attr = reference.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or the module's own SyntaxError/NameError/...: one line
        raise ToolLoadError(f"{field}: cannot import module {module_name!r} ({exc})") from None
    fn = getattr(module, attr, None)
    if fn is None or not callable(fn):
        raise ToolLoadError(f"{field}: module {module_name!r} has no function {attr!r}")
    try:
        schema, takes_record = function_schema(fn)
    except ValueError as exc:
        raise ToolLoadError(f"{field}: {reference!r} has no usable schema: {exc}") from None
    return Tool(schema["function"]["name"], fn, schema, takes_record)


def function_schema(fn: Callable[..., Any]) -> tuple[dict[str, Any], bool]:
    """(OpenAI tool schema, whether ``fn`` takes the record) from the signature and docstring."""
    try:
        hints = typing.get_type_hints(fn)
        signature = inspect.signature(fn)
    except (NameError, TypeError, ValueError) as exc:
        raise ValueError(f"signature unreadable ({exc})") from None
    summary, arg_docs = _docstring(inspect.getdoc(fn) or "")
    properties: dict[str, Any] = {}
    required: list[str] = []
    takes_record = False
    for name, param in signature.parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ValueError(f"*{name} parameters cannot be described to the model")
        if name == RECORD_PARAM:
            takes_record = True
            continue
        if name not in hints:
            raise ValueError(f"parameter {name!r} has no type annotation")
        prop = _json_type(hints[name], name)
        if name in arg_docs:
            prop["description"] = arg_docs[name]
        properties[name] = prop
        if param.default is param.empty:
            required.append(name)
    function = {
        "name": fn.__name__,
        "description": summary or fn.__name__,
        "parameters": {"type": "object", "properties": properties, "required": required},
    }
    return {"type": "function", "function": function}, takes_record


def _json_type(annotation: Any, name: str) -> dict[str, Any]:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return _json_type(rest[0], name)
        raise ValueError(f"parameter {name!r}: unions other than X | None are not supported")
    if origin is typing.Literal:
        return {"enum": list(args)}
    if origin in (list, tuple, Sequence):
        items = _json_type(args[0], name) if args and args[0] is not Ellipsis else {}
        return {"type": "array", **({"items": items} if items else {})}
    if origin in (dict, Mapping):
        return {"type": "object"}
    if annotation in _JSON_TYPES:
        return {"type": _JSON_TYPES[annotation]}
    raise ValueError(f"parameter {name!r}: type {annotation!r} has no JSON schema")


def _docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(first paragraph, {arg: description}) of a Google-style docstring."""
    summary = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
    args: dict[str, str] = {}
    section = re.search(r"^(?:Args|Arguments|Parameters):\s*\n((?:[ \t]+.*\n?)+)", doc, re.M)
    if section:
        name, indent = "", 0
        for line in section.group(1).splitlines():
            match = re.match(r"(\s+)(\w+)(?:\s*\([^)]*\))?:\s*(.*)", line)
            if match and (not name or len(match.group(1)) <= indent):
                indent, name = len(match.group(1)), match.group(2)
                args[name] = match.group(3).strip()
            elif name and line.strip():  # a wrapped description (hanging indent)
                args[name] = f"{args[name]} {line.strip()}".strip()
    return summary, args


def check_arguments(tool: Tool, arguments: Any) -> str | None:
    """Why ``arguments`` do not fit the tool's schema, or None when they do."""
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {type(arguments).__name__}"
    params = tool.parameters
    missing = [name for name in params["required"] if name not in arguments]
    if missing:
        return f"missing required argument(s): {', '.join(missing)}"
    for name, value in arguments.items():
        prop = params["properties"].get(name)
        if prop is None:
            return f"unknown argument {name!r}"
        if not _fits(value, prop):
            return f"argument {name!r}: {json.dumps(value)[:80]} does not match {json.dumps(prop)}"
    return None


def _fits(value: Any, prop: Mapping[str, Any]) -> bool:
    if "enum" in prop:
        return value in prop["enum"]
    kind = prop.get("type")
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "array":
        return isinstance(value, list) and all(_fits(v, prop.get("items", {})) for v in value)
    if kind == "object":
        return isinstance(value, dict)
    return True


async def call(
    tools: Mapping[str, Tool], name: str, arguments: Any, record: Mapping[str, Any], timeout_s: float
) -> CallResult:
    """Run one call; every failure is a CallResult with an error text for the model."""
    t0 = time.monotonic()

    def result(outcome: str, text: str) -> CallResult:
        return CallResult(name, outcome, text, time.monotonic() - t0)

    tool = tools.get(name)
    if tool is None:
        return result("unknown_tool", f"error: unknown tool {name!r} (available: {', '.join(tools)})")
    problem = check_arguments(tool, arguments)
    if problem is not None:
        return result("bad_arguments", f"error: {problem}")
    kwargs = dict(arguments)
    if tool.takes_record:
        kwargs[RECORD_PARAM] = record
    try:
        if inspect.iscoroutinefunction(tool.fn):
            value = await asyncio.wait_for(tool.fn(**kwargs), timeout_s)
        else:
            value = await asyncio.wait_for(_in_daemon_thread(lambda: tool.fn(**kwargs)), timeout_s)
        text = value if isinstance(value, str) else json.dumps(value, default=str)
    except TimeoutError as exc:
        if time.monotonic() - t0 < timeout_s:  # the tool's own TimeoutError, raised before the deadline
            return result("error", f"error: {type(exc).__name__}: {exc}")
        return result("timeout", f"error: {name} timed out after {timeout_s:g} s")
    except Exception as exc:  # the tool's own failure (or an unencodable result) is the model's to handle
        return result("error", f"error: {type(exc).__name__}: {exc}")
    return result("ok", text)


def _in_daemon_thread(fn: Callable[[], Any]) -> asyncio.Future[Any]:
    """``fn()`` in a daemon thread of its own; its result or exception on the returned future (left
    alone when the future was cancelled meanwhile, e.g. by a timeout, or its loop closed)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(value: Any, exc: BaseException | None) -> None:
        if future.done():
            return
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(value)

    def run() -> None:
        try:
            value, exc = fn(), None
        except BaseException as error:  # handed to the awaiting call, which answers the model
            value, exc = None, error
        with contextlib.suppress(RuntimeError):  # the loop closed while the tool ran
            loop.call_soon_threadsafe(settle, value, exc)

    threading.Thread(target=run, name="asyncrl-tool", daemon=True).start()
    return future


def truncate_middle(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters by dropping its middle (verl's default side)."""
    if len(text) <= limit:
        return text
    marker = "...(truncated)..."
    if limit < len(marker) + 2:  # no room for the marker and both ends: keep the head
        return text[:limit]
    keep = limit - len(marker)
    return text[: keep // 2] + marker + text[len(text) - (keep - keep // 2) :]
