"""The one rule for configured names: each is a safe path component.

Pipeline, generation, gallery and sweep names become folders and file names under the storage
(``generations/<name>``, ``galleries/<name>/plans/<generation>.json``, ``tune/<name>``, ``runs/<name>``)
and keys of the lineage. A name is 1 to ``limits.NAME_MAX_LENGTH`` ASCII letters, digits, ``_``,
``-`` and ``.``, not starting with ``.``: so never ``.`` or ``..``, never a separator (``/``, ``\\``),
never absolute, hidden, empty, control characters or look-alike Unicode letters.
"""
from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

from orchestrator import limits

NAME_RULE = f"[A-Za-z0-9_-][A-Za-z0-9_.-]{{0,{limits.NAME_MAX_LENGTH - 1}}}"
_NAME = re.compile(NAME_RULE)
NAME_HELP = (f"1-{limits.NAME_MAX_LENGTH} characters of A-Z a-z 0-9 _ - and dots, not starting with a dot "
             "(it names a folder: no separators, no . or ..)")  # unquoted: the error then shows the value


def check_name(name: str) -> str:
    """``name`` if it follows the rule (module docstring); ValueError saying the rule otherwise."""
    if _NAME.fullmatch(name) is None:
        raise ValueError(f"not a valid name: {NAME_HELP}")
    return name


Name = Annotated[str, AfterValidator(check_name)]
"""A pydantic field type for a configured name (``name: Name``)."""
