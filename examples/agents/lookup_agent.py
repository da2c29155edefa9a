"""An agent of your own for an asyncrl agent-gateway job: the builtin `lookup` task over the OpenAI API.

    asyncrl run examples/gateway-cpu.yaml          # prints the gateway URL and admin key, then:
    ASYNCRL_GATEWAY_URL=http://127.0.0.1:8100 ASYNCRL_GATEWAY_ADMIN_KEY=... \\
        python examples/agents/lookup_agent.py [--n 4] [--groups N] [--concurrency 8] [--stream] \\
        [--apis chat,messages,responses]

It imports nothing of asyncrl (only the `openai` SDK, `httpx`, and `anthropic` for --apis messages): it
stands for an agent that lives outside the trainer, as yours would. The job learns from what it does:

1. Open a group of n sessions of the job's next task with the admin key (`POST /rl/groups {"n": n}`;
   a 429 means the trainer wants no more data now: wait Retry-After and ask again). The answer holds
   the task's record (`record`: here `{"prompt": "secret?", "secret": "c"}`), its chat `messages`, and
   per session a `base_url` and `api_key` for the unmodified OpenAI client.
2. For each session, concurrently, a tool loop: `chat.completions.create(messages, tools=[lookup])`
   (with --stream, `stream=True` and the reply assembled from the chunks); if the reply calls `lookup`,
   run it here (it returns the record's secret letter), append the assistant message and the tool
   message and ask again, up to 3 assistant turns. With --apis, group k speaks the k-th API of the list
   in turn: `chat` as above, `messages` (the anthropic SDK's `messages.create`/`messages.stream`, the
   tool's result a `tool_result` block) or `responses` (the openai SDK's `responses.create`, stateless:
   the whole input every call, the result a `function_call_output` item). One trajectory model for all.
3. Score the session (as the builtin task does: 1.0 the tool answered and the final answer starts with
   the secret, 0.3 it starts with another letter of "abcdefgh", 0.2 the tool answered, 0.0 otherwise),
   `POST <session>/rl/reward {"reward": r, "session": true}`, then `POST <session>/rl/end`. When every
   session of the group has ended, the group's trajectories go to the trainer.

One line per group (its mean reward); stops after --groups groups, or on Ctrl-C / SIGTERM (sessions
still open then expire on the gateway and are never trained on).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from typing import Any

import httpx
import openai

try:  # openai[aiohttp]: aiohttp under httpx's API. httpx's own pool scans every pooled connection on each
    # request; with a hundred sessions in flight that cost the agent 3.5 ms of CPU a call, aiohttp 1.5 ms
    from httpx_aiohttp import HttpxAiohttpClient as HttpClient
except ImportError:
    HttpClient = httpx.AsyncClient

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Return the secret letter of this question.",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]
ALPHABET = "abcdefgh"
MAX_TURNS = 3
MESSAGES_MAX_TOKENS = (
    8  # the Messages API requires one: the job's rollout.sampling.maxTokens (the others' default)
)
CONNECT_WAIT_S = 600.0  # the gateway serves once the rollout's engine is up (a minute or so on CPU)


def score(secret: str, called: bool, answer: str) -> float:
    """The builtin lookup task's graded reward."""
    if not called:
        return 0.0
    text = answer.lstrip()
    if text[:1] == secret:
        return 1.0
    if text[:1] and text[0] in ALPHABET:
        return 0.3
    return 0.2


async def open_group(http: httpx.AsyncClient, url: str, admin_key: str, n: int) -> dict[str, Any]:
    """POST /rl/groups until admitted: 429 (and 503) wait Retry-After; a gateway not up yet is waited for."""
    deadline = time.monotonic() + CONNECT_WAIT_S
    while True:
        try:
            response = await http.post(
                f"{url}/rl/groups", json={"n": n}, headers={"Authorization": f"Bearer {admin_key}"}
            )
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1.0)
            continue
        if response.status_code in (429, 503):
            await asyncio.sleep(float(response.headers.get("retry-after", "1")))
            continue
        response.raise_for_status()
        group: dict[str, Any] = response.json()
        return group


async def complete(
    client: openai.AsyncOpenAI, messages: list[dict[str, Any]], stream: bool
) -> tuple[dict[str, Any], str | None]:
    """One call: the assistant message (as the next request sends it back) and why it finished."""
    request: dict[str, Any] = {"model": "lookup-agent", "messages": messages, "tools": TOOLS}
    if not stream:
        choice = (await client.chat.completions.create(**request)).choices[0]
        return choice.message.model_dump(exclude_none=True), choice.finish_reason
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    async for chunk in await client.chat.completions.create(**request, stream=True):
        for choice in chunk.choices:
            message["content"] += choice.delta.content or ""
            for delta in choice.delta.tool_calls or []:  # id and name first, the arguments in pieces
                call = calls.setdefault(delta.index, {"type": "function", "function": {"arguments": ""}})
                call.setdefault("id", delta.id)
                if delta.function is not None:
                    call["function"].setdefault("name", delta.function.name)
                    call["function"]["arguments"] += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message, finish


