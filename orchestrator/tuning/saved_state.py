"""Whether an interrupted sweep's saved Ray Tune state can be resumed: every state file whole.

Ray Tune saves its experiment in the Ray session's staging folder (atomically) and then copies
it to the sweep folder; a driver killed during that copy leaves a file cut short there, and on
resume Tune loads it, logs the error, starts the experiment anew with a searcher that has lost
its search space, and fails with a message that names neither the file nor the cause.
``damaged_state_files`` finds such files without unpickling anything: a pickle is checked by
walking its opcodes to ``STOP`` (``pickletools.genops`` decodes, it never builds an object),
the experiment state by parsing it as JSON.
"""
from __future__ import annotations

import fnmatch
import io
import json
import pickletools

from orchestrator.storage import join_uri, list_dir, read_bytes

JSON_STATE = "experiment_state-*.json"
PICKLED_STATE = ("*.pkl", "*state-*.json")  # tuner.pkl, searcher-state-*.pkl, search_gen_state-*, basic-variant-state-*


def damaged_state_files(experiment: str) -> list[str]:
    """The URIs of the state files directly under ``experiment`` that are not whole (sorted)."""
    damaged = []
    for name in list_dir(experiment):
        uri = join_uri(experiment, name)
        if fnmatch.fnmatch(name, JSON_STATE):
            if not _whole_json(read_bytes(uri)):
                damaged.append(uri)
        elif any(fnmatch.fnmatch(name, pattern) for pattern in PICKLED_STATE):
            if not _whole_pickle(read_bytes(uri)):
                damaged.append(uri)
    return damaged


def _whole_json(data: bytes) -> bool:
    try:
        json.loads(data)
    except ValueError:
        return False
    return True


def _whole_pickle(data: bytes) -> bool:
    """True when ``data`` is one complete pickle: its opcodes decode up to ``STOP`` and nothing
    follows."""
    stream = io.BytesIO(data)
    try:
        last = None
        for opcode, _argument, _position in pickletools.genops(stream):
            last = opcode
    except ValueError:
        return False
    return last is not None and last.name == "STOP" and stream.tell() == len(data)
