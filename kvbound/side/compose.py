"""The connector's composition and its offload spec, as a layout asks for them (issue 25 item 1's
axes "composition" and "offload spec and tier").

Part of the side package (standard library; vLLM's objects come in as arguments): the
``KVTransferConfig`` fields of a layout (``composed``), the CPU tier's bytes and the capacity it
got (``cpu_bytes_to_use``, ``tier_capacity``, ``as_asked``), a chunk's blocks (``chunk_size_config``), the
extra config of a tiering spec (``tiering_config``), the sub-connectors of a ``MultiConnector``
(``sub_connector``, ``pd_sides``), and what outlives a run (``close``).
"""

from . import (adapter, failed_start, hisparse, kv_events, pd_connector, request_tier, tier_faults, tier_lifecycle,
               tier_pressure)

OFFLOADING = "OffloadingConnector"


def composed(lay, par, extra, mutant):
    """The ``KVTransferConfig`` fields: the OffloadingConnector alone (``composition`` absent), or
    (``multi-pd``) inside vLLM's ``MultiConnector`` after a P/D consumer (``pd_connector.py``; engine
    setting ``pd_hma`` false: one without ``SupportsHMA``), as
    P/D deployments order them (the loader named first serves a request's load when it hits:
    0.33.0 kv_connector/v1/multi_connector.py:451-470; every connector stores and gets every
    request's blocks, :484-494; 0.21.0 - 0.25.1 an empty block list, 0.25.1 :406-413)."""
    offload = dict(kv_connector=OFFLOADING, kv_role="kv_both", kv_connector_extra_config=extra)
    if lay.get("composition") is None or lay["composition"] == hisparse.COMPOSITION:
        return offload  # HiSparse's is set on the config vLLM builds without it (side/hisparse.py configure)
    if lay["composition"] != "multi-pd":
        raise ValueError("unknown composition %r" % (lay["composition"],))
    pd_connector.install()
    pd = dict(kv_connector=pd_connector.connector_name(par), kv_role="kv_both",
              kv_connector_module_path=pd_connector.PD_MODULE,
              kv_connector_extra_config={"pd_p": par.get("pd_p", 0.0), "pd_delay": par.get("pd_delay", 3),
                                         "seed": par.get("seed", 0), "mutant": mutant})
    return dict(kv_connector="MultiConnector", kv_role="kv_both",
                kv_connector_extra_config={"connectors": [pd, offload]})