class Chat:
    """The conversation in OpenAI chat completions."""

    def __init__(
        self, http: httpx.AsyncClient, session: dict[str, Any], messages: list[dict[str, Any]]
    ) -> None:
        self.client = openai.AsyncOpenAI(
            base_url=session["base_url"], api_key=session["api_key"], http_client=http
        )
        self.messages = list(messages)

    async def turn(self, stream: bool) -> tuple[str, list[tuple[str, str]], bool]:
        """(answer text, the (call id, tool name) it calls, cut by max_tokens)."""
        message, finish = await complete(self.client, self.messages, stream)
        self.messages.append(message)
        calls = [(c["id"], c["function"]["name"]) for c in message.get("tool_calls") or []]
        return message.get("content") or "", calls, finish == "length"

    def results(self, outputs: list[tuple[str, str]]) -> None:
        self.messages += [{"role": "tool", "tool_call_id": i, "content": out} for i, out in outputs]


class Messages:
    """The conversation in the Anthropic Messages API (the anthropic SDK, as Claude Code speaks it)."""

    def __init__(
        self, http: httpx.AsyncClient, session: dict[str, Any], messages: list[dict[str, Any]]
    ) -> None:
        import anthropic

        base = session["base_url"].removesuffix("/v1")  # ANTHROPIC_BASE_URL: the session's URL
        self.client = anthropic.AsyncAnthropic(
            base_url=base, api_key=session["api_key"]
        )  # its own HTTP stack
        self.system = "".join(m["content"] for m in messages if m["role"] == "system")
        self.messages = [m for m in messages if m["role"] != "system"]
        self.tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
                       "input_schema": t["function"]["parameters"]} for t in TOOLS]  # fmt: skip

    async def turn(self, stream: bool) -> tuple[str, list[tuple[str, str]], bool]:
        request: dict[str, Any] = {
            "model": "lookup-agent", "max_tokens": MESSAGES_MAX_TOKENS, "messages": self.messages,
            "tools": self.tools,
        }  # fmt: skip
        if self.system:
            request["system"] = self.system
        if stream:
            async with self.client.messages.stream(**request) as events:
                reply = await events.get_final_message()
        else:
            reply = await self.client.messages.create(**request)
        self.messages.append(
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]}
        )
        text = "".join(b.text for b in reply.content if b.type == "text")
        return (
            text,
            [(b.id, b.name) for b in reply.content if b.type == "tool_use"],
            reply.stop_reason == "max_tokens",
        )

    async def close(self) -> None:
        await self.client.close()

    def results(self, outputs: list[tuple[str, str]]) -> None:
        blocks = [{"type": "tool_result", "tool_use_id": i, "content": out} for i, out in outputs]
        self.messages.append({"role": "user", "content": blocks})


class Responses:
    """The conversation in the OpenAI Responses API, stateless (store false, the whole input each call)."""

    def __init__(
        self, http: httpx.AsyncClient, session: dict[str, Any], messages: list[dict[str, Any]]
    ) -> None:
        self.client = openai.AsyncOpenAI(
            base_url=session["base_url"], api_key=session["api_key"], http_client=http
        )
        self.instructions = "".join(m["content"] for m in messages if m["role"] == "system") or None
        self.input: list[Any] = [m for m in messages if m["role"] != "system"]
        self.tools = [{"type": "function", **t["function"]} for t in TOOLS]

    async def turn(self, stream: bool) -> tuple[str, list[tuple[str, str]], bool]:
        request: dict[str, Any] = {"model": "lookup-agent", "input": self.input, "tools": self.tools,
                                   "instructions": self.instructions, "store": False}  # fmt: skip
        if stream:
            reply = None
            async for event in await self.client.responses.create(**request, stream=True):
                if event.type in ("response.completed", "response.incomplete"):
                    reply = event.response
            assert reply is not None, "the stream ended without its response"
        else:
            reply = await self.client.responses.create(**request)
        self.input += [item.model_dump(exclude_none=True) for item in reply.output]
        calls = [(o.call_id, o.name) for o in reply.output if o.type == "function_call"]
        return reply.output_text, calls, reply.status == "incomplete"

    def results(self, outputs: list[tuple[str, str]]) -> None:
        self.input += [{"type": "function_call_output", "call_id": i, "output": out} for i, out in outputs]


APIS = {"chat": Chat, "messages": Messages, "responses": Responses}


