"""The command line: method listing, the embedded demo, the quickstart example, errors."""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

import orchestrator
from orchestrator import cli
from orchestrator.cli import ExitCode, build_parser, main
from orchestrator.lineage.step_keys import train_key
from orchestrator.methods import available_methods

REPO = Path(__file__).resolve().parents[2]


def test_methods_lists_every_method_with_its_parameters_and_defaults(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    for name, cls in available_methods().items():
        assert re.search(rf"^{name}: ", out, re.MULTILINE), name
        for field_name, field in cls.Params.model_fields.items():
            assert re.search(rf"^\s+{field_name}\s+\S+\s+default {re.escape(repr(field.default))}$", out, re.MULTILINE), (name, field_name)
    assert "cosine|euclidean|lorentz" in out  # Literal choices are spelled out


def test_methods_lists_the_second_tier_baselines(capsys):
    assert main(["methods"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name, field_name, default in (("lce", "margin", "0.3"), ("unibct", "neighbours", "10"),
                                      ("advbct", "threshold", "0.5")):
        start = next(i for i, line in enumerate(lines) if line.startswith(f"{name}: "))
        block = []
        for line in lines[start + 1:]:
            if not line.startswith(" "):
                break
            block.append(line)
        assert any(re.fullmatch(rf"\s+{field_name}\s+\S+\s+default {default}", line) for line in block), name


def test_demo_prints_the_pair_table_and_one_summary_row_per_method(capsys):
    assert main(["demo", "--epochs", "1", "--methods", "independent,l2"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^old/independent → old/independent\s+[01]\.\d{4}\s+[01]\.\d{4}\s+[01]\.\d{4}$", out, re.MULTILINE)
    assert re.search(r"^l2 → old/independent\s+", out, re.MULTILINE)
    summary_rows = re.findall(r"^(independent|l2)\s+((-?\d+\.\d{3}|n/a)\s+){8}(yes|no)$", out, re.MULTILINE)
    assert [row[0] for row in summary_rows] == ["independent", "l2"]


def test_unknown_method_is_a_clear_error_before_any_output(capsys):
    assert main(["demo", "--epochs", "1", "--methods", "bct,nosuch"]) == 2
    captured = capsys.readouterr()
    assert "unknown method 'nosuch'" in captured.err and "hbct" in captured.err
    assert captured.out == ""  # the header is not printed for a run that cannot start


@pytest.mark.e2e
def test_quickstart_example_runs_and_reports_the_update():
    result = subprocess.run([sys.executable, str(REPO / "examples" / "quickstart.py"), "--epochs", "2"],
                            capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    assert re.search(r"^new → old\s+[01]\.\d{4}", result.stdout, re.MULTILINE)
    for metric in ("cmc@1", "map"):
        line = next(text for text in result.stdout.splitlines() if text.startswith(metric + " {"))
        assert "'p_com':" in line and "'compatible':" in line


def test_lineage_command_prints_the_tree_and_json(tmp_path, capsys):
    import json

    from orchestrator.lineage import LineageStore

    url = f"sqlite:///{tmp_path / 'lineage.db'}"
    store = LineageStore(url)
    store.upsert_generation("g0", method="independent", params={}, arch="test_resnet", space="cosine")
    store.mark_generation_trained("g0", str(tmp_path / "g0"), "a" * 64, {"loss": 0.5})
    store.upsert_generation("g1", parent="g0", method="bct", params={"lam": 1.0}, arch="test_resnet", space="cosine")
    store.record_compatibility([("g1", "g0", "cmc@1", 0.8125, "test")])
    store.close()

    assert main(["lineage", "--lineage", url]) == 0
    tree = capsys.readouterr().out
    assert re.search(r"^g0\s+independent\s+trained", tree, re.MULTILINE)
    assert re.search(r"^└─ g1\s+bct\s+pending", tree, re.MULTILINE)

    assert main(["lineage", "--lineage", url, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    generations = {g["name"]: g for g in document["generations"]}
    assert generations["g1"]["parent"] == "g0" and generations["g0"]["status"] == "trained"
    assert {"query": "g1", "gallery": "g0", "metric": "cmc@1", "value": 0.8125, "dataset": "test"} in document["compatibility"]


def test_run_rejects_a_bad_file_with_one_line_naming_file_field_and_value(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    original = (REPO / "pipelines" / "lifelong.yaml").read_text()
    text = original.replace("params: {clip: 1.2}", "params: {clip: -1}", 1)  # g1's clip
    assert text != original
    bad.write_text(text)
    assert main(["run", str(bad), "--storage", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "generations[1].method.params.clip" in err and "(got -1)" in err
    assert not (tmp_path / "run").exists()  # nothing was started or written


def test_a_garbled_lineage_database_is_one_line_not_a_traceback(tmp_path, capsys):
    database = tmp_path / "lineage.db"
    database.write_bytes(b"not a database at all\n" * 64)
    assert main(["lineage", "--lineage", f"sqlite:///{database}"]) == ExitCode.UNREACHABLE  # issue 27: names it
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith(f"orchestrator: unreachable: SQLite at sqlite:///{database}: "
                                                         "file is not a database; check that the file is a lineage")
    assert "Traceback" not in error
    with pytest.raises(Exception, match="file is not a database"):
        main(["-v", "lineage", "--lineage", f"sqlite:///{database}"])  # -v: the real exception


# --------------------------------------------------------------------------- parser behaviour


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _option_help_blocks(help_text: str) -> dict[str, str]:
    """{first flag: its help paragraph} of a formatted help text."""
    blocks, current = {}, None
    for line in help_text.splitlines():
        match = re.match(r"^  (-[-\w]+)", line)
        if match:
            current = match.group(1)
            blocks[current] = line
        elif current and line.startswith("    "):
            blocks[current] += " " + line.strip()
        else:
            current = None
    return blocks


def test_version_is_the_package_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"orchestrator {orchestrator.__version__}"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" in project["project"]["dynamic"]  # pyproject reads the same attribute
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "orchestrator.__version__"}


@pytest.mark.parametrize("argv", [["-v", "methods"], ["methods", "-v"], ["--verbose", "methods"], ["methods", "--verbose"]])
def test_verbose_is_accepted_before_or_after_the_subcommand(argv):
    assert build_parser().parse_args(argv).verbose is True
    assert build_parser().parse_args(["methods"]).verbose is False


def test_verbose_after_the_subcommand_shows_the_real_error(tmp_path):
    database = tmp_path / "lineage.db"
    database.write_bytes(b"not a database at all\n" * 64)
    with pytest.raises(Exception, match="file is not a database"):
        main(["lineage", "--lineage", f"sqlite:///{database}", "-v"])


def test_tune_takes_the_pipeline_overrides_of_run():
    parser = build_parser()
    extra = ["--storage", "/tmp/x", "--ray-address", "auto", "--set", "generations.1.training.epochs=3",
             "--set", "ray.num_workers=2"]
    run, tune = parser.parse_args(["run", "p.yaml", *extra]), parser.parse_args(["tune", "t.yaml", *extra])
    expected = {"generations.1.training.epochs": 3, "ray.num_workers": 2, "storage": "/tmp/x", "ray.address": "auto"}
    assert cli.pipeline_overrides(run) == cli.pipeline_overrides(tune) == expected


def test_tune_applies_the_overrides_to_the_pipeline_it_names(tmp_path, monkeypatch, capsys):
    import orchestrator.tuning.config as tune_config

    loaded, real_load = [], tune_config.load_tune_file

    def load_and_stop(path, overrides=None):  # the real loader, then stop before the sweep starts Ray
        loaded.append(real_load(path, overrides))
        raise ValueError("stopped by the test before the sweep")

    monkeypatch.setattr(tune_config, "load_tune_file", load_and_stop)
    storage = tmp_path / "elsewhere"
    code = main(["tune", str(REPO / "pipelines" / "tune.yaml"), "--storage", str(storage), "--ray-address", "auto",
                 "--set", "generations.1.training.epochs=7"])
    assert code == ExitCode.USAGE and "stopped by the test" in capsys.readouterr().err
    pipeline = loaded[0].pipeline
    assert pipeline.storage == str(storage) and pipeline.ray.address == "auto"
    assert pipeline.generation("g1").training.epochs == 7
    assert pipeline.generation("g0-old").training.epochs == 20  # only the named field changed
    assert not storage.exists()  # nothing was started


def test_tune_override_errors_name_the_pipeline_field(capsys):
    code = main(["tune", str(REPO / "pipelines" / "tune.yaml"), "--set", "generations.1.training.epochs=0"])
    assert code == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "pipelines/lifelong.yaml" in err and "generations[1].training.epochs" in err and "(got 0)" in err


def test_help_texts_have_no_markup_and_show_every_default():
    for name, parser in _subcommands().items():
        text = parser.format_help()
        assert not re.search(r"``|:(func|class|mod|meth):", text), name
        blocks = _option_help_blocks(text)
        for action in parser._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            block = blocks[action.option_strings[0]]
            assert action.help and len(action.help) > 10, (name, action.option_strings)  # every option explained
            if action.default not in (None, False, argparse.SUPPRESS) and not isinstance(action, argparse._HelpAction):
                assert "default" in block and (str(action.default) in block or "default:" in block), (name, block)
    top = build_parser().format_help()
    assert "``" not in top and "--version" in top


def test_demo_options_show_their_defaults():
    blocks = _option_help_blocks(_subcommands()["demo"].format_help())
    assert "(default: 20)" in blocks["--epochs"] and "(default: 32)" in blocks["--embed-dim"]
    assert "(default: 0)" in blocks["--seed"] and "(default: test_resnet)" in blocks["--arch"]


@pytest.mark.parametrize(("argv", "message"), [
    (["demo", "--epochs", "0"], "--epochs: expected a number of at least 1, got 0"),
    (["demo", "--workers", "two"], "--workers: expected a whole number, got 'two'"),
    (["search", "p.yaml", "--split", "test", "-k", "0"], "expected a number of at least 1, got 0"),
    (["search", "p.yaml", "--split", "test", "--eval-k", "3"], "--eval-k: expected a number of at least 5, got 3"),
    (["gc", "p.yaml", "--keep-deployments", "0"], "--keep-deployments: expected a number of at least 1, got 0"),
    (["nosuch"], "invalid choice: 'nosuch'"),
])
def test_usage_errors_exit_2_before_any_output(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    captured = capsys.readouterr()
    assert exit_info.value.code == ExitCode.USAGE == 2
    assert message in captured.err and captured.out == ""


@pytest.mark.parametrize(("error", "code", "prefix"), [
    (ValueError("pipelines/x.yaml: name: bad (got 'a b')"), 2, "orchestrator: error: pipelines/x.yaml"),
    (RuntimeError("step train:g1 failed"), 1, "orchestrator: failed: step train:g1"),
    (FileNotFoundError(2, "No such file or directory", "/nowhere"), 1, "orchestrator: error: FileNotFoundError: "),
])
def test_exit_codes_by_kind_of_error(error, code, prefix, monkeypatch, capsys):
    def fail(args):
        raise error

    monkeypatch.setattr(cli, "_methods_command", fail)
    assert main(["methods"]) == code
    err = capsys.readouterr().err
    assert err.startswith(prefix) and err.count("\n") == 1


def test_a_generation_held_by_the_gate_exits_3(monkeypatch, capsys):
    from orchestrator.pipeline.gate import DeploymentHeld

    def held(args):
        raise DeploymentHeld("gate of g2: failed (...); action: hold. g1 keeps serving")

    monkeypatch.setattr(cli, "_run_command", held)
    assert main(["run", "pipelines/lifelong.yaml"]) == ExitCode.HELD == 3
    assert capsys.readouterr().err.startswith("orchestrator: held: gate of g2")
    # 4: busy (tests/cli/test_cli_lineage_store.py); 5, 6: tests/cli/test_honest_failure.py, test_lineage_recovery.py;
    # 7: below
    assert [int(c) for c in ExitCode] == [0, 1, 2, 3, 4, 5, 6, 7]


def test_a_generation_stopped_by_the_health_check_exits_7_with_one_line(monkeypatch, capsys):
    from orchestrator.training.health import TrainingUnhealthy

    def stopped(args):
        raise TrainingUnhealthy("g1: own CMC@1 0.017 after 4 epochs, chance is 0.016", "g1", train_key("g1"),
                                setting="generations.1.health")

    monkeypatch.setattr(cli, "_run_command", stopped)
    assert main(["run", "pipelines/lifelong.yaml"]) == ExitCode.UNHEALTHY == 7
    err = capsys.readouterr().err
    assert err.startswith("orchestrator: unhealthy: g1: own CMC@1 0.017 after 4 epochs, chance is 0.016; "
                          "train:g1 failed, nothing of g1 was evaluated or deployed")
    assert "generations.1.health" in err and err.count("\n") == 1


def test_schema_prints_the_json_schema_and_the_reference(capsys):
    from orchestrator.config_reference import json_schema, markdown_reference

    assert main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out) == json_schema("pipeline")
    assert main(["schema", "--tune"]) == 0
    assert json.loads(capsys.readouterr().out)["title"] == "orchestrator tune file"
    assert main(["schema", "--markdown"]) == 0
    assert capsys.readouterr().out == markdown_reference()


HEAVY_MODULES = ("torch", "timm", "ray", "sqlalchemy")


def test_help_version_and_usage_errors_answer_without_the_heavy_imports():
    """`orchestrator -h`, `--version`, every command's `-h` and an argument error are parsed before
    any of torch, timm, Ray or SQLAlchemy is imported (`--version` took 4.5 s when the search
    command's parser imported the search package, and with it torch)."""
    commands = list(next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices)
    code = ("import contextlib, io, sys\nfrom orchestrator.cli import main\n"
            f"for argv in [['--version'], ['-h'], ['run'], *[[c, '-h'] for c in {commands!r}]]:\n"
            "    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            "        try:\n            main(argv)\n        except SystemExit:\n            pass\n"
            f"print(sorted(m for m in {HEAVY_MODULES!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert len(commands) >= 8 and out.stdout.strip() == "[]", out.stdout + out.stderr
