"""HiSparse beside the OffloadingConnector (composition ``multi-hisparse``, 0.30.0+).

HiSparse keeps a sparse-MLA model's KV in host memory: a host-resident source group (the MLA
cache, ``KVCacheGroupRole.HISPARSE_SOURCE``), its indexer on the GPU (``HISPARSE_INDEXER``) and GPU
resident and hot pages the HiSparse coordinator manages (0.33.0 ``v1/hisparse/layout.py:125-234``).
vLLM runs it only as a ``MultiConnector`` of ``HiSparseConnector`` (its host pool,
``host_pool_gib``, 0.33.0 ``config/kv_transfer.py:16-47``) beside the OffloadingConnector, which
then offloads the indexer group alone (``offloading/config.py:38-45``) and bounds every load by the
deepest prefix the groups it does not offload hold (``offloading_connector.py:164-181``
``_max_loadable_tokens``: the source group's host hits).

Real here: vLLM's own layout builder (``get_hisparse_kv_cache_groups``,
``get_hisparse_kv_cache_config``), the HiSparse coordinator and its host block pool, the
``HiSparseConnector`` on both sides. Faked: its worker's page-transfer engine (CUDA streams and DMA,
``hisparse/worker.py``), by ``WorkerStandIn``, which reports every page transfer and host copy of a
step done when the step ends, as a worker whose copies never lag would. On CPU vLLM refuses a
HiSparse config while it builds its ``VllmConfig`` ("HiSparse currently requires NVIDIA CUDA.",
0.33.0 ``config/vllm.py:1876-1885``): ``configure`` sets it on the config built without it, as the
GPU engine holds it.

Part of the side package (standard library; vLLM is imported where it is used).
"""

from . import adapter

HISPARSE = "HiSparseConnector"
COMPOSITION = "multi-hisparse"
# one sparse-MLA layer and its indexer, as DeepSeek V3.2's attention declares them (the builder
# groups MLA layers by cache role, v1/hisparse/layout.py:92-122)
SOURCE_LAYER, INDEXER_LAYER = "model.layers.0.attn", "model.layers.0.attn.indexer"


_MODEL_DIR = []


def model_dir():
    """The model's local ``config.json`` (once per process): the trace's Llama with an indexer's
    ``index_topk`` of 32 tokens, which sizes HiSparse's hot pages (0.33.0 v1/hisparse/layout.py)."""
    if not _MODEL_DIR:
        _MODEL_DIR.append(adapter.model_dir(max_position_embeddings=1 << 16, tie_word_embeddings=False, index_topk=32))
    return _MODEL_DIR[0]


def layer_specs(lay, head_size=8):
    """{layer name: KVCacheSpec}: the layout's sparse-MLA layer, its sparse cache (the index group's
    leader, the layout's first group) and its indexer (the second), then a layer of each further group
    (0.30.0's builder lays HiSparse out only beside one, v1/hisparse/layout.py:64)."""
    import torch
    from vllm.v1 import kv_cache_interface as kci

    b = lay["groups"][0]["tokens_per_block"]

    def mla(role, **more):
        return adapter.build(kci.MLAAttentionSpec, block_size=b, num_kv_heads=1, head_size=head_size,
                             dtype=torch.float32, cache_role=role, **more)

    specs = {SOURCE_LAYER: mla(kci.SparseCacheRole.SPARSE, is_index_group_leader=True),
             INDEXER_LAYER: mla(kci.SparseCacheRole.INDEXER)}
    for i, g in enumerate(lay["groups"][2:], 1):  # the model's other attention layers, after HiSparse's groups
        specs["model.layers.%d.attn" % i] = adapter.kv_cache_spec(g, head_size=head_size)
    return specs


def offloaded_page_bytes(specs):
    """The page bytes of the one group the OffloadingConnector offloads, the indexer (what its CPU
    tier's chunks are sized by, 0.33.0 offloading/config.py:161-169)."""
    return [specs[INDEXER_LAYER].page_size_bytes]


