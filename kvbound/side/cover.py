"""Line coverage of the release's connector code, per trace job (coverage.py).

Part of the side package: the standard library, and coverage.py (pinned in the deps lock,
``kvbound/conform/vllm-import-deps.lock``), imported only in a worker started to measure
(``ENV=1``: the host sets it, ``kvbound/trace/runner.py`` ``TraceWorker``).

What is measured: ``CONNECTOR_CODE``, the OffloadingConnector and its offload tiers, every
``.py`` file under those paths of the release tree (0.21.0 - 0.33.0 all have the
``offloading/`` package beside ``offloading_connector.py`` and ``v1/kv_offload/``), files never
imported included (no line of theirs ran). Paths are relative to the release tree
(``vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py``).

How: a job with ``"coverage": true`` runs no trace function (on CPython 3.11 any trace
function slows every frame while it is set, docs/benchmarks.md "Coverage"): every module of the
connector code a measuring worker imports is compiled with a probe before each statement
(``probed``), which adds the statement's line to a set of the module's, in whichever thread
runs it (the file-system tier's I/O threads too); the job's lines are those of its probes.
``"coverage": "job"`` traces the job whole with coverage.py instead, from before its engine is
built to after its run: the reference, the same lines file by file (tests/test_coverage.py
compares them on 7 layouts of 0.33.0 and 0.29.0). coverage.py also traces the worker's import
of vLLM (a module's definitions are lines it executes), and is the analysis of both ways (its
statements, and ``translate_lines``: a multi-line statement by its first line).

What runs while a module of the connector code is imported (its definitions, and the calls it
makes then: the CPU tier's policy factory registers its policies, 0.33.0
``v1/kv_offload/cpu/policies/factory.py:25-36``) runs once per process: at the worker's start,
or in the first job whose engine imports it (the CPU tier's modules come with the first engine
built; ``_ImportContext`` tells those lines apart: coverage.py's dynamic context ``"import"``,
or the probes' import sets). Those lines are kept (``Probe.imported``) and counted for every
job after, so a job's lines do not depend on which measured job of the process imported the
module first.

What a job gets per file: ``statements`` (coverage.py's analysis: every line that can run),
``executed`` (those that ran, each multi-line statement by its first line) and ``declared``
(by reason, the statements of code declared in ``unreached.UNREACHED``: what runs only with CUDA,
only with a library or service the CPU host lacks, or has no caller on the release, so the host
can tell "not reachable here" from "not reached yet" without reading vLLM).
"""

import ast
import importlib.abc
import importlib.util
import os
import sys
import threading

from .unreached import ABSTRACT, UNREACHED, abstract_bodies, applies, called_up, declared_in, release_version

ENV = "KVBOUND_COVERAGE"
CONNECTOR_CODE = ("vllm/distributed/kv_transfer/kv_connector/v1/offloading",
                  "vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py",
                  "vllm/v1/kv_offload")
def release_root():
    """The directory holding the release's ``vllm`` package, found without importing it."""
    spec = importlib.util.find_spec("vllm")
    return os.path.dirname(os.path.realpath(list(spec.submodule_search_locations)[0]))


