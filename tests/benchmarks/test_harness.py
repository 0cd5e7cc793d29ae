"""What the benchmarks share (benchmarks/harness.py): reading item counts, the measured commit, the
results file and the generated README section."""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.harness import checkout_commit, parse_sizes, replace_section, rewrite_section, write_results

REPO = Path(__file__).resolve().parents[2]


def test_sizes_parse_from_scientific_notation_ascending_and_once_each():
    assert parse_sizes("1e5,1e6, 2000") == [2000, 100_000, 1_000_000]
    assert parse_sizes("1e3,1000,5e2,") == [500, 1000]


@pytest.mark.parametrize("bad", ["", " , ", "1e5,x", "0", "1e5,-3"])
def test_anything_but_positive_counts_is_refused_with_the_text(bad):
    with pytest.raises(argparse.ArgumentTypeError, match=f"positive item counts .*got {bad!r}"):
        parse_sizes(bad)


def test_the_generated_section_is_replaced_between_its_markers_only(tmp_path):
    text = "head\n<!-- b -->\nstale\n<!-- e -->\ntail <!-- b --> again\n"
    assert replace_section(text, "<!-- b -->\nnew\n<!-- e -->", "<!-- b -->", "<!-- e -->") == \
        "head\n<!-- b -->\nnew\n<!-- e -->\ntail <!-- b --> again\n"
    readme = tmp_path / "README.md"
    readme.write_text(text, encoding="utf-8")
    rewrite_section(readme, "<!-- b -->é<!-- e -->", "<!-- b -->", "<!-- e -->")
    assert readme.read_text(encoding="utf-8") == "head\n<!-- b -->é<!-- e -->\ntail <!-- b --> again\n"


@pytest.mark.parametrize("text", ["no markers", "<!-- e --> end before begin <!-- b -->", "<!-- b --> no end"])
def test_a_text_without_both_markers_in_order_is_refused_naming_them(text):
    with pytest.raises(ValueError, match="no generated section \\(<!-- b --> … <!-- e -->\\)"):
        replace_section(text, "x", "<!-- b -->", "<!-- e -->")


def _git(folder, *args):
    subprocess.run(["git", *args], cwd=folder, check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@t"})


def test_the_commit_is_marked_dirty_only_when_a_watched_path_changed(tmp_path):
    assert checkout_commit(checkout=tmp_path) == "?"  # not a git checkout
    _git(tmp_path, "init", "-q")
    (tmp_path / "orchestrator").mkdir()
    (tmp_path / "orchestrator" / "a.py").write_text("x = 1\n")
    (tmp_path / "notes.txt").write_text("n\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "c")
    short = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tmp_path, capture_output=True,
                           text=True).stdout.strip()
    assert checkout_commit(checkout=tmp_path) == short
    (tmp_path / "notes.txt").write_text("changed\n")
    assert checkout_commit(checkout=tmp_path) == short  # not watched
    assert checkout_commit(("orchestrator", "notes.txt"), checkout=tmp_path) == short + "+dirty"
    (tmp_path / "orchestrator" / "a.py").write_text("x = 2\n")
    assert checkout_commit(checkout=tmp_path) == short + "+dirty"


def test_results_are_written_as_json_into_a_new_folder_and_announced(tmp_path, capsys):
    path = tmp_path / "runs" / "bench" / "r.json"
    write_results(path, {"rows": [1, 2.5], "note": "é"}, lead="\n")
    assert json.loads(path.read_text()) == {"rows": [1, 2.5], "note": "é"}
    assert path.read_text().endswith("}\n")
    assert capsys.readouterr().out == f"\nresults written to {path}\n"


def test_every_benchmark_that_imports_benchmarks_puts_the_checkout_on_the_path_first():
    """``python benchmarks/X.py`` (the README's commands) has only ``benchmarks/`` on the path: a
    script that imports ``benchmarks.*`` must insert the checkout before it (compatibility.py did
    not, and `--from-rows` failed with ModuleNotFoundError)."""
    import re

    missing = []
    for script in sorted((REPO / "benchmarks").glob("*.py")):
        text = script.read_text()
        first_import = re.search(r"^(?:from benchmarks[. ]|import benchmarks)", text, re.MULTILINE)
        if first_import is None or script.name == "__init__.py":
            continue
        guard = text.find("sys.path.insert(0, str(Path(__file__).resolve().parents[1]))")
        if guard == -1 or guard > first_import.start():
            missing.append(script.name)
    assert missing == []


def test_the_compatibility_benchmark_runs_as_the_readme_runs_it(tmp_path):
    """From another folder, as a script: its ``--help`` answers (the imports resolve)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "compatibility.py"), "--help"], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--upgrade" in done.stdout