def connector_config(offload, par, specs):
    """The ``KVTransferConfig`` fields: ``MultiConnector`` [HiSparseConnector, the OffloadingConnector],
    as vLLM orders them (the HiSparse connector binds the coordinator the offloading one reads); the
    host pool holds ``hisparse_host_blocks`` source pages (the builder divides ``host_pool_gib`` by a
    page, 0.33.0 v1/hisparse/layout.py:244-250, runtime.py:293-298)."""
    page = specs[SOURCE_LAYER].page_size_bytes
    gib = (par["hisparse_host_blocks"] * page + page // 2) / float(1 << 30)
    hisparse = dict(kv_connector=HISPARSE, kv_role="kv_both", kv_connector_extra_config={"host_pool_gib": gib})
    return dict(kv_connector="MultiConnector", kv_role="kv_both",
                kv_connector_extra_config={"connectors": [hisparse, offload]})


def configure(vllm_config, transfer_config):
    """HiSparse on a ``VllmConfig`` built without it: its transfer config and ``hisparse_config``."""
    from vllm.config.attention import HiSparseConfig

    vllm_config.kv_transfer_config = transfer_config
    vllm_config.attention_config.hisparse_config = HiSparseConfig()


def kv_cache_config(vllm_config, specs, num_blocks):
    """The scheduler's ``KVCacheConfig`` as the engine core plans it (0.33.0 v1/engine/core.py:282-325,
    ``get_kv_cache_configs``; 0.30.0 - 0.32.0 in ``kv_cache_utils``): vLLM's HiSparse builder lays out
    the host source group, the indexer, the resident and hot groups and any other layer's
    (v1/hisparse/layout.py), with ``num_blocks`` GPU blocks (``num_gpu_blocks_override``), after vLLM's
    check that one request of ``max_model_len`` fits them (``check_enough_kv_cache_memory``'s, which
    raises otherwise, as the engine does at start)."""
    import inspect

    from vllm.distributed.kv_transfer.kv_connector.v1.hisparse.connector import HiSparseConnector
    from vllm.v1.core import kv_cache_utils as kcu

    try:
        from vllm.v1.core import kv_cache_planning as planning  # 0.33.0
    except ImportError:
        planning = kcu
    # the engine core resolves the layout before it plans (0.33.0 v1/engine/core.py:282-295,
    # resolve_kv_cache_layout): the connectors' required one, HiSparse's "BLHNC" (hisparse/connector.py:224-226)
    vllm_config.cache_config.kv_cache_layout = HiSparseConnector.get_required_kvcache_layout(vllm_config)
    vllm_config.cache_config.num_gpu_blocks_override = num_blocks
    more = []
    if "global_kv_cache_groups" in inspect.signature(planning.get_kv_cache_configs).parameters:
        more.append(planning.get_global_kv_cache_groups(vllm_config, [specs]))
    (worker,) = planning.get_kv_cache_configs(vllm_config, [specs], [1 << 40], *more)
    if worker.hisparse_host_num_blocks is None or worker.num_blocks != num_blocks:
        raise ValueError("vLLM planned %d GPU blocks (HiSparse host pool %s), not the HiSparse layout of %d asked"
                         % (worker.num_blocks, worker.hisparse_host_num_blocks, num_blocks))
    return kcu.generate_scheduler_kv_cache_config([worker])


# Why no load of a HiSparse engine is captured as a kvbound case (the plan's replay): the source
# group's blocks come from HiSparse's host pool, whose ids a case would take for GPU blocks of the
# one pool, and its resident and hot groups have no kind of the case format
NO_CASE = ("HiSparse's source group draws its blocks from the host pool (0.33.0 v1/hisparse/coordinator.py),"
           " not the one GPU pool a case describes, and its resident and hot groups have no group kind")


class WorkerStandIn:
    """In place of ``HiSparseConnectorWorker``'s GPU part: a step's page transfers and host copies,
    reported done at the step's end (``take_transfer_updates``, ``take_completed_host_copies``, read by
    ``HiSparseConnector.build_connector_worker_meta``). As the real worker orders them (0.33.0
    hisparse/worker.py:408-460): a restore and a transfer not marked ``after_forward`` start with the
    step, one marked ``after_forward`` with the next step (``_finish_previous_step``)."""

    def __init__(self):
        self.enqueued, self.after_forward, self.copies = [], [], []
        self.steps = 0

    def start_step(self, metadata, request_state_indices=None, request_ids=None, num_tokens=0):
        self.steps += 1
        self.enqueued.extend(self.after_forward)
        transfers = metadata.command.page_transfers if metadata.command is not None else []
        self.enqueued.extend(t.transfer_id for t in transfers if t.restore or not t.after_forward)
        self.after_forward = [t.transfer_id for t in transfers if not t.restore and t.after_forward]
        self.copies.extend(c.dst_block_id for c in metadata.host_block_copies)

    def take_transfer_updates(self):
        done, self.enqueued = self.enqueued, []
        return done, list(done)

    def take_completed_host_copies(self):
        done, self.copies = self.copies, []
        return done

    def prepare_forward(self, attn_metadata):
        return None

    def finish_forward(self):
        return None

    def reset_hot_state(self):
        return None

    def get_kv_connector_stats(self):
        return None

    def shutdown(self):
        return None


def stand_in(wconn, sub_connector):
    """The HiSparse worker of ``wconn`` (a MultiConnector's worker side) on ``WorkerStandIn``; None
    where the composition has no HiSparse connector."""
    hs = sub_connector(wconn, HISPARSE)
    if hs is None:
        return None
    hs.connector_worker = WorkerStandIn()
    return hs.connector_worker


def plant(conn, sub_connector, mutant):
    """Planted (tests only, ``unbounded_load``): the OffloadingConnector in ``conn`` loads as far as its
    tier hits, unbounded by the groups it does not offload (``_max_loadable_tokens`` answers None, as
    where every group is offloaded)."""
    if mutant == "unbounded_load":
        sub_connector(conn, "OffloadingConnector")._max_loadable_tokens = lambda request, num_computed_tokens: None
