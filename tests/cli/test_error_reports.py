"""Every error the package defines derives from ``OrchestratorError`` and carries its exit code and
the word of its one line; the command line reads them off the error."""
import ast
import builtins
import contextvars
from pathlib import Path

import pytest

import orchestrator
from orchestrator import cli
from orchestrator.cli import ExitCode, main
from orchestrator.errors import OrchestratorError, OutsideSystemError
from orchestrator.integrity import IntegrityError
from orchestrator.lineage.errors import LineageBusy, LineageNotFound
from orchestrator.pipeline.step_specs import ChangedStepSpec
from orchestrator.storage.hashing import ChecksumMismatch
from orchestrator.storage.overwrite import UnknownArtefact

#: Raised and caught inside one module, never reported (the gallery step's lost-actor signal).
INTERNAL = {"_Lost"}


def _defined_classes() -> dict[str, list[str]]:
    """Every class the package defines: its name → the last component of each base's name."""
    classes: dict[str, list[str]] = {}
    for path in Path(orchestrator.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                classes[node.name] = [ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases]
    return classes


def test_every_error_the_package_defines_derives_from_orchestrator_error():
    classes = _defined_classes()

    def ancestors(name: str) -> set[str]:
        """``name`` and every class it derives from, by name (a name two modules define: both)."""
        found, todo = set(), [name]
        while todo:
            current = todo.pop()
            if current not in found:
                found.add(current)
                todo += classes.get(current, [])
        return found

    def derives(name: str, target: str) -> bool:
        return target in ancestors(name)

    def is_error(name: str) -> bool:
        return any(isinstance(getattr(builtins, a, None), type) and issubclass(getattr(builtins, a), BaseException)
                   or a == "YAMLError" for a in ancestors(name))

    errors = {name for name in classes if is_error(name)} - INTERNAL - {"OrchestratorError"}
    assert len(errors) >= 14
    assert sorted(name for name in errors if not derives(name, "OrchestratorError")) == []


@pytest.mark.parametrize(("error", "code", "line"), [
    (ChecksumMismatch("/s/shard-0.parquet", "ab", "cd"), ExitCode.INTEGRITY,
     "orchestrator: integrity: checksum mismatch for /s/shard-0.parquet: expected sha256 ab, got cd"),
    (IntegrityError("/s/g0/card.json: card changed"), ExitCode.INTEGRITY, "orchestrator: integrity: /s/g0/card.json"),
    (LineageNotFound("no lineage store at sqlite:///x.db"), ExitCode.USAGE,
     "orchestrator: error: LineageNotFound: no lineage store at sqlite:///x.db"),
    (LineageBusy("held by pid 7"), ExitCode.BUSY, "orchestrator: busy: held by pid 7"),
    (OutsideSystemError("S3", "s3://b/run", "refused", "the endpoint"), ExitCode.UNREACHABLE,
     "orchestrator: unreachable: S3 at s3://b/run: refused; check the endpoint"),
    (ChangedStepSpec("train:g1", ["lr"], "g1"), ExitCode.USAGE, "orchestrator: error: "),
    (UnknownArtefact("/s/generations/g0 exists"), ExitCode.FAILED, "orchestrator: failed: /s/generations/g0 exists"),
    (KeyError("g9"), ExitCode.USAGE, "orchestrator: error: 'g9'"),
    (ModuleNotFoundError("no module named x"), ExitCode.USAGE, "orchestrator: error: no module named x"),
    (NotImplementedError("not here"), ExitCode.FAILED, "orchestrator: failed: not here"),
    (PermissionError(13, "Permission denied", "/s"), ExitCode.FAILED, "orchestrator: error: PermissionError: "),
])
def test_each_error_exits_with_its_code_and_one_line(error, code, line, monkeypatch, capsys):
    def fail(args):
        raise error

    monkeypatch.setattr(cli, "_methods_command", fail)
    assert main(["methods"]) == code
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == 1
    if isinstance(error, OrchestratorError):
        assert (error.exit_code, f"orchestrator: {error.report_line()}\n") == (code, err)


def test_an_error_of_no_known_kind_shows_its_traceback(monkeypatch):
    class Unknown(Exception):
        pass

    def fail(args):
        raise Unknown("?")

    monkeypatch.setattr(cli, "_methods_command", fail)
    with pytest.raises(Unknown):
        main(["methods"])


def test_under_verbose_an_outside_systems_error_shows_its_traceback_and_the_projects_others_their_line(
        monkeypatch, capsys):
    raised: list[Exception] = []

    def fail(args):
        raise raised[-1]

    monkeypatch.setattr(cli, "_methods_command", fail)
    raised.append(OutsideSystemError("SQLite", "sqlite:///x.db", "disk I/O error", "the disk"))
    with pytest.raises(OutsideSystemError, match="disk I/O error"):
        main(["methods", "-v"])
    raised.append(LineageBusy("held by pid 7"))
    assert main(["methods", "-v"]) == ExitCode.BUSY
    assert capsys.readouterr().err.endswith("orchestrator: busy: held by pid 7\n")


def test_an_object_store_error_raised_outside_the_file_operations_is_told_as_the_noted_storage(monkeypatch, capsys):
    from botocore.exceptions import EndpointConnectionError

    from orchestrator import outside

    def fail(args):
        raise EndpointConnectionError(endpoint_url="http://127.0.0.1:9/b/k")

    monkeypatch.setattr(cli, "_methods_command", fail)
    monkeypatch.setattr(outside, "_noted_storage", contextvars.ContextVar("storage", default="s3://b/run"))
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    assert main(["methods"]) == ExitCode.UNREACHABLE
    assert capsys.readouterr().err == (
        'orchestrator: unreachable: S3 at s3://b/run: Could not connect to the endpoint URL: "http://127.0.0.1:9/b/k" '
        "(endpoint AWS's default); check that the endpoint (AWS_ENDPOINT_URL_S3) is up and reachable, and the "
        "credentials (AWS_ACCESS_KEY_ID / AWS_PROFILE)\n")
