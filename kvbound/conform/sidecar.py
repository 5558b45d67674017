"""What every worker script that runs inside a vLLM release's side venv shares.

``kvbound/conform/worker.py`` (one ``update_state_after_alloc`` per case) and
``kvbound/trace/worker.py`` (the engine-core scheduler on a workload) run with
``PYTHONPATH=<release tree>`` in the deps venv, where kvbound is not installed. Each
loads this module by path (``load_by_path``) and gets from it: the protocol loop
(``serve``), the quiet environment vLLM is imported in, a release's dataclass built
from the fields it has (``build``), the failing assert of an exception
(``assert_site``), portable vLLM paths (``portable_path``) and whether an exception was
raised by vLLM or by kvbound's own harness (``raised_in_harness``).

Standard library only.
"""

import ast
import dataclasses
import importlib.util
import json
import os
import sys
import traceback
import types
import warnings

PROTOCOL = 1
KVBOUND_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../kvbound


def load_by_path(name, path):
    """The module at ``path``, registered in ``sys.modules`` as ``name`` (kvbound itself is
    not importable in a release's venv)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_conform(name):
    """A module of kvbound/conform (``capture``, ...) by path."""
    return load_by_path("kvbound_conform_" + name, os.path.join(KVBOUND_ROOT, "conform", name + ".py"))


def quiet_environment():
    """What vLLM is imported under: errors only, no hub, no warnings, and the einops stub."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    warnings.filterwarnings("ignore")
    stub_einops()


def stub_einops():
    """0.29's scheduler import chain reaches vit_attn_wrappers, which imports einops
    (pure Python, not in the import-deps lock); nothing here calls it."""
    try:
        import einops  # noqa: F401
    except ImportError:
        m = types.ModuleType("einops")
        m.rearrange = m.repeat = m.reduce = m.einsum = m.pack = m.unpack = (
            lambda *a, **k: (_ for _ in ()).throw(RuntimeError("einops stub")))
        sys.modules["einops"] = m


def send(out, obj):
    out.write(json.dumps(obj) + "\n")
    out.flush()


def serve(make_release, handle, hello_extra=None):
    """The worker protocol: stdout is the protocol channel (whatever vLLM prints goes to
    stderr); a hello line (or one ``fatal: import`` line), then one JSON message per
    stdin line -> ``handle(release, message)``'s JSON result, tagged with the message id."""
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        rel = make_release()
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which explains it
        send(proto, {"fatal": "import", "error": "%s: %s" % (type(e).__name__, e),
                     "traceback": traceback.format_exc()[-4000:], "python": sys.version})
        return 3
    hello = {"hello": PROTOCOL, "vllm": rel.version, "python": sys.version.split()[0]}
    hello.update(hello_extra(rel) if hello_extra else {})
    send(proto, hello)
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        res = handle(rel, msg)
        res["id"] = msg.get("id")
        send(proto, res)
    return 0


def fields(cls):
    if cls is None:
        return set()
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    return set(getattr(cls, "_fields", ())) | set(getattr(cls, "__annotations__", {}))


def build(cls, **kw):
    """A release's dataclass from the fields it has (releases add and drop fields)."""
    if dataclasses.is_dataclass(cls):
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in kw.items() if k in names}
    return cls(**kw)


def portable_path(filename):
    """A vLLM source path relative to the release tree (``vllm/v1/core/block_pool.py``);
    kvbound's own files relative to the kvbound package (``kvbound/trace/fakes.py``);
    anything else (the standard library, site-packages) by its last two components."""
    if not filename:
        return filename
    p = filename.replace(os.sep, "/")
    if os.path.abspath(filename).startswith(KVBOUND_ROOT + os.sep):
        return "kvbound/" + os.path.relpath(os.path.abspath(filename), KVBOUND_ROOT).replace(os.sep, "/")
    i = p.rfind("/vllm/")
    if i >= 0:
        return p[i + 1:]
    return "/".join(p.split("/")[-2:])


def portable_traceback(exc, limit=4000):
    """The traceback with every file named by ``portable_path`` (nothing of this machine)."""
    lines = []
    for fr in traceback.extract_tb(exc.__traceback__):
        lines.append('  File "%s", line %s, in %s\n    %s' % (portable_path(fr.filename), fr.lineno,
                                                           fr.name, (fr.line or "").strip()))
    lines.append("%s: %s" % (type(exc).__name__, exc))
    return "\n".join(lines)[-limit:]


def raised_in_harness(exc):
    """Whether kvbound's own code raised ``exc``: its innermost frame is a kvbound file.
    An exception raised inside vLLM (even when vLLM was called from one of kvbound's
    fakes or wrappers) is vLLM's."""
    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and os.path.abspath(frames[-1].filename).startswith(KVBOUND_ROOT + os.sep)


def assert_site(exc):
    """The failing ``assert`` statement: file (portable), line, function and its source text.

    The statement is read with ``ast`` from the source file, so a multi-line
    assert comes back whole and kvbound names it without guessing by line number.
    """
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return {"file": None, "line": None, "function": None, "statement": None}
    fr = frames[-1]
    site = {"file": portable_path(fr.filename), "line": fr.lineno, "function": fr.name,
            "statement": fr.line, "message": str(exc) or None}
    try:
        with open(fr.filename) as f:
            tree = ast.parse(f.read())
        best = None
        for node in ast.walk(tree):
            if isinstance(node, ast.Assert) and node.lineno <= fr.lineno <= (node.end_lineno or node.lineno):
                if best is None or node.lineno >= best.lineno:
                    best = node
        if best is not None:
            site["line"] = best.lineno
            site["statement"] = "assert " + ast.unparse(best.test)
    except (OSError, SyntaxError, ValueError):
        pass
    tb = exc.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    local = tb.tb_frame.f_locals
    gc = local.get("group_config")
    gi = getattr(gc, "group_idx", getattr(gc, "group_id", None))
    site["group_index"] = gi if isinstance(gi, int) else None
    site["values"] = {k: v for k, v in local.items() if type(v) is int}
    return site
