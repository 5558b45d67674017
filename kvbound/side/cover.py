"""Line coverage of the release's connector code, per trace job (coverage.py).

Part of the side package: the standard library, and coverage.py (pinned in the deps lock,
``kvbound/conform/vllm-import-deps.lock``), imported only in a worker started to measure
(``ENV=1``: the host sets it, ``kvbound/trace/runner.py`` ``TraceWorker``).

What is measured: ``CONNECTOR_CODE``, the OffloadingConnector and its offload tiers, every
``.py`` file under those paths of the release tree (0.21.0 - 0.33.0 all have the
``offloading/`` package beside ``offloading_connector.py`` and ``v1/kv_offload/``), files never
imported included (no line of theirs ran). Paths are relative to the release tree
(``vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py``).

When: coverage.py runs while the worker imports vLLM (a module's definitions are lines it
executes) and, for a job that asks (``"coverage": true``), while its engine is built and
closed and inside each call of the connector's code after that (``Scope``: the engine core,
the scheduler and kvbound's checks run untraced in between, at the rate they run unmeasured);
``"coverage": "job"`` traces the job whole, from before its engine is built to after its run
(the same lines, slower: tests/test_coverage.py compares them). What runs while a module of the connector code is imported (its definitions,
and the calls it makes then: the CPU tier's policy factory registers its policies, 0.33.0
``v1/kv_offload/cpu/policies/factory.py:25-36``) runs once per process: at the worker's start,
or in the first job whose engine imports it (the CPU tier's modules come with the first engine
built; ``_ImportContext`` marks those lines with coverage.py's dynamic context ``"import"``).
Those lines are kept (``Probe.imported``) and counted for every job after, so a job's lines do
not depend on which measured job of the process imported the module first.

What a job gets per file: ``statements`` (coverage.py's analysis: every line that can run),
``executed`` (those that ran, each multi-line statement by its first line) and ``gpu_only``
(the statements of code declared in ``UNREACHED``: what runs only with CUDA, so the host can
tell "not reachable on CPU" from "not reached yet" without reading vLLM).
"""

import ast
import collections
import functools
import importlib.abc
import importlib.util
import inspect
import os
import sys
import types

ENV = "KVBOUND_COVERAGE"
CONNECTOR_CODE = ("vllm/distributed/kv_transfer/kv_connector/v1/offloading",
                  "vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py",
                  "vllm/v1/kv_offload")
GPU_ONLY = "gpu-only"

# Code of the connector that a CPU trace cannot run, by (file, function): "*" is the whole file,
# "Class.method" a method. A row whose file or function a release lacks is skipped there.
Unreached = collections.namedtuple("Unreached", "file function why reason")
_SPEC, _CW = "vllm/v1/kv_offload/cpu/spec.py", "vllm/distributed/kv_transfer/kv_connector/v1/offloading/worker.py"
_TIER_WORKER = ("the CPU tier's transfer worker: CPUOffloadingSpec.get_worker raises unless the platform"
                " is CUDA-alike or XPU (0.33.0 v1/kv_offload/cpu/spec.py:218-228); the trace runs its fake"
                " transfer engine in its place (kvbound/side/fakes.py, engine.py Engine.__init__)")
_OC = "vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py"
_LAYER_HOOK = ("called around each attention layer's forward by the model's attention wrapper (0.33.0"
               " model_executor/layers/attention/kv_transfer_utils.py:38-59); the trace runs no model forward"
               " (its fake runner, kvbound/side/fakes.py FakeModelRunner)")
