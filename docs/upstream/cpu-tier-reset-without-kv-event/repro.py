"""Standalone reproducer: reset_prefix_cache(reset_connector=True) empties the
OffloadingConnector's CPU tier without a KV event, so a KV-event consumer keeps
listing CPU blocks the tier no longer holds (vLLM 0.33.0).

Needs only vLLM and runs on CPU (a local config.json; the model is never built):

    PYTHONPATH=<vllm tree> python repro.py [--events]

The engine core's Scheduler with the OffloadingConnector (CPU tier) and KV cache
events on (KVEventsConfig(enable_kv_cache_events=True, publisher="null"); every
batch the scheduler publishes is recorded), one full-attention group, 16-token
blocks. A fake worker completes every transfer job in the step that carries it.
Request A (128 prompt tokens) runs to its end: its 8 chunks reach the CPU tier,
announced by BlockStored (medium CPU). Request B then arrives and is still
running when the engine core serves reset_prefix_cache(reset_connector=True)
(the default reset_running_requests=False, as POST
/reset_prefix_cache?reset_external=true sends it during traffic). The GPU pool
refuses its own reset (B holds blocks) and publishes nothing; the connector reset
empties the CPU tier anyway. One more step publishes what the reset left.

The consumer: an index per medium built from the published stream alone
(BlockStored adds, BlockRemoved removes, AllBlocksCleared empties every medium,
the widest reading). The check: every block of A's prompt the index lists on
the CPU medium must still be on the tier, asked through the connector's own
lookup (get_num_new_matched_tokens for a fresh request with A's prompt).

Exit 1 with one line when the index lists CPU blocks the tier no longer holds
(0.22.1 - 0.33.0), 0 when the stream and the tier agree, 2 when A's chunks never
reached the tier (nothing to check). --events also prints the events published
from the reset on, one per line, after the verdict. --idle serves the reset with
nothing running instead (the GPU pool's reset succeeds and publishes
AllBlocksCleared, which this consumer applies to every medium, so the check
passes there; --events shows that AllBlocksCleared is all the stream says).
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
    CacheConfig, DeviceConfig, KVEventsConfig, KVTransferConfig, ModelConfig, ParallelConfig,
    SchedulerConfig, VllmConfig)
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (  # noqa: E402
    OffloadingWorkerMetadata)
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    get_request_block_hasher, init_none_hash, maybe_convert_block_hash)
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

BLOCK, NUM_BLOCKS = 16, 64
PROMPT_A, PROMPT_B = 128, 96


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


def kv_cache_tensor(size, layers, page):
    """The group's one KV-cache tensor (the CPU tier sizes its chunks from it), in the
    release's KVCacheTensor fields (0.33.0: layers and strides; before: shared_by)."""
    if "shared_by" in {f.name for f in dataclasses.fields(KVCacheTensor)}:
        return KVCacheTensor(size=size, shared_by=layers)
    return KVCacheTensor(size=size, layers=layers, layer_stride=size, block_stride=page)


def make_scheduler(model_dir):
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float32)
    page = spec.page_size_bytes
    kv_cache_config = KVCacheConfig(
        num_blocks=NUM_BLOCKS, kv_cache_tensors=[kv_cache_tensor(NUM_BLOCKS * page, ["full"], page)],
        kv_cache_groups=[KVCacheGroupSpec(["full"], spec)])
    model_config = ModelConfig(model=model_dir, tokenizer=model_dir, skip_tokenizer_init=True,
                               max_model_len=4096, dtype="float32", enforce_eager=True)
    cache_config = CacheConfig(block_size=BLOCK, enable_prefix_caching=True)
    cache_config.num_gpu_blocks = NUM_BLOCKS
    vllm_config = VllmConfig(
        model_config=model_config, cache_config=cache_config,
        scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=4096,
                                         enable_chunked_prefill=True, is_encoder_decoder=False),
        parallel_config=ParallelConfig(), device_config=DeviceConfig(device="cpu"),
        kv_transfer_config=KVTransferConfig(
            kv_connector="OffloadingConnector", kv_role="kv_both",
            kv_connector_extra_config={"cpu_bytes_to_use": 256 * page}),
        kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="null"))
    cache_config.num_gpu_blocks = NUM_BLOCKS
    return Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                     structured_output_manager=StructuredOutputManager(vllm_config), block_size=BLOCK)


def make_request(request_id, prompt, max_tokens):
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    params.update_from_generation_config({}, eos_token_id=0)
    return Request(request_id=request_id, prompt_token_ids=prompt, sampling_params=params, pooling_params=None,
                   block_hasher=get_request_block_hasher(BLOCK, sha256))


