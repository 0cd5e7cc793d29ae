"""``orchestrator serve``'s usage errors: one line, exit 2, before any Ray or file is touched."""
import pytest

from cli_runs import cli_in_process
from orchestrator.serving.settings import parse_serve_arguments


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
    assert (args.encoder_replicas, args.search_replicas, args.replica_cpus) == (1, 1, 1.0)  # the pools by default
    args = parse_serve_arguments(["p.yaml", "--encoder-replicas", "2", "--search-replicas", "0", "--replica-cpus", "0.5"])
    assert (args.encoder_replicas, args.search_replicas, args.replica_cpus) == (2, 0, 0.5)  # 0: one process searches
    for bad in (["--replicas", "0"], ["--encoder-replicas", "0"], ["--search-replicas", "-1"], ["--replica-cpus", "0"]):
        with pytest.raises(SystemExit):
            parse_serve_arguments(["p.yaml", *bad])


def test_a_local_ray_gets_serves_throughput_mode_unless_the_user_set_a_variable_and_a_cluster_nothing():
    from orchestrator.serving.settings import SERVE_THROUGHPUT_ENV, local_ray_serve_env

    assert local_ray_serve_env(None, {}) == SERVE_THROUGHPUT_ENV == local_ray_serve_env("local", {"HOME": "/root"})
    assert SERVE_THROUGHPUT_ENV["RAY_SERVE_ENABLE_DIRECT_INGRESS"] == "0"  # the proxy keeps listening on --port
    mine = local_ray_serve_env(None, {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "0"})
    assert "RAY_SERVE_THROUGHPUT_OPTIMIZED" not in mine and len(mine) == len(SERVE_THROUGHPUT_ENV) - 1
    assert local_ray_serve_env("auto", {}) == {} == local_ray_serve_env(None, {"RAY_ADDRESS": "10.0.0.1:6379"})
