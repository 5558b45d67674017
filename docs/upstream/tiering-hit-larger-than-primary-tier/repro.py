"""Standalone reproducer: with the TieringOffloadingSpec (a CPU primary tier and a
file-system secondary tier), a request whose offloaded prefix has more chunks than the
CPU primary tier holds is deferred by its lookup for ever: each step's lookup promotes
the request's missing chunks from the file-system tier, and each promotion evicts a
chunk of the same request that answered HIT earlier in the same lookup (vLLM 0.33.0).

Needs only vLLM and runs on CPU (a local config.json; the model is never built):

    PYTHONPATH=<vllm tree> python repro.py [--trace]

The engine core's Scheduler with the OffloadingConnector and
``spec_name: TieringOffloadingSpec``: a CPU primary tier of 4 chunks
(``cpu_bytes_to_use``) and one ``fs`` secondary tier on a temporary directory (one I/O
thread each way, ``tier_poll_interval_s`` 0), one full-attention group, 16-token blocks,
a chunk per block. A fake worker completes every GPU<->CPU transfer job in the step
that carries it; after every schedule() and update_from_output() the reproducer waits for
the file-system tier's I/O jobs and lookup batches (its threads), so every run takes the
same steps. Request A (8 full blocks and 8 tokens) runs to its end: its 8 chunks are
stored to the CPU tier and cascade to the file-system tier, and the CPU tier keeps 4 of
them (by the release's policy: 4 - 7 on 0.24.0 - 0.32.0). The GPU prefix cache is then reset (as if other traffic had evicted A's blocks;
the connector keeps its tiers), and request B with A's prompt arrives: all 8 chunks are
in the file-system tier, 4 in the CPU tier.

The check: B's lookup (get_num_new_matched_tokens) must answer within 50 steps, and B must
then run to its end. Exit 1 with one line when B is deferred 50 steps in a row (0.22.1 -
0.33.0), 0 when it answers and finishes, 2 when the setup did not come about.
--trace also prints, per step, the tier's answer for each of B's chunks (H HIT, P HIT_PENDING,
R RETRY, M MISS; for a file-system hit, the CPU chunks its promotion evicted, or "full"),
the connector's answer (None: deferred), and the CPU tier's chunks at the step's end.
"""

import dataclasses
import json
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
from vllm.v1.kv_offload.base import make_offload_key  # noqa: E402
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory  # noqa: E402
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

BLOCK, NUM_BLOCKS = 16, 64
CPU_CHUNKS = 4  # the CPU primary tier's capacity, in chunks (one 16-token block each)
PROMPT = [1 + i for i in range(8 * BLOCK + 8)]  # 8 full chunks: twice the CPU tier
STEPS = 50  # consecutive deferrals that count as "for ever"


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


def make_scheduler(model_dir, fs_root):
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float32)
    page = spec.page_size_bytes
    kv_cache_config = KVCacheConfig(
        num_blocks=NUM_BLOCKS, kv_cache_tensors=[kv_cache_tensor(NUM_BLOCKS * page, ["full"], page)],
        kv_cache_groups=[KVCacheGroupSpec(["full"], spec)])
    model_config = ModelConfig(model=model_dir, tokenizer=model_dir, skip_tokenizer_init=True,
                               max_model_len=4096, dtype="float32", enforce_eager=True)
    cache_config = CacheConfig(block_size=BLOCK, enable_prefix_caching=True)
    cache_config.num_gpu_blocks = NUM_BLOCKS
    # the tier divides cpu_bytes_to_use by a chunk's bytes rounded up to the spec's alignment (a page)
    align = getattr(TieringOffloadingSpec, "BLOCK_SIZE_ALIGNMENT", 1)
    chunk_bytes = -(-page // align) * align
    vllm_config = VllmConfig(
        model_config=model_config, cache_config=cache_config,
        scheduler_config=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=32, max_model_len=4096,
                                         enable_chunked_prefill=True, is_encoder_decoder=False),
        parallel_config=ParallelConfig(), device_config=DeviceConfig(device="cpu"),
        kv_transfer_config=KVTransferConfig(
            kv_connector="OffloadingConnector", kv_role="kv_both",
            kv_connector_extra_config={
                "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": CPU_CHUNKS * chunk_bytes,
                "tier_poll_interval_s": 0,
                # the file-system tier ("fs"; "fs_python" in 0.22.1)
                "secondary_tiers": [{"type": "fs" if "fs" in SecondaryTierFactory._registry else "fs_python",
                                     "root_dir": fs_root, "n_read_threads": 1,
                                     "n_write_threads": 1}]}))
    cache_config.num_gpu_blocks = NUM_BLOCKS
    return Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                     structured_output_manager=StructuredOutputManager(vllm_config), block_size=BLOCK)


def make_request(request_id, prompt, max_tokens):
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    params.update_from_generation_config({}, eos_token_id=0)
    return Request(request_id=request_id, prompt_token_ids=prompt, sampling_params=params, pooling_params=None,
                   block_hasher=get_request_block_hasher(BLOCK, sha256))


