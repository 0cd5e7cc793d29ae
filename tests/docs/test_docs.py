"""The documentation is current and what it shows works.

- the configuration reference and the JSON Schemas are what the code generates now, and every
  shipped pipeline and tune file validates against its schema;
- the architecture page lists the layers the import graph has now, and describes every part;
- every ``orchestrator ...`` command in the README and docs/ parses with the real parser;
- every complete pipeline file shown in docs/ loads; relative links point at existing files;
- the README's set-up commands are the ones CI runs; the exit codes documented are the CLI's.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import io
import json
import re
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml

from orchestrator.cli import ExitCode, build_parser
from orchestrator.config import load_pipeline
from orchestrator.config_reference import markdown_reference, schema_text

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
PAGES = [REPO / "README.md", *sorted(DOCS.glob("*.md"))]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
COMMAND = re.compile(r"(?:^|\$ |-- |&& )\s*(orchestrator\s.*)$")
SHELL_OPERATORS = {">", ">>", "|", "&", "&&", ";", "2>&1"}  # where the orchestrator command ends


@functools.cache
def _architecture():
    spec = importlib.util.spec_from_file_location("make_architecture", DOCS / "make_architecture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _import_graph():
    return _architecture().import_graph()


def _code_lines(text: str) -> list[str]:
    """The lines of every fenced code block, shell continuations (a trailing backslash) joined."""
    lines = []
    for block in FENCE.findall(text):
        lines += block.replace("\\\n", " ").splitlines()
    return lines


def _documented_commands() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for line in _code_lines(page.read_text(encoding="utf-8")):
            match = COMMAND.search(line.strip())
            if match:
                found.append((page.name, match.group(1)))
    return found


def _parse(tokens: list[str]) -> tuple[int, str]:
    """(exit status, stderr) of parsing ``tokens`` with the real parser (0: parsed)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(tokens)
    except SystemExit as exit_:
        return int(exit_.code or 0), err.getvalue()
    return 0, ""


# --------------------------------------------------------------------------- generated files


def test_configuration_reference_is_current():
    assert (DOCS / "configuration.md").read_text(encoding="utf-8") == markdown_reference(), \
        "docs/configuration.md is stale: run python3 -m orchestrator.config_reference"


@pytest.mark.parametrize("kind", ["pipeline", "tune"])
def test_json_schemas_are_current(kind):
    assert (DOCS / f"{kind}.schema.json").read_text(encoding="utf-8") == schema_text(kind), \
        f"docs/{kind}.schema.json is stale: run python3 -m orchestrator.config_reference"


def test_every_shipped_file_validates_against_its_schema_and_a_typo_does_not():
    schemas = {kind: json.loads((DOCS / f"{kind}.schema.json").read_text()) for kind in ("pipeline", "tune")}
    files = sorted(REPO.glob("pipelines/*.yaml")) + sorted(REPO.glob("examples/**/*.yaml"))
    assert len(files) >= 6
    for path in files:
        data = yaml.safe_load(path.read_text())
        schema = schemas["tune" if "transition" in data else "pipeline"]
        errors = [error.message for error in jsonschema.Draft202012Validator(schema).iter_errors(data)]
        assert not errors, (path, errors)
    typo = yaml.safe_load((REPO / "pipelines" / "lifelong.yaml").read_text())
    typo["generations"][1]["trainig"] = {"epochs": 3}
    typo["gallery"]["num_shards"] = 0
    typo["generations"][2]["method"]["params"]["lamda"] = 0.5  # hbct has lam, not lamda
    typo["generations"][0]["method"]["params"]["clip"] = -1.0  # hbct's clip is > 0
    errors = {e.json_path: e.message for e in jsonschema.Draft202012Validator(schemas["pipeline"]).iter_errors(typo)}
    assert "'trainig' was unexpected" in errors["$.generations[1]"] and "$.gallery.num_shards" in errors
    assert "$.generations[2].method.params" in errors and "$.generations[0].method.params" in errors
    assert set(errors) == {"$.generations[1]", "$.gallery.num_shards", "$.generations[2].method.params",
                           "$.generations[0].method.params"}


def test_every_field_of_the_reference_has_a_description():
    rows = [re.split(r"(?<!\\)\|", line)[1:-1] for line in markdown_reference().splitlines()
            if re.match(r"^\| `[^`]+` \|", line)]
    field_rows = [cells for cells in rows if len(cells) == 4]  # field | type | default | description
    assert len(field_rows) > 80
    assert not [cells[0] for cells in field_rows if not cells[3].strip()]


