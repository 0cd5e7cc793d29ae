"""YAML read within bounds: size, alias expansion, nesting and scalar length (``orchestrator.limits``).

``yaml.safe_load`` is safe from code execution but not from exhaustion: ten lines of nested aliases
(a "billion laughs") expand to 10^9 nodes in any code that walks the result, a document nested
50,000 levels deep ends in Python's recursion limit, a 10^6-digit integer takes seconds to convert.
``load`` composes the node graph with yaml's ``SafeLoader`` and, while composing, counts every
node with each alias counted as the whole node it stands for, the nesting depth through aliases,
the alias uses and each scalar's length; the first bound passed raises ``YAMLLimitError`` naming
where (field path and line) before any Python object is built. Only then is the graph constructed
(``SafeConstructor``, so the same types as ``yaml.safe_load``).

A node that contains an alias to itself (``&a [*a]``) would be infinite when expanded: refused.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from yaml.events import AliasEvent

from orchestrator import limits
from orchestrator.errors import UsageError


class YAMLLimitError(UsageError, yaml.YAMLError):
    """A document past one of the bounds.

    loc:     the field path where it was found (keys and list positions), () for the whole file.
    message: what was exceeded, with the bound.
    value:   the offending value as shown to the user (an alias, a count, a prefix of a scalar).
    line:    1-based line, or None.
    """

    def __init__(self, loc: tuple, message: str, value: str, line: int | None):
        self.loc, self.message, self.value, self.line = tuple(loc), message, value, line
        super().__init__(f"{message} (got {value})" + (f" [line {line}]" if line is not None else ""))


def read_text(path: str | Path) -> str:
    """The UTF-8 text of the file at ``path``, reading at most ``YAML_MAX_BYTES`` + 1 bytes.

    Raises ``YAMLLimitError`` for a larger file (nothing more is read), ``UnicodeDecodeError`` for
    bytes that are not UTF-8 and ``OSError`` (``FileNotFoundError``, ``IsADirectoryError``, ...)."""
    with open(os.fspath(path), "rb") as handle:
        data = handle.read(limits.YAML_MAX_BYTES + 1)
        size = os.fstat(handle.fileno()).st_size  # 0 for a device or pipe: then "more than"
    if len(data) > limits.YAML_MAX_BYTES:
        shown = f"{size} bytes" if size > limits.YAML_MAX_BYTES else f"more than {limits.YAML_MAX_BYTES} bytes"
        raise YAMLLimitError((), f"file larger than {limits.YAML_MAX_BYTES} bytes (limits.YAML_MAX_BYTES)", shown, None)
    return data.decode("utf-8")


def load(text: str) -> tuple[Any, yaml.Node | None]:
    """``(data, node graph)`` of one YAML document (``data`` as ``yaml.safe_load`` gives it; the
    graph carries line numbers). Raises ``YAMLLimitError`` past a bound, ``yaml.YAMLError`` for
    invalid YAML."""
    if len(text) > limits.YAML_MAX_BYTES:  # characters ≤ bytes: a shorter text may still pass
        raise YAMLLimitError((), f"text longer than {limits.YAML_MAX_BYTES} characters (limits.YAML_MAX_BYTES)",
                             str(len(text)), None)
    loader = _BoundedLoader(text)
    try:
        node = loader.get_single_node()
        return (None if node is None else loader.construct_document(node)), node
    except (ValueError, TypeError, OverflowError) as err:  # e.g. ``!!int abc``: yaml's own error, no traceback
        raise yaml.constructor.ConstructorError(None, None, f"a value cannot be built ({err})") from None
    finally:
        loader.dispose()


def load_value(text: str) -> Any:
    """The Python value of a short YAML text (e.g. a command-line ``--set`` value), bounded."""
    return load(text)[0]


class _BoundedLoader(yaml.SafeLoader):
    """``SafeLoader`` whose composer stops at the first bound passed (see the module docstring)."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._open: list[list[Any]] = []     # per node being composed: [path element, height below]
        self._seen: dict[int, tuple[int, int]] = {}  # id(node) → (expanded size, height), finished nodes
        self._nodes = 0
        self._aliases = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        element = _element(parent, index)
        if self.check_event(AliasEvent):
            return self._compose_alias(element)
        depth = len(self._open) + 1
        if depth > limits.YAML_MAX_DEPTH:
            self._fail(element, f"nesting deeper than {limits.YAML_MAX_DEPTH} levels (limits.YAML_MAX_DEPTH)",
                       f"depth {depth}")
        self._open.append([element, 0])
        before = self._nodes
        node = super().compose_node(parent, index)
        height = self._open[-1][1] + 1
        if isinstance(node, yaml.ScalarNode):
            self._check_scalar(node)
        self._open.pop()
        self._count(1, element, mark=node.start_mark)
        self._finish(node, self._nodes - before, height)
        return node

    def _compose_alias(self, element: Any) -> yaml.Node:
        event = self.peek_event()
        self._aliases += 1
        if self._aliases > limits.YAML_MAX_ALIASES:
            self._fail(element, f"more than {limits.YAML_MAX_ALIASES} aliases (limits.YAML_MAX_ALIASES)",
                       f"*{event.anchor}", event.start_mark)
        node = super().compose_node(None, None)  # the anchored node (or yaml's "undefined alias" error)
        if id(node) not in self._seen:
            self._fail(element, "an alias inside the node it refers to (an infinite document)",
                       f"*{event.anchor}", event.start_mark)
        size, height = self._seen[id(node)]
        if len(self._open) + height > limits.YAML_MAX_DEPTH:
            self._fail(element, f"alias nests the document deeper than {limits.YAML_MAX_DEPTH} levels "
                       "(limits.YAML_MAX_DEPTH)", f"*{event.anchor}", event.start_mark)
        self._count(size, element, f"*{event.anchor}", event.start_mark)
        if self._open:
            self._open[-1][1] = max(self._open[-1][1], height)
        return node

    def _finish(self, node: yaml.Node, size: int, height: int) -> None:
        self._seen[id(node)] = (size, height)
        if self._open:
            self._open[-1][1] = max(self._open[-1][1], height)

    def _count(self, nodes: int, element: Any, value: str | None = None, mark: Any = None) -> None:
        self._nodes += nodes
        if self._nodes > limits.YAML_MAX_NODES:
            self._fail(element, f"the document expands to more than {limits.YAML_MAX_NODES} nodes "
                       "(limits.YAML_MAX_NODES; an alias counts the nodes it stands for)",
                       value or f"{self._nodes} nodes", mark)

    def _check_scalar(self, node: yaml.ScalarNode) -> None:
        text = node.value
        if len(text) > limits.YAML_MAX_SCALAR_CHARS:
            self._fail(None, f"a value longer than {limits.YAML_MAX_SCALAR_CHARS} characters "
                       "(limits.YAML_MAX_SCALAR_CHARS)", f"{text[:20]!r}... ({len(text)} characters)", node.start_mark)
        if node.tag == "tag:yaml.org,2002:int" and sum(c.isdigit() for c in text) > limits.YAML_MAX_INT_DIGITS:
            self._fail(None, f"an integer of more than {limits.YAML_MAX_INT_DIGITS} digits (limits.YAML_MAX_INT_DIGITS)",
                       f"{text[:20]}... ({len(text)} characters)", node.start_mark)

    def _fail(self, element: Any, message: str, value: str, mark: Any = None) -> None:
        mark = mark or self.peek_event().start_mark
        loc = tuple(e for e, _ in self._open) + (() if element is None else (element,))
        raise YAMLLimitError(tuple(e for e in loc if e is not None), message, value, mark.line + 1)


def _element(parent: yaml.Node | None, index: Any) -> Any:
    """The path element of a node composed under ``parent``: a key's text, a list position, None
    for the top level and for mapping keys themselves."""
    if isinstance(parent, yaml.SequenceNode):
        return index
    if isinstance(parent, yaml.MappingNode) and isinstance(index, yaml.ScalarNode):
        return index.value
    return None
