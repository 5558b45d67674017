"""Standalone reproducer: under HiSparse, vLLM's start check accepts a config on which one lone
request within max_model_len never finishes. Its chunked prefill needs the previous chunk's
resident pages (still pinned: their host writes start only with the next step) beside the new
chunk's, one in-flight window more than HiSparseResidentSpec.max_memory_usage_bytes budgets;
allocate_slots fails, the scheduler preempts the request itself, none of its host pages were
published, and the next admission starts from scratch, for ever (vLLM 0.33.0).

Needs only vLLM and runs on CPU (a local config.json; the model is never built):

    PYTHONPATH=<vllm tree> python repro.py [--trace]

Setup, as the engine core plans and schedules it (v1/engine/core.py): one sparse-MLA layer and
its indexer (MLAAttentionSpec, cache roles SPARSE and INDEXER, DeepSeek V3.2 style, the model's
index_topk 32) and one sliding-window layer (64 tokens), 16-token blocks, float32;
HiSparseConnector as the KV connector with a host pool of 96 pages (host_pool_gib);
num_gpu_blocks_override 72 (71 usable beside the null block), max_num_batched_tokens 256
(chunked prefill), synchronous scheduling (async_scheduling False, as --no-async-scheduling sets
it), max_model_len 448. vLLM's own
get_global_kv_cache_groups / get_kv_cache_configs lay the groups out (the host-resident MLA
source, the indexer, HiSparse's resident and hot groups, the sliding window) and run the start
check (kv_cache_planning._check_enough_kv_cache_memory). On CPU VllmConfig refuses HiSparse
("HiSparse currently requires NVIDIA CUDA."), so the config is built without it and given the
HiSparseConnector transfer config and a HiSparseConfig afterwards, as __post_init__ sets them on
CUDA. The engine core's Scheduler runs with a fake model (one sampled token per request past
its prompt) and a fake HiSparse worker that reports page transfers as the real worker does
(hisparse/worker.py start_step): a restore, or a transfer not marked after_forward, completes
in the step that carries it; one marked after_forward (a prefill's spill) is submitted with
the next step (_finish_previous_step) and completes there; host copies complete in their step.

The check is the start check's promise: if it accepts max_model_len 448, a lone request of 430
prompt tokens (max_tokens 1) must finish within 200 steps. On 0.33.0 it never does (exit 1).
If the start check refuses 448 (the patched tree), the max_model_len its message estimates must
serve a lone request of (estimate - 1) tokens (exit 0). Exit 2: the setup did not come about.
--trace also prints, per step, the request's status, the tokens scheduled, the pool's free
blocks and the request's blocks per group (null blocks left out), and for an allocate_slots call
that fails, what each GPU group held and asked for.

The HiSparse worker module's imports reach einops (a vLLM requirement, never called here); a
bare pure-Python vLLM tree without it gets an empty stand-in module.
"""

import json
import os
import re
import shutil
import sys
import tempfile

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")  # vLLM's log lines to stderr, not stdout

try:  # a vLLM requirement the HiSparse worker module's imports reach (vit_attn_wrappers); nothing here calls it
    import einops  # noqa: F401
except ImportError:  # a pure-Python vLLM tree without it: an empty stand-in
    import types

    sys.modules["einops"] = types.ModuleType("einops")

import torch  # noqa: E402

import vllm  # noqa: E402
from vllm import ModelRegistry, SamplingParams  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, ParallelConfig, SchedulerConfig, VllmConfig)
from vllm.config.attention import HiSparseConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.hisparse.connector import (  # noqa: E402
    HiSparseConnector, HiSparseConnectorWorkerMetadata)
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs  # noqa: E402
from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    generate_scheduler_kv_cache_config, get_request_block_hasher, init_none_hash, resolve_cache_hit_alignment_tokens,
    resolve_kv_cache_block_sizes)
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import MLAAttentionSpec, SlidingWindowSpec, SparseCacheRole  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

VERSION = getattr(vllm, "__version__", "unknown")
BLOCK = 16
NUM_GPU_BLOCKS = 72  # the null block included
HOST_PAGES = 96
MAX_MODEL_LEN = 448
PROMPT_LEN = 430  # two chunks of max_num_batched_tokens 256: 256 + 174
CHUNK = 256
STEPS = 200  # a lone request of at most 448 tokens needs 3; 200 is "never"


