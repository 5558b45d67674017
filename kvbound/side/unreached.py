"""The connector code a CPU trace cannot run, declared by (file, function) with the reason and the
vLLM lines: ``UNREACHED``. ``cover.py`` sends, per file, the statements of the rows that hold on
the release, by reason, so the host tells "not reachable here" from "not reached yet" without
reading vLLM (kvbound/trace/coverage.py, docs/trace.md "Coverage").

Part of the side package (standard library only).
"""

import ast
import collections

GPU_ONLY, NEEDS_EXTERNAL, NOT_ON_RELEASE = "gpu-only", "needs-external", "not-on-release"

# Code of the connector that a CPU trace cannot run, by (file, function): "*" is the whole file
# (a file ending in "/": every file under that directory), "Class.method" a method. ``why``:
# GPU_ONLY (CUDA), NEEDS_EXTERNAL (a library or service the host lacks), NOT_ON_RELEASE (no
# caller in the release's code from ``since`` on and before ``until``, version tuples: the row
# applies only to a tree whose ``vllm.__version_tuple__`` is in that range, never to an
# unversioned checkout; the ``ABSTRACT`` row, computed from the tree itself, has no range and holds on
# every tree). A row whose file or function a release lacks is skipped there.
Unreached = collections.namedtuple("Unreached", "file function why reason since until", defaults=(None, None))
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
_FS_IO_C = ("vLLM's compiled fs_io_C extension (the file tier's batched file I/O and lookups, the GIL released), a module"
            " of a built wheel that the pure-Python release tree lacks: the tier takes its Python path instead, which"
            " runs (0.33.0 tiering/fs/io.py:11-21,188-195,214-226; tiering/fs/manager.py:23-28,80-83)")
_FS = "vllm/v1/kv_offload/tiering/fs/"
_NO_FAILED_STORE = ("no caller passes success=False: 0.21.0 calls complete_store from the connector scheduler with"
                    " the default (offloading/scheduler.py:810) and from the reuse manager, which forwards its own"
                    " caller's (v1/kv_offload/reuse_manager.py:122); the first caller with a failure is the tiering"
                    " spec's failed promotion, from 0.22 (0.22.1 tiering/manager.py:87,203-207); the branch: 0.33.0"
                    " cpu/manager.py:393-400")
_ABSTRACT = ("the body of an abstract method (abc.abstractmethod) that no code of the connector calls up to (no"
             " super().name(...) and no Base.name(...) call): every class vLLM instantiates overrides it, so the body"
             " runs only for an out-of-tree subclass that calls it (0.33.0 tiering/base.py:210-388:"
             " SecondaryTierManager's, which the file and example tiers override; v1/kv_offload/base.py:306-756:"
             " OffloadingManager's lookup, prepare_load, prepare_store, on_new_request and OffloadingSpec's"
             " get_manager, get_worker; before 0.24 also OffloadingHandler's and LoadStoreSpec.medium; computed per"
             " tree by abstract_bodies, so it holds on an unversioned checkout too)")
