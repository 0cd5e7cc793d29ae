"""Progress of long, counted work (training epochs, gallery items embedded, tuning trials).

In an interactive terminal a ``Meter`` draws a tqdm bar on stderr and, when the work is done,
leaves its last state as one line through the caller's ``emit``; otherwise (a log file, a Ray job's
log, a pipe) it writes plain lines through ``emit`` at most every ``interval`` seconds, and always
for the last unit. ``ORCHESTRATOR_PROGRESS`` overrides the choice:
``bars``, ``lines`` or ``off`` (lines only for the last unit).
"""
from __future__ import annotations

import os
import sys
import time
from typing import Callable

MODE_ENV = "ORCHESTRATOR_PROGRESS"
MODES = ("bars", "lines", "off")


def progress_mode() -> str:
    """``bars`` | ``lines`` | ``off``: the environment's choice, else bars on a terminal."""
    chosen = os.environ.get(MODE_ENV, "").strip().lower()
    if chosen:
        if chosen not in MODES:
            raise ValueError(f"{MODE_ENV}={chosen!r}: expected one of {', '.join(MODES)}")
        return chosen
    return "bars" if sys.stderr.isatty() else "lines"


class Meter:
    """``done`` of ``total`` units of one piece of work (``total`` None: unknown).

    Lines read ``"<label> <done>/<total> [<unit>] [(<pct>%, <rate> <unit>/s)]  [<note>]"``; with an
    empty ``unit`` (e.g. epochs, where the note carries the loss) the percentage and rate are left out.
    """

    def __init__(self, emit: Callable[[str], None], label: str, total: int | None, unit: str = "",
                 interval: float = 10.0, mode: str | None = None, clock: Callable[[], float] = time.monotonic):
        self.emit, self.label, self.total, self.unit, self.interval = emit, label, total, unit, interval
        self.mode = mode or progress_mode()
        self.clock = clock
        self.done = 0
        self._started = self._last_line = clock()
        self._bar = None
        if self.mode == "bars":
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=label, unit=unit or "it", file=sys.stderr, leave=False,
                             dynamic_ncols=True)

    def advance(self, count: int = 1, note: str = "") -> None:
        """``count`` more units are done; ``note`` is shown beside the count (the bar's postfix)."""
        self.done += count
        now = self.clock()
        finished = self.total is not None and self.done >= self.total
        if self._bar is not None:
            self._bar.update(count)
            if note:
                self._bar.set_postfix_str(note)  # redraws: notes come with coarse units (epochs)
            if finished:  # the bar goes, its last state stays as a line
                self.close()
                self.emit(self.line(note, now))
            return
        if finished or (self.mode == "lines" and now - self._last_line >= self.interval):
            self._last_line = now
            self.emit(self.line(note, now))

    def line(self, note: str = "", now: float | None = None) -> str:
        """The plain progress line for the current count."""
        text = f"{self.label} {self.done}" + (f"/{self.total}" if self.total is not None else "")
        if self.unit:
            elapsed = max((self.clock() if now is None else now) - self._started, 1e-9)
            share = f"{100 * self.done / self.total:.0f}%, " if self.total else ""
            text += f" {self.unit} ({share}{self.done / elapsed:.0f} {self.unit}/s)"
        return text + (f"  {note}" if note else "")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Meter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