def connector_files(root):
    """Every ``.py`` file of ``CONNECTOR_CODE`` under ``root``, relative paths, sorted."""
    out = []
    for rel in CONNECTOR_CODE:
        path = os.path.join(root, rel)
        if os.path.isfile(path):
            out.append(rel)
        for d, dirs, files in os.walk(path):
            dirs.sort()
            out += [os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/") for f in files if f.endswith(".py")]
    return sorted(set(out))


def spans(source):
    """Qualified name -> (first, last) line of every function and class of a module's source
    (``Class.method``, decorators included), and of the branches inside each function or at
    module level that ``unreached.UNREACHED`` may name: ``<qualname>@if <test>`` the body of an
    ``if`` whose test reads ``<test>`` (``ast.unparse``), ``<qualname>@else <test>`` its ``else``,
    ``<qualname>@try import <module>`` the body of a ``try`` that first imports ``<module>``, past
    that import (which runs, and raises where the module is absent; module level: an empty
    qualname). Of two branches of one name, the first."""
    named = {}

    def block(stmts):
        return stmts[0].lineno, stmts[-1].end_lineno

    def visit(node, prefix, qual):
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                first = min([ch.lineno] + [d.lineno for d in ch.decorator_list])
                named.setdefault(prefix + ch.name, (first, ch.end_lineno))
                visit(ch, prefix + ch.name + ".", prefix + ch.name)
                continue
            if isinstance(ch, ast.If):
                named.setdefault(f"{qual}@if {ast.unparse(ch.test)}", block(ch.body))
                if ch.orelse:
                    named.setdefault(f"{qual}@else {ast.unparse(ch.test)}", block(ch.orelse))
            elif isinstance(ch, ast.Try) and isinstance(ch.body[0], (ast.Import, ast.ImportFrom)) and ch.body[1:]:
                first = ch.body[0]
                module = first.module if isinstance(first, ast.ImportFrom) else first.names[0].name
                named.setdefault(f"{qual}@try import {module}", block(ch.body[1:]))
            visit(ch, prefix, qual)

    visit(ast.parse(source), "", "")
    return named


IMPORT_CONTEXT = "import"

# The module global each probed module of the connector code calls, one argument: its probe key
# (``probed``). A single leading underscore: a name of two would be mangled in a class body.
PROBE_NAME = "_kvbound_line_"


def _at0(node):
    """``node`` and its children at line 0, no line of the file: a tracer's line events for the
    probe's own instructions are line 0's, which no statement has, so a probed module reports
    through coverage.py the lines its plain compile does (tests/test_coverage.py compares the
    line tables)."""
    for n in ast.walk(node):
        n.lineno = n.end_lineno = 0
        n.col_offset = n.end_col_offset = 0
    return node


def _hit(key):
    return ast.Call(ast.Name(PROBE_NAME, ast.Load()), [ast.Constant(key)], [])


def _irrefutable(p):
    return (isinstance(p, ast.MatchAs) and (p.pattern is None or _irrefutable(p.pattern))) \
        or (isinstance(p, ast.MatchOr) and any(map(_irrefutable, p.patterns)))


def probed(tree):
    """``tree`` (a module's AST), each statement preceded by a probe ``PROBE_NAME(key)`` at line 0
    (``_at0``), and the keys that stand for more lines than their own: ``(tree, more)``, ``more``
    a key -> the lines it records. A key is the statement's first line, but where a tracer's
    lines for one event are more than the statement's first line:

    - a decorated ``def``/``class`` runs its decorators' lines and the ``def`` line (coverage.py:
      a statement each): a key of its own for them all;
    - an ``except`` clause's line runs when an exception is tested against it, matched or not:
      a typed clause's type is ``PROBE_NAME(line) or TYPE`` (evaluated exactly then), a bare one
      (the last, always matched) probes first thing in its body;
    - a ``case`` line runs when its pattern is tried (a pattern holds no call): case j's body
      records cases 1..j, and where no case need match, an added last ``case _`` records all;
    - a leading docstring (no statement to coverage.py) gets no probe before it (it would stop
      being the docstring), nor do ``from __future__`` imports (they must come first): their
      keys are probed after them.
    Nothing else: what a statement's other lines run (a multi-line statement, a lambda, a
    comprehension) is the statement's first line to coverage.py (``translate_lines``)."""
    more = {}

    def key_of(lines):
        if len(lines) == 1:
            return lines[0]
        k = -1 - len(more)
        more[k] = tuple(lines)
        return k

    def probe(lines):
        return _at0(ast.Expr(_hit(key_of(lines))))

    def body(stmts, doc=False, module=False):
        out, held = [], []
        for i, st in enumerate(stmts):
            lead = (doc and i == 0 and isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant)
                    and isinstance(st.value.value, str))
            future = module and isinstance(st, ast.ImportFrom) and st.module == "__future__"
            visit(st)
            if lead:
                out.append(st)
                continue
            if future:
                out.append(st)
                held.append(st.lineno)
                continue
            out += [probe([ln]) for ln in held]
            held = []
            deco = getattr(st, "decorator_list", None)
            out.append(probe([d.lineno for d in deco] + [st.lineno] if deco else [st.lineno]))
            out.append(st)
        out += [probe([ln]) for ln in held]
        return out

    def visit(st):
        defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(st, field, None)
            if isinstance(stmts, list) and stmts:
                setattr(st, field, body(stmts, doc=field == "body" and isinstance(st, defs)))
        for h in getattr(st, "handlers", ()):
            h.body = body(h.body)
            if h.type is None:
                h.body.insert(0, probe([h.lineno]))
            else:
                h.type = ast.BoolOp(ast.Or(), [_at0(_hit(key_of([h.lineno]))), h.type])
                ast.copy_location(h.type, h.type.values[1])
        if isinstance(st, ast.Match):
            lines = []
            for c in st.cases:
                lines.append(c.pattern.lineno)
                c.body = [probe(list(lines))] + body(c.body)
            last = st.cases[-1]
            if last.guard is not None or not _irrefutable(last.pattern):
                st.cases.append(ast.match_case(_at0(ast.MatchAs(pattern=None, name=None)), None, [probe(list(lines))]))

    tree.body = body(tree.body, doc=True, module=True)
    return tree, more


