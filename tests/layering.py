"""The project's layering, read from its imports with ast (nothing is imported or started):
the scanner and the five rules tests/test_layers.py holds the tree to.

Five rules: no import cycles among the project's modules; no module takes another module's
private name; trainers/ know only the runtime contract of launcher/ (launcher.runtime); no module
over 400 lines; launcher/ is not one flat folder. Each rule is checked against the real tree, and
against small synthetic trees to prove that it can fail (and does not fire on what it allows).
"""

from __future__ import annotations

import ast
import functools
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Union

PROJECT_ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("launcher", "trainers", "cluster")
# The name each folder installs as (setup.cfg's package_dir): only `launcher` is a top-level name.
INSTALLED_AS = {"launcher": "launcher", "trainers": "launcher.trainers", "cluster": "launcher.cluster"}
TRAINERS = INSTALLED_AS["trainers"]
# The only part of launcher/ that a training script may know (the torchrun-style environment
# contract); everything else in launcher/ is the launcher's own business.
TRAINER_CONTRACT = "launcher.runtime"
MAX_MODULE_LINES = 400
MAX_FLAT_LAUNCHER_MODULES = 15

ImportNode = Union[ast.Import, ast.ImportFrom]


@dataclass(frozen=True)
class Edge:
    """One module importing another at `line`. `implied` marks a parent package that the import
    runs without naming it: ``import a.b.c`` executes a/__init__.py and a/b/__init__.py first."""

    source: str
    target: str
    line: int
    implied: bool = False


@dataclass(frozen=True)
class PrivateUse:
    """`source` takes the private `name` that belongs to the project module `owner`."""

    source: str
    name: str
    owner: str
    line: int
    how: str  # "imports" (from owner import _name) or "uses" (owner._name on an imported module)


@dataclass(frozen=True)
class ProjectImports:
    """Everything the rules need, parsed once per tree: modules, import edges, private uses."""

    root: Path
    modules: dict[str, Path]
    edges: tuple[Edge, ...]
    private_uses: tuple[PrivateUse, ...]


# ---------------------------------------------------------------- reading the tree


def find_modules(root: Path) -> dict[str, Path]:
    """Dotted name (as installed: trainers/train.py is launcher.trainers.train) -> file of every module
    in the project's packages. A package is named after its __init__.py, so that `import pkg` and
    `from pkg import name` land on the same node."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root / package).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join((INSTALLED_AS[package], *parts))] = path
    return modules


def is_type_checking_guard(node: ast.If) -> bool:
    """`if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`) never runs, so its imports cannot form a cycle."""
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node that can run, at any depth. Imports inside functions count: a cycle that holds
    only because its imports are deferred is still a cycle, it just fails later. Strings handed
    to importlib are data (a dispatch table), not import statements, so they never show up here."""
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        yield node
        if isinstance(node, ast.If) and is_type_checking_guard(node):
            pending.append(node.test)
            pending.extend(node.orelse)
        else:
            pending.extend(ast.iter_child_nodes(node))


def package_of(module: str, path: Path) -> str:
    """The package a relative import starts from: the module itself when it is an __init__.py."""
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def absolute_base(node: ast.ImportFrom, package: str) -> str:
    """The absolute module a `from ... import` reads from: `from ..x import y` in a.b.c -> a.x."""
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def project_module(name: str, modules: dict[str, Path]) -> str | None:
    """The project module a dotted name lands in (its longest prefix that is one), or None for
    anything outside the project (torch, os, ...)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def parent_packages(module: str) -> list[str]:
    """a.b.c -> [a, a.b]: the __init__ files Python runs before a.b.c itself."""
    parts = module.split(".")
    return [".".join(parts[:end]) for end in range(1, len(parts))]


def imported_targets(node: ImportNode, package: str, modules: dict[str, Path]) -> Iterator[tuple[str, str]]:
    """(imported name, project module it lands in) for each name of one import statement.
    `from pkg import name` imports the submodule pkg.name when there is one, else pkg itself."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            target = project_module(alias.name, modules)
            if target:
                yield alias.name, target
        return
    base = absolute_base(node, package)
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        target = submodule if submodule in modules else project_module(base, modules)
        if target:
            yield alias.name, target


