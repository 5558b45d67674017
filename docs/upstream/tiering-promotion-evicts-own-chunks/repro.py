"""Standalone reproducer: with the tiering spec and the CPU tier's default LRU policy, a
waiting request's promotions from the file-system tier evict its own ready chunks, so its
lookup answers HIT_PENDING every step and the request is never scheduled (vLLM 0.33.0).

Needs only vLLM and runs on CPU (a local config.json; the model is never built):

    PYTHONPATH=<vllm tree> python repro.py [--policy lru|arc] [--steps]

The engine core's Scheduler with the OffloadingConnector and vLLM's TieringOffloadingSpec
(kv_connector_extra_config spec_name "TieringOffloadingSpec"): a CPU primary tier of 8
chunks (cpu_bytes_to_use) and the file-system secondary tier on a temporary directory
(secondary_tiers [{"type": "fs", ...}], tier_poll_interval_s 0: the tiers are served once
per step). One full-attention group, 16-token blocks, one block per chunk. A fake worker
completes every GPU<->CPU transfer job in the step that carries it. After each schedule()
and each update_from_output() the reproducer waits for the fs tier's threads (its jobs,
drain_jobs(), and its lookup batches), so every run takes the same schedule.

Traffic: A (a 6-chunk document D and 8 tokens of its own) runs to its end: D's chunks reach
the CPU tier and are cascaded to the fs tier. F (3 chunks and 8 tokens) runs to its end and
pushes D's last chunk out of the CPU tier. The GPU prefix cache is reset (so D is served
by the offload tiers only, as after the GPU cache turned over). B (D and 8 tokens of its own)
arrives; one step later C (3 chunks and 8 tokens, one output token) arrives, runs and
finishes while B waits. The check: B must be scheduled within 24 steps.

Exit 1 with one line when B is never scheduled while its promotions evict its own chunks
(0.33.0 with the LRU policy), 0 when B is scheduled, 2 when nothing could be checked (D
never reached the fs tier, the CPU tier is not 8 chunks, or B waits for another reason). --policy arc runs the CPU tier's ARC policy instead. --steps also prints, after
the verdict, each step's lookup answers for B, its promotions and what each evicted, and
the CPU tier's chunks in eviction order (for LRU, with their ranks).
"""

import dataclasses
import json
import mmap
import os
import queue
import shutil
import sys
import tempfile
import time

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")  # its log lines (no triton on CPU) to stderr, not stdout

import torch  # noqa: E402

import vllm  # noqa: E402
from vllm import ModelRegistry, SamplingParams  # noqa: E402
from vllm.config import (  # noqa: E402
    CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, ParallelConfig, SchedulerConfig, VllmConfig)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (  # noqa: E402
    OffloadingWorkerMetadata)
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor)
from vllm.v1.kv_offload.base import LookupResult, make_offload_key  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

BLOCK, NUM_BLOCKS, CPU_CHUNKS = 16, 64, 8
DOC_CHUNKS, FILLER_CHUNKS, C_CHUNKS = 6, 3, 3
STEPS = 24


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


def make_scheduler(model_dir, fs_root, policy):
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float32)
    page = spec.page_size_bytes
    kv_cache_config = KVCacheConfig(
        num_blocks=NUM_BLOCKS, kv_cache_tensors=[kv_cache_tensor(NUM_BLOCKS * page, ["full"], page)],
        kv_cache_groups=[KVCacheGroupSpec(["full"], spec)])
    model_config = ModelConfig(model=model_dir, tokenizer=model_dir, skip_tokenizer_init=True,
                               max_model_len=4096, dtype="float32", enforce_eager=True)
    cache_config = CacheConfig(block_size=BLOCK, enable_prefix_caching=True)
    cache_config.num_gpu_blocks = NUM_BLOCKS
    # the spec rounds a chunk's bytes up to the host page (SharedOffloadRegion.BLOCK_SIZE_ALIGNMENT)
    chunk_bytes = -(-page // mmap.PAGESIZE) * mmap.PAGESIZE
    extra = {"cpu_bytes_to_use": CPU_CHUNKS * chunk_bytes, "eviction_policy": policy,
             "spec_name": "TieringOffloadingSpec", "tier_poll_interval_s": 0,
             "secondary_tiers": [{"type": "fs", "root_dir": fs_root, "n_read_threads": 1,
                                  "n_write_threads": 1}]}
    vllm_config = VllmConfig(
        model_config=model_config, cache_config=cache_config,
        scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=4096,
                                         enable_chunked_prefill=True, is_encoder_decoder=False),
        parallel_config=ParallelConfig(), device_config=DeviceConfig(device="cpu"),
        kv_transfer_config=KVTransferConfig(kv_connector="OffloadingConnector", kv_role="kv_both",
                                            kv_connector_extra_config=extra))
    cache_config.num_gpu_blocks = NUM_BLOCKS
    return Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                     structured_output_manager=StructuredOutputManager(vllm_config), block_size=BLOCK)


