"""The progress meter: plain lines at most every ``interval`` seconds (and for the last unit), a
tqdm bar on a terminal that leaves its last state as a line, and the environment override."""
import io

import pytest

from orchestrator.progress import MODE_ENV, Meter, progress_mode
from orchestrator.tuning.config import ParameterRange
from orchestrator.tuning.space import trial_count


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_lines_are_spaced_by_the_interval_and_the_last_unit_always_reports():
    lines, clock = [], Clock()
    meter = Meter(lines.append, "embedded", 1000, "items", interval=10.0, mode="lines", clock=clock)
    for _ in range(9):  # 100 items a second for 9 s: no line yet
        clock.now += 1.0
        meter.advance(100)
    assert lines == []
    clock.now += 1.0
    meter.advance(50)  # 10 s after the start: 950 items
    assert lines == ["embedded 950/1000 items (95%, 95 items/s)"]
    clock.now += 0.5
    meter.advance(50)  # the last unit reports whatever the interval
    assert lines[-1] == "embedded 1000/1000 items (100%, 95 items/s)" and len(lines) == 2


def test_unitless_meter_prints_each_unit_with_its_note_and_unknown_totals_count_up():
    lines = []
    epochs = Meter(lines.append, "epoch", 2, interval=0.0, mode="lines")
    epochs.advance(1, "loss 1.2500")
    epochs.advance(1, "loss 0.5000")
    assert lines == ["epoch 1/2  loss 1.2500", "epoch 2/2  loss 0.5000"]
    open_ended = Meter(lines.append, "trials ended", None, interval=0.0, mode="lines")
    open_ended.advance()
    assert lines[-1] == "trials ended 1"


def test_off_mode_reports_only_the_end():
    lines = []
    meter = Meter(lines.append, "embedded", 3, "items", interval=0.0, mode="off")
    meter.advance(2)
    assert lines == []
    meter.advance(1)
    assert len(lines) == 1 and lines[0].startswith("embedded 3/3 items (100%")


def test_bar_mode_draws_on_stderr_and_leaves_the_last_state_as_a_line(monkeypatch):
    stderr = io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    lines = []
    with Meter(lines.append, "epoch", 3, mode="bars") as meter:
        for epoch in range(3):
            meter.advance(1, f"loss {1.0 / (epoch + 1):.4f}")
            if epoch < 2:
                assert lines == []  # the bar, not lines, while it runs
    assert "epoch" in stderr.getvalue() and "3/3" in stderr.getvalue()
    assert lines == ["epoch 3/3  loss 0.3333"]


def test_mode_follows_the_environment_then_the_terminal(monkeypatch):
    monkeypatch.setenv(MODE_ENV, "off")
    assert progress_mode() == "off"
    monkeypatch.setenv(MODE_ENV, "spinner")
    with pytest.raises(ValueError, match=f"{MODE_ENV}='spinner'"):
        progress_mode()
    monkeypatch.delenv(MODE_ENV)
    monkeypatch.setattr("sys.stderr", io.StringIO())  # not a terminal
    assert progress_mode() == "lines"


def test_trial_count_repeats_the_grid_for_every_sample():
    space = {"lam": ParameterRange(grid=[0.1, 0.5, 1.0]), "clip": ParameterRange(grid=[1.0, 2.0]),
             "tau": ParameterRange(uniform=[0.1, 1.0])}
    assert trial_count(space, 4) == 4 * 3 * 2
    assert trial_count({"tau": ParameterRange(uniform=[0.1, 1.0])}, 5) == 5