def edges_of(module: str, node: ImportNode, package: str, modules: dict[str, Path]) -> Iterator[Edge]:
    """The edges one import statement adds: the module it names and that module's parent packages
    (their __init__ code runs too). A parent package of the importing module itself is left out:
    Python has already started it before this module's code runs, so that edge orders nothing."""
    own_parents = set(parent_packages(module))
    for _, target in imported_targets(node, package, modules):
        if target != module:
            yield Edge(module, target, node.lineno)
        for parent in parent_packages(target):
            if parent in modules and parent != module and parent not in own_parents:
                yield Edge(module, parent, node.lineno, implied=True)


def is_private(name: str) -> bool:
    """`_name` is private to its module; `__name__`-style dunders are not."""
    return name.startswith("_") and not name.startswith("__")


def private_imports_of(module: str, node: ImportNode, package: str,
                       modules: dict[str, Path]) -> Iterator[PrivateUse]:
    """`from owner import _name` where owner is another project module. A private *submodule* is
    a module, not a name, so it is an import edge and not reported here."""
    if not isinstance(node, ast.ImportFrom):
        return
    for name, owner in imported_targets(node, package, modules):
        if is_private(name) and owner != module and f"{absolute_base(node, package)}.{name}" not in modules:
            yield PrivateUse(module, name, owner, node.lineno, "imports")


def module_aliases(module: str, imports: list[ImportNode], package: str,
                   modules: dict[str, Path]) -> dict[str, str]:
    """Local name -> project module it is bound to (`import a.b as m`, `from a import b`,
    `import a.b` binds `a`), so that `m._name` can be traced to its owner."""
    aliases = {}
    for node in imports:
        for alias in node.names:
            if isinstance(node, ast.Import) and alias.asname:
                bound, target = alias.asname, alias.name
            elif isinstance(node, ast.Import):
                bound = target = alias.name.split(".")[0]  # `import a.b` binds a; a.b._x reads through it
            else:
                bound, target = alias.asname or alias.name, f"{absolute_base(node, package)}.{alias.name}"
            if target in modules and target != module:
                aliases[bound] = target
    return aliases


def dotted_chain(node: ast.Attribute) -> list[str] | None:
    """`a.b._c` -> [a, b, _c]; None when the chain does not start at a plain name."""
    chain = [node.attr]
    value = node.value
    while isinstance(value, ast.Attribute):
        chain.append(value.attr)
        value = value.value
    if not isinstance(value, ast.Name):
        return None
    chain.append(value.id)
    return chain[::-1]


def private_attribute_uses(module: str, attributes: list[ast.Attribute], aliases: dict[str, str],
                           modules: dict[str, Path]) -> Iterator[PrivateUse]:
    """`run._finish(...)` on an imported project module takes its private name just as
    `from launcher.run import _finish` does."""
    for node in attributes:
        chain = dotted_chain(node)
        if not chain or chain[0] not in aliases:
            continue
        owner = ".".join([aliases[chain[0]], *chain[1:-1]])
        if owner in modules and owner != module:
            yield PrivateUse(module, node.attr, owner, node.lineno, "uses")


@functools.lru_cache(maxsize=None)
def scan_project(root: Path) -> ProjectImports:
    """Parse every module of the tree once; all five rules read the result."""
    modules = find_modules(root)
    edges: list[Edge] = []
    private: list[PrivateUse] = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        package = package_of(module, path)
        nodes = list(runtime_nodes(tree))
        imports = [node for node in nodes if isinstance(node, (ast.Import, ast.ImportFrom))]
        private_attributes = [node for node in nodes if isinstance(node, ast.Attribute) and is_private(node.attr)]
        for node in imports:
            edges.extend(edges_of(module, node, package, modules))
            private.extend(private_imports_of(module, node, package, modules))
        aliases = module_aliases(module, imports, package, modules)
        private.extend(private_attribute_uses(module, private_attributes, aliases, modules))
    return ProjectImports(root, modules, tuple(edges), tuple(private))


# ---------------------------------------------------------------- rule 1: import cycles


