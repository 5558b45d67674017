"""The import graph of kvbound: no circle, and every import points down the layers.

Every import statement of every module, at any depth (a function's deferred import, one
under ``if`` or ``try``), parsed with ``ast`` from the installed packages' sources:

* no circle among kvbound's modules (spec, proofs, impl and the tool's own packages);
* spec imports nothing of proofs, impl or the tool; proofs and impl import spec, never
  each other nor the tool; ``kvbound.errors``, the leaf every layer raises, imports nothing
  of kvbound;
* the side (what runs in a release's venv, loaded there by path: ``SIDE``) imports nothing
  of kvbound but its own side siblings.

The same sources are held to two sizes: no module over ``MAX_MODULE_LINES`` lines and no class
over ``MAX_CLASS_LINES`` (a module that outgrows them holds more than one idea).

The planted tests at the end show each rule fails on a graph (or a source) that breaks it.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

# What runs in a release's venv (loaded there by path, where kvbound is not installed): every module
# under SIDE_PACKAGE, the one place for it.
SIDE_PACKAGE = "kvbound.side"
LEAF = "kvbound.errors"  # the errors every layer raises: it imports nothing of kvbound
LAYERS = ("kvbound.spec", "kvbound.proofs", "kvbound.impl")
# what each layer may import of kvbound besides itself and the leaf
MAY_IMPORT = {"kvbound.spec": (), "kvbound.proofs": ("kvbound.spec",), "kvbound.impl": ("kvbound.spec",)}
MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 250


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def installed_sources() -> dict:
    """{module name: source text} of every module of kvbound, read where it is installed (the
    layers spec/, proofs/, impl/ lie at the repository top in a checkout, inside kvbound/ in a wheel)."""
    out = {}
    for package in ("kvbound", *LAYERS):
        root = Path(importlib.import_module(package).__file__).parent
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out.setdefault(".".join((package, *parts)), (path, path.read_text()))
    return {name: text for name, (path, text) in out.items()}


def _is_package(name: str, sources: dict) -> bool:
    return any(other.startswith(name + ".") for other in sources)


def imports(name: str, text: str, sources: dict) -> set:
    """Every kvbound module (or ``kvbound.*`` name, known or not) ``name``'s source imports, at any depth."""
    out = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = name if _is_package(name, sources) else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = ".".join(p for p in (package, node.module) if p)
            else:
                base = node.module
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in sources else base for a in node.names]
        else:
            continue
        out.update(t for t in targets if _within(t, "kvbound"))
    return out - {name}


def import_graph(sources: dict) -> dict:
    return {name: imports(name, text, sources) for name, text in sources.items()}


def circles(graph: dict) -> list:
    """Each circle of the graph's known modules, as the path that closes it."""
    found, state = [], {}

    def visit(m, path):
        if state.get(m) == "done":
            return
        if state.get(m) == "open":
            found.append(path[path.index(m):] + [m])
            return
        state[m] = "open"
        for d in sorted(graph.get(m, ())):
            if d in graph:
                visit(d, path + [m])
        state[m] = "done"

    for m in sorted(graph):
        visit(m, [])
    return found


def is_side(name: str) -> bool:
    return _within(name, SIDE_PACKAGE)


def layer_violations(graph: dict) -> list:
    """(module, what it imports, the rule) for each import against the layers."""
    out = []
    for m, deps in sorted(graph.items()):
        for d in sorted(deps):
            if is_side(m):
                if not is_side(d):
                    out.append((m, d, "the side imports nothing of kvbound but its side siblings"))
            elif m == LEAF:
                out.append((m, d, f"{LEAF} imports nothing of kvbound"))
            else:
                layer = next((p for p in LAYERS if _within(m, p)), None)
                if layer and not (_within(d, layer) or d == LEAF or any(_within(d, p) for p in MAY_IMPORT[layer])):
                    out.append((m, d, f"{layer} imports only {', '.join(MAY_IMPORT[layer] + (LEAF,))} of kvbound"))
    return out


def test_kvbound_has_no_import_circle():
    graph = import_graph(installed_sources())
    assert {"kvbound.spec.vocab", "kvbound.proofs.premises", "kvbound.impl.plan", "kvbound.cli"} <= set(graph)
    assert circles(graph) == []


def test_every_import_points_down_the_layers():
    graph = import_graph(installed_sources())
    assert {"kvbound.side.engine", "kvbound.side.tap", "kvbound.side.worker"} <= set(graph)
    assert layer_violations(graph) == []


def oversized(sources: dict) -> list:
    """(module, "module" or "class NAME", its lines) for each module over MAX_MODULE_LINES and each
    class (nested ones included) over MAX_CLASS_LINES, in module order."""
    out = []
    for name, text in sorted(sources.items()):
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            out.append((name, "module", lines))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
                out.append((name, f"class {node.name}", node.end_lineno - node.lineno + 1))
    return out


