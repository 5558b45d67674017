"""The connector code a CPU trace cannot run, declared by (file, function) with the reason and the
vLLM lines: ``UNREACHED``. ``cover.py`` sends, per file, the statements of the rows that hold on
the release, by reason, so the host tells "not reachable here" from "not reached yet" without
reading vLLM (kvbound/trace/coverage.py, docs/trace.md "Coverage").

Part of the side package (standard library only).
"""

import collections

GPU_ONLY, NEEDS_EXTERNAL, NOT_ON_RELEASE = "gpu-only", "needs-external", "not-on-release"

# Code of the connector that a CPU trace cannot run, by (file, function): "*" is the whole file
# (a file ending in "/": every file under that directory), "Class.method" a method. ``why``:
# GPU_ONLY (CUDA), NEEDS_EXTERNAL (a library or service the host lacks), NOT_ON_RELEASE (no
# caller in the release's code from ``since`` on, a version tuple: the row applies only to a
# tree whose ``vllm.__version_tuple__`` is that release or later, never to an unversioned
# checkout). A row whose file or function a release lacks is skipped there.
Unreached = collections.namedtuple("Unreached", "file function why reason since", defaults=(None,))
_SPEC, _CW = "vllm/v1/kv_offload/cpu/spec.py", "vllm/distributed/kv_transfer/kv_connector/v1/offloading/worker.py"
_TIER_WORKER = ("the CPU tier's transfer worker: CPUOffloadingSpec.get_worker raises unless the platform"
                " is CUDA-alike or XPU (0.33.0 v1/kv_offload/cpu/spec.py:218-228); the trace runs its fake"
                " transfer engine in its place (kvbound/side/fakes.py, engine.py Engine.__init__)")
_OC = "vllm/distributed/kv_transfer/kv_connector/v1/offloading_connector.py"
_NO_TOUCH = ("no caller: nothing in vLLM calls an offloading manager's touch from 0.31.0 (0.30.0"
             " offloading/scheduler.py:720-739 _touch was the last; 0.33.0 tiering/manager.py:796-798 and"
             " cpu/manager.py:245 only forward it)")
_TM = "vllm/v1/kv_offload/tiering/manager.py"
_SERVED = ("the facade a secondary tier serves requests from outside the engine through: handed only to"
           " serve_external_requests (0.33.0 tiering/manager.py:421-427, :1096), which only the peer-to-peer and"
           " KVCR tiers override (tiering/p2p/manager.py, tiering/kvcr/manager.py; the example and file tiers keep"
           " the base's no-op, tiering/base.py:343-363)")
