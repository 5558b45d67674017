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
    """The prepared environment of a real vLLM release (``kvbound.conform.prepare``), for a test that
    drives it. Outside CI an unprepared release skips the test with the command that prepares it; in CI
    (``CI`` set, as .ci/run does after .ci/conform prepared the releases) it FAILS: a skip there would
    hide a gap. Every real-vLLM test goes through here (one policy)."""
    import pytest

    from kvbound.conform import prepare

    if not prepare.is_prepared(version):
        if os.environ.get("CI"):
            pytest.fail(f"vllm {version} is not prepared under {prepare.cache_dir()} in CI; .ci/conform must "
                        "prepare it before the tests run")
        pytest.skip(f"vllm {version} is not prepared under {prepare.cache_dir()}: run "
                    f"`kvbound conform --vllm {version} examples/` once")
    return prepare.prepare_release(version, progress=None)

