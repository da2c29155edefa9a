"""Agent tools (episode/tools.py): the schema a model sees, start-up loading errors, argument checks, and
calls whose every failure comes back as an outcome and a message, never as an exception."""

from __future__ import annotations

import asyncio
import pathlib
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal, Optional

import pytest
from asyncrl_workloads.episode import tools
from asyncrl_workloads.tasks import lookup


def search(
    query: str, limit: int = 5, *, exact: bool = False, record: Mapping[str, Any] | None = None
) -> str:
    """Search the corpus for a phrase
    and return the hits.

    The model is not told this paragraph.

    Args:
        query: What to look for, one of
            phrases: words in order (wrapped).
        limit (int): At most this many hits.
        exact: Match the whole phrase.

    Returns:
        unused: never a parameter.
    """
    del record
    return f"{query}:{limit}:{exact}"


def _with(annotation: Any, default: Any = None) -> Callable[..., Any]:
    """A one-parameter function ``f(x)`` annotated with ``annotation``."""

    def f(x):  # type: ignore[no-untyped-def]  # annotated below, as a value
        return x

    f.__annotations__ = {"x": annotation}
    if default is not None:
        f.__defaults__ = (default,)
    return f


def _tool(fn: Callable[..., Any]) -> tools.Tool:
    schema, takes_record = tools.function_schema(fn)
    return tools.Tool(fn.__name__, fn, schema, takes_record)


def _call(
    toolset: Sequence[Callable[..., Any]],
    name: str,
    arguments: Any,
    timeout_s: float = 5.0,
    record: Mapping[str, Any] | None = None,
) -> tools.CallResult:
    by_name = {fn.__name__: _tool(fn) for fn in toolset}
    return asyncio.run(tools.call(by_name, name, arguments, record or {}, timeout_s))


# --- the schema ---------------------------------------------------------------------------------------


def test_the_schema_comes_from_the_signature_and_the_google_docstring() -> None:
    schema, takes_record = tools.function_schema(search)
    assert takes_record
    assert schema == {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the corpus for a phrase and return the hits.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {
                        "type": "string",
                        "description": "What to look for, one of phrases: words in order (wrapped).",
                    },
                    "limit": {"type": "integer", "description": "At most this many hits."},
                    "exact": {"type": "boolean", "description": "Match the whole phrase."},
                },
                "required": ["query"],
            },
        },
    }


def test_a_tool_without_a_docstring_is_described_by_its_name_and_takes_no_record() -> None:
    def ping(host: str) -> str:
        return host

    schema, takes_record = tools.function_schema(ping)
    assert not takes_record
    assert schema["function"]["description"] == "ping"
    assert schema["function"]["parameters"] == {
        "type": "object",
        "properties": {"host": {"type": "string"}},
        "required": ["host"],
    }


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        (str, {"type": "string"}),
        (int, {"type": "integer"}),
        (float, {"type": "number"}),
        (bool, {"type": "boolean"}),
        (list, {"type": "array"}),
        (list[str], {"type": "array", "items": {"type": "string"}}),
        (list[list[int]], {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}}),
        (tuple[float, ...], {"type": "array", "items": {"type": "number"}}),
        (Sequence[bool], {"type": "array", "items": {"type": "boolean"}}),
        (dict, {"type": "object"}),
        (dict[str, int], {"type": "object"}),
        (Mapping[str, Any], {"type": "object"}),
        (Literal["asc", "desc"], {"enum": ["asc", "desc"]}),
        (int | None, {"type": "integer"}),
        (Optional[Literal[1, 2]], {"enum": [1, 2]}),  # noqa: UP045  (typing.Union, not X | Y)
        (list[str] | None, {"type": "array", "items": {"type": "string"}}),
    ],
    ids=str,
)
def test_each_supported_annotation_has_its_json_type(annotation: Any, expected: dict[str, Any]) -> None:
    schema, _ = tools.function_schema(_with(annotation))
    assert schema["function"]["parameters"]["properties"] == {"x": expected}


