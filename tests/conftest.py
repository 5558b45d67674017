"""What every test file shares: where the repository's data lies, and the CLI as a user runs it.

The tests run against whichever kvbound is installed (editable in a checkout; the built
wheel in CI's clean venv), so nothing here reaches into the source tree for code: only
for data (examples/, corpus/, tests/data/).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
CORPUS = ROOT / "corpus"
DATA = ROOT / "tests" / "data"

# The console script installed beside this interpreter; `python -m kvbound` where there is
# none. Never `python -m` from ROOT: the source tree's kvbound/ would shadow the installed one.
_SCRIPT = Path(sys.executable).with_name("kvbound.exe" if os.name == "nt" else "kvbound")
KVBOUND = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-P", "-m", "kvbound"]


def kvbound(*args, cwd=ROOT, timeout=300) -> subprocess.CompletedProcess:
    """Run ``kvbound ARGS...`` in a subprocess: real exit code, stdout and stderr as text."""
    return subprocess.run([*KVBOUND, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=timeout)


def release_env_for(version: str):
    """The prepared environment (``ReleaseEnv``) of a real vLLM release, for a test that drives it:
    the one policy of every real-vLLM test. Outside CI a release not yet prepared skips the test
    with the reason (``kvbound conform --vllm X`` prepares it); in CI (``CI=true``) it is prepared
    here, so a real-vLLM test never skips there (a release that cannot be prepared fails it)."""
    from kvbound.conform.prepare import is_prepared, prepare_release

    if not is_prepared(version) and not os.environ.get("CI"):
        pytest.skip(f"vllm {version} is not prepared (kvbound conform --vllm {version} prepares it)")
    return prepare_release(version, None)


@pytest.fixture
def prepared():
    """``prepared(version)``: ``release_env_for`` as a fixture."""
    return release_env_for


@pytest.fixture(scope="module")
def workers():
    """``workers(version)``: (env, trace worker) of a real release, one worker process per release
    for the whole module (importing vLLM is slow); the release as ``release_env_for`` gives it."""
    from kvbound.trace import runner

    started = {}

    def get(version):
        if version not in started:
            env = release_env_for(version)
            started[version] = (env, runner.start_worker(env))
        return started[version]
    yield get
    for _, w in started.values():
        w.stop()
