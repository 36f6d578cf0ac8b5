"""The layout a newcomer relies on, held by a test: ARCHITECTURE.md's layer list is read here, every
module of orchestrator/, providers/ and playbooks/ must have its place in it, and an import (at
the top or inside a function) may only point to its own layer or one below. The core names no
provider, no provider imports the job engine, and nothing a fake serves comes from orch."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("orchestrator", "providers", "playbooks")
CORE = ROOT / "orchestrator"
PROVIDER_NAMES = {p.name for p in (ROOT / "providers").iterdir() if (p / "__init__.py").is_file()} | {"runpod", "vastai"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def imports(path: Path, source: str | None = None) -> set[str]:
    """Every module this file imports, at the top or inside a function (``from X import y`` counts
    X, and X.y where that is a module): relative imports resolved against the file's package, and
    ``importlib.import_module("a.b")`` / ``__import__("a.b")`` with a literal name counted as imports."""
    tree = ast.parse(source if source is not None else path.read_text())
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # ``from ..jobs import engine`` in orchestrator/views/x.py: orchestrator.jobs
                base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
            if base:
                found.add(base)
                found |= {f"{base}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and _dynamic_import(node.func):
            found.add(node.args[0].value)
    return found


def _dynamic_import(func: ast.expr) -> bool:
    """``importlib.import_module(...)``, ``import_module(...)`` or ``__import__(...)``."""
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name in ("import_module", "__import__")


def graph() -> dict[str, set[str]]:
    """module -> the project's modules it imports (a package's own __init__ left out: importing
    ``orchestrator.jobs.spec`` runs ``orchestrator/jobs/__init__``, which is no choice of the importer)."""
    mods = modules()
    out = {}
    for name, path in mods.items():
        out[name] = {m for m in imports(path) if m in mods and m != name and not name.startswith(m + ".")}
    return out


# -- ARCHITECTURE.md's layers ----------------------------------------------------------------------
def layers(text: str | None = None) -> list[list[str]]:
    """The patterns of each layer, bottom first: the numbered lines between the layer markers, each
    naming its modules in backticks (``pkg.*``: the package and everything under it)."""
    text = text if text is not None else (ROOT / "ARCHITECTURE.md").read_text()
    block = re.search(r"<!-- layers -->(.*?)<!-- /layers -->", text, re.S)
    assert block, "ARCHITECTURE.md has no <!-- layers --> ... <!-- /layers --> list"
    found = []
    for line in block.group(1).splitlines():
        if re.match(r"\s*\d+\.\s", line):
            found.append(re.findall(r"`((?:orchestrator|providers|playbooks)[A-Za-z0-9_.]*(?:\.\*)?)`", line))
    return found


def layer_of(module: str, patterns: list[list[str]]) -> int | None:
    """The layer whose most specific pattern names ``module`` (an exact name beats any ``.*``)."""
    best, rank = None, -1
    for i, layer in enumerate(patterns):
        for p in layer:
            if p == module:
                score = 10_000
            elif p.endswith(".*") and (module == p[:-2] or module.startswith(p[:-1])):
                score = len(p)
            else:
                continue
            if score > rank:
                best, rank = i, score
    return best


def upward(edges: dict[str, set[str]], patterns: list[list[str]]) -> list[str]:
    """Every import that points to a higher layer than its importer's."""
    found = []
    for module, targets in sorted(edges.items()):
        here = layer_of(module, patterns)
        for target in sorted(targets):
            there = layer_of(target, patterns)
            if here is not None and there is not None and there > here:
                found.append(f"{module} (layer {here + 1}) imports {target} (layer {there + 1})")
    return found


def test_every_module_has_its_place_in_architecture_md():
    patterns = layers()
    assert len(patterns) >= 5, patterns
    missing = [m for m in sorted(modules()) if layer_of(m, patterns) is None]
    assert missing == [], f"modules ARCHITECTURE.md's layer list does not place: {missing}"
    named = [p for layer in patterns for p in layer if not p.endswith(".*")]
    assert [p for p in named if p not in modules()] == [], "the layer list names modules that do not exist"


def test_imports_only_point_down_the_layers():
    assert upward(graph(), layers()) == []


def test_an_upward_import_fails_the_layer_check():
    """The check can fail: the ledger importing the export, or the local provider the job engine."""
    edges = graph()
    patterns = layers()
    for module, target in (("orchestrator.ledger.ledger", "orchestrator.export"),
                           ("providers.local.compute", "orchestrator.jobs"),
                           ("orchestrator.instances.lifecycle", "orchestrator.instances.groups")):
        bad = {k: set(v) for k, v in edges.items()}
        bad[module].add(target)
        assert [line for line in upward(bad, patterns) if line.startswith(module + " ")] != [], (module, target)


