"""Real agent frameworks train through the gateway, each with its own dialect, on one gateway job: `asyncrl
run` of examples/gateway-cpu.yaml (1 rollout replica, the trainer, the embedded nats-server), shared by
the module. Unmodified clients, each pointed at a session of its own with the lines docs/gateway.md gives:

- the OpenAI Agents SDK: an ``Agent`` with two function tools run by ``Runner.run``, on its Responses
  model (``/v1/responses``) and on its chat-completions model (``/v1/chat/completions``);
- LangGraph: ``create_react_agent`` over langchain-openai's ``ChatOpenAI`` with the same two tools;
- Claude Code headless (``claude -p``, the Messages API), skipped with the reason where it is not
  installed (tools/setup.sh installs it with npm), and once more in its agent worker image
  (images/agent-claude-code) under the builtin driver, as examples/claude-code.yaml's workers run it;
- Codex CLI headless (``codex exec``, the Responses API through a ``wire_api = "responses"`` provider:
  its ``client_metadata``, ``namespace`` tool and hosted ``web_search`` as it sends them), skipped the same
  way, and under the builtin driver as docs/agent-frameworks.md's worker runs it.

The tiny model calls no tool by itself: the rollout's engine runs the logits processor
``asyncrl_testing.tool_bias:ScriptedToolCall`` and each task carries the tool call to make, so the
first turn is a well-formed call (Hermes format, the job's ``toolParser: hermes``) of one of the client's
own tools, and the turn after the tool's result answers ``done``. Each client runs the tool, sends the
result back and prints the answer; its session ends as one trajectory (the second call continued the
first: two generated turns, the tool result between them masked 0). The model is made here with room for
Claude Code's ~13k-character and Codex CLI's ~20k-character requests (the character-level tokenizer: one
token per character).

Checked last, once everything is quiet: every session's trajectory reached the trainer -- produced =
stored = consumed + dropped + still in the stream, the trainer consumed at least one per session, and no
gateway request got a 5xx.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from asyncrl_testing import images, jobs, learning, tool_bias
from asyncrl_workloads import tinymodel
from asyncrl_workloads.local import containers, pods, process

pytestmark = pytest.mark.e2e
REPO = pathlib.Path(__file__).resolve().parents[2]
NAMESPACE = "default"
CONTEXT = 32768  # tokens = characters: Claude Code's (~13k) and Codex CLI's (~20k) first requests fit
SESSIONS: list[str] = []  # the sessions the clients ended, for the last test
CACHE = pathlib.Path(os.environ.get("ASYNCRL_CACHE", pathlib.Path.home() / ".cache" / "asyncrl"))
CLAUDE = CACHE / "claude-code" / "node_modules" / ".bin" / "claude"
CODEX = CACHE / "codex" / "node_modules" / ".bin" / "codex"
CODEX_PROVIDER = (  # docs/agent-frameworks.md: plain HTTP Responses, the key from the named variable
    'model_providers.asyncrl={{name="asyncrl", base_url="{url}", env_key="OPENAI_API_KEY", '
    'wire_api="responses"}}'
)
AGENT_IMAGE = "agent-claude-code"


def _write_job(tmp: pathlib.Path) -> pathlib.Path:
    model = tinymodel.create_tiny_model(tmp / "model", seed=0, chat=True, max_position_embeddings=CONTEXT)
    body = jobs.load_example("gateway-cpu.yaml")
    spec = body["spec"]
    spec["model"] = {"path": str(model), "dtype": "float32"}
    spec["rollout"]["replicas"] = 1
    spec["rollout"]["engine"].update(
        maxModelLen=CONTEXT, args={"logits_processors": "asyncrl_testing.tool_bias:ScriptedToolCall"}
    )
    spec["rollout"]["sampling"].update(samplesPerPrompt=1, maxTokens=96)
    spec["trainer"]["algorithm"]["name"] = "reinforce++"  # groups of one session: no group baseline
    spec["trainer"]["batch"] = {"prompts": 1, "miniBatches": 1, "microBatchTokens": CONTEXT}
    spec["agent"].update(toolParser="hermes", maxAssistantTurns=6)
    spec["agent"].pop("stopTokens")  # <tool_call> starts the scripted call: it must not stop the turn
    spec["agent"].pop("workers")  # the clients below are this job's agents, not the example's lookup agent
    spec["agent"]["gateway"]["port"] = process.free_port()
    spec["maxSteps"] = 1000  # the module ends the run
    spec["progress"]["reportIntervalSeconds"] = 1
    path = tmp / "gw.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("gateway-clients")
    run_dir = tmp / "run"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(str(REPO / d) for d in ("operator", "workloads", "tools")),
    }
    env.pop("ASYNCRL_GATEWAY_ADMIN_KEY", None)
    log = (tmp / "runner.log").open("w")
    runner = subprocess.Popen(
        [sys.executable, "-m", "asyncrl_workloads.cli", "run", str(_write_job(tmp)),
         "--run-dir", str(run_dir), "--poll", "1", "--timeout", "900"],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        info_path = run_dir / "gateway.json"
        deadline = time.monotonic() + 180
        while not info_path.exists():
            assert runner.poll() is None and time.monotonic() < deadline, (tmp / "runner.log").read_text()[
                -3000:
            ]
            time.sleep(1)
        info = json.loads(info_path.read_text())
        yield {"env": info["env"], "run_dir": run_dir, "tmp": tmp, "runner": runner}
    finally:
        if runner.poll() is None:
            runner.send_signal(signal.SIGINT)
            try:
                runner.wait(timeout=90)
            except subprocess.TimeoutExpired:
                runner.kill()
        log.close()


def _call(url: str, body: dict[str, Any], key: str) -> dict[str, Any]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=120) as response:
        return dict(json.loads(response.read()))


def open_session(run: dict[str, Any]) -> dict[str, Any]:
    """One session (a group of one, on a task of the test's own: the client rewards it), once the engine
    serves."""
    url, admin = run["env"]["ASYNCRL_GATEWAY_URL"], run["env"]["ASYNCRL_GATEWAY_ADMIN_KEY"]
    deadline = time.monotonic() + 300
    while True:
        try:
            return _call(f"{url}/rl/sessions", {"record": None}, admin)
        except OSError:  # not serving yet (the engine starts), or 429
            assert time.monotonic() < deadline, "the gateway never opened a session"
            time.sleep(1)


def finish(session: dict[str, Any]) -> dict[str, Any]:
    """Reward the session and end it; the gateway answers how many trajectories it made."""
    root, key = session["base_url"].removesuffix("/v1"), session["api_key"]
    _call(f"{root}/rl/reward", {"reward": 1.0, "session": True}, key)
    ended = _call(f"{root}/rl/end", {}, key)
    SESSIONS.append(session["session_id"])
    return ended


def _agent_tools(ran: list[str]) -> list[Any]:
    from agents import function_tool

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        ran.append(f"get_weather({city})")
        return f"sunny in {city}"

    @function_tool
    def get_time(city: str) -> str:
        """The local time in a city."""
        ran.append(f"get_time({city})")
        return "12:00"

    return [get_weather, get_time]


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
def test_an_agents_sdk_agent_trains_through_a_session(run: dict[str, Any], api: str) -> None:
    import openai
    from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, set_tracing_disabled

    set_tracing_disabled(True)
    session, ran = open_session(run), []
    client = openai.AsyncOpenAI(base_url=session["base_url"], api_key=session["api_key"], max_retries=0)
    kind = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel
    agent = Agent(
        name="weather",
        instructions="Answer with the tools.",
        tools=_agent_tools(ran),
        model=kind("tiny", client),
    )
    result = asyncio.run(Runner.run(agent, tool_bias.task("get_time", {"city": "Paris"}, "What time is it?")))
    assert ran == ["get_time(Paris)"] and result.final_output == tool_bias.ANSWER
    assert finish(session)["trajectories"] == 1  # the call after the tool result continued the first


def test_a_langgraph_react_agent_trains_through_a_session(run: dict[str, Any]) -> None:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    with warnings.catch_warnings():  # create_react_agent moved to langchain.agents in LangGraph 1.x
        warnings.simplefilter("ignore", DeprecationWarning)
        from langgraph.prebuilt import create_react_agent

    session, ran = open_session(run), []

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        ran.append(f"get_weather({city})")
        return f"sunny in {city}"

    @tool
    def get_time(city: str) -> str:
        """The local time in a city."""
        ran.append(f"get_time({city})")
        return "12:00"

    model = ChatOpenAI(model="tiny", base_url=session["base_url"], api_key=session["api_key"], max_retries=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        graph = create_react_agent(model, [get_weather, get_time])
    task = tool_bias.task("get_weather", {"city": "Oslo"}, "How is the weather?")
    out = graph.invoke({"messages": [("user", task)]})
    assert ran == ["get_weather(Oslo)"] and out["messages"][-1].content == tool_bias.ANSWER
    assert finish(session)["trajectories"] == 1


def test_claude_code_headless_trains_through_a_session(run: dict[str, Any]) -> None:
    if shutil.which("npm") is None and not CLAUDE.exists():
        pytest.skip("npm is not installed: tools/setup.sh installs Claude Code with it")
    if not CLAUDE.exists():
        pytest.skip(f"Claude Code is not installed at {CLAUDE} (tools/setup.sh all installs it)")
    session = open_session(run)
    home, note = run["tmp"] / "claude-home", run["tmp"] / "note.txt"
    home.mkdir(exist_ok=True)
    note.write_text("the secret is c\n")
    env = {
        "PATH": os.environ["PATH"], "HOME": str(home), "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "ANTHROPIC_BASE_URL": session["base_url"].removesuffix("/v1"),
        "ANTHROPIC_API_KEY": session["api_key"],
    }  # fmt: skip
    task = tool_bias.task("Read", {"file_path": str(note)}, "Read the note.")
    done = subprocess.run(
        [str(CLAUDE), "-p", task, "--model", "tiny", "--allowedTools", "Read"],
        cwd=run["tmp"], env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == tool_bias.ANSWER, (
        done.stdout,
        done.stderr[-2000:],
    )
    assert finish(session)["trajectories"] >= 1


def codex_argv(base_url: str, task: str, *flags: str) -> list[str]:
    """``codex exec`` headless on a session (``base_url`` may be the driver's ``{base_url}``)."""
    return [str(CODEX), "exec", "--skip-git-repo-check", "-m", "tiny", *flags,
            "-c", "model_provider=asyncrl", "-c", CODEX_PROVIDER.format(url=base_url), task]  # fmt: skip


def test_codex_headless_trains_through_a_session(run: dict[str, Any]) -> None:
    """Codex's own requests (its developer prompt, function tools, the multi_agent_v1 namespace tool, the
    hosted web_search, client_metadata, ...): the scripted model calls its exec_command tool, Codex runs
    the command (the scratch dir is the sandbox: Codex's own needs user namespaces) and sends the output
    back, the model answers; the second call continues the first: one trajectory."""
    if not CODEX.exists():
        pytest.skip(f"Codex CLI is not installed at {CODEX} (tools/setup.sh all installs it with npm)")
    session = open_session(run)
    work, home = run["tmp"] / "codex-work", run["tmp"] / "codex-home"  # Codex keeps its state in HOME/.codex
    work.mkdir(exist_ok=True)
    home.mkdir(exist_ok=True)
    task = tool_bias.task("exec_command", {"cmd": "printf ran > proof.txt"}, "Write the proof.")
    done = subprocess.run(
        codex_argv(session["base_url"], task, "--dangerously-bypass-approvals-and-sandbox"),
        cwd=work, env={"PATH": os.environ["PATH"], "HOME": str(home), "OPENAI_API_KEY": session["api_key"]},
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.strip() == tool_bias.ANSWER, (
        done.stdout,
        done.stderr[-3000:],
    )
    assert (work / "proof.txt").read_text() == "ran"  # the tool ran
    assert finish(session)["trajectories"] == 1


def responses_answers(run: dict[str, Any]) -> dict[str, float]:
    """The rollout's ``POST /v1/responses`` answers so far, by status code."""
    ports = {p["role"]: p["metricsPort"] for p in json.loads((run["run_dir"] / "pods.json").read_text())}
    samples = learning.metric_samples(ports["rollout"], ("asyncrl_gateway_requests_total",))
    return {
        dict(labels)["code"]: value for _, labels, value in samples if dict(labels)["route"] == "responses"
    }


def test_codex_runs_once_per_session_under_asyncrl_agent(run: dict[str, Any]) -> None:
    """`asyncrl agent -- codex exec ... {base_url} ... {prompt}` as docs/agent-frameworks.md's worker runs
    it: a group of the job's data, one session, the session's URL put into Codex's provider config and its
    key in OPENAI_API_KEY, the job's reward function scoring the session it ended. No script here: the
    random model's turn runs to the job's maxTokens, which the gateway reports as Codex's API would
    (``response.incomplete``, reason max_output_tokens) and Codex ends with exit 1 - an episode all the
    same. So what is checked is that every one of its Responses calls was answered 200, and the session
    ended (not aborted)."""
    if not CODEX.exists():
        pytest.skip(f"Codex CLI is not installed at {CODEX} (tools/setup.sh all installs it with npm)")
    before = responses_answers(run)
    done = subprocess.run(
        [sys.executable, "-m", "asyncrl_workloads.cli", "agent", "--n", "1", "--groups", "1",
         "--session-home", "--workdir", str(run["tmp"]), "--timeout", "500",
         "--", *codex_argv("{base_url}", "{prompt}")],
        cwd=run["tmp"], env={**os.environ, **run["env"]}, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and lines[-1] == "asyncrl agent: 1 groups, 1 sessions ended, 0 aborted", (
        done.stdout[-3000:],
        done.stderr[-3000:],
    )
    after = responses_answers(run)
    answered = {
        code: after[code] - before.get(code, 0.0) for code in after if after[code] != before.get(code)
    }
    assert set(answered) == {"200"} and answered["200"] >= 1, (answered, lines)
    SESSIONS.append("asyncrl agent -- codex exec")


@pytest.mark.parametrize("example", ["agents_sdk_agent.py", "claude_code_driver.py"])
def test_the_example_agents_run_a_group_of_the_jobs_data(run: dict[str, Any], example: str) -> None:
    """examples/agents/ as a user runs them, on a record of the job's data (no scripted call: the model
    answers as it will; the Agents SDK agent rewards, the job's reward function scores Claude Code's)."""
    if example.startswith("claude") and not CLAUDE.exists():
        pytest.skip(f"Claude Code is not installed at {CLAUDE} (tools/setup.sh all installs it)")
    env = {**os.environ, **run["env"]}
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "agents" / example), "--n", "1", "--groups", "1",
         *(["--claude", str(CLAUDE), "--workdir", str(run["tmp"])] if example.startswith("claude") else [])],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.startswith("group "), (done.stdout, done.stderr[-3000:])
    if example.startswith("claude"):
        assert ": exit 0," in done.stdout, done.stdout
    SESSIONS.append(example)


def assert_one_session_ended(done: subprocess.CompletedProcess[str]) -> None:
    """`asyncrl agent --n 1 --groups 1` ran its command once, which exited 0, and ended the session."""
    lines = done.stdout.splitlines()
    assert done.returncode == 0 and lines[-1] == "asyncrl agent: 1 groups, 1 sessions ended, 0 aborted", (
        done.stdout[-3000:],
        done.stderr[-3000:],
    )
    assert ": exit 0:" in lines[0], lines


def test_claude_code_runs_once_per_session_under_asyncrl_agent(run: dict[str, Any]) -> None:
    """The builtin driver as examples/claude-code.yaml's workers run it (`asyncrl agent -- claude -p
    {prompt}`), here by hand against the run's gateway: a group of the job's data, one session, Claude
    Code with the session in ANTHROPIC_BASE_URL/ANTHROPIC_API_KEY and a HOME of its own, the job's reward
    function scoring the session it ended."""
    if not CLAUDE.exists():
        pytest.skip(f"Claude Code is not installed at {CLAUDE} (tools/setup.sh all installs it)")
    env = {
        **os.environ,
        **run["env"],
        "DISABLE_TELEMETRY": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    done = subprocess.run(
        [sys.executable, "-m", "asyncrl_workloads.cli", "agent", "--n", "1", "--groups", "1",
         "--session-home", "--workdir", str(run["tmp"]), "--timeout", "500",
         "--", str(CLAUDE), "-p", "{prompt}", "--model", "tiny"],
        cwd=run["tmp"], env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert_one_session_ended(done)
    SESSIONS.append("asyncrl agent -- claude")


def test_claude_code_runs_a_session_in_its_agent_image(run: dict[str, Any]) -> None:
    """examples/claude-code.yaml's worker as its image runs it (images/agent-claude-code, built by
    tools/build-images): the driver and Claude Code inside the hardened container (read-only root, uid
    10001, tmpfs at /tmp and HOME), started as `asyncrl run --containers` starts a pod
    (`containers.run_argv`: env by name only, so the admin key is in no command line), host network to
    the run's gateway; one session of the job's data, ended and scored."""
    try:
        engine = images.find_runner()
    except images.NoEngine as exc:
        pytest.skip(f"no container engine: {exc}")
    image = images.names()[AGENT_IMAGE]
    if not engine.image_exists(image):
        pytest.skip(f"image {image} is not built (tools/build-images builds it)")
    argv = ("asyncrl", "agent", "--n", "1", "--groups", "1", "--timeout", "500",
            "--", "claude", "-p", "{prompt}", "--model", "tiny")  # fmt: skip
    user, home = images.USERS[AGENT_IMAGE]
    pod = pods.LocalPod(
        name="gw-agent-0", role=pods.AGENT_ROLE, replica=0, argv=argv, env=run["env"], metrics_port=0,
        container=pods.PodContainer(image, argv, user, read_only_root=True, empty_dirs=("/tmp", home)),
    )  # fmt: skip
    command = containers.run_argv(engine.path, "gwclients", pod, run["env"], ())
    assert run["env"]["ASYNCRL_GATEWAY_ADMIN_KEY"] not in " ".join(command)
    done = subprocess.run(
        command, env={**engine.environ(), **run["env"]}, capture_output=True, text=True, timeout=600
    )
    assert_one_session_ended(done)
    SESSIONS.append("agent image: asyncrl agent -- claude")


def test_every_session_reached_the_trainer(run: dict[str, Any]) -> None:
    """Runs last: produced = stored = consumed + dropped + in the stream, one consumed per session."""
    assert SESSIONS, "no client test ran"
    described = json.loads((run["run_dir"] / "pods.json").read_text())
    ports = {p["role"]: p["metricsPort"] for p in described}
    names = ("asyncrl_trajectories_", "asyncrl_gateway_requests_total")
    deadline = time.monotonic() + 300
    while True:
        rollout = learning.metric_samples(ports["rollout"], names)
        trainer = learning.metric_samples(ports["trainer"], names)
        produced = learning.total(rollout, "asyncrl_trajectories_produced_total")
        consumed = learning.total(trainer, "asyncrl_trajectories_consumed_total")
        dropped = learning.total(trainer, "asyncrl_trajectories_dropped_total")
        if produced >= len(SESSIONS) and consumed + dropped >= produced:
            break
        assert time.monotonic() < deadline, (produced, consumed, dropped, len(SESSIONS))
        time.sleep(2)
    nats_url = json.loads((run["run_dir"] / "job.json").read_text())["endpoints"]["natsUrl"]
    stored, in_stream = learning.stream_state(nats_url, NAMESPACE, "gw")
    assert produced == stored and stored == consumed + dropped + in_stream, (stored, consumed, dropped)
    assert consumed >= len(SESSIONS), (consumed, dropped, len(SESSIONS))
    codes = {
        (dict(labels)["route"], dict(labels)["code"])
        for name, labels, value in rollout
        if name == "asyncrl_gateway_requests_total" and value
    }
    assert not [c for c in codes if c[1].startswith("5")], codes
