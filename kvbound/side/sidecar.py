"""What every worker that runs inside a vLLM release's side venv shares.

``conform_worker.py`` (one ``update_state_after_alloc`` per case) and ``trace_worker.py``
(the engine-core scheduler on a workload) run with ``PYTHONPATH=<release tree>`` in the
deps venv, where kvbound is not installed, as part of the side package. From here: the
protocol loop (``serve``), the failing assert of an exception (``assert_site``), portable
vLLM paths (``portable_path``) and whether an exception was raised by vLLM or by
kvbound's own harness (``raised_in_harness``). Booting vLLM on CPU is ``adapter.py``'s.
Also what ties a process's life to its parent's (``die_with_parent``), which the host's
campaign pool uses too: a worker never outlives the process that started it.

Standard library only.
"""

import ast
import json
import os
import signal
import sys
import threading
import time
import traceback

PROTOCOL = 1
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# set by the host (kvbound/conform/runner.py Worker.start): who started this worker, and how
# often it says how far its start has come (kvbound/options.py ProcessOptions)
PARENT_ENV, HEARTBEAT_ENV = "KVBOUND_PARENT_PID", "KVBOUND_HEARTBEAT_S"
KVBOUND_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../kvbound


def send(out, obj):
    out.write(json.dumps(obj) + "\n")
    out.flush()


def die_with_parent(parent_pid=None, sig=signal.SIGKILL):
    """Have the kernel send ``sig`` to this process when the thread that started it ends
    (Linux ``prctl(PR_SET_PDEATHSIG)``), however it ends (``kill -9`` included); with
    ``parent_pid``, end now if that parent is already gone. True when tied; elsewhere
    nothing is tied (a worker then ends at its next read of stdin, which its parent held)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        tied = ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
    if tied and parent_pid is not None and os.getppid() != parent_pid:
        os._exit(128 + int(sig))  # the parent ended before the tie was made
    return tied


class Heartbeat:
    """While the worker starts (importing vLLM: seconds on an idle machine, minutes on a
    loaded one), a line every ``interval`` seconds saying how far it has come: its CPU
    seconds and the modules imported, the last one named. The host waits while these grow
    and gives up only when they stop (kvbound/conform/runner.py ``Worker.start``)."""

    def __init__(self, proto, interval):
        self.proto, self.interval = proto, interval
        self.lock, self.done = threading.Lock(), threading.Event()
        self.thread = threading.Thread(target=self._beat, name="kvbound-heartbeat", daemon=True)

    def _beat(self):
        while not self.done.wait(self.interval):
            try:
                names = list(sys.modules)
            except RuntimeError:  # the dict changed size under us: next beat
                continue
            with self.lock:
                if not self.done.is_set():
                    send(self.proto, {"starting": "import", "cpu_s": round(time.process_time(), 3),
                                      "modules": len(names), "last_module": names[-1] if names else None})

    def __enter__(self):
        if self.interval > 0:
            self.thread.start()
        return self

    def __exit__(self, *exc):
        with self.lock:
            self.done.set()
        return False


def serve(make_release, handle, hello_extra=None):
    """The worker protocol: stdout is the protocol channel (whatever vLLM prints goes to
    stderr); heartbeats while the release loads (``Heartbeat``), a hello line (or one
    ``fatal: import`` line), then one JSON message per stdin line -> ``handle(release,
    message)``'s JSON result, tagged with the message id. The worker dies with its parent
    (``die_with_parent``)."""
    parent = os.environ.get(PARENT_ENV)
    if parent:
        die_with_parent(int(parent))
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        with Heartbeat(proto, float(os.environ.get(HEARTBEAT_ENV) or 0)):
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


def portable_path(filename):
    """A vLLM source path relative to the release tree (``vllm/v1/core/block_pool.py``);
    kvbound's own files relative to the kvbound package (``kvbound/side/fakes.py``);
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


_PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cover.py")


def portable_traceback(exc, limit=4000):
    """The traceback with every file named by ``portable_path`` (nothing of this machine), less
    the frames of the coverage probe's (``cover.py``: its loader's ``exec_module`` around the
    import of a module of the connector code is the measurement's, absent from the same run
    unmeasured) but for an innermost one (the probe itself raised: a harness fault)."""
    lines = []
    frames = traceback.extract_tb(exc.__traceback__)
    for i, fr in enumerate(frames):
        if os.path.abspath(fr.filename) == _PROBE and i < len(frames) - 1:
            continue
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