def test_relative_and_dynamic_imports_are_read():
    """An upward import written relatively or through importlib is still an import: the check sees it."""
    views = ROOT / "orchestrator" / "views" / "fleet.py"
    ledger = ROOT / "orchestrator" / "ledger" / "ledger.py"
    assert "orchestrator.jobs.engine" in imports(views, "from ..jobs import engine\n")
    assert "orchestrator.jobs" in imports(views, "from .. import jobs\n")
    assert "orchestrator.views.jobs" in imports(views, "from . import jobs\n")
    assert "orchestrator.export" in imports(ledger, "import importlib\nimportlib.import_module('orchestrator.export')\n")
    assert "orchestrator.export" in imports(ledger, "from importlib import import_module as im\nx = __import__('orchestrator.export')\n")
    patterns = layers()
    for module, source in (("orchestrator.ledger.ledger", "from ..instances.lifecycle import Orch\n"),
                           ("orchestrator.ledger.ledger", "import importlib\nimportlib.import_module('orchestrator.jobs.engine')\n")):
        path = modules()[module]
        edges = {module: {m for m in imports(path, source) if m in modules() and m != module}}
        assert upward(edges, patterns) != [], (module, source)


# -- packages: what each holds and which layers -------------------------------------------------------
def package_layers(doc: str) -> set[int] | None:
    """The layers a package's docstring says it holds: "Layer 6", "Layers 2, 6 and 9", "Layers 8 to 11"."""
    found = re.search(r"\bLayers? (\d+(?:(?:, | and | to )\d+)*)", doc)
    if not found:
        return None
    words = found.group(1)
    numbers = [int(n) for n in re.findall(r"\d+", words)]
    if " to " in words:
        return set(range(numbers[0], numbers[-1] + 1))
    return set(numbers)


def core_packages() -> dict[str, Path]:
    """orchestrator/'s packages whose ``__init__`` is only a docstring (provider/, jobs/, views/ and cli/
    export their names and are layered as wholes)."""
    out = {}
    for init in CORE.glob("*/__init__.py"):
        tree = ast.parse(init.read_text())
        if len(tree.body) == 1 and isinstance(tree.body[0], ast.Expr):
            out[module_name(init)] = init
    return out


def test_each_package_says_what_it_holds_and_its_layers_are_true():
    """A package's docstring names its modules' layers; each of its modules sits in one of them, and
    its ``__init__`` imports nothing (importing ``orchestrator.ledger.ledger_sql`` runs it)."""
    patterns = layers()
    packages = core_packages()
    assert len(packages) >= 8, sorted(packages)
    wrong = {}
    for name, init in packages.items():
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        said = package_layers(doc)
        assert said, f"{name}'s docstring says none of its layers"
        actual = {layer_of(m, patterns) + 1 for m in modules() if m.startswith(name + ".")}
        if not actual <= said:
            wrong[name] = (sorted(said), sorted(actual))
    assert wrong == {}


def test_a_package_whose_modules_leave_its_layers_fails_the_check():
    assert package_layers("Layers 2, 6 and 9 (ARCHITECTURE.md)") == {2, 6, 9}
    assert package_layers("Layers 8 to 11: x") == {8, 9, 10, 11}
    assert package_layers("Layer 6 (ARCHITECTURE.md)") == {6}
    assert package_layers("nothing said") is None


def test_no_provider_imports_the_job_engine():
    offenders = [f"{m} imports {t}" for m, targets in graph().items() if m.startswith("providers")
                 for t in targets if t == "orchestrator.jobs" or t.startswith("orchestrator.jobs.")]
    assert offenders == []


def test_the_layer_list_is_read_as_written():
    text = ("<!-- layers -->\n1. **low** — `orchestrator.a`, `orchestrator.pkg.*`\n"
            "2. **high** — `orchestrator.b`, `orchestrator.pkg.top`\n<!-- /layers -->")
    patterns = layers(text)
    assert patterns == [["orchestrator.a", "orchestrator.pkg.*"], ["orchestrator.b", "orchestrator.pkg.top"]]
    assert layer_of("orchestrator.pkg.low", patterns) == 0 and layer_of("orchestrator.pkg.top", patterns) == 1
    assert upward({"orchestrator.a": {"orchestrator.b"}}, patterns) != []
    assert upward({"orchestrator.b": {"orchestrator.a"}}, patterns) == []


def test_the_import_graph_has_no_cycle():
    edges = graph()
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == "open":
                cycle = stack[stack.index(nxt):] + [nxt]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(edges):
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
        project = {m.split(".")[0] for m in imports(path)} & set(PACKAGES)
        assert not project, f"{path.name} imports {sorted(project)}"


def test_the_project_cites_no_document_outside_it():
    """A comment cites a public source (an address, a doc's title), never a path beside the checkout."""
    offenders = []
    tracked = [p for folder in (*PACKAGES, "tests", "bench", "scripts", "examples", "migrations")
               for p in (ROOT / folder).rglob("*")] + list(ROOT.glob("*"))
    for path in tracked:
        if path.suffix not in (".py", ".md", ".toml", ".yaml", ".tmpl") or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        if re.search(r"\.\./shared/|shared/(reference|seeds)\b", text):
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