_POLLED = ("the tier-poll thread, started only for a tier that sets tolerates_off_thread_polling (0.33.0"
           " tiering/manager.py:295-301,312-316): the peer-to-peer tier alone (tiering/p2p/manager.py:230);"
           " every run starts and stops none through the early returns of _start_tier_poll_thread and"
           " _stop_tier_poll_thread (counted run), and their lines past those returns are this tier's")
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
    Unreached("vllm/v1/kv_offload/tiering/spec.py", "TieringOffloadingSpec.create_worker", GPU_ONLY,
              "the tiering spec's GPU<->CPU worker, built only by the get_worker it inherits; " + _TIER_WORKER),
    Unreached("vllm/v1/kv_offload/tiering/spec.py", "TieringOffloadingSpec._validate_canonical_refs", GPU_ONLY,
              "checks the GPU KV tensors' canonical mappings for create_worker (0.33.0 tiering/spec.py:521-577); "
              + _TIER_WORKER),
    Unreached(_CW, "OffloadingConnectorWorker._init_worker", GPU_ONLY, _TIER_WORKER),
    Unreached(_CW, "OffloadingConnectorWorker.register_kv_caches", GPU_ONLY,
              "binds the model runner's GPU KV tensors and builds the transfer worker (0.33.0"
              " offloading/worker.py:68-218); " + _TIER_WORKER),
    Unreached(_OC, "OffloadingConnector.register_kv_caches", GPU_ONLY,
              "forwards to OffloadingConnectorWorker.register_kv_caches (0.33.0 offloading_connector.py:108-110)"),
    # the secondary tiers beside the file-system one (0.33.0 v1/kv_offload/tiering/factory.py:146-174
    # registers example, fs, p2p, obj, kvcr); the trace runs fs (Layout.offload_spec "tiering-fs")
    Unreached("vllm/v1/kv_offload/tiering/obj/", "*", NEEDS_EXTERNAL,
              "the object-store tier: NIXL agents (vllm.distributed.nixl_utils, 0.33.0"
              " v1/kv_offload/tiering/obj/manager.py:12-13) and an S3-compatible object store"),
    Unreached("vllm/v1/kv_offload/tiering/p2p/", "*", NEEDS_EXTERNAL,
              "the peer-to-peer tier: NIXL transfers between vLLM instances (0.33.0"
              " v1/kv_offload/tiering/p2p/data/nixl.py:46-47) under a ZMQ control plane to its peers"
              " (p2p/control/zmq.py)"),
    Unreached("vllm/v1/kv_offload/tiering/kvcr/", "*", NEEDS_EXTERNAL,
              "the KVCR tier: the external kvcr package and its service (0.33.0"
              " v1/kv_offload/tiering/kvcr/manager.py:15-41 imports kvcr)"),
    *(Unreached(_TM, "_SecondaryTierFacingParent." + f, NEEDS_EXTERNAL, _SERVED)
      for f in ("on_new_request", "lookup", "create_store_job", "on_request_finished")),
    *(Unreached(_TM, "TieringOffloadingManager." + f, NEEDS_EXTERNAL, _POLLED)
      for f in ("_start_tier_poll_thread", "_stop_tier_poll_thread", "_tier_poll_loop", "poll_tiers")),
    # the connector's scheduler property (from 0.30.0): vLLM's own tests read it, nothing in the release does
    Unreached(_OC, "OffloadingConnector.scheduler", NOT_ON_RELEASE,
              "no caller: nothing in vLLM reads the OffloadingConnector's scheduler property (0.33.0"
              " offloading_connector.py:68-71; 0.30.0 - 0.33.0 trees searched for a connector's .scheduler"
              " and a getattr of \"scheduler\": none; the engine core's own scheduler is another object)",
              (0, 30, 0)),
    # the offloading manager's touch lost its one caller in 0.31.0: the connector scheduler's
    # _touch (0.30.0 offloading/scheduler.py:720-739) is gone, and a policy's recency comes from
    # on_store_miss / on_request_finished (0.31.0 cpu/policies/base.py:80-113)
    Unreached("vllm/v1/kv_offload/cpu/manager.py", "CPUOffloadingManager.touch", NOT_ON_RELEASE, _NO_TOUCH,
              (0, 31, 0)),
    Unreached("vllm/v1/kv_offload/tiering/manager.py", "TieringOffloadingManager.touch", NOT_ON_RELEASE,
              _NO_TOUCH, (0, 31, 0)),
    Unreached("vllm/v1/kv_offload/cpu/policies/arc.py", "ARCCachePolicy.touch", NOT_ON_RELEASE,
              _NO_TOUCH + "; ARC overrides both of the policy base's callers of touch, on_store_miss and"
              " on_request_finished (0.33.0 cpu/policies/arc.py:92-97,117-140 over base.py:85-94,109-131)",
              (0, 31, 0)),
)


def declared_in(row, rel) -> bool:
    """Whether ``UNREACHED`` row ``row`` speaks of the file ``rel``."""
    return row.file == rel or (row.file.endswith("/") and rel.startswith(row.file))


def applies(row, version) -> bool:
    """Whether ``UNREACHED`` row ``row`` holds on a tree of ``version`` (a version tuple, or None
    for a checkout without one): a row with ``since`` only from that release on."""
    return row.since is None or (version is not None and tuple(version) >= row.since)


def release_version():
    """The imported vLLM's ``__version_tuple__`` as three ints, or None (an unversioned checkout
    reports ``(0, 0, "dev")``)."""
    import vllm

    v = tuple(getattr(vllm, "__version_tuple__", ()))[:3]
    return v if len(v) == 3 and all(isinstance(x, int) for x in v) and v[:2] != (0, 0) else None