def make_request(request_id, prompt, max_tokens):
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    params.update_from_generation_config({}, eos_token_id=0)
    return Request(request_id=request_id, prompt_token_ids=prompt, sampling_params=params, pooling_params=None,
                   block_hasher=get_request_block_hasher(BLOCK, sha256))


def settle(manager, timeout_s=60.0):
    """Wait for the fs tier's threads: every transfer job (the pool's wait_idle) and every
    lookup probe submitted to its lookup thread (answered, not yet drained by the scheduler).
    The jobs are then reported at the next poll, in job order."""
    deadline = time.monotonic() + timeout_s
    for tier in manager.secondary_tiers:
        tier.drain_jobs()
        lookups = getattr(tier, "_lookup_manager", None)
        if lookups is None:
            continue
        while True:
            # a probe is in flight once submitted and unanswered: 0.30 gives it a phase; before, a
            # probe without a result is in flight once the step's flush submitted it
            in_flight = {(key, getattr(state, "generation", None)) for key, state in lookups._lookup_state.items()
                         if (state.phase.name == "IN_FLIGHT" if hasattr(state, "phase") else state.result is None)}
            batches = []
            while True:
                try:
                    batches.append(lookups._pending_results.get_nowait())
                except queue.Empty:
                    break
            for batch in batches:
                lookups._pending_results.put(batch)
            # 0.30+ answers (key, generation, found); 0.28-0.29 (key, found)
            if in_flight <= {(e[0], e[1] if len(e) == 3 else None) for batch in batches for e in batch}:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the fs tier's lookups did not finish")
            time.sleep(0.0005)


