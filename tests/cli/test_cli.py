"""The command line: method listing, the embedded demo, the quickstart example, errors."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli import main
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
    summary_rows = re.findall(r"^(independent|l2)\s+(-?\d+\.\d{3}\s+){8}(yes|no)$", out, re.MULTILINE)
    assert [row[0] for row in summary_rows] == ["independent", "l2"]


def test_unknown_method_is_a_clear_error(capsys):
    assert main(["demo", "--epochs", "1", "--methods", "bct,nosuch"]) == 2
    err = capsys.readouterr().err
    assert "unknown method 'nosuch'" in err and "hbct" in err


@pytest.mark.e2e
def test_quickstart_example_runs_and_reports_the_update():
    result = subprocess.run([sys.executable, str(REPO / "examples" / "quickstart.py"), "--epochs", "2"],
                            capture_output=True, text=True, timeout=300, cwd=REPO)
    assert result.returncode == 0, result.stderr[-2000:]
    assert re.search(r"^new → old\s+[01]\.\d{4}", result.stdout, re.MULTILINE)
    for metric in ("cmc@1", "map"):
        line = next(l for l in result.stdout.splitlines() if l.startswith(metric + " {"))
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
    text = (REPO / "pipelines" / "lifelong.yaml").read_text().replace("params: {clip: 1.2}", "params: {clip: -1}", 1)
    bad.write_text(text)
    assert main(["run", str(bad), "--storage", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "generations[1].method.params.clip" in err and "(got -1)" in err
    assert not (tmp_path / "run").exists()  # nothing was started or written


def test_a_garbled_lineage_database_is_one_line_not_a_traceback(tmp_path, capsys):
    database = tmp_path / "lineage.db"
    database.write_bytes(b"not a database at all\n" * 64)
    assert main(["lineage", "--lineage", f"sqlite:///{database}"]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("orchestrator: error: DatabaseError: ")
    assert "file is not a database" in error and "Traceback" not in error
    with pytest.raises(Exception, match="file is not a database"):
        main(["-v", "lineage", "--lineage", f"sqlite:///{database}"])  # -v: the real exception
