"""Claude Code as the agent of an asyncrl gateway job: open groups, run `claude -p` once per session.

    asyncrl run examples/gateway-cpu.yaml          # prints the gateway URL and admin key, then:
    ASYNCRL_GATEWAY_URL=http://127.0.0.1:8100 ASYNCRL_GATEWAY_ADMIN_KEY=... \\
        python examples/agents/claude_code_driver.py [--n 4] [--groups 1] [--claude PATH] [--workdir DIR]

Claude Code speaks only the Anthropic Messages API, so each session is given to it as
`ANTHROPIC_BASE_URL` (the session's URL: its `base_url` without `/v1`) and `ANTHROPIC_API_KEY` (the
session's key); it runs headless (`-p`) in a fresh HOME (the user's own config and login stay out of it;
a subscription login's OAuth token is refused by the gateway with a 401 saying what to set) with
telemetry and non-essential traffic off. The task is the group's record prompt (the job's next data
record). Every call it makes lands in its session; when it exits the driver ends the session, and the
job's reward function scores the final answer against the record (or set one yourself first:
`POST <session>/rl/reward {"reward": r, "session": true}`). One line per session: exit code and the
answer's first line.

Only the standard library: it stands for a CLI-agent driver outside the trainer, as yours would be.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any

CACHED = pathlib.Path.home() / ".cache" / "asyncrl" / "claude-code" / "node_modules" / ".bin" / "claude"


def post(url: str, key: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    """POST with the key; 429 (no admission yet) waits Retry-After and asks again."""
    while True:
        request = urllib.request.Request(
            url, data=json.dumps(body or {}).encode(), method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return dict(json.loads(response.read()))
        except urllib.error.HTTPError as exc:
            if exc.code != 429:
                raise
            time.sleep(float(exc.headers.get("Retry-After", "1")))


def run_session(args: argparse.Namespace, task: str, session: dict[str, Any]) -> str:
    root = session["base_url"].removesuffix("/v1")
    with tempfile.TemporaryDirectory(prefix="claude-home-") as home:
        env = {
            "PATH": os.environ.get("PATH", ""), "HOME": home, "DISABLE_TELEMETRY": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "ANTHROPIC_BASE_URL": root, "ANTHROPIC_API_KEY": session["api_key"],
        }  # fmt: skip
        done = subprocess.run(
            [args.claude, "-p", task, "--model", args.model, *args.claude_args],
            cwd=args.workdir, env=env, capture_output=True, text=True, timeout=args.timeout,
        )  # fmt: skip
    post(f"{root}/rl/end", session["api_key"])
    answer = (done.stdout.strip().splitlines() or [""])[0]
    return f"session {session['session_id']}: exit {done.returncode}, answer {answer[:80]!r}"


def main(args: argparse.Namespace) -> int:
    for _ in range(args.groups):
        group = post(f"{args.url}/rl/groups", args.admin_key, {"n": args.n})
        task = str((group.get("record") or {}).get(args.prompt_key) or group["messages"][-1]["content"])
        with concurrent.futures.ThreadPoolExecutor(args.n) as pool:
            sessions = group["sessions"]
            for line in pool.map(run_session, [args] * len(sessions), [task] * len(sessions), sessions):
                print(f"group {group['group_id']}: {line}", flush=True)
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
    parser.add_argument(
        "--claude", default=str(CACHED) if CACHED.exists() else "claude", help="the claude binary"
    )
    parser.add_argument("--model", default="policy", help="any id: the gateway serves the job's policy")
    parser.add_argument("--prompt-key", default="prompt", help="the record field that is the task")
    parser.add_argument("--workdir", default=".", help="where Claude Code works (its tools act here)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per session")
    parser.add_argument("claude_args", nargs="*", help="more arguments for claude, after --")
    args = parser.parse_args(argv)
    if not args.url or not args.admin_key:
        parser.error("set ASYNCRL_GATEWAY_URL and ASYNCRL_GATEWAY_ADMIN_KEY (or --url and --admin-key)")
    args.url = args.url.rstrip("/")
    return args


if __name__ == "__main__":
    sys.exit(main(parse()))