def test_the_architecture_page_lists_the_current_layers_and_describes_every_part():
    architecture = _architecture()
    text = (DOCS / "architecture.md").read_text(encoding="utf-8")
    listed = re.search(r"<!-- layers:start[^>]*-->\n(.*?)\n<!-- layers:end -->", text, re.DOTALL).group(1)
    assert listed == architecture.layer_text(*_import_graph()), "docs/architecture.md is stale: run python3 docs/make_architecture.py"
    described = text.split("## The parts", 1)[1]
    for part in architecture.parts():
        assert re.search(rf"^- .*`{part}`", described, re.MULTILINE), f"docs/architecture.md does not describe {part}"
    assert (DOCS / "architecture.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_science_layers_do_not_import_ray():
    edges, ray_users = _import_graph()
    science = {"geometry", "models", "methods", "metrics", "training", "data", "comparison", "evaluation"}
    assert science <= set(edges) and not science & ray_users
    assert {"distributed", "tuning"} <= ray_users  # the graph does see Ray where it is used


# --------------------------------------------------------------------------- commands and examples


def test_every_documented_command_parses():
    commands = _documented_commands()
    assert len(commands) > 25 and {"README.md", "cli.md", "cluster.md", "search.md"} <= {page for page, _ in commands}
    for page, command in commands:
        words = shlex.split(command, comments=True)[1:]
        cut = next((i for i, word in enumerate(words) if word in SHELL_OPERATORS), len(words))
        status, err = _parse(words[:cut])
        assert status == 0, f"{page}: {command!r}: {err.strip()}"


def test_inline_command_mentions_name_real_commands_and_options():
    subcommands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    mentions = 0
    for page in PAGES:
        prose = FENCE.sub("", page.read_text(encoding="utf-8"))
        for span in re.findall(r"`(orchestrator [^`]+)`", prose):
            words = span.split()
            if words[1].startswith("-"):
                continue  # a top-level option such as --version
            mentions += 1
            assert words[1] in subcommands, f"{page.name}: {span!r}: no command {words[1]!r}"
            known = subcommands[words[1]]._option_string_actions
            for word in words[2:]:
                flag = word.split("=")[0]
                if flag.startswith("-"):
                    assert flag in known, f"{page.name}: {span!r}: {words[1]} has no option {flag}"
    assert mentions > 20


def test_a_wrong_command_would_be_caught():
    assert _parse(["run", "pipelines/lifelong.yaml", "--stroage", "x"])[0] == 2
    assert _parse(["tune"])[0] == 2


def test_complete_pipeline_files_shown_in_the_docs_load():
    shown = []
    for page in PAGES:
        shown += [block for block in FENCE.findall(page.read_text(encoding="utf-8"))
                  if block.startswith("# docs: complete pipeline file")]
    assert len(shown) >= 2
    for number, block in enumerate(shown):
        path = DOCS / f".shown-{number}.yaml"
        try:
            path.write_text(block, encoding="utf-8")
            config = load_pipeline(path)
        finally:
            path.unlink(missing_ok=True)
        assert config.generations and config.data.loader_kwargs(config.data.train_split)


def test_relative_links_point_at_existing_files():
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text(encoding="utf-8")):
            if "://" not in target:
                assert (page.parent / target).exists(), f"{page.name}: broken link {target}"


def test_the_readme_set_up_is_the_one_ci_runs():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    cpu_torch = "python3 -m pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu"
    commands = [line for line in _code_lines(readme) if line.startswith("python3 -m") and line != cpu_torch]
    assert cpu_torch in _code_lines(readme)  # the lean install's first step (issue 26)
    venv = "python3 -m venv .venv && . .venv/bin/activate"
    run = "python3 -m pip install -e '.[dev]' && orchestrator run pipelines/lifelong.yaml"
    test = "python3 -m pip install -e '.[dev]' && python3 -m ruff check . && python3 -m mypy && python3 -m pytest -n 3 --dist loadgroup"
    assert commands[:3] == [venv, run, test]
    assert (REPO / ".ci" / "run").read_text().splitlines()[-1] == test


def test_the_documented_exit_codes_are_the_cli_s():
    table = (DOCS / "cli.md").read_text(encoding="utf-8").split("## Exit codes", 1)[1]
    documented = {int(code) for code in re.findall(r"^\| (\d) \|", table, re.MULTILINE)}
    assert {int(code) for code in ExitCode} <= documented
    assert documented - {int(code) for code in ExitCode} <= {4}  # busy: the lineage lock's code
