"""`asyncrl agent`'s pure parts (how a session becomes a command line and an environment) and the local
runner's agent pods. The driver against a real gateway, sessions ended and aborted: tests/e2e."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import yaml
from asyncrl_api import config, models
from asyncrl_operator import render
from asyncrl_testing import jobs
from asyncrl_workloads import agentdriver, cli
from asyncrl_workloads.local import gateway, pods

REPO = pathlib.Path(__file__).resolve().parents[2]

SESSION = {"session_id": "s1", "api_key": "sk-sess-1", "base_url": "http://10.0.0.1:8100/sessions/s1/v1"}


def test_the_prompt_goes_where_the_command_asks_for_it() -> None:
    argv, stdin = agentdriver.session_argv(["claude", "-p", "{prompt}", "--model", "m"], "say hi")
    assert (argv, stdin) == (["claude", "-p", "say hi", "--model", "m"], False)
    argv, stdin = agentdriver.session_argv(["my-agent", "--fast"], "say hi")
    assert (argv, stdin) == (["my-agent", "--fast"], True)


def test_the_sessions_base_url_goes_where_the_command_asks_for_it_and_its_key_never() -> None:
    """Codex CLI takes the URL only in its config (docs/agent-frameworks.md's worker, checked as a spec):
    {base_url} is replaced, the key stays in OPENAI_API_KEY (its provider's env_key)."""
    docs = (REPO / "docs" / "agent-frameworks.md").read_text()
    (block,) = [b for b in docs.split("```yaml\n")[1:] if "codex" in b]
    agent = models.AgentSpec.model_validate(yaml.safe_load(block.split("```")[0])["agent"])
    assert agent.workers is not None
    argv, stdin = agentdriver.session_argv(agent.workers.session_command, "fix it", SESSION["base_url"])
    assert not stdin and argv[-1] == "fix it" and argv[:2] == ["codex", "exec"]
    assert f'base_url="{SESSION["base_url"]}", env_key="OPENAI_API_KEY"' in argv[-2]
    assert SESSION["api_key"] not in " ".join(argv)


def test_the_session_is_in_the_environment_every_common_client_reads(tmp_path: pathlib.Path) -> None:
    env = agentdriver.session_env(SESSION, tmp_path / "reward", {"PATH": "/bin"})
    assert env["OPENAI_BASE_URL"] == SESSION["base_url"] and env["OPENAI_API_KEY"] == "sk-sess-1"
    assert env["ANTHROPIC_BASE_URL"] == "http://10.0.0.1:8100/sessions/s1"  # the SDK adds /v1/messages
    assert env["ANTHROPIC_API_KEY"] == env["ASYNCRL_SESSION_KEY"] == "sk-sess-1"
    assert env["ASYNCRL_SESSION_URL"] == "http://10.0.0.1:8100/sessions/s1" and env["PATH"] == "/bin"
    assert env["ASYNCRL_REWARD_FILE"] == str(tmp_path / "reward")


def test_the_prompt_is_the_last_user_message_else_the_records() -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "secret?"}]
    assert agentdriver.prompt_of({"messages": messages, "record": {"prompt": "x"}}) == "secret?"
    blocks = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert agentdriver.prompt_of({"messages": blocks}) == "ab"
    assert agentdriver.prompt_of({"messages": None, "record": {"prompt": "fix it"}}) == "fix it"
    assert json.loads(agentdriver.prompt_of({"messages": None, "record": {"q": 1}})) == {"q": 1}