class ReproNeverBuiltModel(torch.nn.Module):
    """The model architecture ModelConfig inspects; never instantiated (no model runs)."""

    def __init__(self, *, vllm_config, prefix=""):
        super().__init__()

    def embed_input_ids(self, input_ids):
        raise NotImplementedError

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        raise NotImplementedError

    def compute_logits(self, hidden_states):
        raise NotImplementedError


def layer_specs():
    """One sparse-MLA layer (the index group's leader), its indexer, and a sliding-window layer."""
    mla = dict(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float32)
    return {
        "model.layers.0.attn": MLAAttentionSpec(**mla, cache_role=SparseCacheRole.SPARSE,
                                                is_index_group_leader=True),
        "model.layers.0.attn.indexer": MLAAttentionSpec(**mla, cache_role=SparseCacheRole.INDEXER),
        "model.layers.1.attn": SlidingWindowSpec(block_size=BLOCK, num_kv_heads=1, head_size=8,
                                                 dtype=torch.float32, sliding_window=64),
    }


def make_vllm_config(model_dir, max_model_len, specs):
    model_config = ModelConfig(model=model_dir, tokenizer=model_dir, skip_tokenizer_init=True,
                               max_model_len=max_model_len, dtype="float32", enforce_eager=True)
    vllm_config = VllmConfig(
        model_config=model_config, cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=True),
        scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=CHUNK, max_model_len=max_model_len,
                                         enable_chunked_prefill=True, async_scheduling=False,
                                         is_encoder_decoder=False),
        parallel_config=ParallelConfig(), device_config=DeviceConfig(device="cpu"))
    # what VllmConfig.__post_init__ sets on CUDA for a HiSparseConnector (config/vllm.py:1876-1881)
    page = specs["model.layers.0.attn"].page_size_bytes
    host_pool_gib = (HOST_PAGES * page + page // 2) / float(1 << 30)
    vllm_config.kv_transfer_config = KVTransferConfig(
        kv_connector="HiSparseConnector", kv_role="kv_both",
        kv_connector_extra_config={"host_pool_gib": host_pool_gib})
    vllm_config.attention_config.hisparse_config = HiSparseConfig()
    # the engine core resolves the connector's required layout before it plans (core.py:286-290)
    vllm_config.cache_config.kv_cache_layout = HiSparseConnector.get_required_kvcache_layout(vllm_config)
    vllm_config.cache_config.num_gpu_blocks_override = NUM_GPU_BLOCKS
    return vllm_config


def plan(vllm_config, specs):
    """The engine core's planning (core.py:292-370): groups, the start check, the scheduler's config.
    Raises the start check's ValueError when it refuses max_model_len."""
    groups = get_global_kv_cache_groups(vllm_config, [specs])
    (worker,) = get_kv_cache_configs(vllm_config, [specs], [1 << 40], groups)
    kv_cache_config = generate_scheduler_kv_cache_config([worker])
    vllm_config.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
    vllm_config.cache_config.block_size = min(
        g.kv_cache_spec.block_size for g in kv_cache_config.kv_cache_groups if g.kv_cache_spec.prefix_cacheable)
    block_size, hash_block_size = resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
    kv_cache_config.hash_block_size = hash_block_size
    kv_cache_config.cache_hit_alignment_tokens = resolve_cache_hit_alignment_tokens(
        kv_cache_config, vllm_config, block_size, hash_block_size)
    return kv_cache_config, block_size, hash_block_size


class FakeHiSparseWorker:
    """The HiSparse worker's transfer reports (hisparse/worker.py:408-452, 929-963, eager host
    mirror): restores and transfers not marked after_forward complete in their step; those marked
    after_forward are submitted at the next step's start and complete there."""

    def __init__(self):
        self.after_forward = []

    def step(self, meta):
        done = list(self.after_forward)
        transfers = meta.command.page_transfers if meta.command is not None else []
        done += [t.transfer_id for t in transfers if t.restore or not t.after_forward]
        self.after_forward = [t.transfer_id for t in transfers if not t.restore and t.after_forward]
        copies = tuple(c.dst_block_id for c in meta.host_block_copies)
        if not done and not copies:
            return None
        return HiSparseConnectorWorkerMetadata(
            enqueued_transfer_counts={t: 1 for t in done}, completed_transfer_counts={t: 1 for t in done},
            completed_host_copy_dst_ids=copies)


def group_names(sched):
    """Each group's name in the trace (its spec class; the host-resident MLA source as HostSource)."""
    names = []
    for g in sched.kv_cache_config.kv_cache_groups:
        name = type(g.kv_cache_spec).__name__.replace("Spec", "").replace("Attention", "")
        names.append("HostSource" if g.host_resident else name)
    return names


def group_blocks(sched, rid):
    """The request's blocks per group (null blocks left out), by group kind."""
    managers = sched.kv_cache_manager.coordinator.single_type_managers
    return " ".join(f"{name}={sum(1 for b in m.req_to_blocks.get(rid, ()) if not b.is_null)}"
                    for name, m in zip(group_names(sched), managers))


def watch_allocations(sched, notes):
    """--trace: each allocate_slots call that fails, with what each group asked of the GPU pool."""
    kvm = sched.kv_cache_manager
    asked = {}
    for i, manager in enumerate(kvm.coordinator.single_type_managers):
        def counted(*args, _real=manager.get_num_blocks_to_allocate, _i=i, **kwargs):
            n = _real(*args, **kwargs)
            asked[_i] = n
            return n
        manager.get_num_blocks_to_allocate = counted
    allocate = kvm.allocate_slots

    def allocate_slots(request, num_new_tokens, *args, **kwargs):
        asked.clear()
        got = allocate(request, num_new_tokens, *args, **kwargs)
        if got is None:  # (the sliding window's skipped blocks are freed before the pool is asked)
            groups = [g for g in asked if not sched.kv_cache_config.kv_cache_groups[g].host_resident]
            managers = kvm.coordinator.single_type_managers
            held = {g: sum(1 for b in managers[g].req_to_blocks.get(request.request_id, ()) if not b.is_null)
                    for g in groups}
            names = group_names(sched)
            notes.append(f"allocate_slots({num_new_tokens} tokens) refused: held+new "
                         + ", ".join(f"{names[g]} {held[g]}+{asked[g]}" for g in groups)
                         + f" = {sum(held[g] + asked[g] for g in groups)} blocks of {kvm.block_pool.num_gpu_blocks - 1}"
                         f" usable ({sum(asked[g] for g in groups)} new, {kvm.block_pool.get_num_free_blocks()} free);"
                         f" has_pending_block_frees {sched.connector.has_pending_block_frees()}")
        return got

    kvm.allocate_slots = allocate_slots


def serve_alone(vllm_config, kv_cache_config, block_size, hash_block_size, prompt_len, trace):
    """One request of prompt_len tokens alone on a fresh scheduler: (steps, preemptions, finished, the
    request's computed tokens when each preemption came)."""
    sched = Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                      structured_output_manager=StructuredOutputManager(vllm_config), block_size=block_size,
                      hash_block_size=hash_block_size)
    worker = FakeHiSparseWorker()
    req = Request(request_id="lone", prompt_token_ids=[1 + i % 5000 for i in range(prompt_len)],
                  sampling_params=SamplingParams(max_tokens=1, ignore_eos=True), pooling_params=None,
                  block_hasher=get_request_block_hasher(hash_block_size, sha256))
    sched.add_request(req)
    notes = []
    if trace is not None:
        watch_allocations(sched, notes)
    preemptions, preempted_at = 0, set()
    try:
        for step in range(1, STEPS + 1):
            computed = req.num_computed_tokens
            so = sched.schedule()
            preempted = so.preempted_req_ids or set()
            preemptions += len(preempted)
            if preempted:
                preempted_at.add(computed)
            if trace is not None:
                trace.append(f"  step {step}: {req.status.name}, scheduled"
                             f" {so.num_scheduled_tokens.get('lone', 0)}, computed {req.num_computed_tokens}"
                             f"/{prompt_len}, free blocks {sched.kv_cache_manager.block_pool.get_num_free_blocks()},"
                             f" held: {group_blocks(sched, 'lone')}{''.join('; ' + n for n in notes)}")
                notes.clear()
            ids = list(so.num_scheduled_tokens)
            sampled = [[7] if sched.requests[r].num_computed_tokens >= sched.requests[r].num_tokens else []
                       for r in ids]
            meta = worker.step(so.kv_connector_metadata)
            sched.update_from_output(so, ModelRunnerOutput(
                req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled,
                kv_connector_output=KVConnectorOutput(kv_connector_worker_meta=meta)))
            if "lone" not in sched.requests:
                return step, preemptions, True, preempted_at
        return STEPS, preemptions, False, preempted_at
    finally:
        sched.shutdown()