@pytest.mark.parametrize(
    ("annotation", "message"),
    [
        (int | str, "unions other than X | None are not supported"),
        (set[int], "has no JSON schema"),
        (Any, "has no JSON schema"),
        (list[bytes], "has no JSON schema"),
    ],
    ids=str,
)
def test_an_annotation_without_a_json_schema_is_refused(annotation: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tools.function_schema(_with(annotation))


def test_a_parameter_with_a_default_is_optional() -> None:
    schema, _ = tools.function_schema(_with(int, default=3))
    assert schema["function"]["parameters"]["required"] == []


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def f(x: int, y): ...", "parameter 'y' has no type annotation"),
        ("def f(*names: str): ...", r"\*names parameters cannot be described"),
        ("def f(**options: int): ...", r"\*options parameters cannot be described"),
        ("def f(x: 'Undefined'): ...", "signature unreadable"),
    ],
)
def test_a_signature_the_model_cannot_be_told_is_refused(source: str, message: str) -> None:
    namespace: dict[str, Any] = {}
    exec(source, namespace)
    with pytest.raises(ValueError, match=message):
        tools.function_schema(namespace["f"])


# --- loading at start-up ------------------------------------------------------------------------------

_TOOL_MODULE = '''
from __future__ import annotations

def add(a: int, b: int = 1) -> int:
    """Add two numbers."""
    return a + b

def untyped(a):
    return a

def spread(*values: int) -> int:
    return sum(values)

NOT_A_FUNCTION = 3
'''


@pytest.fixture(scope="module")
def tool_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An importable module of tools (and one that fails to import), named uniquely for this run."""
    root = tmp_path_factory.mktemp("tool_modules")
    name = f"asyncrl_test_tools_{root.name.replace('-', '_')}"
    (root / f"{name}.py").write_text(_TOOL_MODULE)
    (root / f"{name}_broken.py").write_text("def f(:\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(root))
        yield name
    for module in (name, f"{name}_broken"):
        sys.modules.pop(module, None)


def test_tools_load_by_reference_under_their_function_names(tool_module: str) -> None:
    loaded = tools.load_tools([f"{tool_module}:add", "asyncrl_workloads.tasks.lookup:lookup"])
    assert list(loaded) == ["add", "lookup"]
    assert loaded["lookup"].fn is lookup.lookup and loaded["lookup"].takes_record
    assert loaded["lookup"].parameters == {"type": "object", "properties": {}, "required": []}
    assert loaded["add"].parameters["required"] == ["a"] and not loaded["add"].takes_record


@pytest.mark.parametrize(
    ("references", "message"),
    [
        (["no_such_module_for_asyncrl:f"], "[0]: cannot import module 'no_such_module_for_asyncrl'"),
        (["{mod}_broken:f"], "[0]: cannot import module '{mod}_broken' (invalid syntax"),
        (["{mod}:add", "{mod}:missing"], "[1]: module '{mod}' has no function 'missing'"),
        (["{mod}:NOT_A_FUNCTION"], "[0]: module '{mod}' has no function 'NOT_A_FUNCTION'"),
        (["{mod}:untyped"], "[0]: '{mod}:untyped' has no usable schema: parameter 'a' has no type"),
        (["{mod}:spread"], r"[0]: '{mod}:spread' has no usable schema: *values parameters"),
        (["{mod}:add", "{mod}:add"], "[1]: a second tool named 'add'"),
    ],
)
def test_a_tool_that_cannot_be_used_fails_loading_in_one_line_naming_its_entry(
    tool_module: str, references: list[str], message: str
) -> None:
    with pytest.raises(tools.ToolLoadError) as err:
        tools.load_tools([r.format(mod=tool_module) for r in references])
    text = str(err.value)
    assert text.startswith("spec.agent.tools[") and "\n" not in text
    assert f"spec.agent.tools{message.format(mod=tool_module)}" in text


# --- arguments ----------------------------------------------------------------------------------------


def _typed(
    name: str,
    count: int,
    ratio: float,
    flag: bool,
    tags: list[str],
    options: dict[str, Any],
    order: Literal["asc", "desc"] = "asc",
) -> str:
    return name


GOOD = {"name": "n", "count": 2, "ratio": 0.5, "flag": True, "tags": ["a"], "options": {}}


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({}, None),
        ({"ratio": 1, "order": "desc", "tags": []}, None),
        ({"name": None}, "missing required argument(s): name"),
        ({"count": "2"}, "argument 'count': \"2\" does not match"),
        ({"count": 2.0}, "argument 'count': 2.0 does not match"),
        ({"count": True}, "argument 'count': true does not match"),
        ({"ratio": False}, "argument 'ratio'"),
        ({"flag": 1}, "argument 'flag'"),
        ({"tags": "a"}, "argument 'tags'"),
        ({"tags": ["a", 1]}, "argument 'tags'"),
        ({"options": []}, "argument 'options'"),
        ({"order": "random"}, "argument 'order'"),
        ({"extra": 1}, "unknown argument 'extra'"),
        ({"record": {"secret": "a"}}, "unknown argument 'record'"),
    ],
)
def test_arguments_are_checked_against_the_schema(change: dict[str, Any], problem: str | None) -> None:
    arguments = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    found = tools.check_arguments(_tool(_typed), arguments)
    if problem is None:
        assert found is None
    else:
        assert found is not None and found.startswith(problem)


@pytest.mark.parametrize(("arguments", "kind"), [([], "list"), ('{"name": "n"}', "str"), (None, "NoneType")])
def test_arguments_that_are_not_an_object_are_refused(arguments: Any, kind: str) -> None:
    assert tools.check_arguments(_tool(_typed), arguments) == f"arguments must be a JSON object, got {kind}"


# --- calls --------------------------------------------------------------------------------------------


def echo(text: str) -> str:
    """Echo."""
    return text


async def shout(text: str) -> str:
    """Echo, louder."""
    await asyncio.sleep(0)
    return text.upper()


def secret(record: Mapping[str, Any]) -> str:
    """The record's secret."""
    return str(record["secret"])


