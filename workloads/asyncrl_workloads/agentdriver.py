"""`asyncrl agent -- CMD ARGS...`: any command-line agent trained through gateway sessions, without code.

Run by the agent workers of a job with `spec.agent.workers.sessionCommand` (render/agents.py builds the
command line) and by hand against a local run's gateway. Standard library only (asyncio, subprocess,
urllib), so it runs in any image that has Python; ``cli.py`` hands it the arguments.

Per group, at most --concurrency session processes at once (a group is opened only when all its sessions
can start, so none waits out its session timeout in a queue):

1. ``POST $ASYNCRL_GATEWAY_URL/rl/groups`` with the admin key (``{"n": N}`` with --n, else the job's
   samplesPerPrompt); a 429 or 503 waits Retry-After, a gateway not up yet is waited for (--connect-wait).
2. Per session, CMD in a scratch working directory of its own, ``{prompt}`` in any argument replaced by the
   task's prompt (the last user message of the group's chat messages, else the record's prompt), else the
   prompt on stdin, and ``{base_url}`` by the session's OpenAI base URL (for a CLI that takes it only in
   its config, as Codex CLI: ``-c model_providers.<id>.base_url``; the key is never put on the command
   line: such a CLI reads it from an env var it is told); the session is in the environment the common
   clients read: OPENAI_BASE_URL and OPENAI_API_KEY (the OpenAI SDKs, LangChain; Codex CLI's provider
   `env_key`), ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY (Claude Code, the Anthropic SDK),
   ASYNCRL_SESSION_URL and ASYNCRL_SESSION_KEY (``/rl/reward``), ASYNCRL_REWARD_FILE.
3. When CMD exits (any code: a failed run is an episode too, the job's reward function scores it) a reward
   it wrote to $ASYNCRL_REWARD_FILE (a number) is set, and the session ended. A CMD still running at
   --timeout is killed with its process group and the session aborted (``/rl/abort``: never trained on,
   counted ``asyncrl_gateway_sessions_total{state="aborted"}``); its group goes out without it.

SIGTERM/SIGINT: no new groups; running commands are killed and their sessions aborted; exit 143/130.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import pathlib
import shutil
import signal
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

PROMPT = "{prompt}"
BASE_URL = "{base_url}"
KILL_GRACE_S = 5.0
REQUEST_TIMEOUT_S = 30.0
"""A whole gateway request (send, answer read to its end), however slowly the gateway answers."""
RETRY_S = 1.0
STOP_GRACE_S = 5.0
"""After a stop signal, how long a session's closing call (reward, end, abort) is retried while the gateway
does not answer at all: one that is going away with the job (the local runner stops its rollouts with the
workers; a deleted job's pods) expires the session itself, and the worker exits instead of retrying for
--connect-wait."""


class GatewayError(Exception):
    """The gateway refused a request for good (a wrong admin key, a bad request)."""


class Stopped(Exception):
    """A signal arrived while a request waited to be retried."""


def post(
    url: str, key: str, body: Mapping[str, Any] | None, timeout: float = REQUEST_TIMEOUT_S
) -> tuple[int, Any, float]:
    """(status, JSON body or None, Retry-After seconds) of one POST; transport errors raise OSError, and
    an answer still arriving ``timeout`` seconds after the request was sent raises TimeoutError (urllib's
    own timeout bounds each socket read only, which a server sending a byte now and then never trips)."""
    deadline = time.monotonic() + timeout
    data = json.dumps(body or {}).encode()
    request = urllib.request.Request(url, data=data, method="POST")
    request.add_header("Authorization", f"Bearer {key}")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(_read_by(response, deadline) or b"null"), 0.0
    except urllib.error.HTTPError as exc:
        text = _read_by(exc, deadline)
        try:
            payload = json.loads(text)
        except ValueError:
            payload = text.decode(errors="replace")
        try:
            wait = float(exc.headers.get("retry-after") or RETRY_S)
        except ValueError:
            wait = RETRY_S
        return exc.code, payload, wait


def _read_by(response: Any, deadline: float) -> bytes:
    """The whole body, read in pieces, each socket wait cut to what is left until ``deadline``."""
    chunks: list[bytes] = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the answer did not arrive in time")
        with contextlib.suppress(AttributeError):  # the socket under http.client's response
            response.fp.raw._sock.settimeout(left)
        chunk = response.read1(65536) if hasattr(response, "read1") else response.read()
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def prompt_of(group: Mapping[str, Any]) -> str:
    """The task's prompt: the last user message of the group's chat messages, else record.prompt."""
    for message in reversed(group.get("messages") or []):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return "".join(p.get("text", "") for p in content if isinstance(p, dict))
            return str(content or "")
    record = group.get("record") or {}
    prompt = record.get("prompt") if isinstance(record, dict) else None
    return prompt if isinstance(prompt, str) else json.dumps(record)


def session_env(
    session: Mapping[str, Any], reward_file: pathlib.Path, base: Mapping[str, str]
) -> dict[str, str]:
    v1 = str(session["base_url"]).rstrip("/")
    root = v1.removesuffix("/v1")
    key = str(session["api_key"])
    return {
        **base,
        "OPENAI_BASE_URL": v1,
        "OPENAI_API_KEY": key,
        "ANTHROPIC_BASE_URL": root,  # Claude Code and the Anthropic SDK add /v1/messages themselves
        "ANTHROPIC_API_KEY": key,
        "ASYNCRL_SESSION_URL": root,
        "ASYNCRL_SESSION_KEY": key,
        "ASYNCRL_SESSION_ID": str(session["session_id"]),
        "ASYNCRL_REWARD_FILE": str(reward_file),
    }


def session_argv(command: Sequence[str], prompt: str, base_url: str = "") -> tuple[list[str], bool]:
    """CMD with {base_url} and {prompt} substituted, and whether the prompt goes on stdin instead."""
    argv = [arg.replace(BASE_URL, base_url) for arg in command]
    if any(PROMPT in arg for arg in argv):
        return [arg.replace(PROMPT, prompt) for arg in argv], False
    return argv, True


def read_reward(path: pathlib.Path) -> float | None:
    try:
        return float(path.read_text().strip())
    except (OSError, ValueError):
        return None


class Driver:
    def __init__(self, args: argparse.Namespace, environ: Mapping[str, str]) -> None:
        self.args = args
        self.environ = dict(environ)
        self.url = str(args.url).rstrip("/")
        self.slots = args.concurrency
        self.free = asyncio.Condition()
        self.running = 0
        self.group_size = args.n or 1
        self.stopping = asyncio.Event()
        self.stopped_at = 0.0
        self.counts = {"ended": 0, "aborted": 0, "groups": 0}
        self.processes: set[asyncio.subprocess.Process] = set()

    async def call(self, url: str, key: str, body: Mapping[str, Any] | None = None) -> Any:
        """POST with retries of what may pass: 429/503 (Retry-After), a gateway not up yet."""
        deadline = time.monotonic() + self.args.connect_wait
        while True:
            try:
                timeout = REQUEST_TIMEOUT_S
                if self.stopping.is_set():  # a gateway trickling its answer gets no more than the grace
                    timeout = min(timeout, max(0.1, self.stopped_at + STOP_GRACE_S - time.monotonic()))
                status, payload, wait = await asyncio.to_thread(post, url, key, body, timeout)
            except (OSError, TimeoutError) as exc:
                if time.monotonic() > deadline:
                    raise GatewayError(f"{url}: {exc}") from None
                wait = RETRY_S
                status = 0
            if status in (0, 429, 503):
                if self.stopping.is_set() and not url.endswith(("/rl/abort", "/rl/end", "/rl/reward")):
                    raise Stopped()
                if (
                    status == 0
                    and self.stopping.is_set()
                    and time.monotonic() > self.stopped_at + STOP_GRACE_S
                ):
                    raise GatewayError(f"{url}: no answer {STOP_GRACE_S:g} s after the stop signal")
                await asyncio.sleep(wait)
                continue
            if status >= 400:
                raise GatewayError(f"{url}: HTTP {status} {payload}")
            return payload

    async def run(self) -> None:
        tasks: set[asyncio.Task[None]] = set()
        try:
            while not self.stopping.is_set():
                if self.args.groups is not None and self.counts["groups"] >= self.args.groups:
                    break
                need = min(self.group_size, self.slots)
                async with self.free:
                    await self.free.wait_for(functools.partial(self.can_open, need))
                    if self.stopping.is_set():
                        break
                    self.running += need  # held until the group's size is known
                body = {"n": self.args.n} if self.args.n else {}
                try:
                    group = await self.call(f"{self.url}/rl/groups", self.args.admin_key, body)
                except Stopped:
                    await self.release(need)
                    break
                except BaseException:
                    await self.release(need)
                    raise
                self.counts["groups"] += 1
                self.group_size = len(group["sessions"])
                async with self.free:
                    self.running += self.group_size - need
                task = asyncio.create_task(self.run_group(group))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def can_open(self, need: int) -> bool:
        return self.stopping.is_set() or self.slots - self.running >= need

    def stop(self) -> None:
        """From a signal handler: no new groups, running commands killed, their sessions aborted."""
        self.stopping.set()
        self.stopped_at = time.monotonic()
        asyncio.get_running_loop().create_task(self.release(0))  # wakes a wait for free slots

    async def release(self, count: int) -> None:
        async with self.free:
            self.running -= count
            self.free.notify_all()

    async def run_group(self, group: Mapping[str, Any]) -> None:
        prompt = prompt_of(group)
        await asyncio.gather(*(self.run_session(s, prompt) for s in group["sessions"]))

    async def run_session(self, session: Mapping[str, Any], prompt: str) -> None:
        scratch = pathlib.Path(
            tempfile.mkdtemp(prefix=f"session-{session['session_id']}-", dir=self.args.workdir)
        )
        root = str(session["base_url"]).rstrip("/").removesuffix("/v1")
        key = str(session["api_key"])
        try:
            finished = await self.run_command(session, prompt, scratch)
            if finished:
                reward = read_reward(scratch / "reward")
                if reward is not None:
                    await self.call(f"{root}/rl/reward", key, {"reward": reward, "session": True})
                await self.call(f"{root}/rl/end", key)
                self.counts["ended"] += 1
            else:
                await self.call(f"{root}/rl/abort", key)
                self.counts["aborted"] += 1
        except GatewayError as exc:
            print(f"asyncrl agent: session {session['session_id']}: {exc}", file=sys.stderr, flush=True)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
            await self.release(1)

    async def run_command(self, session: Mapping[str, Any], prompt: str, scratch: pathlib.Path) -> bool:
        """Run CMD for one session; True when it exited by itself, False when it was killed."""
        argv, on_stdin = session_argv(self.args.session_command, prompt, str(session["base_url"]).rstrip("/"))
        env = session_env(session, scratch / "reward", self.environ)
        if self.args.session_home:
            env["HOME"] = str(scratch)
        with open(scratch / "output.log", "wb") as log:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=scratch,
                env=env,
                start_new_session=True,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                stdin=asyncio.subprocess.PIPE if on_stdin else asyncio.subprocess.DEVNULL,
            )
            self.processes.add(proc)
            try:
                # the prompt goes in beside the wait: a command that never reads stdin cannot hold it up
                feed = asyncio.create_task(write_stdin(proc, prompt)) if on_stdin else None
                stop = asyncio.create_task(self.stopping.wait())
                done, _ = await asyncio.wait(
                    [asyncio.create_task(proc.wait()), stop], timeout=self.args.timeout,
                    return_when=asyncio.FIRST_COMPLETED,
                )  # fmt: skip
                stop.cancel()
                if feed is not None:
                    feed.cancel()
                if proc.returncode is not None:
                    code = proc.returncode
                    tail = (scratch / "output.log").read_text(errors="replace").strip().splitlines()[-1:]
                    print(f"session {session['session_id']}: exit {code}: {' '.join(tail)[:200]}", flush=True)
                    return True
                why = "stopping" if stop in done else f"still running at --timeout {self.args.timeout:g}s"
                print(f"session {session['session_id']}: {why}: killed, session aborted", flush=True)
                await kill(proc)
                return False
            finally:
                self.processes.discard(proc)


async def write_stdin(proc: asyncio.subprocess.Process, prompt: str) -> None:
    if proc.stdin is None:
        return
    with contextlib.suppress(OSError):
        proc.stdin.write(prompt.encode())
        await proc.stdin.drain()
        proc.stdin.close()


async def kill(proc: asyncio.subprocess.Process) -> None:
    """SIGTERM the command's process group, SIGKILL it after KILL_GRACE_S."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            await asyncio.wait_for(proc.wait(), KILL_GRACE_S)
            return
        except TimeoutError:
            continue


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=os.environ.get("ASYNCRL_GATEWAY_URL"), help="the gateway's URL")
    parser.add_argument("--admin-key", default=os.environ.get("ASYNCRL_GATEWAY_ADMIN_KEY"),
                        help="(default $ASYNCRL_GATEWAY_ADMIN_KEY)")  # fmt: skip
    parser.add_argument("--n", type=int, help="sessions per group (default: the job's samplesPerPrompt)")
    parser.add_argument("--concurrency", type=int, default=1, help="session processes at once (default 1)")
    parser.add_argument("--timeout", type=float, default=540.0,
                        help="kill a session's command after this many seconds and abort the session "
                        "(default 540: below the gateway's default sessionTimeoutSeconds, 600)")  # fmt: skip
    parser.add_argument("--groups", type=int, help="stop after this many groups (default: until stopped)")
    parser.add_argument("--connect-wait", type=float, default=600.0,
                        help="seconds to wait for the gateway (it serves once an engine is up)")  # fmt: skip
    parser.add_argument("--workdir", help="where session scratch directories go (default: the temp dir)")
    parser.add_argument("--session-home", action="store_true",
                        help="HOME is the session scratch directory (CLIs keeping state there)")  # fmt: skip
    parser.add_argument("session_command", metavar="-- CMD ARGS", nargs=argparse.REMAINDER,
                        help="the agent's command ({prompt}: the task's prompt, else on stdin; {base_url}: "
                        "the session's OpenAI base URL)")  # fmt: skip


