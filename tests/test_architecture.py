"""The layout a newcomer relies on: imports in orchestrator/ only point down (no cycle, lazy
imports included), the core names no provider, and nothing a fake serves comes from orch."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "orchestrator"
PROVIDER_NAMES = {p.stem for p in (ROOT / "providers").glob("*.py") if p.stem != "__init__"} | {"runpod", "vastai"}


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> set[str]:
    """Every module of the project this file imports, at the top or inside a function."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def core_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in CORE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        graph[name] = {m for m in imports(path) if m in modules and m != name and m != "orchestrator"}
    return graph


def test_the_core_import_graph_has_no_cycle():
    graph = core_graph()
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycle = stack[stack.index(nxt):] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)


def test_no_core_module_names_a_provider():
    """No import from providers/, no provider's name in code (comments and docstrings may cite one)."""
    offenders = []
    for path in CORE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                      and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                offenders += [f"{path.name}: imports {m}" for m in mods if m.split(".")[0] == "providers"]
            elif isinstance(node, ast.Name) and node.id.endswith("Provider") and node.id != "Provider":
                offenders.append(f"{path.name}:{node.lineno}: {node.id}")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                words = set(node.value.lower().replace('"', " ").replace("'", " ").split())
                named = words & PROVIDER_NAMES - {"local"}
                if named or node.value == "local":
                    offenders.append(f"{path.name}:{node.lineno}: {node.value[:60]!r}")
    assert offenders == []


def test_fakes_import_nothing_from_the_code_they_test():
    for path in (ROOT / "tests" / "fakes").glob("*.py"):
        project = {m.split(".")[0] for m in imports(path)} & {"orchestrator", "providers", "playbooks"}
        assert not project, f"{path.name} imports {sorted(project)}"
