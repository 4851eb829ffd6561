"""The package's import graph stays a contract: no cycles, no private names across modules.

Walks every module's AST.  Every import counts, also one inside a function (it still runs, and it
still ties the two modules together); only imports under ``if TYPE_CHECKING:`` are left out, since
they never run.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import seqloader

ROOT = Path(seqloader.__file__).resolve().parent
PACKAGE = "seqloader"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Yield (node, ...) for every import node that runs (skips ``if TYPE_CHECKING:`` bodies)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def _resolve(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


@functools.lru_cache(maxsize=1)  # (the tree does not change during a run; no test mutates it)
def _graph():
    """(edges, private) where edges maps a module to the package modules it imports and private
    lists (importer, imported module, name) for every ``_name`` taken from another module."""
    modules = _modules()
    edges: dict[str, set[str]] = {m: set() for m in modules}
    private: list[tuple[str, str, str]] = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in _imports(tree):
            if isinstance(node, ast.Import):
                targets = [(a.name, None) for a in node.names]
            else:
                base = _resolve(module, path, node)
                targets = []
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in modules:  # `from pkg import submodule`
                        targets.append((sub, None))
                    else:
                        targets.append((base, alias.name))
            for target, name in targets:
                if not (target == PACKAGE or target.startswith(PACKAGE + ".")):
                    continue
                # importing a.b.c runs a and a.b too; the edge that matters is the module named
                if target in modules and target != module:
                    edges[module].add(target)
                if name and name.startswith("_") and not name.startswith("__") and target != module:
                    private.append((module, target, name))
        private += _private_attributes(module, path, tree, modules)
    return edges, private


def _private_attributes(module: str, path: Path, tree: ast.AST, modules) -> list:
    """``mod._name`` where ``mod`` names another module of the package."""
    aliases: dict[str, str] = {}
    for node in _imports(tree):
        if isinstance(node, ast.ImportFrom):
            base = _resolve(module, path, node)
            aliases.update({a.asname or a.name: f"{base}.{a.name}" for a in node.names
                            if f"{base}.{a.name}" in modules})
        else:
            aliases.update({a.asname: a.name for a in node.names
                            if a.asname and a.name in modules})
    return [(module, aliases[n.value.id], n.attr) for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
            and n.value.id in aliases and aliases[n.value.id] != module
            and n.attr.startswith("_") and not n.attr.startswith("__")]


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    edges, _ = _graph()
    cycles = _cycles(edges)
    assert not cycles, "import cycles (imports inside functions count):\n" + "\n".join(
        " <-> ".join(c) for c in cycles)


def test_no_private_names_across_modules():
    _, private = _graph()
    assert not private, "modules import another module's _private names:\n" + "\n".join(
        f"{a} imports {n} from {b}" for a, b, n in private)


def test_no_two_modules_share_a_file_name():
    seen: dict[str, list[str]] = {}
    for module, path in _modules().items():
        if path.name in ("__init__.py", "__main__.py"):
            continue
        seen.setdefault(path.name, []).append(module)
    dups = {k: v for k, v in seen.items() if len(v) > 1}
    assert not dups, f"module file names used twice: {dups}"


def _bound_names(stmts) -> set[str]:
    """Names a module's top level binds (also inside ``try``/``if``)."""
    out: set[str] = set()
    for node in stmts:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                out.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Try):
            out |= _bound_names(node.body + node.orelse + node.finalbody)
            for h in node.handlers:
                out |= _bound_names(h.body)
        elif isinstance(node, ast.If):
            out |= _bound_names(node.body + node.orelse)
    return out


def test_all_names_exist():
    """``__all__`` says what a module exports; every name in it is defined there (a module
    with ``__getattr__`` may define some lazily)."""
    bad = []
    for module, path in _modules().items():
        tree = ast.parse(path.read_text(), str(path))
        defined = _bound_names(tree.body)
        declared = next((node.value for node in tree.body if isinstance(node, ast.Assign)
                         and any(isinstance(t, ast.Name) and t.id == "__all__"
                                 for t in node.targets)), None)
        if declared is None or "__getattr__" in defined:
            continue
        missing = [e.value for e in declared.elts if e.value not in defined]
        if missing:
            bad.append(f"{module}: {missing}")
    assert not bad, f"__all__ names not defined: {bad}"


# The layers, bottom up (docs/how-it-works.md): a module imports its own layer or those below.
LAYERS = [
    ("seqloader.errors", "seqloader.version", "seqloader.progress"),
    ("seqloader.format",),
    ("seqloader.workers",),  # the worker-process plumbing: serves dataflow, write and tools
    ("seqloader.read", "seqloader.transforms"),
    ("seqloader.dataflow", "seqloader.settings", "seqloader.resume"),
    ("seqloader.write", "seqloader.trainers", "seqloader.measured"),
    ("seqloader.loader",),
    ("seqloader",),  # the package's top level: its explicit re-exports
    ("seqloader.tools",),
    ("seqloader.cli", "seqloader.__main__"),
]


def _layer(module: str) -> int:
    best, level = -1, None
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, level = len(p), i
    assert level is not None, f"{module} is in no layer: add it to LAYERS"
    return level


def test_no_import_runs_up_a_layer():
    """format -> read/transforms -> dataflow -> write -> loader -> tools -> cli: a lower layer
    never imports a higher one (not even inside a function)."""
    edges, _ = _graph()
    up = sorted((a, b) for a, targets in edges.items() for b in targets
                if _layer(b) > _layer(a))
    assert not up, "imports that run up a layer:\n" + "\n".join(f"{a} imports {b}" for a, b in up)


def _imported_by(importers: str, imported: str) -> list[tuple[str, str]]:
    edges, _ = _graph()
    return sorted((a, b) for a, targets in edges.items() for b in targets
                  if (a == importers or a.startswith(importers + "."))
                  and (b == imported or b.startswith(imported + ".")))


def test_write_imports_nothing_from_dataflow():
    """The writer's processes run on :mod:`seqloader.workers`, not on the Loader's stages."""
    bad = _imported_by("seqloader.write", "seqloader.dataflow")
    assert not bad, "write/ imports dataflow/:\n" + "\n".join(f"{a} imports {b}" for a, b in bad)


def test_workers_import_no_stage_writer_tool_or_loader():
    bad = [pair for upper in ("seqloader.dataflow", "seqloader.write", "seqloader.tools",
                              "seqloader.loader", "seqloader.read", "seqloader.transforms")
           for pair in _imported_by("seqloader.workers", upper)]
    assert not bad, "workers/ imports an upper layer:\n" + "\n".join(f"{a} imports {b}"
                                                                      for a, b in bad)
