"""Standalone reproducer: the OffloadingConnector defers a request's lookup on a chunk
whose write is in flight although no hit the request can get would load it: the
EAGLE drafter group pops that chunk as the volatile trailing chunk whatever the write
gives, so after the wait the connector answers 0, the answer it has at once (vLLM 0.33.0).

Needs only vLLM and runs on CPU (a local config.json; the model is never built):

    PYTHONPATH=<vllm tree> python repro.py

The engine core's Scheduler with the OffloadingConnector (CPU tier), an EAGLE drafter (2
speculative tokens) and one full-attention KV-cache group holding the target's and the
drafter's layers (so tagged is_eagle_group), 16-token blocks. Request A (96 prompt tokens,
1 output token) runs and finishes; the connector's stores of its 6 chunks stay in flight
(this fake worker reports no transfer done), so the CPU tier answers HIT_PENDING for them. Request B (A's prompt and 40 tokens
of its own) then hits 80 tokens in the GPU prefix cache (5 of A's 6 blocks: the
coordinator drops the last block for EAGLE) and asks the connector for the rest: chunk 5
is pending, chunk 6 was never stored. The lookup defers (get_num_new_matched_tokens
returns None) and B is not scheduled. After some steps the writes of A's chunks complete,
as the worker would report them: in one run successfully, in a second run as failed
(complete_store(success=False), the tier drops them). The check: when B's lookup was
deferred on pending writes, the hit it gets once they complete is larger than the hit it
gets once they fail; otherwise the wait could not give more and the deferral only delayed B.

Exit 1 with one line when B was deferred and both runs give the same hit (0.33.0), 0 when B
is not deferred or the wait gave more, 2 when the traffic did not reach the case (no write
in flight past B's GPU hit when B arrived).
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
    SpeculativeConfig, VllmConfig)
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor)
from vllm.v1.kv_offload.base import ReqContext, make_offload_key  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

BLOCK, NUM_BLOCKS = 16, 64
PROMPT_A = [1 + i for i in range(96)]  # 6 full blocks, 6 chunks
PROMPT_B = PROMPT_A + [5000 + i for i in range(40)]
WAIT_STEPS = 4  # steps B waits before the writes complete
STEPS = 40


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
    """One tensor shared by both groups' layers (the CPU tier sizes its chunks from it), in the
    release's KVCacheTensor fields (0.33.0: layers and strides; before: shared_by)."""
    if "shared_by" in {f.name for f in dataclasses.fields(KVCacheTensor)}:
        return KVCacheTensor(size=size, shared_by=layers)
    return KVCacheTensor(size=size, layers=layers, layer_stride=layer_stride, block_stride=block_stride)


def make_scheduler(model_dir):
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float32)
    page = spec.page_size_bytes
    # one group holds the target's and the drafter's layers (the same spec), tagged as the
    # drafter's, as 0.33.0's planner tags a group holding a draft layer (kv_cache_planning.py:1651-1655)
    kv_cache_config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[kv_cache_tensor(NUM_BLOCKS * page, ["full", "draft"], NUM_BLOCKS * page, page)],
        kv_cache_groups=[KVCacheGroupSpec(["full", "draft"], spec, is_eagle_group=True)])
    model_config = ModelConfig(model=model_dir, tokenizer=model_dir, skip_tokenizer_init=True,
                               max_model_len=4096, dtype="float32", enforce_eager=True)
    cache_config = CacheConfig(block_size=BLOCK, enable_prefix_caching=True)
    cache_config.num_gpu_blocks = NUM_BLOCKS
    speculative_config = SpeculativeConfig(  # EAGLE, 2 tokens; the drafter is never built either
        method="eagle", model=model_dir, num_speculative_tokens=2, target_model_config=model_config,
        target_parallel_config=ParallelConfig())
    vllm_config = VllmConfig(
        speculative_config=speculative_config, model_config=model_config, cache_config=cache_config,
        scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=512, max_model_len=4096,
                                         enable_chunked_prefill=True, is_encoder_decoder=False),
        parallel_config=ParallelConfig(), device_config=DeviceConfig(device="cpu"),
        kv_transfer_config=KVTransferConfig(
            kv_connector="OffloadingConnector", kv_role="kv_both",
            kv_connector_extra_config={"cpu_bytes_to_use": 256 * page}))
    cache_config.num_gpu_blocks = NUM_BLOCKS
    return Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                     structured_output_manager=StructuredOutputManager(vllm_config), block_size=BLOCK)


def make_request(request_id, prompt, max_tokens):
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    params.update_from_generation_config({}, eos_token_id=0)
    return Request(request_id=request_id, prompt_token_ids=prompt, sampling_params=params, pooling_params=None,
                   block_hasher=get_request_block_hasher(BLOCK, sha256))