def fails(text: str) -> str:
    """Raises."""
    raise ValueError(f"no {text}")


async def fails_async() -> str:
    """Raises, asynchronously."""
    raise KeyError("gone")


def test_a_sync_tool_answers_with_its_text() -> None:
    result = _call([echo], "echo", {"text": "hi"})
    assert (result.name, result.outcome, result.text) == ("echo", "ok", "hi")
    assert 0.0 <= result.seconds < 5.0


def test_an_async_tool_answers_with_its_text() -> None:
    assert _call([shout], "shout", {"text": "hi"}).text == "HI"


def test_a_record_parameter_receives_the_samples_record() -> None:
    result = _call([secret], "secret", {}, record={"secret": "q"})
    assert (result.outcome, result.text) == ("ok", "q")


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ({"hits": [1, 2]}, '{"hits": [1, 2]}'),
        (3, "3"),
        (None, "null"),
        ([pathlib.PurePosixPath("/a")], '["/a"]'),
    ],
)
def test_a_result_that_is_not_a_string_is_answered_as_json(value: Any, text: str) -> None:
    def value_tool() -> Any:
        """A value."""
        return value

    result = _call([value_tool], "value_tool", {})
    assert (result.outcome, result.text) == ("ok", text)


@pytest.mark.parametrize(
    ("fn", "arguments", "text"),
    [(fails, {"text": "way"}, "error: ValueError: no way"), (fails_async, {}, "error: KeyError: 'gone'")],
    ids=["sync", "async"],
)
def test_a_tool_that_raises_is_answered_with_its_error(
    fn: Callable[..., Any], arguments: dict[str, Any], text: str
) -> None:
    result = _call([fn], fn.__name__, arguments)
    assert (result.name, result.outcome, result.text) == (fn.__name__, "error", text)


def test_a_result_that_cannot_be_encoded_is_an_error_not_an_exception() -> None:
    def tuple_keys() -> Any:
        """Keys JSON cannot hold."""
        return {(1, 2): 3}

    result = _call([tuple_keys], "tuple_keys", {})
    assert result.outcome == "error" and result.text.startswith("error: TypeError: keys must be")


