"""The import graph of rocketray's own modules, read with ``ast`` (nothing is imported or run).

Every ``import`` and ``from ... import`` statement counts, wherever it stands: at module level, inside
a function, under ``if TYPE_CHECKING:`` or in a ``try``. A type-only import is still a dependency of
the design (the module cannot be understood without the other one), and an import hidden in a
function is still an arrow. ``from __future__`` is not a module of ours and is skipped, and so is
everything outside rocketray. ``importlib.import_module`` with a computed name is not seen.

Modules are named as installed: the folders of ``[tool.setuptools.package-dir]`` in pyproject.toml
map to their packages (``broker/x.py`` is ``rocketray.broker.x``). Scripts outside the package (the
benchmarks, the examples, ``driver.py``) are named by their path (``benchmarks.run``); a script's
top-level import of a sibling file (``import command_process``) resolves to that sibling.

``strongly_connected`` returns every import cycle as one component (Tarjan's algorithm), so a
circle through three files is reported as well as one through two.
"""

from __future__ import annotations

import ast
import tomllib
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Import:
    """One arrow: ``source`` imports ``target`` (a module of ours) at ``line``; ``names`` are the
    names a ``from`` import takes out of ``target`` (empty for ``import target``)."""

    source: str
    target: str
    line: int
    names: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Module:
    name: str
    path: Path
    is_package: bool


def package_dirs(root: Path) -> dict[str, Path]:
    """Package name -> folder, from pyproject.toml's ``[tool.setuptools.package-dir]``."""
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    mapping = pyproject["tool"]["setuptools"]["package-dir"]
    return {package: root / folder for package, folder in mapping.items()}


def product_modules(root: Path) -> dict[str, Module]:
    """Every module of the installed package, by dotted name; a C extension by its stub (``.pyi``).

    A folder's subpackages (a subfolder with an ``__init__.py``, such as ``cli/commands``) belong to
    its package: ``cli/commands/admin.py`` is ``rocketray.cli.commands.admin``."""
    modules: dict[str, Module] = {}
    for package, folder in package_dirs(root).items():
        for path in sorted(folder.rglob("*.py")) + sorted(folder.rglob("*.pyi")):
            parts = path.relative_to(folder).parent.parts
            if not all((folder.joinpath(*parts[:i + 1]) / "__init__.py").is_file() for i in range(len(parts))):
                continue
            inner = ".".join((package, *parts))
            is_package = path.name == "__init__.py"
            name = inner if is_package else f"{inner}.{path.stem}"
            modules.setdefault(name, Module(name, path, is_package))
    return modules


def script_modules(root: Path, folders: tuple[str, ...], files: tuple[str, ...]) -> dict[str, Module]:
    """Scripts outside the package: every ``*.py`` of ``folders`` and the single ``files``."""
    paths = [p for folder in folders for p in sorted((root / folder).glob("*.py"))]
    paths += [root / f for f in files]
    modules = {}
    for path in paths:
        name = ".".join(path.relative_to(root).with_suffix("").parts)
        modules[name] = Module(name, path, False)
    return modules


def _resolve(modules: dict[str, Module], name: str) -> str | None:
    """The module of ours that ``name`` (a module or a name inside one) lives in, or None."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _base(module: Module, node: ast.ImportFrom) -> str:
    """The absolute module a ``from`` statement names (relative imports resolved against ``module``)."""
    if not node.level:
        return node.module or ""
    parts = module.name.split(".")
    if not module.is_package:
        parts = parts[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def _sibling(module: Module, modules: dict[str, Module], name: str) -> str:
    """A script's top-level import of a file beside it, by the sibling's full name; else ``name``."""
    if module.name.startswith("rocketray") or "." not in module.name:
        return name
    sibling = f"{module.name.rpartition('.')[0]}.{name}"
    return sibling if _resolve(modules, sibling) else name


def imports_of(module: Module, modules: dict[str, Module]) -> list[Import]:
    """Every arrow out of ``module`` into another module of ``modules``, in source order."""
    tree = ast.parse(module.path.read_text(), filename=str(module.path))
    found: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(modules, _sibling(module, modules, alias.name))
                if target is not None and target != module.name:
                    found.append(Import(module.name, target, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            base = _base(module, node)
            if base == "__future__":
                continue
            base = _sibling(module, modules, base)
            by_target: dict[str, list[str]] = {}
            for alias in node.names:
                # "from pkg import mod" imports the module pkg.mod; "from mod import name" a name of mod
                submodule = f"{base}.{alias.name}"
                if submodule in modules:
                    by_target.setdefault(submodule, [])
                    continue
                target = _resolve(modules, base)
                if target is not None:
                    by_target.setdefault(target, []).append(alias.name)
            for target, names in by_target.items():
                if target != module.name:
                    found.append(Import(module.name, target, node.lineno, tuple(names)))
    found.sort(key=lambda i: i.line)
    return found


def graph(modules: dict[str, Module]) -> list[Import]:
    """Every arrow between ``modules``."""
    return [arrow for module in modules.values() for arrow in imports_of(module, modules)]


def strongly_connected(nodes: list[str], arrows: list[Import]) -> list[list[str]]:
    """The strongly connected components of more than one module (each sorted), sorted: every
    import cycle. Iterative Tarjan, so a long chain does not hit the recursion limit."""
    out: dict[str, list[str]] = {n: [] for n in nodes}
    for arrow in arrows:
        out[arrow.source].append(arrow.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in nodes:
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if i < len(out[node]):
                work.append((node, i + 1))
                nxt = out[node][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components)


def is_private(name: str) -> bool:
    """A name another module should not take: one leading underscore, not a dunder."""
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))