UNREACHED = (
    Unreached("vllm/v1/kv_offload/cpu/gpu_worker.py", "*", GPU_ONLY,
              "the GPU<->CPU transfer handlers: CUDA streams and events, pinned buffers, the swap kernels"
              " (0.33.0 v1/kv_offload/cpu/gpu_worker.py:284-932 SingleDirectionOffloadingHandler,"
              " CPUOffloadingWorker)"),
    Unreached("vllm/v1/kv_offload/cpu/swap_blocks_triton.py", "*", GPU_ONLY,
              "a Triton GPU kernel (0.33.0 v1/kv_offload/cpu/swap_blocks_triton.py:25-74)"),
    Unreached("vllm/v1/kv_offload/cpu/host_register.py", "*", GPU_ONLY,
              "cudaHostRegister through the CUDA runtime (0.33.0 v1/kv_offload/cpu/host_register.py:24-104)"),
    Unreached("vllm/v1/kv_offload/cpu/shared_offload_region.py", "*", GPU_ONLY,
              "the host region the GPU transfer workers share, mapped only by CPUOffloadingSpec.create_worker"
              " when the platform is CUDA-alike or XPU (0.33.0 v1/kv_offload/cpu/spec.py:176-216)"),
    Unreached(_SPEC, "_all_workers_barrier", GPU_ONLY, _TIER_WORKER),
    Unreached(_SPEC, "CPUOffloadingSpec._uses_shared_region", GPU_ONLY, _TIER_WORKER),
    Unreached(_SPEC, "CPUOffloadingSpec.create_worker", GPU_ONLY, _TIER_WORKER),
    Unreached(_SPEC, "CPUOffloadingSpec.get_worker", GPU_ONLY, _TIER_WORKER),
    Unreached(_CW, "OffloadingConnectorWorker._init_worker", GPU_ONLY, _TIER_WORKER),
    Unreached(_CW, "OffloadingConnectorWorker.register_kv_caches", GPU_ONLY,
              "binds the model runner's GPU KV tensors and builds the transfer worker (0.33.0"
              " offloading/worker.py:68-218); " + _TIER_WORKER),
    Unreached("vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py",
              "OffloadingConnector.register_kv_caches", GPU_ONLY,
              "forwards to OffloadingConnectorWorker.register_kv_caches (0.33.0 offloading_connector.py:108-110)"),
    Unreached(_OC, "OffloadingConnector.wait_for_layer_load", GPU_ONLY, _LAYER_HOOK),
    Unreached(_OC, "OffloadingConnector.save_kv_layer", GPU_ONLY, _LAYER_HOOK),
    Unreached(_OC, "OffloadingConnector.get_required_kvcache_layout", GPU_ONLY,
              "asked by the attention backend when the model runner lays out its GPU KV cache (0.33.0"
              " v1/attention/backends/utils.py:369 -> kv_connector/utils.py:48-60); the trace builds no"
              " attention backend"),
)


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
    """Qualified name (``Class.method``) -> (first, last) line, decorators included, of every
    function and class of a module's source."""
    named = {}

    def visit(node, prefix):
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                first = min([ch.lineno] + [d.lineno for d in ch.decorator_list])
                named.setdefault(prefix + ch.name, (first, ch.end_lineno))
                visit(ch, prefix + ch.name + ".")
            else:
                visit(ch, prefix)

    visit(ast.parse(source), "")
    return named


IMPORT_CONTEXT = "import"


