"""No import cycles among dvla's modules, counting imports inside functions; the model never
imports the simulator."""

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[2]


def project_modules() -> dict[str, Path]:
    """{dotted module name: file} for every package pyproject installs (its package-dir map)."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = setuptools["package-dir"]
    modules = {}
    for package in setuptools["packages"]:
        base = next(
            p for p in sorted(folders, key=len, reverse=True) if package == p or package.startswith(p + ".")
        )
        folder = ROOT / folders[base] / package[len(base) :].lstrip(".").replace(".", "/")
        for file in folder.glob("*.py"):
            name = package if file.stem == "__init__" else f"{package}.{file.stem}"
            modules[name] = file
    return modules


def imports_of(name: str, file: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules `file` imports anywhere (module level or inside functions)."""
    package = name if file.stem == "__init__" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {t for t in targets if t in modules and t != name}
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it names in an import (a package's `__init__` counts as a
    module; the implicit import of a submodule's parent packages does not)."""
    modules = project_modules()
    return {name: imports_of(name, file, modules) for name, file in modules.items()}


def test_the_scanner_sees_function_level_imports_and_finds_cycles(tmp_path):
    modules = {"p.a": tmp_path / "a.py", "p.b": tmp_path / "b.py"}
    modules["p.a"].write_text("from p.b import thing\n")
    modules["p.b"].write_text("def f():\n    from p import a\n    import p.a\n")
    modules["p"] = tmp_path / "__init__.py"
    graph = {name: imports_of(name, file, modules) for name, file in modules.items() if name != "p"}
    assert graph == {"p.a": {"p.b"}, "p.b": {"p", "p.a"}}  # `from p import a` runs p's __init__ too
    assert cycles(graph) == [["p.a", "p.b"]]


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 60  # the scan found the project
    assert cycles(graph) == []


def test_the_model_never_imports_the_simulator():
    graph = import_graph()
    core = [
        m for m in graph if m.startswith(("dvla.model", "dvla.adapters", "dvla.action_head", "dvla.backbone"))
    ]
    reach, todo = set(), list(core)
    while todo:
        for target in graph[todo.pop()]:
            if target not in reach:
                reach.add(target)
                todo.append(target)
    assert not {m for m in reach if m.startswith("dvla.sim")}
