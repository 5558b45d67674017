"""One worker process per release, fed case by case; a dead worker costs one case.

The worker imports vLLM once (~8 s), so every case of a release goes to the same
process. If it dies or hangs on a case, that case is reported as a fault with
the worker's stderr, a fresh worker starts, and the run goes on.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvbound.errors import WorkerError
from kvbound.options import WORKERS
from kvbound.spec import case_to_dict

from .prepare import PrepareError, ReleaseEnv

# the side package's entry script (kvbound/side/worker.py), run as "worker.py <role>"
WORKER = Path(__file__).parent.parent / "side" / "worker.py"
MAX_CRASHES_IN_A_ROW = 3


class Worker:
    def __init__(self, env: ReleaseEnv, role: str = "conform"):
        self.env = env
        self.role = role  # what the entry script serves: conform's cases, or kvbound trace's jobs
        self.proc: subprocess.Popen | None = None
        self.hello: dict | None = None
        self._err = tempfile.TemporaryFile(mode="w+")
        self.extra_env: dict = {}  # what this role's worker is started with besides (trace: coverage)
        self._buf = b""  # what the worker wrote past the last line read
        self._eof = False  # its stdout ended

    def start(self) -> dict:
        """Start the process and wait for its hello. The wait has no wall-clock limit: while
        the worker loads the release it sends a heartbeat (``sidecar.Heartbeat``: its CPU
        seconds, the modules imported), and start gives up only when the process has died or
        its heartbeats have shown no progress for ``WORKERS.start_idle_s`` (a loaded machine
        slows the import; it does not stop it). The error says what it was waiting for."""
        from kvbound.side.sidecar import HEARTBEAT_ENV, PARENT_ENV

        pyenv = dict(os.environ, PYTHONUNBUFFERED="1", VLLM_LOGGING_LEVEL="ERROR",
                     VLLM_TARGET_DEVICE="cpu", TOKENIZERS_PARALLELISM="false",
                     PYTHONHASHSEED=WORKERS.hash_seed,  # a seeded trace repeats itself (options.py)
                     **{PARENT_ENV: str(os.getpid()), HEARTBEAT_ENV: str(WORKERS.heartbeat_s)})
        if self.env.tree:
            pyenv["PYTHONPATH"] = self.env.tree
        pyenv.update(self.extra_env)
        # -P keeps the worker's own directory (kvbound's sources) off sys.path.
        self.proc = subprocess.Popen(
            [self.env.python, "-P", str(WORKER), self.role], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._err, env=pyenv,
        )
        msg, waiting = self._await_hello()
        if msg is None or "hello" not in msg:
            code = self._exit_code()
            self.stop()
            if msg and msg.get("fatal") == "import":
                raise WorkerError(
                    f"vllm {self.env.version} failed to import in {self.env.python}"
                    f" (PYTHONPATH={self.env.tree}): {msg.get('error')}.\n"
                    "If a module is missing, the pinned dependency list"
                    " (kvbound/conform/vllm-import-deps.lock) does not fit this release:"
                    " add the module there and run again (the deps venv is rebuilt when the list"
                    f" changes). Traceback tail:\n{msg.get('traceback', '')[-1500:]}")
            why = (f"it exited with code {code}" if code is not None else
                   f"it made no progress for {WORKERS.start_idle_s:.0f} s")
            raise WorkerError(
                f"the worker for vllm {self.env.version} did not start: {why}, {waiting}."
                f" Its stderr ends:\n{self.stderr_tail() or '(nothing)'}")
        self.hello = msg
        return msg

    def _await_hello(self) -> tuple[dict | None, str]:
        """(the first message that is not a heartbeat, or None, what the wait was on)."""
        t0 = mark = time.monotonic()
        seen = (-1.0, -1)  # (CPU seconds, modules) at the last progress
        waiting = "starting Python (no heartbeat yet)"
        while True:
            line = self._readline(max(1.0, WORKERS.start_idle_s - (time.monotonic() - mark)))
            msg = _parse(line)
            if msg is None:
                return None, waiting  # died (EOF), or silent past the idle window
            if "starting" not in msg:
                return msg, waiting
            now = (float(msg.get("cpu_s") or 0.0), int(msg.get("modules") or 0))
            if now[0] >= seen[0] + WORKERS.start_progress_cpu_s or now[1] > seen[1]:
                seen, mark = now, time.monotonic()
            elif time.monotonic() - mark > WORKERS.start_idle_s:
                return None, waiting
            waiting = (f"importing vllm ({now[1]} modules so far, the last {msg.get('last_module')};"
                       f" {now[0]:.1f} CPU s in {time.monotonic() - t0:.0f} s)")

    def _exit_code(self) -> int | None:
        """The worker's exit code once its output ended (it is exiting), else None (alive)."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=10) if self._eof else self.proc.poll()
        except subprocess.TimeoutExpired:
            return None

    def _readline(self, timeout: float) -> str | None:
        """One line from the worker: None when it sent nothing for ``timeout`` seconds, ""
        at EOF. The wait is for the worker's next bytes, not for the whole line: a large
        result (a long segment's lookups run to megabytes) takes as long as it takes."""
        assert self.proc and self.proc.stdout
        fd = self.proc.stdout.fileno()
        parts = [self._buf]
        while b"\n" not in parts[-1]:
            if not select.select([fd], [], [], timeout)[0]:
                self._buf = b"".join(parts)
                return None
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                self._eof, self._buf = True, b""
                return b"".join(parts).decode(errors="replace")
            parts.append(chunk)
        line, _, self._buf = b"".join(parts).partition(b"\n")
        return line.decode(errors="replace") + "\n"

    def send(self, msg: dict) -> None:
        """One message to the worker (a dead one is seen at the next read)."""
        assert self.proc and self.proc.stdin
        try:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def stderr_tail(self, n: int = 2000) -> str:
        self._err.flush()
        self._err.seek(0)
        return self._err.read()[-n:]

    def run(self, case_id: int, case: dict) -> dict:
        self.send({"id": case_id, "case": case})
        line = self._readline(WORKERS.case_timeout_s)
        if line is None:
            self.stop()
            return {"outcome": "worker_timeout", "timeout_s": WORKERS.case_timeout_s}
        msg = _parse(line)
        if msg is None:  # EOF: the process died
            code = self.proc.wait(timeout=10)
            tail = self.stderr_tail()
            self.proc = None
            return {"outcome": "worker_crash", "exit_code": code, "stderr_tail": tail}
        return msg

    def stop(self) -> None:
        if self.proc is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def _parse(line: str | None) -> dict | None:
    if not line:
        return None
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        return {"outcome": "worker_crash", "exit_code": None, "stderr_tail": f"garbled line: {line[:500]}"}