def main():
    trace = [] if "--trace" in sys.argv else None
    init_none_hash(sha256)
    model_dir = tempfile.mkdtemp(prefix="repro-model-")
    try:
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump({"architectures": ["ReproNeverBuiltModel"], "model_type": "llama", "hidden_size": 64,
                       "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 1,
                       "num_hidden_layers": 2, "vocab_size": 32000, "max_position_embeddings": 1 << 16,
                       "rms_norm_eps": 1e-5, "torch_dtype": "float32", "index_topk": 32}, f)
        ModelRegistry.register_model("ReproNeverBuiltModel", ReproNeverBuiltModel)
        rc = run(model_dir, trace)
    finally:
        shutil.rmtree(model_dir, ignore_errors=True)
    for line in trace or ():
        print(line)
    return rc


def run(model_dir, trace):
    specs = layer_specs()
    vllm_config = make_vllm_config(model_dir, MAX_MODEL_LEN, specs)
    try:
        planned = plan(vllm_config, specs)
        refused = None
    except ValueError as e:
        refused = str(e)
    if refused is None:
        kv_cache_config = planned[0]
        if kv_cache_config.num_blocks != NUM_GPU_BLOCKS or kv_cache_config.hisparse_host_num_blocks != HOST_PAGES:
            print(f"vllm {VERSION}: cannot check: planned {kv_cache_config.num_blocks} GPU blocks and"
                  f" {kv_cache_config.hisparse_host_num_blocks} host pages, not {NUM_GPU_BLOCKS} and {HOST_PAGES}")
            return 2
        steps, preemptions, finished, preempted_at = serve_alone(vllm_config, *planned, PROMPT_LEN, trace)
        if not finished:
            print(f"FAIL: vllm {VERSION}: the start check accepts max_model_len {MAX_MODEL_LEN} on {NUM_GPU_BLOCKS}"
                  f" GPU blocks, but a lone request of {PROMPT_LEN} prompt tokens (chunks of {CHUNK}) did not finish"
                  f" in {steps} steps: the scheduler preempted it {preemptions} times, each time with"
                  f" {' or '.join(map(str, sorted(preempted_at)))} of its {PROMPT_LEN} tokens computed (its next"
                  f" chunk's allocate_slots fails while the previous chunk's resident pages await their host writes)")
            return 1
        print(f"ok: vllm {VERSION} accepts max_model_len {MAX_MODEL_LEN} and serves a lone {PROMPT_LEN}-token"
              f" request in {steps} steps ({preemptions} preemptions)")
        return 0
    found = re.search(r"estimated maximum model length is (\d+)", refused)
    if not found:
        print(f"vllm {VERSION}: cannot check: the start check refused max_model_len {MAX_MODEL_LEN} with no"
              f" estimate: {refused[:200]}")
        return 2
    estimate = int(found.group(1))
    vllm_config = make_vllm_config(model_dir, estimate, specs)
    try:
        planned = plan(vllm_config, specs)
    except ValueError as e:
        print(f"FAIL: vllm {VERSION}: the start check refuses max_model_len {estimate}, its own estimate: {e}")
        return 1
    steps, preemptions, finished, _ = serve_alone(vllm_config, *planned, estimate - 1, trace)
    if not finished:
        print(f"FAIL: vllm {VERSION}: the start check refuses {MAX_MODEL_LEN} (estimate {estimate}) and accepts"
              f" {estimate}, but a lone request of {estimate - 1} prompt tokens did not finish in {steps} steps"
              f" ({preemptions} preemptions)")
        return 1
    print(f"ok: vllm {VERSION} refuses max_model_len {MAX_MODEL_LEN} at start (estimate {estimate}) and serves a"
          f" lone {estimate - 1}-token request in {steps} steps ({preemptions} preemptions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