# -- the layer map at run time -----------------------------------------------------------------------
def instance_ops_names() -> set[str]:
    """What ``InstanceOps`` defines (its fields and methods): all a module below the lifecycle may use
    of the ``Orch`` it is handed."""
    tree = ast.parse((CORE / "instances" / "instance_ops.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "InstanceOps")
    return {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))} | \
        {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}


def calls_up(source: str, allowed: set[str]) -> set[str]:
    """``orch.<name>`` uses in ``source`` that ``allowed`` does not define."""
    return {n.attr for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id == "orch" and n.attr not in allowed}


def test_below_the_lifecycle_an_orch_is_used_only_for_the_instance_operations():
    """reconcile, sync, watchdog, volumes... are handed the lifecycle's ``Orch``: what they call on it
    must be defined below them (``instance_ops``), or the map is false at run time (reconcile's
    destroy calling back up into the lifecycle that called reconcile)."""
    patterns = layers()
    lifecycle = layer_of("orchestrator.instances.lifecycle", patterns)
    allowed = instance_ops_names()
    assert {"down", "move", "provider", "connect", "ledger"} <= allowed
    offenders = {m: sorted(calls_up(path.read_text(), allowed)) for m, path in sorted(modules().items())
                 if (layer_of(m, patterns) or 0) < lifecycle}
    assert {m: names for m, names in offenders.items() if names} == {}
    assert calls_up("def f(orch, inst):\n    orch.stop(inst)\n", allowed) == {"stop"}  # the check can fail


def test_a_comment_citing_another_project_names_its_repository():
    """``sky/provision/aws/instance.py`` alone is a path nobody can open: the repository's address
    goes with it (github.com/skypilot-org/skypilot, sky/...)."""
    repos = {"sky/": "github.com/skypilot-org/skypilot", "src/dstack/": "github.com/dstackai/dstack"}
    offenders = []
    for path in (p for package in PACKAGES for p in (ROOT / package).rglob("*.py")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            for prefix, repo in repos.items():
                if re.search(rf"(?<![\w/.]){re.escape(prefix)}\w", line) and repo not in line \
                        and (i == 0 or repo not in lines[i - 1]):
                    offenders.append(f"{path.relative_to(ROOT)}:{i + 1}")
    assert offenders == []


# -- job kinds own what differs ---------------------------------------------------------------------
KINDS_DIR = CORE / "jobs" / "kinds"


def kind_keys() -> set[str]:
    from orchestrator.jobs.kinds import KINDS

    return set(KINDS)


def kind_leaks(path: Path, source: str | None = None) -> list[str]:
    """What a core module outside jobs/kinds/ knows of one kind in particular: a comparison with a
    kind's key (``kind == "command"``, ``key in ("train", ...)``), or an import of a kind's own module
    (``jobs.kinds.<x>``; the registry ``jobs.kinds`` and what it exports are the way in)."""
    keys, mods = kind_keys(), modules()
    tree = ast.parse(source if source is not None else path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            sides += [e for s in sides if isinstance(s, (ast.Tuple, ast.List, ast.Set)) for e in s.elts]
            named = sorted({s.value for s in sides if isinstance(s, ast.Constant) and s.value in keys})
            found += [f"{path.name}:{node.lineno}: compares with the kind {k!r}" for k in named]
    found += [f"{path.name}: imports {m}" for m in sorted(imports(path, source))
              if m.startswith("orchestrator.jobs.kinds.") and m in mods]
    return found


def test_no_core_module_outside_the_kinds_names_one_kind():
    """A third kind is a file in jobs/kinds/ and a line in KINDS: nothing else tests for a kind's key
    or reaches into a kind's module."""
    offenders = [leak for path in sorted(CORE.rglob("*.py")) if KINDS_DIR not in path.parents
                 for leak in kind_leaks(path)]
    assert offenders == []


def test_a_kind_named_outside_the_kinds_fails_the_check():
    views = ROOT / "orchestrator" / "views" / "jobs.py"
    for source in ('if d.get("kind") == "command":\n    pass\n', 'x = kind.key in ("x", "train")\n',
                   'y = "train" != spec.kind\n', "from orchestrator.jobs.kinds.command import node_log\n",
                   "from ..jobs.kinds import training\n", "import orchestrator.jobs.kinds.base\n"):
        assert kind_leaks(views, source) != [], source
    assert kind_leaks(views, "from orchestrator.jobs.kinds import KINDS, CommandKind\nx = d['kind'] in KINDS\n") == []


def test_the_lifecycle_names_no_package_it_provisions():
    """What a machine is made ready with is its job kind's (``JobKind.provisioning``, data the
    lifecycle runs): the lifecycle and the job engine name no package, LibreYOLO included."""
    bring_up = [CORE / "instances" / "lifecycle.py", CORE / "jobs" / "engine.py"]
    named = [f"{p.name}:{n}" for p in bring_up for n, line in enumerate(p.read_text().splitlines(), 1)
             if "libreyolo" in line.lower()]
    assert named == []