def main(args: argparse.Namespace) -> int:
    if args.session_command[:1] == ["--"]:
        args.session_command = args.session_command[1:]
    problems = [
        what
        for what, bad in (
            ("a command after --", not args.session_command),
            ("--url or ASYNCRL_GATEWAY_URL", not args.url),
            ("--admin-key or ASYNCRL_GATEWAY_ADMIN_KEY", not args.admin_key),
            ("--concurrency >= 1", args.concurrency < 1),
            ("--timeout > 0", args.timeout <= 0),
        )
        if bad
    ]
    if problems:
        print(f"asyncrl agent: needs {', '.join(problems)}", file=sys.stderr)
        return 2
    return asyncio.run(_serve(args))


async def _serve(args: argparse.Namespace) -> int:
    driver = Driver(args, os.environ)
    received: list[signal.Signals] = []

    def on_signal(sig: signal.Signals) -> None:
        received.append(sig)
        driver.stop()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        await driver.run()
    except GatewayError as exc:
        print(f"asyncrl agent: {exc}", file=sys.stderr)
        return 1
    finally:
        c = driver.counts
        print(
            f"asyncrl agent: {c['groups']} groups, {c['ended']} sessions ended, {c['aborted']} aborted",
            flush=True,
        )
    return 128 + int(received[0]) if received else 0  # the shell's convention: 130, 143