def step(sched, manager):
    """One engine step: schedule, then a fake model's output (one token per request past its
    prompt) and a fake worker's (every transfer job of the step completed; a request whose
    load completed is reported in finished_recving)."""
    so = sched.schedule()
    settle(manager)
    ids = list(so.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        req = sched.requests[rid]
        sampled.append([1000 + req.num_output_tokens] if req.num_computed_tokens >= req.num_tokens else [])
    meta = so.kv_connector_metadata
    done = {jid: 1 for jid in [*meta.store_jobs, *meta.load_jobs]}
    loaded = {job.req_id for job in meta.load_jobs.values()}
    sched.update_from_output(so, ModelRunnerOutput(
        req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled,
        kv_connector_output=KVConnectorOutput(
            finished_recving=loaded or None,
            kv_connector_worker_meta=OffloadingWorkerMetadata(completed_jobs=done))))
    settle(manager)
    return so


class Recorder:
    """What B sees, read at the connector's own calls: the connector's answer for B
    (get_num_new_matched_tokens; None defers B for the step), the tiering manager's
    lookup answers for B's chunks, every promotion (the primary tier's prepare_write: the
    chunk promoted and the chunks it evicted) and every store of a request's computed
    chunks (the manager's prepare_store, and what it evicted)."""

    def __init__(self, sched, manager):
        self.names = {}
        self.answers, self.lookups, self.promotions, self.stores, self.tiers = [], [], [], [], []
        connector, primary = sched.connector, manager.primary_tier
        get_matched, lookup, prepare_write, prepare_store = (
            connector.get_num_new_matched_tokens, manager.lookup, primary.prepare_write, manager.prepare_store)

        def get_num_new_matched_tokens(request, num_computed_tokens, *args, **kw):
            out = get_matched(request, num_computed_tokens, *args, **kw)
            if request.request_id == "B":
                self.answers[-1] = out[0]
            return out

        def traced_lookup(key, req_context, **kw):
            result = lookup(key, req_context, **kw)
            if req_context.req_id == "B":
                self.lookups[-1].append((self.name(key), result))
            return result

        def traced_prepare_write(keys, req_context, *args, **kw):
            out = prepare_write(keys, req_context, *args, **kw)
            self.promotions[-1].append((req_context.req_id, [self.name(k) for k in keys],
                                        None if out is None else [self.name(k) for k in out.evicted_keys]))
            return out

        def traced_prepare_store(keys, req_context, *args, **kw):
            out = prepare_store(keys, req_context, *args, **kw)
            if out is not None and out.keys_to_store:
                self.stores[-1].append((req_context.req_id, [self.name(k) for k in out.keys_to_store],
                                        [self.name(k) for k in out.evicted_keys]))
            return out

        connector.get_num_new_matched_tokens = get_num_new_matched_tokens
        manager.lookup = traced_lookup
        primary.prepare_write = traced_prepare_write
        manager.prepare_store = traced_prepare_store

    def name_chunks(self, request, label, count):
        for i, block_hash in enumerate(request.block_hashes[:count]):
            self.names[make_offload_key(block_hash, 0)] = f"{label}{i}"

    def name(self, key):
        return self.names.get(key, "?")

    def new_step(self):
        self.answers.append("not asked")
        self.lookups.append([])
        self.promotions.append([])
        self.stores.append([])


def tier_contents(manager, rec):
    """The CPU tier's chunks, first evicted first (LRU: by rank; ARC: T1 then T2), each with
    'P' while its write is pending."""
    policy = manager.primary_tier._policy
    ranks = getattr(policy, "_ranks", None)
    if ranks is not None:
        chunks = sorted(policy.chunks.items(), key=lambda kv: ranks[kv[0]])
        return " ".join(f"{rec.name(k)}{ranks[k]}{'P' if not c.is_ready else ''}".replace(" ", "")
                        for k, c in chunks)
    if hasattr(policy, "t1"):  # ARC
        chunks = [*policy.t1.items(), *policy.t2.items()]
    else:  # an LRU without ranks (before 0.30): an OrderedDict, least recent first
        chunks = list(getattr(policy, "chunks", getattr(policy, "blocks", {})).items())
    return " ".join(f"{rec.name(k)}{'P' if not c.is_ready else ''}" for k, c in chunks)


def main():
    policy = sys.argv[sys.argv.index("--policy") + 1] if "--policy" in sys.argv else "lru"
    init_none_hash(sha256)
    model_dir = tempfile.mkdtemp(prefix="repro-model-")
    fs_root = tempfile.mkdtemp(prefix="repro-fs-tier-")
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump({"architectures": ["ReproNeverBuiltModel"], "model_type": "llama", "hidden_size": 64,
                   "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 1,
                   "num_hidden_layers": 2, "vocab_size": 32000, "max_position_embeddings": 4096,
                   "rms_norm_eps": 1e-5, "torch_dtype": "float32"}, f)
    ModelRegistry.register_model("ReproNeverBuiltModel", ReproNeverBuiltModel)
    sched = make_scheduler(model_dir, fs_root, policy)
    manager = sched.connector.connector_scheduler.manager
    try:
        return run(sched, manager, policy)
    finally:
        manager.shutdown()
        shutil.rmtree(fs_root, ignore_errors=True)
        shutil.rmtree(model_dir, ignore_errors=True)


def run(sched, manager, policy):
    capacity = getattr(manager.primary_tier, "_num_chunks", getattr(manager.primary_tier, "_num_blocks", None))
    if capacity != CPU_CHUNKS:  # _num_blocks before 0.30
        print(f"vllm {vllm.__version__}: cannot check: the CPU tier holds {capacity} chunks, not {CPU_CHUNKS}")
        return 2
    rec = Recorder(sched, manager)
    doc = [1 + i for i in range(DOC_CHUNKS * BLOCK)]
    a = make_request("A", doc + [2000 + i for i in range(8)], 1)
    f = make_request("F", [3000 + i for i in range(FILLER_CHUNKS * BLOCK + 8)], 1)
    rec.name_chunks(a, "d", DOC_CHUNKS)
    rec.name_chunks(f, "f", FILLER_CHUNKS)
    for req in (a, f):  # each runs to its end
        sched.add_request(req)
        while sched.requests:
            rec.new_step()
            step(sched, manager)
    on_fs = sum(os.path.exists(manager.secondary_tiers[0].file_mapper.get_file_name(make_offload_key(h, 0)))
                for h in a.block_hashes[:DOC_CHUNKS])
    if on_fs < DOC_CHUNKS:
        print(f"vllm {vllm.__version__}: cannot check: {on_fs} of D's {DOC_CHUNKS} chunks reached the fs tier")
        return 2
    sched.reset_prefix_cache()  # the GPU prefix cache only: D is served by the offload tiers
    start = len(rec.answers)
    sched.add_request(make_request("B", doc + [4000 + i for i in range(8)], 1))
    scheduled_at = None
    for i in range(STEPS):
        if i == 1:
            c = make_request("C", [5000 + j for j in range(C_CHUNKS * BLOCK + 8)], 1)
            rec.name_chunks(c, "c", C_CHUNKS)
            sched.add_request(c)
        rec.new_step()
        so = step(sched, manager)
        rec.tiers.append(tier_contents(manager, rec))
        b = sched.requests.get("B")
        if scheduled_at is None and ("B" in so.num_scheduled_tokens or b is None
                                     or b.status == RequestStatus.WAITING_FOR_REMOTE_KVS):
            scheduled_at = i
    answers = rec.answers[start:]
    lookups, promotions, stores = rec.lookups[start:], rec.promotions[start:], rec.stores[start:]
    own = {f"d{i}" for i in range(DOC_CHUNKS)}
    b_promotions = [(keys, evicted) for ps in promotions for rid, keys, evicted in ps if rid == "B" and evicted is not None]
    self_evictions = sum(1 for _, evicted in b_promotions if set(evicted) & own)
    deferred = sum(1 for a_ in answers if a_ is None)
    run_len = 0
    for a_ in reversed(answers):
        if a_ is not None:
            break
        run_len += 1
    c_left = sum(1 for name in tier_contents(manager, rec).split() if name.startswith("c"))
    hit = next((a_ for a_ in answers if a_ not in (None, "not asked")), None)
    if scheduled_at is None and not self_evictions:
        last = " ".join(f"{n}:{r.name}" for n, r in lookups[-1]) or "none"
        print(f"vllm {vllm.__version__}: cannot check: request B was not scheduled in {STEPS} steps, but none of its"
              f" {len(b_promotions)} promotions evicted one of its own chunks (its lookups in the last step: {last})")
        rc = 2
    elif scheduled_at is None:
        pending = sum(1 for step_lookups in lookups[-run_len:] for _, r in step_lookups if r is LookupResult.HIT_PENDING)
        print(f"FAIL: vllm {vllm.__version__}: request B (a {DOC_CHUNKS}-chunk prefix on the fs tier, a CPU tier of"
              f" {CPU_CHUNKS} chunks, {policy}) was never scheduled in {STEPS} steps: its lookup deferred it in the"
              f" last {run_len} steps in a row ({pending} HIT_PENDING answers), and its {len(b_promotions)}"
              f" promotions from the fs tier evicted one of B's own ready chunks {self_evictions} times;"
              f" C's chunks, committed after B's first access, stayed ({c_left} of {C_CHUNKS})")
        rc = 1
    else:
        print(f"vllm {vllm.__version__}: ok: request B ({policy}) was scheduled at step {scheduled_at} with a"
              f" {hit}-token hit from the offload tiers after {deferred} deferred step(s); its"
              f" {len(b_promotions)} promotions evicted one of B's own chunks {self_evictions} times")
        rc = 0
    if "--steps" in sys.argv:
        for i, (answer, step_lookups, ps, ss) in enumerate(zip(answers, lookups, promotions, stores)):
            looked = " ".join(f"{n}:{r.name}" for n, r in step_lookups)
            promoted = "; ".join(f"{rid} promotes {' '.join(k)} -> evicts {' '.join(e) if e is not None else 'refused'}"
                                 for rid, k, e in ps)
            stored = "; ".join(f"{rid} stores {' '.join(k)} -> evicts {' '.join(e) or 'nothing'}" for rid, k, e in ss)
            print(f"  step {i}: B {answer}; lookups {looked or '-'}; {promoted or 'no promotion'}"
                  f"{'; ' + stored if stored else ''}")
            print(f"    CPU tier after it (first evicted first): {rec.tiers[i]}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