def settle(manager):
    """Wait for the secondary tiers' threads: every I/O job (cascade, promotion) and every
    lookup batch the step submitted has finished, so each run takes the same steps."""
    for tier in manager.secondary_tiers:
        if hasattr(tier, "drain_jobs"):
            tier.drain_jobs()
        else:  # before 0.24: every submitted job finished (handed over or waiting to be)
            pool = tier._pool
            deadline = time.monotonic() + 60
            while pool.repro_handed + len(pool._finished_q) < pool.repro_submitted:
                if time.monotonic() > deadline:
                    raise RuntimeError("the file-system tier's jobs did not finish")
                time.sleep(0.0005)
        lm = getattr(tier, "_lookup_manager", None)
        if lm is None:
            continue
        awaited = {(k, getattr(st, "generation", None)) for k, st in lm._lookup_state.items()
                   if (st.phase.name == "IN_FLIGHT" if hasattr(st, "phase") else st.result is None)}
        deadline = time.monotonic() + 60
        while awaited:
            batches = []
            while True:
                try:
                    batches.append(lm._pending_results.get_nowait())
                except queue.Empty:
                    break
            for b in batches:
                lm._pending_results.put(b)
            posted = {(e[0], e[1] if len(e) == 3 else None) for b in batches for e in b}
            if awaited <= posted:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the file-system tier's lookups did not finish")
            time.sleep(0.0005)


def count_jobs(manager):
    """Before 0.24 a tier's pool has no wait_idle: count its jobs, submitted and handed over."""
    for tier in manager.secondary_tiers:
        if hasattr(tier, "drain_jobs"):
            continue
        pool = tier._pool
        pool.repro_submitted = pool.repro_handed = 0
        enqueue_load, enqueue_store, get_finished = pool.enqueue_load, pool.enqueue_store, pool.get_finished

        def counted(enqueue):
            def wrapper(*args, **kwargs):
                pool.repro_submitted += 1
                return enqueue(*args, **kwargs)
            return wrapper

        def handed():
            jobs = get_finished()
            pool.repro_handed += len(jobs)
            return jobs

        pool.enqueue_load, pool.enqueue_store, pool.get_finished = counted(enqueue_load), counted(enqueue_store), handed


def step(sched, manager):
    """One engine step: schedule, then a fake model's output (one token per request past its
    prompt) and a fake worker's (every transfer job of the step completed)."""
    so = sched.schedule()
    settle(manager)
    ids = list(so.num_scheduled_tokens)
    sampled = []
    for rid in ids:
        req = sched.requests[rid]
        sampled.append([1000 + req.num_output_tokens] if req.num_computed_tokens >= req.num_tokens else [])
    meta = so.kv_connector_metadata
    done = {jid: 1 for jid in [*meta.store_jobs, *meta.load_jobs]}
    loaded = {job.req_id for job in meta.load_jobs.values() if not getattr(job, "sync", False)}
    sched.update_from_output(so, ModelRunnerOutput(
        req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled,
        kv_connector_output=KVConnectorOutput(finished_recving=loaded or None,
                                              kv_connector_worker_meta=OffloadingWorkerMetadata(completed_jobs=done))))
    settle(manager)


def answer_name(got):
    """A tier's lookup answer, in one letter: H HIT, P HIT_PENDING, R RETRY, M MISS (before 0.25,
    a tier answers True, None (pending or busy: "N") or False)."""
    if got is True or got is False or got is None:
        return {True: "H", None: "N", False: "M"}[got]
    return {"HIT": "H", "HIT_PENDING": "P", "RETRY": "R", "MISS": "M"}[got.name]


def policy_chunks(manager):
    """The CPU primary tier's entries (``chunks`` from 0.30.0, ``blocks`` before)."""
    policy = manager.primary_tier._policy
    return policy.chunks if hasattr(policy, "chunks") else policy.blocks


def primary_view(manager, names):
    """The CPU primary tier's chunks, by B's chunk index (pending: a promotion in flight)."""
    chunks = policy_chunks(manager)
    held = sorted((int(names[k]) if k in names else 10**6, c.is_ready) for k, c in chunks.items())
    return " ".join(f"{'?' if i == 10**6 else i}{'' if ready else '(pending)'}" for i, ready in held)


def main():
    init_none_hash(sha256)
    model_dir = tempfile.mkdtemp(prefix="repro-model-")
    fs_root = tempfile.mkdtemp(prefix="repro-fs-tier-")
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump({"architectures": ["ReproNeverBuiltModel"], "model_type": "llama", "hidden_size": 64,
                   "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 1,
                   "num_hidden_layers": 2, "vocab_size": 32000, "max_position_embeddings": 4096,
                   "rms_norm_eps": 1e-5, "torch_dtype": "float32"}, f)
    ModelRegistry.register_model("ReproNeverBuiltModel", ReproNeverBuiltModel)
    sched = make_scheduler(model_dir, fs_root)
    try:
        return run(sched)
    finally:
        sched.shutdown()
        shutil.rmtree(fs_root, ignore_errors=True)
        shutil.rmtree(model_dir, ignore_errors=True)


