"""Draw the package's architecture from its real import graph: ``docs/architecture.png``.

Every top-level part of ``orchestrator/`` (a subpackage or a module) is a box; an arrow A → B means
some module of A imports B (at module level or inside a function). Parts are stacked in layers:
a part sits one layer above the highest part it imports, so the bottom row imports no other part
and every arrow points down (parts that import each other share a layer). Parts with a module that
imports Ray are drawn orange: the figure shows at a glance that the science layers do not.

    python3 docs/make_architecture.py            # writes docs/architecture.png, prints the layers

``layers()`` and ``layer_text()`` are what docs/architecture.md lists (tests/docs checks it is
current).
"""
from __future__ import annotations

import argparse
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "orchestrator"
SKIPPED = {"__init__", "__main__"}


def parts() -> list[str]:
    """The package's top-level parts: folders of modules and modules (not ``__init__`` / ``__main__``)."""
    found = [p.name for p in PACKAGE.iterdir() if p.is_dir() and any(p.glob("*.py"))]  # namespace packages too
    found += [p.stem for p in PACKAGE.glob("*.py") if p.stem not in SKIPPED]
    return sorted(found)


def _files(part: str) -> list[Path]:
    folder = PACKAGE / part
    return sorted(folder.rglob("*.py")) if folder.is_dir() else [PACKAGE / f"{part}.py"]


def _imported(path: Path) -> set[str]:
    """Every absolute module name a file imports."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def import_graph() -> tuple[dict[str, set[str]], set[str]]:
    """``({part: parts it imports}, parts with a module importing Ray)``."""
    known = set(parts())
    edges: dict[str, set[str]] = {}
    ray_users = set()
    for part in known:
        imported = set().union(*(_imported(path) for path in _files(part)))
        edges[part] = {name.split(".")[1] for name in imported
                       if name.startswith("orchestrator.") and name.split(".")[1] in known} - {part}
        if any(name == "ray" or name.startswith("ray.") for name in imported):
            ray_users.add(part)
    return edges, ray_users


def layers(edges: dict[str, set[str]]) -> list[list[str]]:
    """Parts by layer, bottom first: one above the highest part imported (cycles share a layer)."""
    reach = {part: _reachable(edges, part) for part in edges}
    level: dict[str, int] = {}

    def depth(part: str) -> int:
        if part not in level:
            below = [dep for dep in edges[part] if part not in reach[dep]]  # not in a cycle with part
            level[part] = 1 + max((depth(dep) for dep in below), default=-1)
            for other in edges:  # the rest of its cycle sits with it
                if other != part and other in reach[part] and part in reach[other]:
                    level[other] = level[part]
        return level[part]

    for part in sorted(edges):
        depth(part)
    rows: list[list[str]] = [[] for _ in range(max(level.values()) + 1)]
    for part in sorted(edges):
        rows[level[part]].append(part)
    return rows


def _reachable(edges: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), list(edges[start])
    while todo:
        part = todo.pop()
        if part not in seen:
            seen.add(part)
            todo.extend(edges[part])
    return seen


def layer_text(edges: dict[str, set[str]] | None = None, ray_users: set[str] | None = None) -> str:
    """The layers as Markdown lines, top first (Ray users marked), as docs/architecture.md lists
    them; of ``import_graph()`` unless a graph is given."""
    if edges is None or ray_users is None:
        edges, ray_users = import_graph()
    rows = layers(edges)
    return "\n".join(f"- layer {number}: " + ", ".join(f"`{p}`" + (" (Ray)" if p in ray_users else "") for p in row)
                     for number, row in reversed(list(enumerate(rows))))


def reduced(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The edges not implied by a longer path (what the figure draws; the rest is clutter)."""
    reach = {part: _reachable(edges, part) for part in edges}
    return {part: {dep for dep in deps if not any(dep in reach[other] for other in deps - {dep} if part not in reach[other])}
            for part, deps in edges.items()}


def _positions(rows: list[list[str]], edges: dict[str, set[str]], width: int) -> dict[str, tuple[float, float]]:
    """x, y of every part: each row ordered by the mean x of what its parts import (fewer crossings)."""
    position: dict[str, tuple[float, float]] = {}
    for level, row in enumerate(rows):
        def mean_x(part: str) -> float:
            xs = [position[dep][0] for dep in edges[part] if dep in position]
            return sum(xs) / len(xs) if xs else width / 2
        ordered = sorted(row, key=lambda part: (mean_x(part), part))
        for i, part in enumerate(ordered):
            position[part] = ((i + 0.5) * width / len(row), level * 1.0)
    return position


def draw(output: Path = REPO / "docs" / "architecture.png") -> Path:
    """Render the layered graph to ``output`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    edges, ray_users = import_graph()
    rows = layers(edges)
    width = max(len(row) for row in rows) + 1
    position = _positions(rows, edges, width)
    figure, axes = plt.subplots(figsize=(9.5, 0.62 * len(rows) + 1.4))
    for part, deps in reduced(edges).items():
        for dep in deps:
            (x0, y0), (x1, y1) = position[part], position[dep]
            axes.annotate("", xy=(x1, y1 + 0.2), xytext=(x0, y0 - 0.2),
                          arrowprops={"arrowstyle": "->", "color": "#718096", "lw": 0.8, "alpha": 0.8})
    for part, (x, y) in position.items():
        colour = "#f6ad55" if part in ray_users else "#90cdf4"
        axes.text(x, y, part, ha="center", va="center", fontsize=9,
                  bbox={"boxstyle": "round,pad=0.35", "facecolor": colour, "edgecolor": "#2d3748"})
    for level in range(len(rows)):
        axes.text(-0.3, level, f"layer {level}", ha="right", va="center", fontsize=8, color="#4a5568")
    axes.set_xlim(-1.3, width + 0.1)
    axes.set_ylim(-0.6, len(rows) - 0.4)
    axes.axis("off")
    axes.set_title("orchestrator's parts by import layer (generated by docs/make_architecture.py)\n"
                   "arrow: imports (implied ones left out); orange: imports Ray itself; blue: does not",
                   fontsize=9)
    figure.tight_layout()
    figure.savefig(output, dpi=110)
    plt.close(figure)
    return output


if __name__ == "__main__":  # pragma: no cover
    parser = argparse.ArgumentParser(description="Draw the package's import layers and print them for docs/architecture.md.")
    parser.add_argument("output", nargs="?", type=Path, default=REPO / "docs" / "architecture.png",
                        help="the figure to write (default: docs/architecture.png)")
    path = draw(parser.parse_args().output)
    print(layer_text())
    print(f"wrote {path}")