def test_an_unknown_tool_is_answered_with_the_available_names() -> None:
    result = _call([echo, shout], "scream", {"text": "hi"})
    assert (result.outcome, result.text) == (
        "unknown_tool",
        "error: unknown tool 'scream' (available: echo, shout)",
    )


def test_bad_arguments_are_answered_without_running_the_tool() -> None:
    ran: list[str] = []

    def spy(text: str) -> str:
        """Records its calls."""
        ran.append(text)
        return text

    result = _call([spy], "spy", {"text": 3})
    assert result.outcome == "bad_arguments" and result.text.startswith("error: argument 'text'")
    assert ran == []


def test_a_hung_sync_tool_times_out_and_frees_the_episode() -> None:
    release = threading.Event()

    def hang() -> str:
        """Waits to be released."""
        release.wait(10)
        return "late"

    try:
        result = _call([hang], "hang", {}, timeout_s=0.05)
    finally:
        release.set()
    assert (result.outcome, result.text) == ("timeout", "error: hang timed out after 0.05 s")
    assert 0.05 <= result.seconds < 2.0


def test_a_hung_async_tool_times_out_and_is_cancelled() -> None:
    cancelled: list[bool] = []

    async def stall() -> str:
        """Never answers."""
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "late"

    result = _call([stall], "stall", {}, timeout_s=0.05)
    assert (result.outcome, result.text) == ("timeout", "error: stall timed out after 0.05 s")
    assert cancelled == [True]


@pytest.mark.parametrize("is_async", [False, True])
def test_a_tool_that_raises_timeout_error_itself_is_an_error_not_our_timeout(is_async: bool) -> None:
    def sync_fetch() -> str:
        """A fetch whose own client timed out."""
        raise TimeoutError("upstream took too long")

    async def async_fetch() -> str:
        """The same, awaited."""
        raise TimeoutError("upstream took too long")

    fn = async_fetch if is_async else sync_fetch
    result = _call([fn], fn.__name__, {}, timeout_s=30)
    assert (result.outcome, result.text) == ("error", "error: TimeoutError: upstream took too long")


def test_a_blocking_sync_tool_does_not_stall_the_event_loop() -> None:
    """The sync tool waits for an event only an async tool on the loop can set: it finishes only if the
    sync tool runs in another thread."""
    ready = threading.Event()

    def waits() -> str:
        """Blocks until the other tool ran."""
        return "released" if ready.wait(5) else "starved"

    async def releases() -> str:
        """Runs on the event loop."""
        await asyncio.sleep(0.01)
        ready.set()
        return "set"

    by_name = {fn.__name__: _tool(fn) for fn in (waits, releases)}

    async def both() -> list[tools.CallResult]:
        return list(
            await asyncio.gather(
                tools.call(by_name, "waits", {}, {}, 10), tools.call(by_name, "releases", {}, {}, 10)
            )
        )

    assert [(r.outcome, r.text) for r in asyncio.run(both())] == [("ok", "released"), ("ok", "set")]


# --- truncation ---------------------------------------------------------------------------------------

TEXT = "".join(chr(ord("a") + i % 26) for i in range(100))


@pytest.mark.parametrize(
    ("limit", "expected"),
    [
        (100, TEXT),
        (1000, TEXT),
        (27, "abcde...(truncated)...rstuv"),
        (20, "a...(truncated)...uv"),
        (19, "a...(truncated)...v"),
        (18, TEXT[:18]),
        (16, TEXT[:16]),
    ],
)
def test_long_tool_output_is_cut_in_the_middle(limit: int, expected: str) -> None:
    assert tools.truncate_middle(TEXT, limit) == expected


def test_truncated_output_is_exactly_the_limit_long() -> None:
    limits = range(1, len(TEXT))
    assert [len(tools.truncate_middle(TEXT, limit)) for limit in limits] == list(limits)