class _ImportContext(importlib.abc.MetaPathFinder):
    """While measuring: each module of the connector code is executed under coverage.py's
    dynamic context ``IMPORT_CONTEXT`` (and what it imports and calls meanwhile), so the
    lines its import runs are told from the lines a job runs. Finds nothing itself: it asks
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
        if spec.origin and os.path.realpath(spec.origin) in self.probe.paths and hasattr(spec.loader, "exec_module"):
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
        scope = self.hook.probe.scope  # a scoped job: an import runs inside it, wherever it is asked
        if scope is not None:
            return scope.run(self._exec, module)
        return self._exec(module)

    def _exec(self, module):
        hook = self.hook
        hook.depth += 1
        if hook.depth == 1:
            hook.probe.cov.switch_context(IMPORT_CONTEXT)
        try:
            self.inner.exec_module(module)
        finally:
            hook.depth -= 1
            if hook.depth == 0:
                hook.probe.cov.switch_context("")


# Defects a test plants in the scope (a job's ``coverage_plant``), to show the scoped job's lines
# are held to the whole job's: each one makes a scoped job miss lines the connector runs.
PLANTS = {"generators_outside": "a generator a scoped method returns is iterated outside the scope"
                                " (the connector's take_events, drained by vLLM's scheduler)"}


class Scope:
    """What a scoped job traces (``Probe.start(scoped=True)``): coverage.py's tracer of the main
    thread is on while ``depth`` > 0 (a count, so nested calls are one span: ``run``, the
    methods ``wrap`` scopes) and off in between, so the engine, the scheduler and kvbound's
    checks run untraced outside the connector's calls.

    On CPython 3.11 any trace function slows every frame while it is set, whatever it records
    (docs/benchmarks.md "Coverage"), so the switch removes it: ``CTracer.stop`` only clears the
    tracer's started flag and the tracer takes itself off at its next event
    (``PyEval_SetTrace(NULL, NULL)``, coverage/ctracer/tracer.c ``CTracer_trace``);
    ``CTracer.start`` sets it again. (``Collector.pause`` and ``resume`` would switch every
    thread's tracer from the calling thread: not used. The file-system tier's I/O threads keep
    the tracers coverage.py gave them when they started, traced whole, as in a whole job.)
    Every switch but ``narrow``'s is made in a frame of this module that is entered and left in
    one state, by C calls (no frame of theirs), so the tracer's stack of frames follows the
    interpreter's; while tracing is switched on, the frame that switched it is charged to the
    tracer's top entry, one of this file's (``narrow``'s: it left the tracer one entry deep),
    which records nothing: this file is not measured.

    What runs inside: the engine's build and close (``trace_worker.py``), every import of a
    module of the connector code (``_ImportingLoader``), every call of the methods ``wrap``
    scopes, and each step of a generator they return (a generator's body runs where it is
    iterated: the connector's ``take_events``, drained by vLLM's scheduler). tests/test_coverage.py
    holds a scoped job to the lines the same job traced whole runs, file by file."""

    def __init__(self, probe, tracer, plant=None):
        self.probe, self.tracer, self.plant = probe, tracer, plant
        self.depth = 1  # on: a job starts with its build

    def run(self, fn, *a, **k):
        """``fn(*a, **k)`` inside the scope. The switches are made in this frame (C calls of
        the tracer: no frame of theirs), which is entered and left in one state."""
        self.depth += 1
        if self.depth == 1:
            self.tracer.start()
        try:
            return fn(*a, **k)
        finally:
            self.depth -= 1
            if self.depth == 0:
                self.tracer.stop()

    def narrow(self):
        """The job's engine is built: from here only inside the scope. The one switch made
        otherwise (on since the job's start, off from here): the tracer's stack stays one
        entry deeper than the interpreter's, an entry of this file's, which records nothing."""
        self.depth -= 1
        if self.depth == 0:
            self.tracer.stop()

    def wrap(self, obj):
        """Each method of ``obj`` whose code is the connector code's (its class's and the
        classes' it inherits: the file decides) runs inside the scope: an instance attribute
        around the bound method. An instance attribute already there (another wrapper) is
        refused: each method is wrapped once."""
        for name in dir(type(obj)):
            fn = inspect.getattr_static(type(obj), name)
            code = getattr(getattr(fn, "__func__", fn), "__code__", None)
            if code is None or name.startswith("__") or not self.probe.measured(code.co_filename):
                continue
            if name in vars(obj):
                raise RuntimeError("%s.%s is wrapped already: the coverage scope wraps each method once"
                                   % (type(obj).__name__, name))
            setattr(obj, name, self._scoped(getattr(obj, name)))

    def _scoped(self, method):
        @functools.wraps(method)
        def scoped(*a, **k):
            out = self.run(method, *a, **k)
            if type(out) is types.GeneratorType and self.plant != "generators_outside":
                return self._generator(out)
            return out

        return scoped

    def _generator(self, gen):
        """``gen``'s items, each step of it (next, send, throw, close) inside the scope."""
        value = error = None
        while True:
            try:
                out = self.run(gen.send, value) if error is None else self.run(gen.throw, error)
            except StopIteration as stop:
                return stop.value
            value = error = None
            try:
                value = yield out
            except GeneratorExit:
                self.run(gen.close)
                raise
            except BaseException as e:  # noqa: BLE001 - thrown in: passed on to gen
                error = e


class Probe:
    """coverage.py over the connector code of this process's release."""

    def __init__(self):
        import coverage  # the deps lock pins it; only a worker started to measure imports it

        self.root = release_root()
        self.files = connector_files(self.root)
        self.cov = coverage.Coverage(data_file=None, config_file=False, branch=False,
                                     include=[os.path.join(self.root, f) for f in self.files])
        self.paths = {os.path.join(self.root, f) for f in self.files}
        self.imported = {}  # relpath -> the lines that ran while its module was imported
        self._static = {}  # relpath -> (reporter, statements, gpu_only)
        self._hook = _ImportContext(self)
        self._measured = {}  # a code object's file name -> whether it is of the connector code
        self.scope = None  # the Scope of a scoped job, while it runs

    def start(self, scoped=False, plant=None):
        """Start measuring; ``scoped``: traced only inside ``self.scope`` (``Scope``), which is
        on until its ``narrow``; ``plant``: a row of ``PLANTS`` (tests only)."""
        if plant is not None and plant not in PLANTS:
            raise ValueError("unknown coverage plant %r: kvbound/side/cover.py PLANTS has %s"
                             % (plant, ", ".join(PLANTS)))
        self.cov.erase()
        self.cov.start()
        self.scope = None
        if scoped:
            tracer = self.cov._collector.tracers[0]  # Collector.start's: the calling (main) thread's
            if type(tracer).__name__ != "CTracer":  # the switch's semantics (Scope) are the C tracer's
                self.cov.stop()
                raise RuntimeError("coverage.py runs its %s, not its CTracer" % type(tracer).__name__)
            self.scope = Scope(self, tracer, plant)
        sys.meta_path.insert(0, self._hook)

    def measured(self, filename):
        """Whether code of ``filename`` (a code object's) is of the connector code."""
        got = self._measured.get(filename)
        if got is None:
            got = self._measured[filename] = os.path.realpath(filename) in self.paths
        return got

    def stop(self, at_import=False):
        """Stop measuring; the lines that ran since ``start``, per file, with the lines every
        module imported so far ran at its import. ``at_import``: all of them are import-time."""
        sys.meta_path.remove(self._hook)
        self.scope = None
        self.cov.stop()
        data = self.cov.get_data()
        out = {}
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
        its functions, and its statements in ``UNREACHED`` code."""
        if rel not in self._static:
            from coverage.python import PythonFileReporter

            path = os.path.join(self.root, rel)
            reporter = PythonFileReporter(path, self.cov)
            statements = set(reporter.lines())
            with open(path) as f:
                named = spans(f.read())
            gpu = set()
            for row in UNREACHED:
                if row.file == rel and row.why == GPU_ONLY:
                    first, last = (min(statements, default=0), max(statements, default=0)) \
                        if row.function == "*" else named.get(row.function, (0, -1))
                    gpu.update(ln for ln in statements if first <= ln <= last)
            self._static[rel] = (reporter, statements, gpu)
        return self._static[rel]

    def report(self, ran):
        """The job's coverage, per file: statements, executed and gpu_only, sorted line numbers."""
        out = {}
        for rel in self.files:
            _, statements, gpu = self.static(rel)
            out[rel] = {"statements": sorted(statements), "executed": sorted(ran.get(rel, ())),
                        "gpu_only": sorted(gpu)}
        return out


def probe_from_environment():
    """A Probe when the worker was started to measure (``ENV``), else None."""
    return Probe() if os.environ.get(ENV) == "1" else None
