"""Temporary files of killed atomic writes are removed by the next run (issue 13 part 7).

A process killed inside ``write_bytes_atomic`` (SIGKILL: no cleanup handler runs) leaves its
``.<name>.tmp-<hex>`` file; the next pipeline run removes every such file under its storage that is
older than the run, and leaves younger ones (a write in progress) and every other file alone.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from orchestrator.config import load_pipeline
from orchestrator.pipeline.runner import PipelineRunner
from orchestrator.storage import filesystem, remove_stale_temporaries, write_bytes_atomic
from orchestrator.storage.filesystem import STALE_TEMPORARY_GRACE_S

REPO = Path(__file__).resolve().parents[2]

def killed_write(target: Path) -> Path:
    """Write ``target`` in a child process that is killed (SIGKILL) halfway; the temporary file it leaves."""
    pid = os.fork()
    if pid == 0:  # the child: no except/finally of the write runs after the kill
        try:
            def killed(handle, data):
                handle.write(data[: len(data) // 2])
                handle.flush()
                os.kill(os.getpid(), signal.SIGKILL)

            filesystem._write_all = killed  # the child's copy of the module only
            filesystem.write_bytes_atomic(str(target), b"x" * 4096)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    (left,) = [p for p in target.parent.iterdir() if p.name.startswith(f".{target.name}.tmp-")]
    assert left.stat().st_size == 2048 and not target.exists()
    return left


def age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_only_stale_temporaries_of_atomic_writes_are_removed(tmp_path):
    root = tmp_path / "run"
    stale = [killed_write(root / "generations" / "g0" / "model.safetensors"), killed_write(root / "plans" / "g1.json")]
    fresh = killed_write(root / "reports" / "compatibility.json")
    write_bytes_atomic(str(root / "kept.json"), b"{}")
    lookalikes = [root / ".notes.tmp-1234", root / "x.tmp-" / "data", root / "plans" / f"visible.tmp-{'a' * 32}"]
    for path in lookalikes:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"not ours")
    for path in stale + lookalikes:
        age(path, 3600)
    age(fresh, STALE_TEMPORARY_GRACE_S / 2)  # a write that may still be in progress

    assert remove_stale_temporaries(str(root), started=time.time()) == len(stale)
    assert not any(p.exists() for p in stale)
    assert fresh.exists() and all(p.exists() for p in lookalikes) and (root / "kept.json").read_bytes() == b"{}"
    assert remove_stale_temporaries(str(root), started=time.time()) == 0
    assert remove_stale_temporaries(str(tmp_path / "missing"), started=time.time()) == 0
    assert remove_stale_temporaries("memory://bucket/run", started=time.time()) == 0


class _FirstStep(Exception):
    pass


def test_a_run_removes_them_before_its_first_step(tmp_path, monkeypatch):
    storage = tmp_path / "run"
    left = killed_write(storage / "generations" / "g0-old" / "model.safetensors")
    age(left, 3600)
    config = load_pipeline(REPO / "pipelines" / "lifelong.yaml", {"storage": str(storage)})
    said: list[str] = []
    runner = PipelineRunner(config, progress=said.append)

    def first_step(*args, **kwargs):
        raise _FirstStep

    monkeypatch.setattr(runner, "_step", first_step)
    with pytest.raises(_FirstStep):
        runner.run()
    assert not left.exists()
    assert len(said) == 1 and said[0].endswith(f"removed 1 temporary file(s) left by interrupted writes under {storage}")
