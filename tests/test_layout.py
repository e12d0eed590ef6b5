"""The house rules of docs/architecture.md, checked on the source tree (static: the files are parsed, not run).

- no module over 400 lines, except the numba kernels (``_kernels.py``);
- module-level imports of seqpack modules point to the same or a lower floor, and form no cycle;
- the library never imports the measurement package ``seqpack_bench``;
- an import of a seqpack module inside a function only defers a heavy third-party package (the imported
  module, or one it imports at module level, imports torch, transformers, pyarrow, ...).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
MAX_LINES = 400
HEAVY = {"torch", "transformers", "pyarrow", "datasets", "ray", "matplotlib", "tokenizers", "PIL"}

#: seqpack's floors, bottom (0) to top (10): docs/architecture.md.
FLOORS = {
    "sample": 0, "accounting": 0, "padding": 0, "_torch": 0, "algorithms": 1, "packed": 2, "data": 3, "io": 4, "pipeline": 5,
    "stream": 6, "adapters": 7, "collate": 8, "hf": 8, "loss": 8, "moe": 8, "mtp": 8, "parallel": 8, "interop": 8,
    "config": 9, "cli": 10, "__main__": 10,
}


def _modules() -> dict[str, Path]:
    out = {}
    for p in SRC.rglob("*.py"):
        parts = list(p.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _owner(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _targets(node: ast.AST, module: str, is_pkg: bool) -> list[str]:
    """The modules an import statement loads (``from pkg import submodule`` -> the submodule only)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    assert isinstance(node, ast.ImportFrom)
    base = node.module or ""
    if node.level:
        pkg = module if is_pkg else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            pkg = pkg.rpartition(".")[0]
        base = f"{pkg}.{base}" if base else pkg
    subs = [f"{base}.{a.name}" for a in node.names]
    if all(s in MODULES for s in subs):
        return subs
    return [base]


def _scan():
    """(module-level seqpack deps, heavy third-party at module level, function-level seqpack imports)."""
    deps: dict[str, set[str]] = {}
    heavy: set[str] = set()
    inner: list[tuple[str, str, list[str]]] = []
    for mod, path in MODULES.items():
        deps[mod] = set()
        tree = ast.parse(path.read_text(), str(path))

        def visit(node: ast.AST, in_function: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    visit(child, True)
                elif isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                    continue
                elif isinstance(child, (ast.Import, ast.ImportFrom)):
                    names = _targets(child, mod, path.name == "__init__.py")
                    if not in_function and any(n.split(".")[0] in HEAVY for n in names):
                        heavy.add(mod)
                    ours = [o for n in names if n.split(".")[0] in ("seqpack", "seqpack_bench") and (o := _owner(n))]
                    if in_function and ours:
                        inner.append((f"{path.relative_to(SRC)}:{child.lineno}", ast.unparse(child), ours))
                    elif not in_function:
                        deps[mod].update(o for o in ours if o != mod)
                else:
                    visit(child, in_function)

        visit(tree, False)
    return deps, heavy, inner


DEPS, HEAVY_AT_IMPORT, FUNCTION_IMPORTS = _scan()


def _pulls_heavy(mod: str, seen: set[str] | None = None) -> bool:
    seen = set() if seen is None else seen
    if mod in seen:
        return False
    seen.add(mod)
    return mod in HEAVY_AT_IMPORT or any(_pulls_heavy(d, seen) for d in DEPS.get(mod, ()))


def _floor(mod: str) -> int | None:
    parts = mod.split(".")
    if parts[0] != "seqpack":
        return None
    return 11 if len(parts) == 1 else FLOORS.get(parts[1])


def test_no_module_over_400_lines_except_kernels():
    big = {str(p.relative_to(SRC)): n for p in MODULES.values()
           if (n := p.read_text().count("\n")) > MAX_LINES and p.name != "_kernels.py"}
    assert big == {}


def test_every_library_module_has_a_floor():
    assert [m for m in MODULES if m.startswith("seqpack.") and _floor(m) is None] == []


def test_imports_point_downward():
    up = [f"{m} -> {d}" for m, ds in DEPS.items() for d in ds
          if _floor(m) is not None and _floor(d) is not None and _floor(d) > _floor(m) and _floor(d) != 11]
    assert up == []


def test_no_import_cycles():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def strong(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in DEPS.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in DEPS:
        if v not in index:
            strong(v)
    assert cycles == []


def test_the_library_never_imports_seqpack_bench():
    assert [m for m, ds in DEPS.items() if not m.startswith("seqpack_bench") for d in ds
            if d.startswith("seqpack_bench")] == []
    assert [where for where, _, ours in FUNCTION_IMPORTS if not where.startswith("seqpack_bench")
            and any(o.startswith("seqpack_bench") for o in ours)] == []


def test_function_level_imports_only_defer_heavy_packages():
    light = [f"{where}: {stmt}" for where, stmt, ours in FUNCTION_IMPORTS if not any(_pulls_heavy(o) for o in ours)]
    assert light == []


@pytest.mark.parametrize("bad", ["seqpack.packed", "seqpack.algorithms.core"])
def test_the_checks_see_real_edges(bad):
    # the scan must find the ordinary downward imports, or every check above would pass vacuously
    assert DEPS[bad] and all(_floor(d) <= _floor(bad) for d in DEPS[bad])
