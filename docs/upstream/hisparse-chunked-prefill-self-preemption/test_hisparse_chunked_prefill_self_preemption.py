# SPDX-License-Identifier: Apache-2.0
"""Regression test for vLLM's tests/v1/core/ (HiSparse start check and scheduler):
the start check's promise, that one request of max_model_len fits the KV cache, holds
for a lone chunked prefill under HiSparse.

A sparse-MLA layer and its indexer (DeepSeek V3.2 style) with HiSparseConnector, and
optionally a sliding-window layer; vLLM's own get_global_kv_cache_groups /
get_kv_cache_configs lay the groups out over ``num_gpu_blocks_override`` blocks and run
the start check. The engine core's Scheduler (synchronous, 256 tokens a step) then
serves one request alone, with a stand-in for the HiSparse worker that reports page
transfers as the real one does (hisparse/worker.py start_step): a spill planned
``after_forward`` is submitted at the next step's start and completes there.

Before the fix the start check budgets one in-flight window of resident pages
(HiSparseResidentSpec.max_memory_usage_bytes), while a chunked prefill holds two: the
previous chunk's pages stay pinned until their host writes complete, one step later.
The lone request's second chunk then cannot be allocated, the scheduler preempts the
request itself, nothing was published to the host pool, and the cycle repeats.
"""

import json
import sys

import pytest
import torch

try:  # a vLLM requirement the HiSparse worker module's imports reach; absent from a bare CPU tree
    import einops  # noqa: F401
except ImportError:
    import types

    sys.modules["einops"] = types.ModuleType("einops")

from vllm import ModelRegistry, SamplingParams  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    ParallelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.config.attention import HiSparseConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.hisparse.connector import (  # noqa: E402
    HiSparseConnector,
    HiSparseConnectorWorkerMetadata,
)
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_planning import (  # noqa: E402
    get_global_kv_cache_groups,
    get_kv_cache_configs,
)
from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    generate_scheduler_kv_cache_config,
    get_request_block_hasher,
    init_none_hash,
    resolve_cache_hit_alignment_tokens,
    resolve_kv_cache_block_sizes,
)
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    MLAAttentionSpec,
    SlidingWindowSpec,
    SparseCacheRole,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

BLOCK_SIZE = 16
MAX_NUM_BATCHED_TOKENS = 256
HOST_PAGES = 96
MAX_MODEL_LEN = 448  # the longest length tried: the model's max_position_embeddings
MAX_STEPS = 20  # a lone request of < 448 tokens needs 2 steps


class NeverBuiltModel(torch.nn.Module):
    """The architecture ModelConfig inspects; never instantiated."""

    def __init__(self, *, vllm_config, prefix=""):
        super().__init__()

    def embed_input_ids(self, input_ids):
        raise NotImplementedError

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        raise NotImplementedError

    def compute_logits(self, hidden_states):
        raise NotImplementedError


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A local DeepSeek-V3.2-like config: index_topk sizes HiSparse's hot pages."""
    init_none_hash(sha256)
    ModelRegistry.register_model("HiSparseNeverBuiltModel", NeverBuiltModel)
    path = tmp_path_factory.mktemp("hisparse-model")
    (path / "config.json").write_text(json.dumps({
        "architectures": ["HiSparseNeverBuiltModel"], "model_type": "llama",
        "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 1, "num_hidden_layers": 2, "vocab_size": 32000,
        "max_position_embeddings": MAX_MODEL_LEN, "rms_norm_eps": 1e-5,
        "torch_dtype": "float32", "index_topk": 32,
    }))
    return str(path)


def layer_specs(with_sliding_window: bool):
    mla = dict(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=8, dtype=torch.float32)
    specs = {
        "model.layers.0.attn": MLAAttentionSpec(
            **mla, cache_role=SparseCacheRole.SPARSE, is_index_group_leader=True
        ),
        "model.layers.0.attn.indexer": MLAAttentionSpec(
            **mla, cache_role=SparseCacheRole.INDEXER
        ),
    }
    if with_sliding_window:
        specs["model.layers.1.attn"] = SlidingWindowSpec(
            block_size=BLOCK_SIZE, num_kv_heads=1, head_size=8,
            dtype=torch.float32, sliding_window=64,
        )
    return specs