ABSTRACT = "@abstract"  # a row's function: the abstract methods of its files that nothing calls up to
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
    # the file tier's calls into vLLM's compiled extension, where a built wheel has it (0.27.0+ for
    # the file I/O, 0.25.0+ for the lookups); a release without the guard skips the row
    Unreached(_FS + "io.py", "@try import vllm.fs_io_C", NEEDS_EXTERNAL, _FS_IO_C),
    Unreached(_FS + "io.py", "batch_store_block@if _HAS_FSIO_C", NEEDS_EXTERNAL, _FS_IO_C),
    Unreached(_FS + "io.py", "batch_load_block@if _HAS_FSIO_C", NEEDS_EXTERNAL, _FS_IO_C),
    Unreached(_FS + "manager.py", "@try import vllm.fs_io_C", NEEDS_EXTERNAL, _FS_IO_C),
    Unreached(_FS + "manager.py", "FsAsyncLookupManager.batch_lookup@if _HAS_BATCH_LOOKUP_C", NEEDS_EXTERNAL, _FS_IO_C),
    *(Unreached(_TM, "_SecondaryTierFacingParent." + f, NEEDS_EXTERNAL, _SERVED)
      for f in ("on_new_request", "lookup", "create_store_job", "on_request_finished")),
    *(Unreached(_TM, "TieringOffloadingManager." + f, NEEDS_EXTERNAL, _POLLED)
      for f in ("_start_tier_poll_thread", "_stop_tier_poll_thread", "_tier_poll_loop", "poll_tiers")),
    Unreached(_TM, "TieringOffloadingManager.shutdown@if self._tier_poll_thread is not None", NEEDS_EXTERNAL, _POLLED),
    # a tier the facade serves is skipped when the manager fans a request out (0.28.0+): only the facade
    # passes exclude_tier_idx (0.33.0 tiering/manager.py:176-204)
    *(Unreached(_TM, f"TieringOffloadingManager.{f}@if {i} == exclude_tier_idx", NEEDS_EXTERNAL, _SERVED)
      for f, i in (("lookup", "i"), ("on_new_request", "tier_idx"), ("_maybe_finalize_request", "tier_idx"))),
    Unreached("vllm/", ABSTRACT, NOT_ON_RELEASE, _ABSTRACT),
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
    # a policy's evict(0): the CPU tier calls evict only for a positive count (0.21.0 - 0.33.0; 0.33.0
    # cpu/manager.py:323-334), and nothing else in the release calls a policy's evict
    *(Unreached(f"vllm/v1/kv_offload/cpu/policies/{f}.py", f"{c}.evict@if n == 0", NOT_ON_RELEASE,
                "no caller asks a policy to evict nothing: the CPU tier's one call of evict sits under `if"
                " num_chunks_to_evict > 0` (0.33.0 cpu/manager.py:323-334; 0.21.0 :139-143)", (0, 21, 0))
      for f, c in (("lru", "LRUCachePolicy"), ("arc", "ARCCachePolicy"))),
    # a failed store before the tiering spec (0.21.x): nothing passes complete_store success=False
    Unreached("vllm/v1/kv_offload/cpu/manager.py", "CPUOffloadingManager.complete_store@else success",
              NOT_ON_RELEASE, _NO_FAILED_STORE, (0, 21, 0), (0, 22, 0)),
    *(Unreached(f"vllm/v1/kv_offload/cpu/policies/{f}.py", f"{c}.remove", NOT_ON_RELEASE,
                _NO_FAILED_STORE + "; a policy's remove has no other caller (0.21.0 cpu/manager.py:194)",
                (0, 21, 0), (0, 22, 0))
      for f, c in (("lru", "LRUCachePolicy"), ("arc", "ARCCachePolicy"))),
    Unreached("vllm/v1/kv_offload/tiering/base.py", "SecondaryTierManager.touch", NOT_ON_RELEASE,
              _NO_TOUCH + "; the tiering manager's touch was the secondary tiers' one caller (0.30.0"
              " tiering/manager.py:518-528)", (0, 31, 0)),
    Unreached(_TM, "TieringOffloadingManager._transfer_jobs", NOT_ON_RELEASE,
              "no reader: the property that replaced the manager's _transfer_jobs dict in 0.28.0 (0.27.0"
              " tiering/manager.py:198,260) is read by nothing in the release (0.33.0 tiering/manager.py:430-432)",
              (0, 28, 0)),
    Unreached("vllm/v1/kv_offload/tiering/example/manager.py", "ExampleSecondaryTierManager.get_num_chunks",
              NOT_ON_RELEASE, "no reader: nothing in the release calls the example tier's get_num_chunks (0.33.0"
              " tiering/example/manager.py:203-205; it was get_num_blocks to 0.29.0)", (0, 30, 0)),
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
    for a checkout without one): a row with ``since`` only from that release on, one with
    ``until`` only before it."""
    if row.since is None and row.until is None:
        return True
    return version is not None and tuple(version) >= (row.since or (0,)) and tuple(version) < (row.until or (999,))


def release_version():
    """The imported vLLM's ``__version_tuple__`` as three ints, or None (an unversioned checkout
    reports ``(0, 0, "dev")``)."""
    import vllm

    v = tuple(getattr(vllm, "__version_tuple__", ()))[:3]
    return v if len(v) == 3 and all(isinstance(x, int) for x in v) and v[:2] != (0, 0) else None


def _abstract(fn) -> bool:
    return any((d.attr if isinstance(d, ast.Attribute) else getattr(d, "id", "")) == "abstractmethod"
               for d in fn.decorator_list)


def called_up(sources) -> set:
    """What the code of ``sources`` (module sources) calls up to a base class: the method names
    of ``super().name(...)`` (any ``super`` call), and ``(Class, name)`` of ``Class.name(...)``."""
    up = set()
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                base = node.func.value
                if isinstance(base, ast.Call) and getattr(base.func, "id", "") == "super":
                    up.add(node.func.attr)
                elif isinstance(base, ast.Name):
                    up.add((base.id, node.func.attr))
    return up


def abstract_bodies(source, up) -> list:
    """The (first, last) lines of the body of each abstract method of ``source`` that nothing in
    ``up`` (``called_up``) calls: by name through ``super()``, or as ``Class.name``."""
    out = []
    for cls in ast.walk(ast.parse(source)):
        if isinstance(cls, ast.ClassDef):
            for fn in cls.body:
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and _abstract(fn) \
                        and fn.name not in up and (cls.name, fn.name) not in up and not _elided(fn):
                    out.append((fn.body[0].lineno, fn.end_lineno))
    return out


def _elided(fn) -> bool:
    """A body of ``...`` alone (after a docstring or not): nothing to run, and coverage.py counts
    no statement of it."""
    body = fn.body[1:] if ast.get_docstring(fn, clean=False) is not None else fn.body
    return all(isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant) and st.value.value is Ellipsis
               for st in body)
