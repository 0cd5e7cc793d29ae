"""Ray Data settings of one of the project's Datasets, set for a block and put back after it.

Ray Data reads its settings from the driver's current ``DataContext`` (every Dataset copies it
when it is made and carries the copy to its executor and workers; a progress bar asks the current
one again as it starts) and logs through the ``ray.data`` logger. Both are the whole process's: a
step that set them for good changed them for whatever else the process runs with Ray Data (a
user's program that calls the pipeline, the next Dataset of the project). A block of
``data_settings`` sets them and puts back what was there when it ends.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def data_settings(**fields: Any) -> Iterator[None]:
    """Inside the block: ``fields`` set on the driver's current ``DataContext`` (for example
    ``enable_progress_bars=False``) and the ``ray.data`` logger at WARNING at the least (the
    pipeline prints its own progress, not Ray Data's INFO lines); after it, the values before."""
    import ray.data

    context = ray.data.DataContext.get_current()
    logger = logging.getLogger("ray.data")
    before, level = {name: getattr(context, name) for name in fields}, logger.level
    for name, value in fields.items():
        setattr(context, name, value)
    logger.setLevel(max(logger.getEffectiveLevel(), logging.WARNING))
    try:
        yield
    finally:
        for name, value in before.items():
            setattr(context, name, value)
        logger.setLevel(level)