def step(sched):
    """One engine step: schedule, then a fake model's output (one token per request past its
    prompt) and a fake worker's (every transfer job of the step completed)."""
    so = sched.schedule()
    ids = list(so.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        req = sched.requests[rid]
        sampled.append([1000 + req.num_output_tokens] if req.num_computed_tokens >= req.num_tokens else [])
    meta = so.kv_connector_metadata
    done = {jid: 1 for jid in [*meta.store_jobs, *meta.load_jobs]}
    sched.update_from_output(so, ModelRunnerOutput(
        req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled,
        kv_connector_output=KVConnectorOutput(kv_connector_worker_meta=OffloadingWorkerMetadata(completed_jobs=done))))


class Index:
    """A KV-event consumer's view: the block hashes each medium holds, from the stream alone."""

    def __init__(self):
        self.held = {}

    def apply(self, event):
        if isinstance(event, BlockStored):
            self.held.setdefault(str(event.medium), set()).update(event.block_hashes)
        elif isinstance(event, BlockRemoved):
            self.held.setdefault(str(event.medium), set()).difference_update(event.block_hashes)
        elif isinstance(event, AllBlocksCleared):
            self.held.clear()  # the widest reading: every medium


def on_cpu(index, block_hash):
    """Whether the index lists the block on the CPU medium (the connector publishes the raw hash
    or its external form, by release)."""
    held = index.held.get("CPU", set())
    return block_hash in held or maybe_convert_block_hash(block_hash) in held


def main():
    init_none_hash(sha256)
    model_dir = tempfile.mkdtemp(prefix="repro-model-")
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump({"architectures": ["ReproNeverBuiltModel"], "model_type": "llama", "hidden_size": 64,
                   "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 1,
                   "num_hidden_layers": 2, "vocab_size": 32000, "max_position_embeddings": 4096,
                   "rms_norm_eps": 1e-5, "torch_dtype": "float32"}, f)
    ModelRegistry.register_model("ReproNeverBuiltModel", ReproNeverBuiltModel)
    sched = make_scheduler(model_dir)
    index, published = Index(), []

    def publish(batch):  # what a subscriber receives, in order
        for event in batch.events:
            published.append(event)
            index.apply(event)

    sched.kv_event_publisher.publish = publish
    prompt_a = [1 + i for i in range(PROMPT_A)]
    sched.add_request(make_request("A", prompt_a, 2))
    while "A" in sched.requests:
        step(sched)
    probe = make_request("A-again", prompt_a, 2)  # A's prompt, for the consumer's view and the tier's
    listed_before = sum(on_cpu(index, h) for h in probe.block_hashes)
    if not listed_before:
        print(f"vllm {vllm.__version__}: cannot check: no block of A's prompt reached the CPU tier")
        return 2
    idle = "--idle" in sys.argv
    if not idle:
        sched.add_request(make_request("B", [5000 + i for i in range(PROMPT_B)], 64))
        for _ in range(3):
            step(sched)
    at_reset = len(published)
    ok = sched.reset_prefix_cache(reset_connector=True)
    if idle:  # no step runs: publish what the reset queued as the next step would
        sched.update_from_output(sched.schedule(), ModelRunnerOutput(req_ids=[], req_id_to_index={}))
    else:
        step(sched)  # B runs on; this step publishes what the reset queued
    listed = sum(on_cpu(index, h) for h in probe.block_hashes)
    leading = next((i for i, h in enumerate(probe.block_hashes) if not on_cpu(index, h)), listed)
    # what the listed blocks promise: the leading ones, short of the prompt's last token
    promised = min(leading, (PROMPT_A - 1) // BLOCK) * BLOCK
    if hasattr(sched.connector, "on_new_request"):  # what add_request does first (0.23.0 on)
        sched.connector.on_new_request(probe)
    hit_tokens, _ = sched.connector.get_num_new_matched_tokens(probe, 0)
    hit_tokens = hit_tokens or 0
    after = published[at_reset:]
    kinds = sorted({f"{type(e).__name__}({getattr(e, 'medium', '')})" for e in after})
    if hit_tokens < promised:
        print(f"FAIL: vllm {vllm.__version__}: after reset_prefix_cache(reset_connector=True) (returned {ok};"
              f" {'nothing' if idle else 'request B'} running) the KV events still list {listed} of A's {len(probe.block_hashes)} blocks on"
              f" the CPU medium ({promised} tokens of A's prompt), but the tier answers {hit_tokens} (events"
              f" published from the reset on: {', '.join(kinds) or 'none'})")
        rc = 1
    else:
        print(f"vllm {vllm.__version__}: reset returned {ok}; the events list {listed} of A's blocks on the CPU"
              f" medium, the tier answers {hit_tokens} tokens for A's prompt; ok: the stream and the tier agree"
              f" (events published from the reset on: {', '.join(kinds) or 'none'})")
        rc = 0
    if "--events" in sys.argv:
        for e in after:
            print("  ", type(e).__name__, getattr(e, "medium", None), len(getattr(e, "block_hashes", ())))
    return rc


if __name__ == "__main__":
    sys.exit(main())