def run_release(env: ReleaseEnv, cases: list, progress=None) -> tuple[dict, list[dict]]:
    """(hello, [raw result per case]) for one release; a worker that dies is restarted."""
    w = Worker(env)
    t0 = time.monotonic()
    hello = w.start()
    if progress:
        progress(f"kvbound conform: vllm {hello['vllm']} imported ({time.monotonic() - t0:.0f} s);"
                 f" replaying {len(cases)} cases")
    out = []
    step = max(1, len(cases) // 5)
    crashes = 0  # in a row: a worker that dies on every case is not restarted forever
    try:
        for i, case in enumerate(cases):
            if crashes >= MAX_CRASHES_IN_A_ROW:
                out.append({"outcome": "worker_crash", "exit_code": None, "stderr_tail":
                            f"not run: the worker died on {crashes} cases in a row; fix that first"
                            f" (the last stderr is on the earlier cases)"})
                continue
            if not w.alive:
                w = Worker(env)
                w.start()
            res = w.run(i, _case_dict(case))
            crashes = crashes + 1 if res.get("outcome") in ("worker_crash", "worker_timeout") else 0
            out.append(res)
            if progress and (i + 1) % step == 0 and i + 1 < len(cases):
                progress(f"kvbound conform: vllm {env.version}: {i + 1}/{len(cases)} cases")
    finally:
        w.stop()
    return hello, out


def _case_dict(case) -> dict:
    from kvbound.spec.lookup_case import LookupCase, lookup_case_to_dict

    return lookup_case_to_dict(case) if isinstance(case, LookupCase) else case_to_dict(case)


def current_env() -> ReleaseEnv:
    """The vllm importable in this interpreter's environment, if any."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        v = version("vllm")
    except PackageNotFoundError:
        raise PrepareError(
            "no vllm is importable in this environment and no --vllm was given: name a release,"
            " e.g. `kvbound conform --vllm 0.29.0 --vllm 0.33.0` (prepared once under the cache"
            " directory, then reused offline)") from None
    return ReleaseEnv(v, sys.executable, None)