def finish(sched, so):
    """A fake model's output for a scheduled step: one token per request past its prompt."""
    ids = list(so.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        req = sched.requests[rid]
        sampled.append([1000 + req.num_output_tokens] if req.num_computed_tokens >= req.num_tokens else [])
    sched.update_from_output(so, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                                   sampled_token_ids=sampled))


def answer(manager, key):
    """The tier's answer for a key by name (0.21.0 - 0.24.0 tiers answer True / None (pending) / False)."""
    got = manager.lookup(key, ReqContext(req_id="probe"))
    return {True: "HIT", None: "HIT_PENDING", False: "MISS"}[got] if got in (True, None, False) else got.name


def run(model_dir, writes_succeed):
    """B's deferred steps, its connector hit, and the tier's answers for A's chunks when B arrived."""
    sched = make_scheduler(model_dir)
    cs = sched.connector.connector_scheduler
    sched.add_request(make_request("A", PROMPT_A, 1))
    while "A" in sched.requests:  # A prefills, samples its one token and finishes
        finish(sched, sched.schedule())
    b = make_request("B", PROMPT_B, 1)
    n_chunks = len(b.block_hashes)
    keys = {g: [make_offload_key(h, g) for h in b.block_hashes] for g in (0,)}
    at_arrival = {g: [answer(cs.manager, k) for k in keys[g][:n_chunks]] for g in (0,)}
    pending = [k for g in (0,) for k in keys[g] if answer(cs.manager, k) == "HIT_PENDING"]
    answers = []  # B's lookups as the scheduler asks them: (locally computed tokens, the connector's answer)
    ask = sched.connector.get_num_new_matched_tokens

    def observed(request, num_computed_tokens, *args, **kwargs):
        got = ask(request, num_computed_tokens, *args, **kwargs)
        if request.request_id == "B":
            answers.append((num_computed_tokens, got[0]))
        return got

    sched.connector.get_num_new_matched_tokens = observed
    sched.add_request(b)
    for n in range(1, STEPS + 1):
        if n == WAIT_STEPS + 1 and pending:  # the worker reports A's writes done (or failed)
            cs.manager.complete_store(pending, ReqContext(req_id="A"), success=writes_succeed)
        finish(sched, sched.schedule())
        if answers and answers[-1][1] is not None:  # the connector answered (a load, if any, never completes here)
            break
    deferred = sum(1 for _, a in answers if a is None)
    gpu_hit, hit = answers[-1] if answers else (None, None)
    first = (gpu_hit or 0) // BLOCK  # B's chunks past its GPU hit
    return dict(deferred=deferred, hit=hit, gpu_hit=gpu_hit, past_gpu_hit=at_arrival[0][first:], first=first,
                pending=sum(1 for a in at_arrival[0][first:] if a == "HIT_PENDING"), answered=hit is not None)


def main():
    init_none_hash(sha256)
    model_dir = tempfile.mkdtemp(prefix="repro-model-")
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                   "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 1,
                   "num_hidden_layers": 2, "vocab_size": 32000, "max_position_embeddings": 4096,
                   "rms_norm_eps": 1e-5, "torch_dtype": "float32"}, f)
    # the target and the EAGLE drafter SpeculativeConfig derives from it ("Eagle" + the target's class)
    ModelRegistry.register_model("LlamaForCausalLM", ReproNeverBuiltModel)
    ModelRegistry.register_model("EagleLlamaForCausalLM", ReproNeverBuiltModel)
    ok, failed = run(model_dir, True), run(model_dir, False)
    states = (f"chunks {ok['first']}-{ok['first'] + len(ok['past_gpu_hit']) - 1}:"
              f" {', '.join(ok['past_gpu_hit'])}")
    if not ok["answered"] or not failed["answered"]:
        print(f"vllm {vllm.__version__}: cannot check: the connector gave B no answer in {STEPS} steps")
        return 2
    if not ok["pending"]:
        print(f"vllm {vllm.__version__}: cannot check: no write past B's GPU hit ({ok['gpu_hit']} tokens) was in"
              f" flight when B arrived (tier, {states})")
        return 2
    if ok["deferred"] == 0:
        print(f"vllm {vllm.__version__}: ok: B not deferred (GPU hit {ok['gpu_hit']}, connector hit {ok['hit']};"
              f" tier when B arrived, {states})")
        return 0
    if ok["hit"] == failed["hit"]:
        print(f"FAIL: vllm {vllm.__version__}: request B (GPU prefix hit {ok['gpu_hit']} tokens) was deferred"
              f" {ok['deferred']} step(s) on {ok['pending']} in-flight write(s) past it; once they complete its connector"
              f" hit is {ok['hit']} tokens, the same as once they fail ({failed['hit']}): the wait could not give"
              f" more (tier when B arrived, {states})")
        return 1
    print(f"vllm {vllm.__version__}: ok: B waited {ok['deferred']} step(s) and the wait gave {ok['hit']} tokens"
          f" (failed writes: {failed['hit']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