def test_a_reward_file_is_a_number_or_nothing(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "reward"
    assert agentdriver.read_reward(path) is None
    path.write_text("0.75\n")
    assert agentdriver.read_reward(path) == 0.75
    path.write_text("great")
    assert agentdriver.read_reward(path) is None


def test_the_command_line_is_checked_before_anything_runs(capsys: Any, monkeypatch: Any) -> None:
    monkeypatch.delenv("ASYNCRL_GATEWAY_URL", raising=False)
    monkeypatch.delenv("ASYNCRL_GATEWAY_ADMIN_KEY", raising=False)
    assert cli.main(["agent", "--concurrency", "0"]) == 2
    err = capsys.readouterr().err
    assert (
        "a command after --" in err and "--url or ASYNCRL_GATEWAY_URL" in err and "--concurrency >= 1" in err
    )


def test_local_agent_pods_reach_the_front_url_with_the_runs_key_and_hide_secrets(
    monkeypatch: Any,
) -> None:
    monkeypatch.chdir(REPO)  # relative paths in a worker's command are the current directory's
    body = jobs.load_example("gateway-cpu.yaml")
    body["spec"]["agent"]["workers"] = {
        "command": ["python3", "examples/agents/lookup_agent.py"],
        "replicas": 2,
        "env": [
            {"name": "MODE", "value": "x"},
            {"name": "TOOL_KEY", "valueFrom": {"secretKeyRef": {"name": "tools", "key": "k"}}},
        ],
    }
    job = models.AsyncRLJob.model_validate(body)
    manifests = render.render(job)
    cfg = config.JobConfig.model_validate_json(pods.job_json(manifests))
    local = gateway.plan(job.spec, {"ASYNCRL_GATEWAY_ADMIN_KEY": "run-key"})
    assert local is not None
    agents = pods.expand_agents(manifests, cfg, local, {"TOOL_KEY": "tool-secret"})
    assert [(p.name, p.role, p.metrics_port) for p in agents] == [
        ("gw-agent-0", "agent", 0),
        ("gw-agent-1", "agent", 0),
    ]
    env = agents[0].env
    assert env["ASYNCRL_GATEWAY_URL"] == local.front_url and env["ASYNCRL_GATEWAY_ADMIN_KEY"] == "run-key"
    assert env["MODE"] == "x" and env["TOOL_KEY"] == "tool-secret" and "HOME" not in env
    assert agents[0].argv[1:] == ("examples/agents/lookup_agent.py",) and agents[0].argv[0].endswith(
        "python3"
    )
    # in the worker's image (--containers) the script is the checkout's, its folder mounted read-only
    # (the tests run from the repository root, as `asyncrl run` does)
    script = REPO / "examples" / "agents" / "lookup_agent.py"
    assert agents[0].container is not None
    assert agents[0].container.argv == ("python3", str(script))
    assert agents[0].container.host_paths == (str(script.parent),)
    described = json.loads(pods.describe(agents))[0]["env"]
    assert described["TOOL_KEY"] == described["ASYNCRL_GATEWAY_ADMIN_KEY"] == "(secret)"
    assert "tool-secret" not in pods.describe(agents) and "run-key" not in pods.describe(agents)


def test_only_the_paths_a_workers_command_names_go_into_its_container(tmp_path: pathlib.Path) -> None:
    (tmp_path / "agents" / "lib").mkdir(parents=True)
    (tmp_path / "agents" / "run.py").write_text("")
    (tmp_path / "tasks.jsonl").write_text("")
    argv = ["python3", "agents/run.py", "--data", "tasks.jsonl"]
    argv += ["--lib", "agents/lib", "--x=agents", "nope.py"]
    got, mounts = pods.host_arguments(argv, tmp_path)
    assert got == [
        "python3", str(tmp_path / "agents/run.py"), "--data", str(tmp_path / "tasks.jsonl"),
        "--lib", str(tmp_path / "agents/lib"), "--x=agents", "nope.py",
    ]  # fmt: skip
    # a file's folder (its sibling modules import), a folder itself, none inside another
    assert mounts == (str(tmp_path),)
    assert pods.host_arguments(["python3", "agents/run.py"], tmp_path)[1] == (str(tmp_path / "agents"),)
    assert pods.host_arguments(["claude", "-p", "{prompt}"], tmp_path) == (["claude", "-p", "{prompt}"], ())


def _driver(tmp_path: pathlib.Path, **kw: Any) -> agentdriver.Driver:
    args = cli._parser().parse_args(["agent", "--url", "http://127.0.0.1:9", "--admin-key", "k", "--", "x"])
    args.workdir = str(tmp_path)
    for key, value in kw.items():
        setattr(args, key, value)
    return agentdriver.Driver(args, {"PATH": "/bin:/usr/bin"})


def test_a_gateway_that_answers_a_byte_at_a_time_cannot_hold_a_request(
    tmp_path: pathlib.Path, monkeypatch: Any
) -> None:
    """Each request has a total deadline (urllib's timeout is per read, which a dripping server never
    trips); past --connect-wait the driver gives up with the URL named."""
    import asyncio
    import time

    from asyncrl_testing import fault_server

    monkeypatch.setattr(agentdriver, "REQUEST_TIMEOUT_S", 1.0)
    with fault_server.serve(fault_server.DRIP) as faults:
        driver = _driver(tmp_path, connect_wait=1.5)
        started = time.monotonic()
        try:
            asyncio.run(driver.call(f"{faults.base_url}/rl/groups", "k", {}))
        except agentdriver.GatewayError as exc:
            assert "/rl/groups" in str(exc)
        else:
            raise AssertionError("a dripping gateway answered")
        assert time.monotonic() - started < 10 and len(faults.arrivals) >= 1


def test_a_command_that_never_reads_its_prompt_is_still_killed_at_the_timeout(tmp_path: pathlib.Path) -> None:
    """The prompt (here 1 MB, far over a pipe's buffer) is written beside the wait, not before it."""
    import asyncio
    import time

    driver = _driver(tmp_path, session_command=["sleep", "600"], timeout=1.0)
    started = time.monotonic()
    finished = asyncio.run(driver.run_command(SESSION, "x" * 1_000_000, tmp_path))
    assert finished is False and time.monotonic() - started < agentdriver.KILL_GRACE_S + 5


def test_after_a_stop_a_gateway_that_is_gone_gets_a_few_seconds_not_connect_wait(
    tmp_path: pathlib.Path, monkeypatch: Any
) -> None:
    """A stopped worker aborts its sessions; with the gateway going away too (nothing listens on port 9)
    it gives up after STOP_GRACE_S instead of retrying for --connect-wait (600 s: the local runner then
    killed every worker 15 s into its stop)."""
    import asyncio
    import time

    monkeypatch.setattr(agentdriver, "STOP_GRACE_S", 0.5)
    monkeypatch.setattr(agentdriver, "RETRY_S", 0.1)
    driver = _driver(tmp_path, connect_wait=600.0)

    async def stop_then_abort() -> None:
        driver.stop()
        await driver.call("http://127.0.0.1:9/sessions/s1/rl/abort", "k")

    started = time.monotonic()
    try:
        asyncio.run(stop_then_abort())
    except agentdriver.GatewayError as exc:
        assert "/rl/abort" in str(exc) and "after the stop signal" in str(exc)
    else:
        raise AssertionError("an abort reached a gateway that is not there")
    assert time.monotonic() - started < 10


def test_after_a_stop_a_gateway_that_answers_a_byte_at_a_time_gets_the_grace_not_the_request_timeout(
    tmp_path: pathlib.Path, monkeypatch: Any
) -> None:
    """The grace bounds each closing call too: a gateway trickling its answer forever is cut at
    STOP_GRACE_S, not at REQUEST_TIMEOUT_S (30 s)."""
    import asyncio
    import time

    from asyncrl_testing import fault_server

    monkeypatch.setattr(agentdriver, "STOP_GRACE_S", 1.0)
    with fault_server.serve(fault_server.DRIP) as faults:
        driver = _driver(tmp_path, connect_wait=600.0)

        async def stop_then_end() -> None:
            driver.stop()
            await driver.call(f"{faults.base_url}/sessions/s1/rl/end", "k")

        started = time.monotonic()
        try:
            asyncio.run(stop_then_end())
        except agentdriver.GatewayError as exc:
            assert "/rl/end" in str(exc)
        else:
            raise AssertionError("a dripping gateway answered")
        assert time.monotonic() - started < 8 and len(faults.arrivals) >= 1