def run(sched):
    manager = sched.connector.connector_scheduler.manager
    primary = manager.primary_tier
    capacity = primary._num_chunks if hasattr(primary, "_num_chunks") else primary._num_blocks
    count_jobs(manager)
    if capacity != CPU_CHUNKS:
        print(f"vllm {vllm.__version__}: cannot check: the CPU primary tier holds {capacity} chunks, not {CPU_CHUNKS}")
        return 2
    sched.add_request(make_request("A", PROMPT, 1))
    while "A" in sched.requests:  # A prefills (32 tokens a step), samples its one token and finishes
        step(sched, manager)
    for _ in range(2):  # A's last stores complete and cascade
        step(sched, manager)
    b = make_request("B", PROMPT, 1)
    keys = [make_offload_key(h, 0) for h in b.block_hashes]
    names = {k: f"{i}" for i, k in enumerate(keys)}
    fs = manager.secondary_tiers[0]
    in_fs = sum(os.path.exists(fs.file_mapper.get_file_name(k)) for k in keys)
    in_cpu = [names[k] for k in policy_chunks(manager) if k in names]
    if in_fs < len(keys) or len(in_cpu) != CPU_CHUNKS:
        print(f"vllm {vllm.__version__}: cannot check: A's {len(keys)} chunks did not reach the tiers"
              f" ({in_fs} in the fs tier, CPU tier: {' '.join(in_cpu)})")
        return 2
    if not sched.reset_prefix_cache():  # A's GPU blocks are gone; the connector's tiers are kept
        print(f"vllm {vllm.__version__}: cannot check: the GPU prefix cache was not reset")
        return 2

    answers, trace = [], []  # B's lookups: the connector's answer; per step, the tier's answers and contents
    ask, lookup = sched.connector.get_num_new_matched_tokens, manager.lookup
    seen = []

    def observed(request, num_computed_tokens, *args, **kwargs):
        seen.clear()
        got = ask(request, num_computed_tokens, *args, **kwargs)
        if request.request_id == "B":
            assert num_computed_tokens == 0, "B was asked with a GPU prefix-cache hit"
            answers.append(got[0])
            trace.append(" ".join(seen))
        return got

    write, promoted = primary.prepare_write, []

    def write_seen(keys, *args, **kwargs):  # a promotion's slot in the CPU tier (prepare_store)
        got = write(keys, *args, **kwargs)
        promoted.append(None if got is None else [names.get(k, "?") for k in got.evicted_keys])
        return got

    def lookup_seen(key, req_context, *args, **kwargs):
        promoted.clear()
        got = lookup(key, req_context, *args, **kwargs)
        if key in names:
            note = answer_name(got)
            if promoted:  # an fs-tier hit: promoted (evicting) or refused (tier full)
                note += "(full)" if promoted[0] is None else f"(evicts {','.join(promoted[0]) or '-'})"
            seen.append(names[key] + note)
        return got

    sched.connector.get_num_new_matched_tokens = observed
    manager.lookup = lookup_seen
    primary.prepare_write = write_seen
    sched.add_request(b)
    views = []
    for _ in range(STEPS):
        step(sched, manager)
        views.append(primary_view(manager, names))
        if answers and answers[-1] is not None:
            break
    deferred = sum(1 for a in answers if a is None)
    finished_in = None
    if answers and answers[-1] is not None:  # B loads what the lookup answered and runs to its end
        for n in range(1, STEPS + 1):
            step(sched, manager)
            if "B" not in sched.requests:
                finished_in = n
                break
    last = trace[-1] if trace else ""
    if answers and answers[-1] is None and deferred >= STEPS:
        print(f"FAIL: vllm {vllm.__version__}: request B ({len(keys)} chunks in the fs tier; the CPU primary tier holds"
              f" {capacity}) was deferred by its lookup {deferred} steps in a row: each lookup's promotions evict chunks"
              f" of B that answered HIT in the same lookup (last lookup, chunk+H/P/R/M: {last})")
        rc = 1
    elif answers and answers[-1] is not None and finished_in is None:
        print(f"FAIL: vllm {vllm.__version__}: request B's lookup answered {answers[-1]} tokens after {deferred} deferred"
              f" step(s), but B did not finish in {STEPS} more steps")
        rc = 1
    elif answers and answers[-1] is not None:
        print(f"vllm {vllm.__version__}: ok: request B's lookup answered {answers[-1]} tokens"
              f" ({answers[-1] // BLOCK} of {len(keys)} chunks; the CPU tier holds {capacity}) after {deferred}"
              f" deferred step(s) and ran to its end in {finished_in} more step(s);"
              f" last lookup: {last}")
        rc = 0
    else:
        print(f"vllm {vllm.__version__}: cannot check: B was not looked up")
        rc = 2
    if "--trace" in sys.argv:
        for n, (t, v) in enumerate(zip(trace, views), 1):
            print(f"  step {n}: B's lookup {t} -> {answers[n - 1]}; then the CPU tier holds {v}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