def make_vllm_config(model_dir, specs, num_gpu_blocks, max_model_len):
    """max_model_len -1: auto-fit to the KV cache (get_kv_cache_configs)."""
    model_config = ModelConfig(
        model=model_dir, tokenizer=model_dir, skip_tokenizer_init=True,
        max_model_len=max_model_len, dtype="float32", enforce_eager=True,
    )
    vllm_config = VllmConfig(
        model_config=model_config,
        cache_config=CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=True),
        scheduler_config=SchedulerConfig(
            max_num_seqs=8, max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
            max_model_len=model_config.max_model_len, enable_chunked_prefill=True,
            async_scheduling=False, is_encoder_decoder=False,
        ),
        parallel_config=ParallelConfig(),
        device_config=DeviceConfig(device="cpu"),
    )
    # VllmConfig refuses HiSparse off CUDA: set what its __post_init__ sets there
    page = specs["model.layers.0.attn"].page_size_bytes
    vllm_config.kv_transfer_config = KVTransferConfig(
        kv_connector="HiSparseConnector", kv_role="kv_both",
        kv_connector_extra_config={"host_pool_gib": (HOST_PAGES + 0.5) * page / 2**30},
    )
    vllm_config.attention_config.hisparse_config = HiSparseConfig()
    vllm_config.cache_config.kv_cache_layout = (
        HiSparseConnector.get_required_kvcache_layout(vllm_config)
    )
    vllm_config.cache_config.num_gpu_blocks_override = num_gpu_blocks
    return vllm_config


def plan_kv_cache(vllm_config, specs):
    """The engine core's planning; raises the start check's ValueError."""
    groups = get_global_kv_cache_groups(vllm_config, [specs])
    (worker_config,) = get_kv_cache_configs(vllm_config, [specs], [1 << 40], groups)
    kv_cache_config = generate_scheduler_kv_cache_config([worker_config])
    vllm_config.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
    block_size, hash_block_size = resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
    kv_cache_config.hash_block_size = hash_block_size
    kv_cache_config.cache_hit_alignment_tokens = resolve_cache_hit_alignment_tokens(
        kv_cache_config, vllm_config, block_size, hash_block_size
    )
    return kv_cache_config, block_size, hash_block_size


def accepts(model_dir, specs, num_gpu_blocks, max_model_len) -> bool:
    vllm_config = make_vllm_config(model_dir, specs, num_gpu_blocks, max_model_len)
    try:
        plan_kv_cache(vllm_config, specs)
    except ValueError:
        return False
    return True


