"""seqloader.transforms' modules import in one direction (a DAG, no cycle): each one
imports alone, first, in a fresh interpreter, and loads only the modules below it."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "seqloader" / "transforms"

#: What each module may import from its siblings (directly); nothing may import the
#: package itself (``from . import X``), which would run __init__ and every module.
ALLOWED = {
    "rng": set(),
    "geometry": set(),
    "pilresize": set(),
    "resample": {"pilresize"},
    "jpegwindow": set(),
    "tensor": {"rng"},
    "ops": {"rng", "geometry", "resample", "jpegwindow"},
    "fused": {"rng", "geometry", "resample", "jpegwindow", "tensor"},
    "compile": {"rng", "geometry", "fused", "ops", "tensor"},
    "gpu": {"geometry", "ops"},
}

# Imports seqloader.transforms.<name> with stub packages for seqloader and
# seqloader.transforms (so neither __init__ runs), each time after dropping every
# seqloader module, and prints the transforms modules each import loaded.
_PROBE = """
import importlib, json, sys, types
root, names = sys.argv[1], sys.argv[2:]
loaded = {}
for name in names:
    for m in [m for m in sys.modules if m == "seqloader" or m.startswith("seqloader.")]:
        del sys.modules[m]
    for pkg, path in (("seqloader", root), ("seqloader.transforms", root + "/transforms")):
        mod = types.ModuleType(pkg)
        mod.__path__ = [path]
        sys.modules[pkg] = mod
    importlib.import_module("seqloader.transforms." + name)
    loaded[name] = sorted(m.rsplit(".", 1)[1] for m in sys.modules
                          if m.startswith("seqloader.transforms."))
print(json.dumps(loaded))
"""


def _closure(name: str) -> set[str]:
    out, todo = set(), [name]
    while todo:
        for dep in ALLOWED[todo.pop()] - out:
            out.add(dep)
            todo.append(dep)
    return out


def _sibling_imports(path: Path) -> set[str]:
    """The sibling modules ``path`` imports anywhere (top level or inside a function);
    ``"."`` for an import of the package itself."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module is None:
                found |= {"." if a.name not in ALLOWED else a.name for a in node.names}
            else:
                found.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (
                node.module or "").startswith("seqloader.transforms"):
            found.add(node.module.split(".")[2] if node.module.count(".") > 1 else ".")
    return found


def test_every_module_is_in_the_import_order():
    modules = {p.stem for p in PKG.glob("*.py")} - {"__init__"}
    assert modules == set(ALLOWED), "add new transforms modules to ALLOWED, in the DAG"


def test_modules_import_only_modules_below_them_even_inside_functions():
    for name in ALLOWED:
        got = _sibling_imports(PKG / f"{name}.py")
        assert got <= ALLOWED[name], f"transforms/{name}.py imports {sorted(got - ALLOWED[name])}"


def test_each_module_imports_alone_first_without_a_cycle():
    out = subprocess.run([sys.executable, "-c", _PROBE, str(REPO / "seqloader"), *ALLOWED],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout)
    for name in ALLOWED:
        assert set(loaded[name]) <= _closure(name) | {name}, (name, loaded[name])