def import_graph(edges: tuple[Edge, ...]) -> dict[str, set[str]]:
    """Module -> the modules it imports, explicit and implied alike (both execute code)."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.source, set()).add(edge.target)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's components with more than one module: each is a knot of mutually reachable
    modules, i.e. at least one import cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def shortest_path(graph: dict[str, set[str]], start: str, goal: str, allowed: set[str]) -> list[str]:
    """Breadth-first path start .. goal inside one component (one always exists there)."""
    came_from = {start: start}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        if node == goal:
            break
        for nxt in sorted(graph.get(node, ()) & allowed):
            if nxt not in came_from:
                came_from[nxt] = node
                queue.append(nxt)
    path = [goal]
    while path[-1] != start:
        path.append(came_from[path[-1]])
    return path[::-1]


def canonical(cycle: list[str]) -> tuple[str, ...]:
    """Rotate a cycle to start at its smallest module, so one cycle is printed once."""
    first = cycle.index(min(cycle))
    return tuple(cycle[first:] + cycle[:first])


def cycles_covering(graph: dict[str, set[str]], component: set[str]) -> list[tuple[str, ...]]:
    """A component can hold very many cycles; print the shortest cycle through each of its
    imports instead, so every import that has to go appears in at least one printed cycle."""
    found = set()
    for source in sorted(component):
        for target in sorted(graph[source] & component):
            found.add(canonical([source] + shortest_path(graph, target, source, component)[:-1]))
    return sorted(found, key=lambda cycle: (len(cycle), cycle))


def import_cycles(root: Path) -> list[str]:
    """Rule 1: each cycle as `a -> b -> c -> a`, then the import lines that close them, so the
    refactor knows which statements to move."""
    project = scan_project(root)
    graph = import_graph(project.edges)
    components = strongly_connected(graph)
    report = [" -> ".join(cycle + cycle[:1]) for component in components
              for cycle in cycles_covering(graph, component)]
    component_of = {module: i for i, component in enumerate(components) for module in component}
    knotted = [edge for edge in first_edges(project.edges)
               if component_of.get(edge.source, -1) == component_of.get(edge.target, -2)]
    if knotted:
        report.append("the imports inside those cycles:")
        report.extend(f"  {edge.source} -> {edge.target}  ({where(project, edge)}"
                      + (", its parent package runs)" if edge.implied else ")") for edge in knotted)
    return report


def first_edges(edges: tuple[Edge, ...]) -> list[Edge]:
    """One edge per (source, target): the first line that makes it, explicit before implied."""
    best: dict[tuple[str, str], Edge] = {}
    for edge in sorted(edges, key=lambda e: (e.implied, e.line)):
        best.setdefault((edge.source, edge.target), edge)
    return sorted(best.values(), key=lambda e: (e.source, e.target))


def where(project: ProjectImports, edge: Edge) -> str:
    """`launcher/cli.py:12`, relative to the project root."""
    return f"{project.modules[edge.source].relative_to(project.root)}:{edge.line}"


# ---------------------------------------------------------------- rules 2 to 5


def private_imports(root: Path) -> list[str]:
    """Rule 2: another module's `_name` is its implementation; taking it couples to that."""
    return sorted({f"{use.source} {use.how} {use.name} from {use.owner} (line {use.line})"
                   for use in scan_project(root).private_uses})


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def outside_trainer_contract(module: str) -> bool:
    """launcher and launcher.* other than launcher.runtime(.*) and the trainers themselves."""
    return within(module, "launcher") and not within(module, TRAINER_CONTRACT) and not within(module, TRAINERS)


def trainer_imports_outside_contract(root: Path) -> list[str]:
    """Rule 3: trainers/ run under any launcher (torchrun too), so they import only the runtime
    contract. The implied launcher/__init__ of `import launcher.runtime` is allowed."""
    return sorted({f"{edge.source} imports {edge.target} (line {edge.line})"
                   for edge in scan_project(root).edges
                   if within(edge.source, TRAINERS) and not edge.implied
                   and outside_trainer_contract(edge.target)})


def oversized_modules(root: Path) -> list[str]:
    """Rule 4: a module over 400 lines owns more than one thing."""
    report = []
    for path in scan_project(root).modules.values():
        count = len(path.read_text(encoding="utf-8").splitlines())
        if count > MAX_MODULE_LINES:
            report.append(f"{path.relative_to(root)} has {count} lines (limit {MAX_MODULE_LINES})")
    return sorted(report)


def flat_launcher_modules(root: Path) -> list[str]:
    """Rule 5: more than 15 files directly in launcher/ means no subpackage says what owns what."""
    flat = sorted(path.name for path in (root / "launcher").glob("*.py"))
    if len(flat) <= MAX_FLAT_LAUNCHER_MODULES:
        return []
    return [f"launcher/ holds {len(flat)} modules directly (limit {MAX_FLAT_LAUNCHER_MODULES}; "
            f"group them into subpackages): {', '.join(flat)}"]