class _ImportContext(importlib.abc.MetaPathFinder):
    """In a worker that measures, from its start: each module of the connector code is compiled
    with probes (``probed``: ``Probe.load``) and executed under the import context, so the
    lines its import runs (and what it imports and calls meanwhile) are told from the lines a
    job runs: coverage.py's dynamic context ``IMPORT_CONTEXT`` in a job traced whole, the
    probes' import sets in a probed job (``Probe.enter_import``). Finds nothing itself: it asks
    the finders after it and wraps the loader of a measured file."""

    def __init__(self, probe):
        self.probe, self.depth = probe, 0

    def find_spec(self, name, path=None, target=None):
        if not name.startswith("vllm"):
            return None
        for finder in sys.meta_path:
            spec = None if finder is self or not hasattr(finder, "find_spec") \
                else finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.origin and os.path.realpath(spec.origin) in self.probe.paths and hasattr(spec.loader, "get_data"):
            spec.loader = _ImportingLoader(spec.loader, self)
        return spec


class _ImportingLoader(importlib.abc.Loader):
    def __init__(self, inner, hook):
        self.inner, self.hook = inner, hook

    def __getattr__(self, name):  # get_source, get_filename, ... as the real loader answers
        return getattr(self.inner, name)

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        hook = self.hook
        code = hook.probe.load(module, self.inner)
        hook.depth += 1
        if hook.depth == 1:
            hook.probe.enter_import()
        try:
            exec(code, module.__dict__)
        finally:
            hook.depth -= 1
            if hook.depth == 0:
                hook.probe.leave_import()


# Defects a test plants in the probes (a job's ``coverage_plant``), to show the probed job's
# lines are held to the whole job's: each one makes a probed job miss lines the connector runs.
PLANTS = {"threads_unseen": "the probes record only what the main thread runs (the file-system"
                            " tier's I/O threads go unseen)"}


class _Lines:
    """One probed module's records: its globals (where ``PROBE_NAME`` is bound), the keys its
    probes recorded in the job (``job``) and, while a module is imported, in the import
    (``imp``), and its keys of more lines (``probed``)."""

    def __init__(self, globs, more):
        self.globs, self.more = globs, more
        self.job, self.imp = set(), None

    def lines(self, keys):
        out = set()
        for k in keys:
            out.update(self.more.get(k, (k,)))
        return out


def _main_thread_only(keys):
    main = threading.main_thread()

    def add(key):
        if threading.current_thread() is main:
            keys.add(key)

    return add