def cpu_bytes_to_use(cpu_chunks, page_bytes, blocks_per_chunk, align):
    """The ``kv_connector_extra_config`` ``cpu_bytes_to_use`` that gives the CPU tier exactly
    ``cpu_chunks`` chunks. Every release divides it by a chunk's bytes rounded up to the spec's
    ``BLOCK_SIZE_ALIGNMENT``, ``align`` (none, so 1, before 0.23; 1 in 0.23.0 - 0.26.0; the host's page from 0.27.0,
    ``SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT = mmap.PAGESIZE``, 0.27.0 cpu/shared_offload_region.py:39): 0.21.0
    v1/kv_offload/cpu/spec.py:33-46, 0.25.1 :66-91, 0.33.0 :109-123. A chunk's bytes are a block's
    (the trace's one KV tensor over every group's page, ``adapter.kv_cache_config``: vLLM reads
    ``kv_cache_tensors[0].size // num_blocks``, 0.29.0 offloading/config.py:96-101, or, 0.33.0
    offloading/config.py:48-58, each group's page times its layers, one here) times
    ``blocks_per_chunk``. ``engine.Engine`` checks the tier it got."""
    per_chunk = sum(page_bytes) * blocks_per_chunk
    return cpu_chunks * (-(-per_chunk // align) * align)


def chunk_size_config(lay):
    """The ``kv_connector_extra_config`` entry that makes a chunk ``blocks_per_chunk`` GPU
    blocks. Every release reads ``block_size``, the tokens of one offloaded chunk, when
    all groups share one block size (0.24.0 ``v1/kv_offload/base.py:503-515``; 0.26.0
    ``offloading/config.py:61,75-88``; 0.33.0 ``offloading/config.py:123``); only 0.26 and
    later read ``blocks_per_chunk`` (0.26.0 ``offloading/config.py:60``): before 0.26 that
    key is ignored and a chunk is one block. One chunk per block is every release's
    default: no entry."""
    bpc = lay.get("blocks_per_chunk", 1)
    if bpc == 1:
        return {}
    sizes = {g["tokens_per_block"] for g in lay["groups"]}
    if len(sizes) == 1:
        return {"block_size": sizes.pop() * bpc}
    return {"blocks_per_chunk": bpc}


def tier_capacity(manager):
    """The chunks the CPU tier under ``manager`` holds at most (``_num_blocks`` before 0.30,
    ``_num_chunks`` from 0.30.0 v1/kv_offload/cpu/manager.py:52), or None where no CPU tier is
    found (``kv_events.cpu_tier``)."""
    tier = kv_events.cpu_tier(manager)
    return None if tier is None else adapter.first_attr(tier, "_num_chunks", "_num_blocks")


def as_asked(csched, lay, par, version):
    """The CPU tier's capacity (``tier_capacity``), once the connector's scheduler side ``csched`` is
    found to run as the layout asked (``ValueError`` naming what differs). The shadow and the store
    checks map chunks with the layout's blocks_per_chunk (a release that ignored the setting once ran
    bpc2 with one block per chunk, and the shadow's mapping reported its stores as wrong); cpu_chunks is
    the tier's capacity, on every release."""
    real_bpc = adapter.first_attr(csched.config, "blocks_per_chunk", "block_size_factor")
    if real_bpc != lay.get("blocks_per_chunk", 1):
        raise ValueError("layout %s asks for %d blocks per chunk, vllm %s's connector runs with %s"
                         % (lay.get("name"), lay.get("blocks_per_chunk", 1), version, real_bpc))
    got = tier_capacity(csched.manager)
    if got is not None and got != par["cpu_chunks"]:
        raise ValueError("layout %s asks for a CPU tier of %d chunks, vllm %s's holds %d (cpu_bytes_to_use)"
                         % (lay.get("name"), par["cpu_chunks"], version, got))
    return got


def tiering_config(lay, par):
    """``kv_connector_extra_config`` of ``offload_spec`` ``tiering-fs``: vLLM's
    ``TieringOffloadingSpec`` (a CPU primary tier) with its file-system secondary tier on a new
    temporary directory, as the spec documents it (0.33.0 v1/kv_offload/tiering/spec.py:1-33:
    ``secondary_tiers`` [{"type": "fs", ...}], ``root_dir`` tiering/fs/manager.py:102-113); one
    I/O thread each way, and no tier-poll thread (``tier_poll_interval_s`` 0: the tiers are
    served once per step, spec.py:364-368). ``tiering-example``: the same spec with its
    in-memory example tier (``{"type": "example"}``, tiering/factory.py:56-57 from 0.22.1). The file
    tier's backpressure detector where the engine settings ``par`` ask for one
    (``tier_pressure.tier_config``), and its KV events where they are on and it has them. Either
    with the request-level tier after it where engine setting ``request_tier_p`` asks for one
    (``request_tier``), a tier that cannot start where the harness starts it to fail, and one
    that cannot stop before them where the harness stops it to fail (``failed_start``)."""
    import tempfile

    spec = {"spec_name": "TieringOffloadingSpec", "tier_poll_interval_s": 0}
    # after it: a request-level tier, and a tier that fails to start; before it, one that fails to stop
    # (side/failed_start.py)
    beside = [t for t in (request_tier.tier_config(par), failed_start.tier_config(par)) if t is not None]
    before = [t for t in (failed_start.tier_before(par),) if t is not None]
    if lay["offload_spec"] == "tiering-example":  # in memory, every job done at once (tiering/example/manager.py)
        return dict(spec, secondary_tiers=[*before, {"type": "example"}, *beside])
    if lay["offload_spec"] != "tiering-fs":
        raise ValueError("unknown offload_spec %r" % (lay["offload_spec"],))
    root = tempfile.mkdtemp(prefix="kvbound-fs-tier-")
    tier = {"type": _fs_tier_type(), "root_dir": root, "n_read_threads": 1, "n_write_threads": 1}
    backpressure = tier_pressure.tier_config(par)
    if backpressure is not None:
        tier["backpressure"] = backpressure
    if par.get("kv_events") and _announces_stores():
        tier["enable_kv_events"] = True  # its stores announced as KV events (side/kv_events.py DiskTier)
    return dict(spec, secondary_tiers=[*before, tier, *beside])


def _fs_tier_type():
    """The name the release's tier factory registers its file-system tier under: ``fs`` (0.23.0
    - 0.33.0 ``tiering/factory.py``), ``fs_python`` in 0.22.1 (``tiering/factory.py:61-65``)."""
    from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory

    return "fs" if "fs" in SecondaryTierFactory._registry else "fs_python"


def _announces_stores():
    """Whether the release's file-system tier takes ``enable_kv_events`` (0.26.0 - 0.33.0
    ``tiering/fs/manager.py``; the tier factory passes a tier's config keys to it as keywords,
    0.33.0 ``tiering/factory.py:62-97``, so an older tier would refuse the key)."""
    import inspect

    from vllm.v1.kv_offload.tiering.fs.manager import FileSystemTierManager

    return "enable_kv_events" in inspect.signature(FileSystemTierManager.__init__).parameters


def subscribe_tiers(eng, tap):
    """The secondary tiers' faults, clocks and checks, each on the tiers it acts on."""
    tier_faults.subscribe(eng, tap)  # inside the shadow's promotions: a lost file's chunks hold nothing
    tier_pressure.subscribe(eng, tap)  # a tier's backpressure detector on the step clock
    request_tier.subscribe(eng, tap)  # what a request-level tier is owed at each request's finish
    tier_lifecycle.subscribe(eng, tap)  # nothing of a request after a tier heard it finish


def sub_connector(conn, name):
    """The connector of class ``name`` in ``conn`` (itself, or one of a MultiConnector's)."""
    return next((c for c in getattr(conn, "_connectors", None) or [conn] if type(c).__name__ == name), None)


def pd_sides(eng):
    """(scheduler side, worker side) of the P/D consumer beside the OffloadingConnector, or
    (None, None); the worker side writes its loads through ``external_load``."""
    name = pd_connector.connector_name(eng.par)
    ps, pw = sub_connector(eng.sched.connector, name), sub_connector(eng.wconn, name)
    if pw is not None:
        pw.on_load = lambda rid, start, end, ids: external_load(eng, rid, start, end, ids)
    return ps, pw


def external_load(eng, rid, start, end, block_ids):
    """The P/D consumer wrote tokens [start, end) of request ``rid`` into ``block_ids`` (per
    group): the shadow KV gets the KV a prefill node computed for them."""
    req = eng.sched.requests.get(rid)
    if eng.shadow is not None and req is not None:
        eng.shadow.content.write_external(req, block_ids, start, end, "P/D load of request %s" % rid)


def count(eng):
    """The P/D consumer's hits and loads, beside the engine's counters."""
    if eng.pd_worker is not None:
        eng.stats.update(pd_hits=eng.pd_sched.hits, pd_loads=eng.pd_worker.loads,
                         pd_finished_one_group=eng.pd_sched.finished_one_group,
                         pd_finished_all_groups=eng.pd_sched.finished_all_groups)


def close(eng):
    """What outlives a run: a tiering spec's shared-memory region, its tiers' threads and their
    directory (TieringOffloadingManager.shutdown, 0.33.0 v1/kv_offload/tiering/manager.py:1251),
    shut down here when the run ended before the engine's own teardown (``Engine.shutdown``)."""
    tier_pressure.restore(eng)
    tier_faults.restore(eng)
    if getattr(eng.csched.manager, "secondary_tiers", None):
        import shutil

        if not eng.shut_down:
            eng.csched.manager.shutdown()
        for tier in eng.vllm_config.kv_transfer_config.kv_connector_extra_config["secondary_tiers"]:
            if "root_dir" in tier:
                shutil.rmtree(tier["root_dir"], ignore_errors=True)