def test_no_module_over_500_lines_and_no_class_over_250():
    sources = installed_sources()
    for package in (*LAYERS, "kvbound.commands", SIDE_PACKAGE):  # every tree is read, the side's too
        assert any(_within(name, package) and name != package for name in sources), package
    assert oversized(sources) == []


# --- the rules fail where they should ------------------------------------------------------------

def _planted(sources: dict, module: str, line: str) -> dict:
    """``sources`` with a function holding ``line`` appended to ``module`` (a deferred import)."""
    out = dict(sources)
    out[module] = sources[module] + f"\n\ndef _planted():\n    if True:\n        {line}\n"
    return out


def test_a_deferred_import_that_closes_a_circle_fails():
    """The circle spec had (a Case validating through cases.py, which imports the Case), planted back."""
    sources = installed_sources()
    planted = _planted(sources, "kvbound.spec.case", "from .cases import case_from_dict")
    new = circles(import_graph(planted))
    assert new == [["kvbound.spec.case", "kvbound.spec.cases", "kvbound.spec.case"]]


def test_a_circle_in_a_package_of_its_own_fails(tmp_path):
    """The graph of a package written to disk: a.py imports b at module level, b imports a in a function."""
    pkg = tmp_path / "kvbound" / "planted"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("def f():\n    try:\n        import kvbound.planted.a as a\n    except ImportError:\n        pass\n")
    (pkg / "c.py").write_text("from .a import b\n")  # an edge into the circle, not part of it
    sources = {f"kvbound.planted.{p.stem}".removesuffix(".__init__"): p.read_text() for p in pkg.glob("*.py")}
    assert circles(import_graph(sources)) == [["kvbound.planted.a", "kvbound.planted.b", "kvbound.planted.a"]]


def test_an_import_against_the_layers_fails():
    sources = installed_sources()
    before = layer_violations(import_graph(sources))
    cases = [
        ("kvbound.spec.plan", "from kvbound.proofs.terms import MAX", "kvbound.proofs.terms"),
        ("kvbound.spec.vocab", "import kvbound.cli", "kvbound.cli"),
        ("kvbound.proofs.world", "from kvbound.impl import plan", "kvbound.impl.plan"),
        ("kvbound.impl.plan", "from ..proofs import premises", "kvbound.proofs.premises"),
        ("kvbound.errors", "from kvbound.spec import cdiv", "kvbound.spec"),
        ("kvbound.side.fakes", "from kvbound.spec import cdiv", "kvbound.spec"),
        ("kvbound.side.sidecar", "from ..conform import prepare", "kvbound.conform.prepare"),
        ("kvbound.side.engine", "from kvbound.trace import layouts", "kvbound.trace.layouts"),
    ]
    for module, line, target in cases:
        bad = [v for v in layer_violations(import_graph(_planted(sources, module, line))) if v not in before]
        assert [(m, d) for m, d, _ in bad] == [(module, target)], (module, line, bad)
    # a side module's own side siblings, and the layers' downward imports, are not violations
    for module, line in [("kvbound.side.engine", "from . import fakes"), ("kvbound.impl.plan", "from kvbound.spec import cdiv"),
                         ("kvbound.proofs.terms", "from kvbound.errors import CaseError")]:
        assert layer_violations(import_graph(_planted(sources, module, line))) == before


def test_an_oversized_module_or_class_fails():
    """A module padded to the bound passes and one line more fails; so does a class."""
    sources = installed_sources()
    before = oversized(sources)
    module = "kvbound.spec.vocab"
    text = sources[module]
    pad = MAX_MODULE_LINES - len(text.splitlines())
    assert pad > 0
    for extra, want in ((0, []), (1, [(module, "module", MAX_MODULE_LINES + 1)])):
        planted = {**sources, module: text + "#\n" * (pad + extra)}
        assert [v for v in oversized(planted) if v not in before] == want
    # a class of a module of its own (well under the module bound), and one nested in a function
    planted_module = "kvbound.spec.planted"
    for body, want in ((MAX_CLASS_LINES - 1, []), (MAX_CLASS_LINES, [(planted_module, "class Planted", MAX_CLASS_LINES + 1)])):
        planted = {**sources, planted_module: "class Planted:\n" + "    x = 0\n" * body}
        assert [v for v in oversized(planted) if v not in before] == want
    nested = "def f():\n    class Inner:\n" + "        x = 0\n" * MAX_CLASS_LINES
    assert oversized({planted_module: nested}) == [(planted_module, "class Inner", MAX_CLASS_LINES + 1)]
