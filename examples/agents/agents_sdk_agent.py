"""An OpenAI Agents SDK agent as the agent of an asyncrl gateway job: the builtin `lookup` task.

    asyncrl run examples/gateway-cpu.yaml          # prints the gateway URL and admin key, then:
    ASYNCRL_GATEWAY_URL=http://127.0.0.1:8100 ASYNCRL_GATEWAY_ADMIN_KEY=... \\
        python examples/agents/agents_sdk_agent.py [--n 4] [--groups 1] [--chat-completions]

Each session is one `Runner.run` of an `Agent` whose model is pointed at the session: the SDK's default
`OpenAIResponsesModel` (the Responses API) or, with --chat-completions, `OpenAIChatCompletionsModel`,
both over `AsyncOpenAI(base_url=<session base_url>, api_key=<session key>)`; tracing is off (it would
post to OpenAI). The agent's `lookup` tool returns the record's secret; the session is rewarded as the
builtin task scores it (1.0: the answer starts with the secret after looking it up) and ended. Every call
the SDK makes continues the session's one trajectory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import urllib.request
from typing import Any

import openai
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)


def post(url: str, key: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body or {}).encode(), method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=60) as response:
        return dict(json.loads(response.read()))


async def run_session(record: dict[str, Any], session: dict[str, Any], chat_completions: bool) -> float:
    looked_up: list[str] = []

    @function_tool
    def lookup() -> str:
        """Return the secret letter of this question."""
        looked_up.append(record["secret"])
        return str(record["secret"])

    client = openai.AsyncOpenAI(base_url=session["base_url"], api_key=session["api_key"])
    model_class = OpenAIChatCompletionsModel if chat_completions else OpenAIResponsesModel
    agent = Agent(
        name="lookup", instructions="Look the secret up, then answer with it.", tools=[lookup],
        model=model_class("policy", client), model_settings=ModelSettings(max_tokens=8),
    )  # fmt: skip
    try:
        result = await Runner.run(agent, str(record["prompt"]), max_turns=3)
        answer = str(result.final_output or "")
    except Exception as exc:  # max turns, a refused call: scored as it stands
        print(f"session {session['session_id']}: {exc!r}", file=sys.stderr)
        answer = ""
    reward = 1.0 if looked_up and answer.lstrip()[:1] == record["secret"] else 0.2 if looked_up else 0.0
    root = session["base_url"].removesuffix("/v1")
    post(f"{root}/rl/reward", session["api_key"], {"reward": reward, "session": True})
    post(f"{root}/rl/end", session["api_key"])
    return reward


async def main(args: argparse.Namespace) -> int:
    set_tracing_disabled(True)
    for _ in range(args.groups):
        group = post(f"{args.url}/rl/groups", args.admin_key, {"n": args.n})
        rewards = await asyncio.gather(
            *(run_session(group["record"], s, args.chat_completions) for s in group["sessions"])
        )
        print(f"group {group['group_id']}: rewards {rewards}", flush=True)
    return 0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--url", default=os.environ.get("ASYNCRL_GATEWAY_URL"), help="gateway URL (replica 0)"
    )
    parser.add_argument("--admin-key", default=os.environ.get("ASYNCRL_GATEWAY_ADMIN_KEY"))
    parser.add_argument("--n", type=int, default=4, help="sessions per group (a GRPO group)")
    parser.add_argument("--groups", type=int, default=1)
    parser.add_argument("--chat-completions", action="store_true", help="OpenAIChatCompletionsModel")
    args = parser.parse_args(argv)
    if not args.url or not args.admin_key:
        parser.error("set ASYNCRL_GATEWAY_URL and ASYNCRL_GATEWAY_ADMIN_KEY (or --url and --admin-key)")
    args.url = args.url.rstrip("/")
    return args


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse())))
