"""Prepare, once per machine, what a release's worker needs: a venv with vLLM's
import-time dependencies and the release's unpacked ``vllm/*.py`` tree.

Both live under the user's cache directory and are reused offline afterwards;
the compiled ``.so`` files and triton are skipped, since the scheduler is pure
Python and only ``vllm._C`` (a warning) misses them. Every failure says what to do.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from kvbound.errors import PrepareError

LOCK_NAME = "vllm-import-deps.lock"
DONE = ".kvbound-complete"  # written last: a directory without it is a failed half-prepare




@dataclass(frozen=True)
class ReleaseEnv:
    """Where one release's worker runs: the interpreter and the ``PYTHONPATH`` tree."""

    version: str
    python: str
    tree: str | None  # None: the vllm importable in ``python``'s own environment


def cache_dir() -> Path:
    """``$KVBOUND_CACHE`` or ``${XDG_CACHE_HOME:-~/.cache}/kvbound``."""
    if os.environ.get("KVBOUND_CACHE"):
        return Path(os.environ["KVBOUND_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kvbound"


def lock_text() -> str:
    return resources.files("kvbound.conform").joinpath(LOCK_NAME).read_text()


def lock_requirements(text: str | None = None) -> list[str]:
    """The pinned list as pip takes it: ``torch==2.13.0+cpu`` becomes ``torch==2.13.0``
    (the CPU wheel pip finds locally under that name; a bare index pick is a CUDA build)."""
    reqs = []
    for line in (text if text is not None else lock_text()).splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            reqs.append(re.sub(r"^(torch==[^+\s]+)\+cpu$", r"\1", line))
    return reqs


def _say(progress, msg: str) -> None:
    if progress:
        progress(msg)


def _pip_failure(what: str, out: str, hint: str, unreachable: bool = False) -> PrepareError:
    tail = "\n".join(out.strip().splitlines()[-6:])
    low = out.lower()
    if unreachable or any(s in low for s in ("network is unreachable", "temporary failure in name resolution",
                              "failed to establish a new connection", "connection refused",
                              "max retries exceeded", "name or service not known")):
        hint = ("no network: pip could not reach a package index that has it. Prepare once on a machine with"
                f" network (the result is cached under {cache_dir()}), or point PIP_INDEX_URL /"
                " PIP_FIND_LINKS at a local mirror")
    return PrepareError(f"{what} failed: {hint}\n--- pip said (last lines) ---\n{tail}")


def _download_failure(version: str, out: str) -> PrepareError:
    """Tell "no such release" from "no index reachable": pip lists the versions it saw,
    and vllm has many, so an empty list means the index was not reached."""
    m = re.search(r"\(from versions: ([^)]*)\)", out)
    seen = [v.strip() for v in m.group(1).split(",")] if m else []
    if m and seen and seen != ["none"]:
        near = [v for v in seen if re.fullmatch(r"\d+\.\d+\.\d+", v)][-6:]
        return PrepareError(
            f"vllm=={version} is not on the package index: pick a released version"
            f" (the newest there: {', '.join(near)}), e.g. --vllm 0.29.0 or --vllm 0.33.0")
    return _pip_failure(
        f"downloading vllm=={version}", out,
        "see pip's message; retry, or put the wheel in the wheels directory by hand", unreachable=bool(m))


def deps_venv(progress=print) -> Path:
    """The venv holding vLLM's import-time dependencies, keyed by the lock's digest."""
    reqs = lock_requirements()
    digest = hashlib.sha256("\n".join(reqs).encode()).hexdigest()[:12]
    root = cache_dir() / f"deps-{digest}"
    py = root / "bin" / "python"
    if (root / DONE).exists() and py.exists():
        return root
    tmp = root.with_name(root.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    _say(progress, f"kvbound conform: preparing vLLM import deps venv ({len(reqs)} pinned packages,"
                   f" ~1.3 GB, about 1-2 min) in {root}")
    r = subprocess.run([sys.executable, "-m", "venv", str(tmp)], capture_output=True, text=True)
    if r.returncode:
        raise PrepareError(f"creating a venv at {tmp} failed: {r.stderr.strip()}"
                           " (install the python3-venv package, or check the disk)")
    req_file = tmp / "requirements.lock"
    req_file.write_text("\n".join(reqs) + "\n")
    r = subprocess.run(
        [str(tmp / "bin" / "python"), "-m", "pip", "install", "--no-deps", "--no-input",
         "--disable-pip-version-check", "-q", "-r", str(req_file)],
        capture_output=True, text=True,
    )
    if r.returncode:
        raise PrepareError(str(_pip_failure(
            "installing vLLM's import deps", r.stdout + r.stderr,
            f"see pip's message; the pinned list is kvbound/conform/{LOCK_NAME}"
            " (torch must resolve to the CPU build 2.13.0)")))
    (tmp / DONE).write_text(f"{digest}\n")
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)
    _say(progress, f"kvbound conform: deps venv ready ({time.monotonic() - t0:.0f} s)")
    return root


def release_tree(version: str, python: Path, progress=print) -> Path:
    """``vllm/*.py`` of release ``version``, unpacked from its PyPI wheel (no ``.so``)."""
    if not re.fullmatch(r"\d+\.\d+\.\d+(\.post\d+|rc\d+)?", version):
        raise PrepareError(f"--vllm {version!r}: give a released version like 0.29.0")
    root = cache_dir() / f"vllm-{version}"
    if (root / DONE).exists() and (root / "vllm" / "__init__.py").exists():
        return root
    t0 = time.monotonic()
    wheels = cache_dir() / "wheels" / version
    wheels.mkdir(parents=True, exist_ok=True)
    whl = sorted(wheels.glob(f"vllm-{version}-*.whl"))
    if not whl:
        _say(progress, f"kvbound conform: downloading vllm=={version} wheel (~330 MB) into {wheels}")
        cmd = [str(python), "-m", "pip", "download", "--no-deps", "--no-input",
               "--disable-pip-version-check", "-q", "--only-binary=:all:",
               f"vllm=={version}", "-d", str(wheels)]
        extra = os.environ.get("KVBOUND_VLLM_FIND_LINKS")  # a local wheel directory, e.g. a CI cache
        if extra:
            cmd[4:4] = ["--find-links", extra]
        r = subprocess.run(cmd, capture_output=True, text=True)
        out = r.stdout + r.stderr
        if r.returncode:
            shutil.rmtree(wheels, ignore_errors=True)
            raise _download_failure(version, out)
        whl = sorted(wheels.glob(f"vllm-{version}-*.whl"))
        if not whl:
            raise PrepareError(f"pip reported success but left no vllm-{version}-*.whl in {wheels}")
    _say(progress, f"kvbound conform: unpacking vllm/*.py of {whl[-1].name}")
    tmp = root.with_name(root.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with zipfile.ZipFile(whl[-1]) as z:
            for name in z.namelist():
                if name.startswith("vllm/") and name.endswith(".py"):
                    z.extract(name, tmp)
    except (zipfile.BadZipFile, OSError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        whl[-1].unlink(missing_ok=True)
        raise PrepareError(f"unpacking {whl[-1]} failed ({e}); the bad wheel was removed: run again") from None
    (tmp / DONE).write_text(f"{whl[-1].name}\n")
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)
    if not os.environ.get("KVBOUND_KEEP_WHEELS"):
        shutil.rmtree(wheels, ignore_errors=True)  # the tree is all we run; 330 MB back
    _say(progress, f"kvbound conform: vllm {version} tree ready ({time.monotonic() - t0:.0f} s)")
    return root


def is_prepared(version: str) -> bool:
    digest = hashlib.sha256("\n".join(lock_requirements()).encode()).hexdigest()[:12]
    return ((cache_dir() / f"deps-{digest}" / DONE).exists()
            and (cache_dir() / f"vllm-{version}" / DONE).exists())


def prepare_release(version: str, progress=print) -> ReleaseEnv:
    venv = deps_venv(progress)
    tree = release_tree(version, venv / "bin" / "python", progress)
    return ReleaseEnv(version, str(venv / "bin" / "python"), str(tree))