def largest_accepted_max_model_len(model_dir, specs, num_gpu_blocks) -> int:
    lo, hi = 0, MAX_MODEL_LEN
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if accepts(model_dir, specs, num_gpu_blocks, mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def worker_meta(scheduler_output, after_forward: list[int]):
    """The HiSparse worker's report for one step; ``after_forward`` carries the
    previous step's post-forward spills (submitted at this step's start)."""
    meta = scheduler_output.kv_connector_metadata
    transfers = meta.command.page_transfers if meta.command is not None else []
    done = after_forward + [t.transfer_id for t in transfers if t.restore or not t.after_forward]
    after_forward[:] = [t.transfer_id for t in transfers if not t.restore and t.after_forward]
    copies = tuple(c.dst_block_id for c in meta.host_block_copies)
    return HiSparseConnectorWorkerMetadata(
        enqueued_transfer_counts=dict.fromkeys(done, 1),
        completed_transfer_counts=dict.fromkeys(done, 1),
        completed_host_copy_dst_ids=copies,
    )


def serve_lone_request(vllm_config, kv_cache_config, block_size, hash_block_size,
                       num_prompt_tokens):
    """(finished, steps, preemptions) of one request alone on the scheduler."""
    scheduler = Scheduler(
        vllm_config=vllm_config, kv_cache_config=kv_cache_config,
        structured_output_manager=StructuredOutputManager(vllm_config),
        block_size=block_size, hash_block_size=hash_block_size,
    )
    request = Request(
        request_id="0", prompt_token_ids=list(range(1, num_prompt_tokens + 1)),
        sampling_params=SamplingParams(max_tokens=1, ignore_eos=True), pooling_params=None,
        block_hasher=get_request_block_hasher(hash_block_size, sha256),
    )
    scheduler.add_request(request)
    after_forward: list[int] = []
    preemptions = 0
    try:
        for step in range(1, MAX_STEPS + 1):
            output = scheduler.schedule()
            preemptions += len(output.preempted_req_ids or ())
            req_ids = list(output.num_scheduled_tokens)
            sampled = [[7] if request.num_computed_tokens >= request.num_tokens else []
                       for _ in req_ids]
            scheduler.update_from_output(output, ModelRunnerOutput(
                req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                sampled_token_ids=sampled,
                kv_connector_output=KVConnectorOutput(
                    kv_connector_worker_meta=worker_meta(output, after_forward)),
            ))
            if request.is_finished():
                return True, step, preemptions
        return False, MAX_STEPS, preemptions
    finally:
        scheduler.shutdown()


SHAPES = [
    pytest.param(True, 72, id="mla+sliding_window-72blocks"),
    pytest.param(False, 49, id="mla-49blocks"),
]


@pytest.mark.parametrize("with_sliding_window,num_gpu_blocks", SHAPES)
def test_lone_request_within_accepted_max_model_len_finishes(
    model_dir, with_sliding_window, num_gpu_blocks
):
    """For the largest max_model_len the start check accepts, every lone request
    within it (prompt + 1 output token) finishes without preempting itself."""
    specs = layer_specs(with_sliding_window)
    max_model_len = largest_accepted_max_model_len(model_dir, specs, num_gpu_blocks)
    assert max_model_len > MAX_NUM_BATCHED_TOKENS  # a chunked prefill is possible
    vllm_config = make_vllm_config(model_dir, specs, num_gpu_blocks, max_model_len)
    planned = plan_kv_cache(vllm_config, specs)
    for num_prompt_tokens in range(1, max_model_len):
        finished, steps, preemptions = serve_lone_request(vllm_config, *planned, num_prompt_tokens)
        assert finished and preemptions == 0, (
            f"the start check accepts max_model_len {max_model_len} on {num_gpu_blocks} GPU "
            f"blocks, but a lone request of {num_prompt_tokens} prompt tokens "
            f"{'finished' if finished else 'did not finish'} in {steps} steps with "
            f"{preemptions} preemption(s) of itself"
        )


@pytest.mark.parametrize("with_sliding_window,num_gpu_blocks", SHAPES)
def test_auto_fit_max_model_len_serves_lone_request(model_dir, with_sliding_window, num_gpu_blocks):
    """max_model_len auto-fit (-1) picks a length whose longest lone request finishes."""
    specs = layer_specs(with_sliding_window)
    vllm_config = make_vllm_config(model_dir, specs, num_gpu_blocks, -1)
    planned = plan_kv_cache(vllm_config, specs)
    max_model_len = vllm_config.model_config.max_model_len
    finished, steps, preemptions = serve_lone_request(vllm_config, *planned, max_model_len - 1)
    assert finished and preemptions == 0, (
        f"auto-fit chose max_model_len {max_model_len} on {num_gpu_blocks} GPU blocks, but a "
        f"lone request of {max_model_len - 1} prompt tokens "
        f"{'finished' if finished else 'did not finish'} in {steps} steps with "
        f"{preemptions} preemption(s) of itself"
    )
