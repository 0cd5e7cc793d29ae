"""Commands that only read or validate answer without importing torch, timm, torchvision or Ray
(issue 26): a config error, a missing store or file, ``schema`` and ``methods`` run in a fresh
interpreter, whose ``sys.modules`` is then read. A config error imports nothing a valid file's
check does not need either: no database, Arrow, file-system or image library (issue 40). Their CPU
time and memory are measured in docs/troubleshooting.md ("The first answers"), not asserted here."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.config import PipelineConfigError, load_pipeline
from orchestrator.config.architectures import CACHE_ENV, cache_file, unknown_architectures

HEAVY = ("torch", "timm", "torchvision", "ray")
#: What checking a pipeline file never needs: the lineage's database, Arrow, file systems, images.
NOT_FOR_CHECKING = (*HEAVY, "sqlalchemy", "alembic", "pyarrow", "fsspec", "s3fs", "PIL", "faiss")
PIPELINE = str(Path(__file__).resolve().parents[2] / "pipelines" / "lifelong.yaml")
TUNE = str(Path(__file__).resolve().parents[2] / "pipelines" / "tune.yaml")


def _heavy_after(argv: list[str], env: dict[str, str], heavy: tuple[str, ...] = HEAVY) -> tuple[int, str, list[str]]:
    """(exit code, stderr, the ``heavy`` packages imported) of ``orchestrator argv`` in a fresh interpreter."""
    code = ("import contextlib, io, sys\nfrom orchestrator.cli import main\nerr = io.StringIO()\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):\n"
            f"    status = main({argv!r})\n"
            f"print(status, sorted(m for m in {heavy!r} if m in sys.modules))\nprint(err.getvalue())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    first, _, stderr = out.partition("\n")
    status, _, modules = first.partition(" ")
    return int(status), stderr, eval(modules)  # noqa: S307 (a list of names printed by the child above)


@pytest.fixture
def cached_env(tmp_path, monkeypatch):
    """An environment whose timm model-name cache exists (written by asking timm once here)."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    assert unknown_architectures(["test_resnet", "resnet10t"]) == {}
    assert cache_file().is_file()
    return dict(os.environ)


@pytest.mark.parametrize("argv, exit_code, message", [
    (["run", "{bad}"], 2, "data: Field required"),
    (["run", PIPELINE, "--set", "generations.1.method.params.lam=-1"], 2, "generations[1].method.params.lam"),
    (["run", PIPELINE, "--set", "gallery.index=flat2"], 2, "gallery.index: must be one of"),
    (["tune", TUNE, "--set", "generations.0.training.epochs=0"], 2, "generations[0].training.epochs"),
    (["lineage", PIPELINE, "--storage", "{missing}"], 2, "LineageNotFound"),
    (["lineage", "--lineage", "sqlite:///{missing}/lineage.db"], 2, "LineageNotFound"),
    (["search", PIPELINE, "--storage", "{missing}", "--split", "test"], 2, "no such folder (nothing was run there)"),
    (["verify", "{missing}/pipeline.yaml"], 2, "file not found"),
    (["schema"], 0, ""),
    (["methods"], 0, ""),
])
def test_validating_and_refusing_import_no_torch_timm_or_ray(argv, exit_code, message, cached_env, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ngenerations: []\n")
    argv = [a.format(bad=bad, missing=tmp_path / "missing") for a in argv]
    status, stderr, heavy = _heavy_after(argv, cached_env)
    assert (status, heavy) == (exit_code, []), stderr
    assert message in stderr
    assert not (tmp_path / "missing").exists()  # a refusal creates nothing


@pytest.mark.parametrize("argv, message", [
    (["run", "{bad}"], "data: Field required"),
    (["run", PIPELINE, "--set", "generations.1.method.params.lam=-1"], "generations[1].method.params.lam"),
    (["run", PIPELINE, "--set", "data.options.colour=1"], "data.options.colour: unknown option of source 'digits'"),
    (["run", PIPELINE, "--set", "gallery.index=flat2"], "gallery.index: must be one of"),
    (["tune", TUNE, "--set", "generations.0.training.epochs=0"], "generations[0].training.epochs"),
])
def test_a_config_error_imports_no_database_arrow_file_system_or_image_library(argv, message, cached_env, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ngenerations: []\n")
    status, stderr, heavy = _heavy_after([a.format(bad=bad) for a in argv], cached_env, NOT_FOR_CHECKING)
    assert (status, heavy) == (2, []), stderr
    assert message in stderr


def test_a_wrong_arch_is_refused_before_anything_starts_with_the_nearest_name(cached_env, tmp_path):
    with pytest.raises(PipelineConfigError) as caught:
        load_pipeline(PIPELINE, {"generations.2.model.arch": "resnet10x", "storage": str(tmp_path / "runs")})
    assert caught.value.problems == ["generations[2].model.arch: not a timm model name (did you mean 'resnet10t'?) "
                                     "(got \"resnet10x\") [set by override]"]
    assert main(["run", PIPELINE, "--storage", str(tmp_path / "runs"), "--set", "generations.2.model.arch=resnet10x"]) == 2
    assert not (tmp_path / "runs").exists()


def test_the_arch_is_asked_of_timm_only_once_the_rest_of_the_file_is_valid(cached_env, tmp_path):
    """With another error in the file, a wrong arch is not reported yet: that answer would need timm."""
    with pytest.raises(PipelineConfigError) as caught:
        load_pipeline(PIPELINE, {"generations.2.model.arch": "resnet10x", "generations.1.method.params.lam": -1})
    assert [p.split(":")[0] for p in caught.value.problems] == ["generations[1].method.params.lam"]


def test_the_cache_answers_only_for_names_it_lists(tmp_path, monkeypatch):
    """A name missing from the cached list is asked of timm (a stale or partial cache cannot refuse
    a real model); a listed one is accepted from the list."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    cache_file().parent.mkdir(parents=True, exist_ok=True)
    cache_file().write_text('["only_this_one"]')
    assert unknown_architectures(["only_this_one"]) == {}
    assert unknown_architectures(["test_resnet"]) == {}  # not listed: timm says it exists
    assert set(unknown_architectures(["test_resnet", "resnet10x"])) == {"resnet10x"}
    import timm

    assert cache_file().read_text().count('"') == 2 * len(timm.list_models())  # rewritten from timm
