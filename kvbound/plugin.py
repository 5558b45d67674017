"""kvbound as a vLLM plugin: capture and live checks in a serving engine, no code change.

``pip install kvbound`` beside vLLM registers ``register`` under vLLM's
``vllm.general_plugins`` entry-point group (pyproject.toml). vLLM calls every general
plugin in each process it starts, the engine core (``EngineCore.__init__``) and each
worker (``WorkerWrapperBase``) included, before it builds the scheduler; docs/plugin.md
lists the lines per release. ``VLLM_PLUGINS`` (a comma list of plugin names) filters
them as for any plugin.

``register`` does nothing unless one of these is set:

* ``KVBOUND_CAPTURE=FILE``: every ``update_state_after_alloc`` call of the
  ``OffloadingConnector`` that loads is appended to FILE as one kvbound case
  (``side.capture``), before vLLM plans it; replay with ``kvbound plan`` or
  ``kvbound conform``.
* ``KVBOUND_MONITOR=1``: every such call is checked as ``kvbound trace`` checks it
  (``trace.callcheck.check_call``: vLLM's load plan against the spec of the running
  release, and the premises of the proofs). Each violation is one WARNING line on the
  ``kvbound`` logger; nothing is raised into vLLM, and an exception vLLM itself raises
  goes on unchanged after it is described.

Idempotent (both processes, or a second ``load_general_plugins``, may call it), and a
release without the connector is one line, not an error.
"""

from __future__ import annotations

import logging
import os

CAPTURE_VAR = "KVBOUND_CAPTURE"
MONITOR_VAR = "KVBOUND_MONITOR"
logger = logging.getLogger("kvbound")

_state = {"release": None, "handler": None, "installed": None}


def _on(value: str | None) -> bool:
    return (value or "").strip().lower() not in ("", "0", "false", "no", "off")


def _ensure_handler() -> None:
    """The ``kvbound`` lines reach stderr when nothing else takes them: vLLM configures its
    own ``vllm`` logger, not the root, so without a handler here only WARNING+ would show,
    unprefixed. A deployment that configures ``kvbound`` or the root logger keeps its own."""
    if logger.handlers or logging.getLogger().handlers or _state["handler"] is not None:
        return
    h = logging.StreamHandler()
    h.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [kvbound] %(message)s"))
    logger.addHandler(h)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    _state["handler"] = h


def register() -> None:
    """vLLM's ``vllm.general_plugins`` entry point (``kvbound.plugin:register``)."""
    path = os.environ.get(CAPTURE_VAR) or None
    monitor = _on(os.environ.get(MONITOR_VAR))
    if not (path or monitor) or _state["installed"] == (path, monitor):
        return  # off, or done in this process already (a second load_general_plugins)
    _ensure_handler()
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import (
            OffloadingConnectorScheduler,
        )
    except Exception as e:  # noqa: BLE001 - a release without the connector: say so, go on
        logger.warning("kvbound: vLLM's OffloadingConnectorScheduler is not importable here (%s: %s);"
                       " %s and %s do nothing in this process", type(e).__name__, e, CAPTURE_VAR, MONITOR_VAR)
        return
    observer = monitor_call if monitor and _monitored_release() else None
    from kvbound.side import capture

    try:
        capture.install(path, OffloadingConnectorScheduler, observer)
    except Exception as e:  # noqa: BLE001 - never into vLLM
        logger.warning("kvbound: could not wrap OffloadingConnectorScheduler (%s: %s); nothing captured",
                       type(e).__name__, e)
        return
    _state["installed"] = (path, monitor)
    logger.info("kvbound: %s in pid %d (vllm %s)", " and ".join(
        w for w, on in ((f"capturing loading calls to {path}", path), ("monitoring them", observer)) if on),
        os.getpid(), _vllm_version())


def _vllm_version() -> str:
    try:
        import vllm

        return str(vllm.__version__)
    except Exception:  # noqa: BLE001
        return "?"


def _monitored_release() -> str | None:
    """The release whose spec judges the calls; None (said once) when kvbound has none for it,
    or when the checks cannot be imported."""
    if _state["release"] is None:
        version = _vllm_version()
        try:
            from kvbound.spec import release_features
            from kvbound.trace import callcheck  # noqa: F401 - the checks, imported once here

            release_features(version)
            _state["release"] = version
        except Exception as e:  # noqa: BLE001 - UnsupportedVersion, or a missing dependency
            logger.warning("kvbound: not monitoring vllm %s (%s: %s); capture is unaffected",
                           version, type(e).__name__, e)
            _state["release"] = ""
    return _state["release"] or None


def monitor_call(sched, request, record, exc) -> None:
    """``side.capture``'s observer: one call checked, each violation one WARNING line."""
    from kvbound.trace.callcheck import check_call

    release = _monitored_release()
    if release is None:
        return
    if exc is not None:
        from kvbound.side.sidecar import assert_site

        record = dict(record, assert_site=assert_site(exc))
    verdict, found = check_call(release, record)
    where = "vllm %s request %s (case %s)" % (release, request.request_id, record["case"].get("name"))
    for kind, detail in found:
        logger.warning("kvbound monitor: %s: %s: %s", where, kind, _one_line(_describe(kind, detail)))
    if exc is not None and not found:
        logger.warning("kvbound monitor: %s: vLLM raised %s in update_state_after_alloc, as the spec of"
                       " this release predicts (verdict %s)", where, _one_line(record.get("error")), verdict)


def _describe(kind: str, detail: dict) -> str:
    if kind == "plan:spec_disagreement":
        real, spec = detail["real"], detail["spec"]
        return "; ".join("%s: vLLM %s, spec %s" % (f, _field(real, f), _field(spec, f)) for f in detail["diff"])
    if detail.get("group_index") is not None:
        return "group %s: %s" % (detail["group_index"], detail.get("detail"))
    return str(detail.get("detail"))


def _field(plan: dict, name: str):
    if name == "outcome" and plan.get("outcome") != "ok":
        return "%s (%s)" % (plan.get("outcome"), plan.get("assertion") or plan.get("error"))
    return plan.get(name)


def _one_line(text) -> str:
    return " ".join(str(text).split())
