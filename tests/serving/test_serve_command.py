"""``orchestrator serve``'s usage errors: one line, exit 2, before any Ray or file is touched."""
import os
from pathlib import Path

import pytest

from cli_runs import cli_in_process
from orchestrator.serving.settings import parse_serve_arguments

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("argv", "message"), [
    (["serve", "p.yaml", "--poll", "0"], "--poll: a positive number of seconds, got 0.0"),
    (["serve", "p.yaml", "--token-env", "ORCHESTRATOR_TEST_UNSET_TOKEN"],
     "--token-env: environment variable ORCHESTRATOR_TEST_UNSET_TOKEN is not set or empty"),
])
def test_bad_serve_options_are_one_line_and_exit_2(argv, message, tmp_path, monkeypatch):
    monkeypatch.delenv("ORCHESTRATOR_TEST_UNSET_TOKEN", raising=False)
    result = cli_in_process(*argv, cwd=tmp_path)
    assert result.returncode == 2 and result.stderr == f"orchestrator: error: {message}\n" and not result.stdout


def test_the_serve_config_arguments_parse_as_the_command_line():
    args = parse_serve_arguments(["p.yaml", "--replicas", "3", "--read-prefix", "s3://b/q", "--read-prefix", "/data/q"])
    assert (args.file, args.replicas, args.read_prefix, args.host, args.port) == ("p.yaml", 3, ["s3://b/q", "/data/q"],
                                                                                  "127.0.0.1", 8000)
    assert (args.encoder_replicas, args.search_replicas, args.replica_cpus) == (1, 0, 1.0)  # one process by default
    args = parse_serve_arguments(["p.yaml", "--encoder-replicas", "2", "--search-replicas", "2", "--replica-cpus", "0.5"])
    assert (args.encoder_replicas, args.search_replicas, args.replica_cpus) == (2, 2, 0.5)  # the pools
    assert (args.max_batch, args.batch_wait, args.concurrent_batches) == (32, 0.003, 2)  # the batching defaults
    args = parse_serve_arguments(["p.yaml", "--max-batch", "8", "--batch-wait", "0", "--concurrent-batches", "3"])
    assert (args.max_batch, args.batch_wait, args.concurrent_batches) == (8, 0.0, 3)
    for bad in (["--replicas", "0"], ["--encoder-replicas", "0"], ["--search-replicas", "-1"], ["--replica-cpus", "0"],
                ["--concurrent-batches", "0"], ["--max-batch", "0"], ["--batch-wait", "-1"]):
        with pytest.raises(SystemExit):
            parse_serve_arguments(["p.yaml", *bad])


def test_a_local_ray_gets_serves_throughput_mode_and_direct_ingress_on_the_ports_unless_the_user_set_them():
    from orchestrator.serving.settings import SERVE_THROUGHPUT_ENV, direct_ingress_ports, local_ray_serve_env

    ports = {"RAY_SERVE_DIRECT_INGRESS_MIN_HTTP_PORT": "8000", "RAY_SERVE_DIRECT_INGRESS_MAX_HTTP_PORT": "8003"}
    env = local_ray_serve_env(None, {}, 8000, 3)
    assert env == {**SERVE_THROUGHPUT_ENV, **ports} == local_ray_serve_env("local", {"HOME": "/root"}, 8000, 3)
    assert direct_ingress_ports(env) == range(8000, 8003)  # three ingress replicas: 8000, 8001, 8002
    mine = local_ray_serve_env(None, {"RAY_SERVE_ENABLE_DIRECT_INGRESS": "0"}, 8000, 1)
    assert "RAY_SERVE_ENABLE_DIRECT_INGRESS" not in mine and len(mine) == len(env) - 1
    assert direct_ingress_ports({**mine, "RAY_SERVE_ENABLE_DIRECT_INGRESS": "0"}) is None  # the user's 0: the proxy
    assert direct_ingress_ports({"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}) == range(30000, 31000)  # Ray's own defaults
    assert direct_ingress_ports({}) is None
    assert local_ray_serve_env("auto", {}, 8000, 1) == {} == local_ray_serve_env(None, {"RAY_ADDRESS": "10.0.0.1:6379"},
                                                                                  8000, 1)


def test_a_busy_port_is_one_line_before_any_ray_starts(tmp_path, monkeypatch):
    import socket

    from orchestrator.distributed import runtime
    from orchestrator.errors import UsageError
    from orchestrator.serving.settings import check_ports_free

    monkeypatch.setattr(runtime, "connect", lambda *a, **k: pytest.fail("Ray started before the port was checked"))
    for name in ("RAY_SERVE_THROUGHPUT_OPTIMIZED", "RAY_SERVE_ENABLE_DIRECT_INGRESS", "RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(os, "environ", dict(os.environ))  # what the command sets stays in this test
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(UsageError, match=rf"127.0.0.1:{port} cannot be listened on \(Address already in use\)"):
            check_ports_free("127.0.0.1", range(port, port + 2))  # the replicas' ports: the busy one named
        result = cli_in_process("serve", str(REPO / "pipelines" / "lifelong.yaml"), "--storage", str(tmp_path / "run"),
                                "--port", str(port), cwd=tmp_path)
    assert result.returncode == 2 and not result.stdout
    assert result.stderr == (f"orchestrator: error: --port: 127.0.0.1:{port} cannot be listened on (Address already in "
                             f"use); choose another --port\n")
    check_ports_free("127.0.0.1", range(port, port + 1))  # closed: free again