async def run_session(
    http: httpx.AsyncClient, group: dict[str, Any], session: dict[str, Any], stream: bool, api: str = "chat"
) -> float:
    """One episode through the API's own client; the session's reward is set and the session ended."""
    conversation = APIS[api](http, session, group["messages"])
    secret = str(group["record"]["secret"])
    called, answer = False, ""
    try:
        for turn in range(1, MAX_TURNS + 1):
            answer, calls, cut = await conversation.turn(stream)
            if not calls or cut or turn == MAX_TURNS:
                break
            conversation.results(
                [(i, secret if name == "lookup" else f"unknown tool {name!r}") for i, name in calls]
            )
            called = called or any(
                name == "lookup" for _, name in calls
            )  # reaches the model with the next call
    except Exception as exc:  # an API's status error (openai or anthropic): the session is scored as it is
        if getattr(exc, "status_code", None) is None:
            raise
        print(f"session {session['session_id']}: {api} {exc.status_code} {exc}", file=sys.stderr)
    finally:
        if isinstance(conversation, Messages):
            await conversation.close()
    reward = score(secret, called, answer)
    base = session["base_url"].removesuffix("/v1")
    auth = {"Authorization": f"Bearer {session['api_key']}"}
    for path, body in (("/rl/reward", {"reward": reward, "session": True}), ("/rl/end", None)):
        for attempt in range(3):  # a pooled connection the server just closed: send it again
            try:
                response = await http.post(base + path, json=body, headers=auth)
                break
            except httpx.TransportError:
                if attempt == 2:
                    raise
        if response.status_code >= 400:
            print(f"session {session['session_id']}: {path} {response.status_code}", file=sys.stderr)
    return reward


async def worker(args: argparse.Namespace, http: httpx.AsyncClient, tickets: dict[str, int]) -> None:
    while args.groups is None or tickets["started"] < args.groups:
        tickets["started"] += 1
        api = args.apis[(tickets["started"] - 1) % len(args.apis)]
        group = await open_group(http, args.url, args.admin_key, args.n)
        rewards = await asyncio.gather(
            *(run_session(http, group, s, args.stream, api) for s in group["sessions"])
        )
        tickets["done"] += 1
        mean = sum(rewards) / len(rewards)
        print(
            f"group {group['group_id']} ({tickets['done']} done, {api}): mean reward {mean:.3f} "
            f"[{' '.join(f'{r:.1f}' for r in rewards)}]",
            flush=True,
        )


async def main(args: argparse.Namespace) -> int:
    """Run the workers until --groups groups are done (0) or Ctrl-C (130) / SIGTERM (143)."""
    loop, stopped = asyncio.get_running_loop(), asyncio.Event()
    signals: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda sig=sig: (signals.append(sig), stopped.set()))
    # idle connections are dropped well before the server's keep-alive timeout, so a request is rarely
    # sent on a connection the server is closing at that moment
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64, keepalive_expiry=2.0)
    async with HttpClient(timeout=httpx.Timeout(600.0, connect=10.0), limits=limits) as http:
        tickets = {"started": 0, "done": 0}
        workers = [asyncio.create_task(worker(args, http, tickets)) for _ in range(args.concurrency)]
        stop = asyncio.create_task(stopped.wait())
        await asyncio.wait([*workers, stop], return_when=asyncio.FIRST_COMPLETED)
        if not stopped.is_set():  # a worker ended: wait for the others (--groups) or a signal
            await asyncio.wait([asyncio.gather(*workers), stop], return_when=asyncio.FIRST_COMPLETED)
        # Stop: cancel what is in flight (its sessions expire on the gateway, never trained on). The wait
        # is bounded: a cancellation swallowed inside a client library must not keep the agent alive.
        for task in [*workers, stop]:
            task.cancel()
        await asyncio.wait([*workers, stop], timeout=10)
        for task in workers:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
    return {signal.SIGINT: 130, signal.SIGTERM: 143}.get(signals[0], 1) if signals else 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--url", default=os.environ.get("ASYNCRL_GATEWAY_URL"), help="gateway URL (replica 0)"
    )
    parser.add_argument("--admin-key", default=os.environ.get("ASYNCRL_GATEWAY_ADMIN_KEY"))
    parser.add_argument("--n", type=int, default=4, help="sessions per group (a GRPO group)")
    parser.add_argument(
        "--groups", type=int, default=None, help="stop after this many groups (default: never)"
    )
    parser.add_argument("--concurrency", type=int, default=8, help="groups at once")
    parser.add_argument("--stream", action="store_true", help="stream the completions (stream=True)")
    parser.add_argument(
        "--apis",
        default="chat",
        help="comma-separated APIs the groups take in turn: chat, messages, responses",
    )
    args = parser.parse_args(argv)
    args.apis = [a.strip() for a in args.apis.split(",") if a.strip()]
    if not args.apis or set(args.apis) - set(APIS):
        parser.error(f"--apis: a comma-separated list of {', '.join(APIS)}")
    if not args.url or not args.admin_key:
        parser.error("set ASYNCRL_GATEWAY_URL and ASYNCRL_GATEWAY_ADMIN_KEY (or --url and --admin-key)")
    args.url = args.url.rstrip("/")
    return args


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))  # 130 on Ctrl-C, 143 on SIGTERM: the shell's convention
