"""An AST import graph of one package, its cycles and its layer violations.

Every ``import`` statement counts, wherever it stands (a function body, a ``try``, ``if TYPE_CHECKING``): an
import hidden in a function still makes the two modules depend on each other. ``from pkg import x`` is an edge
to ``pkg`` (its ``__init__`` runs) and, when ``pkg.x`` is a module, to ``pkg.x`` as well. Importing
``pkg.sub.mod`` from outside ``pkg.sub`` runs ``pkg/sub/__init__.py`` first, so that is an edge to ``pkg.sub``
too; a module inside the package does not get it (its package is already being imported).

Example:
    >>> graph = {"p.a": {"p.b"}, "p.b": {"p.a"}, "p.c": {"p.a"}}
    >>> cycles(graph)
    [['p.a', 'p.b']]
    >>> layer_violations(graph, {"a": 0, "b": 1, "c": 1}, "p")
    [('p.a', 'p.b')]
"""

from __future__ import annotations

import ast
from pathlib import Path


def module_names(root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file for every ``.py`` file of ``root/package`` (packages by their own name)."""
    found = {}
    for file in sorted((root / package).rglob("*.py")):
        parts = file.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = file
    return found


def _targets(node: ast.AST, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:  # relative: resolve against the importing module's package
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - node.level + 1]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    return [source] + [f"{source}.{alias.name}" for alias in node.names]


def import_graph(root: str | Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports anywhere in its file."""
    modules = module_names(Path(root), package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, file in modules.items():
        tree = ast.parse(file.read_text(encoding="utf-8"), str(file))
        for node in ast.walk(tree):
            for target in _targets(node, name, file.name == "__init__.py"):
                while target and target not in modules:  # ``pkg.mod.attr`` -> ``pkg.mod``
                    target = target.rpartition(".")[0]
                if not target or target == name or not (target + ".").startswith(package + "."):
                    continue
                graph[name].add(target)
                parent = target.rpartition(".")[0]
                while parent and not (name + ".").startswith(parent + "."):  # packages the importer is outside of
                    graph[name].add(parent)
                    parent = parent.rpartition(".")[0]
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, each sorted, in sorted order (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        # Iterative depth-first search: each frame is (node, iterator over its remaining successors).
        frames = [(node, iter(sorted(graph.get(node, ()))))]
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        while frames:
            current, successors = frames[-1]
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    frames.append((succ, iter(sorted(graph.get(succ, ())))))
                    break
                if succ in on_stack:
                    low[current] = min(low[current], index[succ])
            else:
                frames.pop()
                if frames:
                    parent = frames[-1][0]
                    low[parent] = min(low[parent], low[current])
                if low[current] == index[current]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == current:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def component(module: str, package: str) -> str:
    """The top-level part of ``package`` a module belongs to: ``lmforge.models.stack`` -> ``models``
    (``""`` for the package itself)."""
    rest = module[len(package) + 1:] if module != package else ""
    return rest.split(".")[0]


def layer_of(module: str, layers: dict[str, int], package: str) -> int:
    """The layer of the most specific key of ``layers`` that names ``module`` or a package holding it: a key
    such as ``"data.sources"`` places one module apart from its package (``"data"``)."""
    rest = module[len(package) + 1:] if module != package else ""
    parts = rest.split(".") if rest else []
    for n in range(len(parts), 1, -1):
        if ".".join(parts[:n]) in layers:
            return layers[".".join(parts[:n])]
    return layers[component(module, package)]


def layer_violations(graph: dict[str, set[str]], layers: dict[str, int], package: str) -> list[tuple[str, str]]:
    """(importer, imported) pairs where a module imports from a higher layer than its own, sorted.

    ``layers`` maps each top-level part (see :func:`component`) to its layer number, lowest first, and may
    place single modules apart (see :func:`layer_of`); a part it does not name is a :class:`KeyError`, so a
    new package has to be placed before the check passes. A package ``__init__`` that imports nothing above
    the ground floor (its names resolve lazily) pulls no higher layer in, so running it is no dependency on
    its layer.
    """
    packages = {name.rpartition(".")[0] for name in graph}
    lazy = {p for p in packages if p in graph and all(layer_of(t, layers, package) == 0 for t in graph[p])}
    return sorted(
        (src, dst)
        for src, targets in graph.items()
        for dst in targets
        if dst not in lazy and layer_of(dst, layers, package) > layer_of(src, layers, package)
    )
