"""Standalone reproducer: a partial prefix-cache hit's copy-on-write rewrites the
source block of an OffloadingConnector store that is still in flight (vLLM 0.28.0).

Needs only vLLM and runs on CPU (a local config.json; the model is never built):

    PYTHONPATH=<vllm tree> python repro.py

The engine core's Scheduler with the OffloadingConnector (CPU tier), full attention +
Mamba ("align"), 64-token blocks, prefix-match unit 16 (--prefix-match-unit 16), 40 GPU
blocks. Request A (doc[:285], one output token) prefills and finishes: the connector
builds the store of its last chunks only on the next step, from A's blocks, which the
core has freed meanwhile (the connector fences them: a store whose source block is
handed out again in a step is flushed first). Request B (doc[:521] + its own tokens)
arrives as A finishes and hits A's prefix at 272 tokens: a partial hit inside A's
block 4, so the KV-cache manager copies the cached block into a fresh one
(SchedulerOutput.kv_cache_block_copies). The check, on every step: a block that is
the destination of a copy in the step is not the source of a store job built in this
step or earlier that the step's metadata does not flush (the worker copies a store
after the step's forward unless it is flushed; the block copies run before it).

Exit 1 with one line when a copy's destination is such a store's source (0.28.0), 0
when every such store is flushed, 2 when no copy met a store's source block.
"""

import dataclasses
import json
import os
import sys
import tempfile

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")  # its log lines (no triton on CPU) to stderr, not stdout

import torch  # noqa: E402

import vllm  # noqa: E402
from vllm import ModelRegistry, SamplingParams  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, ParallelConfig, SchedulerConfig,
    VllmConfig)
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor, MambaSpec)
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

BLOCK, UNIT, NUM_BLOCKS = 64, 16, 16
DOC = [1 + i for i in range(600)]
STEPS = 8
MAX_AGE = 2  # a store built at step t is in flight in steps t+1 and t+2 (its copy takes that long)
ARRIVALS = {  # step -> [(request, prompt, max_tokens)]
    1: [("A", DOC[:200], 1), ("B", DOC[:300], 3)],
    2: [("C", [7500 + i for i in range(350)], 2)],
}


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


def kv_cache_tensor(size, layers, layer_stride, block_stride):
    """One tensor shared by both groups' layers (the CPU tier sizes its chunks from it)."""
    if "shared_by" in {f.name for f in dataclasses.fields(KVCacheTensor)}:
        return KVCacheTensor(size=size, shared_by=layers)
    return KVCacheTensor(size=size, layers=layers, layer_stride=layer_stride, block_stride=block_stride)


def make_scheduler(model_dir):
    specs = [FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float32),
             MambaSpec(block_size=BLOCK, shapes=((64,),), dtypes=(torch.float32,), mamba_cache_mode="align")]
    page = sum(s.page_size_bytes for s in specs)
    kv_cache_config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[kv_cache_tensor(NUM_BLOCKS * page, ["full", "mamba"], NUM_BLOCKS * max(
            s.page_size_bytes for s in specs), page)],
        kv_cache_groups=[KVCacheGroupSpec(["full"], specs[0]), KVCacheGroupSpec(["mamba"], specs[1])])
    model_config = ModelConfig(model=model_dir, tokenizer=model_dir, skip_tokenizer_init=True,
                               max_model_len=8192, dtype="float32", enforce_eager=True)
    cache_config = CacheConfig(block_size=BLOCK, enable_prefix_caching=True, mamba_cache_mode="align",
                               prefix_match_unit=UNIT)
    cache_config.num_gpu_blocks = NUM_BLOCKS
    vllm_config = VllmConfig(
        model_config=model_config, cache_config=cache_config,
        scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=8192,
                                         enable_chunked_prefill=True, is_encoder_decoder=False),
        parallel_config=ParallelConfig(), device_config=DeviceConfig(device="cpu"),
        kv_transfer_config=KVTransferConfig(
            kv_connector="OffloadingConnector", kv_role="kv_both",
            kv_connector_extra_config={"cpu_bytes_to_use": 256 * page}))
    cache_config.num_gpu_blocks = NUM_BLOCKS
    kw = {}
    from vllm.v1.core import kv_cache_utils
    if hasattr(kv_cache_utils, "resolve_kv_cache_block_sizes"):
        bs, hbs = kv_cache_utils.resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
        kw["hash_block_size"] = hbs
    return Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                     structured_output_manager=StructuredOutputManager(vllm_config), block_size=BLOCK, **kw)


def make_request(request_id, prompt, max_tokens):
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    params.update_from_generation_config({}, eos_token_id=0)
    return Request(request_id=request_id, prompt_token_ids=prompt, sampling_params=params, pooling_params=None,
                   block_hasher=get_request_block_hasher(UNIT, sha256))


def finish(sched, so):
    """A fake model's output for a scheduled step: one token per request past its prompt."""
    ids = list(so.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        req = sched.requests[rid]
        sampled.append([1000 + req.num_output_tokens] if req.num_computed_tokens >= req.num_tokens else [])
    sched.update_from_output(so, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                                   sampled_token_ids=sampled))


def main():
    init_none_hash(sha256)
    model_dir = tempfile.mkdtemp(prefix="repro-model-")
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump({"architectures": ["ReproNeverBuiltModel"], "model_type": "llama", "hidden_size": 64,
                   "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 1,
                   "num_hidden_layers": 2, "vocab_size": 32000, "max_position_embeddings": 8192,
                   "rms_norm_eps": 1e-5, "torch_dtype": "float32"}, f)
    ModelRegistry.register_model("ReproNeverBuiltModel", ReproNeverBuiltModel)
    sched = make_scheduler(model_dir)
    stores = {}  # store job id -> (request, step built, its GPU source blocks)
    flushed = set()
    met = 0
    for n in range(1, STEPS + 1):
        for rid, prompt, max_tokens in ARRIVALS.get(n, ()):
            sched.add_request(make_request(rid, prompt, max_tokens))
        so = sched.schedule()
        meta = so.kv_connector_metadata
        flushed |= set(meta.jobs_to_flush or ())
        for copy in so.kv_cache_block_copies or ():
            for jid, (rid, built, src) in sorted(stores.items()):
                if n - built <= MAX_AGE and copy.dst_block_id in src:
                    met += 1
                    if jid not in flushed:
                        print(f"FAIL: vllm {vllm.__version__}: step {n}: block {copy.dst_block_id}, the source of store"
                              f" job {jid} of request {rid} (built at step {built}, not flushed), is the destination"
                              f" of the block copy {copy.src_block_id} -> {copy.dst_block_id}, which runs before"
                              " the store copies it")
                        return 1
        for jid, job in meta.store_jobs.items():
            stores[jid] = (job.req_id, n, [int(b) for b in job.src_spec.block_ids])
        finish(sched, so)
    if not met:
        print(f"vllm {vllm.__version__}: cannot check: no block copy's destination was an earlier store's source")
        return 2
    print(f"vllm {vllm.__version__}: ok: the {met} store(s) whose source block a copy rewrites are flushed first")
    return 0


if __name__ == "__main__":
    sys.exit(main())