class Probe:
    """The connector code's lines per job, two ways: ``"probes"`` (a job's ``"coverage": true``),
    no trace function: the modules of the connector code are compiled with a probe before each
    statement (``probed``), which adds its key to a set of the module's (a ``set.add`` bound
    to the module global ``PROBE_NAME``: a global's load and a C call, in any thread); and
    ``"job"`` (``"coverage": "job"``): coverage.py's tracer over the whole job (the reference:
    tests/test_coverage.py holds the probes to it, file by file). coverage.py is the analysis
    of both (``static``: its statements and ``translate_lines``) and what measures the
    worker's import of vLLM."""

    MODES = ("probes", "job")

    def __init__(self):
        import coverage  # the deps lock pins it; only a worker started to measure imports it

        self.root = release_root()
        self.files = connector_files(self.root)
        self.cov = coverage.Coverage(data_file=None, config_file=False, branch=False,
                                     include=[os.path.join(self.root, f) for f in self.files])
        self.paths = {os.path.join(self.root, f) for f in self.files}
        self.imported = {}  # relpath -> the lines that ran while its module was imported
        self._static = {}  # relpath -> (reporter, statements, declared: {why: statements})
        self._up = None  # unreached.called_up of the connector's code
        self._hook = _ImportContext(self)
        self._lines = {}  # relpath -> _Lines of its probed module
        self.mode = self.plant = None  # while a job (or the worker's import) measures

    def start(self, mode="job", plant=None):
        """Start measuring, ``mode`` one of ``MODES``; ``plant``: a row of ``PLANTS`` (tests
        only, probes). From the first start on, every module of the connector code this process
        imports is compiled with probes (``_ImportContext``), measured or not."""
        if mode not in self.MODES:
            raise ValueError("unknown coverage mode %r: %s" % (mode, ", ".join(self.MODES)))
        if plant is not None and (plant not in PLANTS or mode != "probes"):
            raise ValueError("unknown coverage plant %r: kvbound/side/cover.py PLANTS has %s (probed jobs)"
                             % (plant, ", ".join(PLANTS)))
        if self._hook not in sys.meta_path:
            sys.meta_path.insert(0, self._hook)
        self.mode, self.plant = mode, plant
        if mode == "job":
            self.cov.erase()
            self.cov.start()
        else:
            for lines in self._lines.values():
                lines.job.clear()
                self._bind(lines)

    def _bind(self, lines):
        keys = lines.imp if lines.imp is not None else lines.job
        planted = self.mode == "probes" and self.plant == "threads_unseen"
        lines.globs[PROBE_NAME] = _main_thread_only(keys) if planted else keys.add

    def load(self, module, loader):
        """The code of a module of the connector code, compiled with probes (``probed``), its
        probes bound to a new ``_Lines`` of the file."""
        path = loader.get_filename(module.__name__)
        tree, more = probed(ast.parse(loader.get_data(path), path))
        rel = os.path.relpath(os.path.realpath(path), self.root).replace(os.sep, "/")
        lines = self._lines[rel] = _Lines(module.__dict__, more)
        if self._hook.depth and self.mode == "probes":  # imported inside another's import
            lines.imp = set()
        self._bind(lines)
        return compile(tree, path, "exec", dont_inherit=True)

    def enter_import(self):
        """A module of the connector code is being imported (the outermost such import)."""
        if self.mode == "job":
            self.cov.switch_context(IMPORT_CONTEXT)
        elif self.mode == "probes":
            for lines in self._lines.values():
                lines.imp = set()
                self._bind(lines)

    def leave_import(self):
        if self.mode == "job":
            self.cov.switch_context("")
        elif self.mode == "probes":
            for rel, lines in self._lines.items():
                imp, lines.imp = lines.imp, None
                self._bind(lines)
                if imp:
                    lines.job |= imp
                    at = self._translate(rel, lines.lines(imp))
                    if at:
                        self.imported.setdefault(rel, set()).update(at)

    def _translate(self, rel, lines):
        reporter, statements, _ = self.static(rel)
        return set(reporter.translate_lines(lines)) & statements

    def stop(self, at_import=False):
        """Stop measuring; the lines that ran since ``start``, per file, with the lines every
        module imported so far ran at its import. ``at_import``: all of them are import-time."""
        mode, self.mode, self.plant = self.mode, None, None
        out = {}
        if mode == "probes":
            for lines in self._lines.values():
                self._bind(lines)  # a plant's binding undone
            for rel in self.files:
                lines = self._lines.get(rel)
                ran = self._translate(rel, lines.lines(lines.job)) if lines is not None else set()
                out[rel] = ran | self.imported.get(rel, set())
            return out
        self.cov.stop()
        data = self.cov.get_data()
        for rel in self.files:
            reporter, statements, _ = self.static(rel)
            by_line = data.contexts_by_lineno(os.path.join(self.root, rel))
            ran = set(reporter.translate_lines(by_line)) & statements
            at = ran if at_import else set(reporter.translate_lines(
                ln for ln, ctx in by_line.items() if IMPORT_CONTEXT in ctx)) & statements
            if at:
                self.imported.setdefault(rel, set()).update(at)
            out[rel] = ran | self.imported.get(rel, set())
        return out

    def static(self, rel):
        """What does not change between jobs: the file's reporter, statements, the lines inside
        its functions, and its statements in ``UNREACHED`` code, by reason."""
        if rel not in self._static:
            from coverage.python import PythonFileReporter

            path = os.path.join(self.root, rel)
            reporter = PythonFileReporter(path, self.cov)
            statements = set(reporter.lines())
            with open(path) as f:
                source = f.read()
            named = spans(source)
            declared, version = {}, release_version()
            for row in UNREACHED:
                if declared_in(row, rel) and applies(row, version):
                    runs = [(min(statements, default=0), max(statements, default=0))] if row.function == "*" else \
                        abstract_bodies(source, self._called_up()) if row.function == ABSTRACT else \
                        [named.get(row.function, (0, -1))]
                    declared.setdefault(row.why, set()).update(ln for ln in statements for a, b in runs if a <= ln <= b)
            self._static[rel] = (reporter, statements, declared)
        return self._static[rel]

    def _called_up(self):
        """What the connector's code calls up to a base class (``unreached.called_up``), once."""
        if self._up is None:
            sources = []
            for rel in self.files:
                with open(os.path.join(self.root, rel)) as f:
                    sources.append(f.read())
            self._up = called_up(sources)
        return self._up

    def report(self, ran):
        """The job's coverage, per file: statements, executed and declared (by reason), sorted
        line numbers."""
        out = {}
        for rel in self.files:
            _, statements, declared = self.static(rel)
            out[rel] = {"statements": sorted(statements), "executed": sorted(ran.get(rel, ())),
                        "declared": {why: sorted(lines) for why, lines in sorted(declared.items()) if lines}}
        return out


def probe_from_environment():
    """A Probe when the worker was started to measure (``ENV``), else None."""
    return Probe() if os.environ.get(ENV) == "1" else None
