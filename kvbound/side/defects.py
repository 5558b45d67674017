"""The planted trace defects: the one table of the faults a test plants in the trace, beside
``proofs/mutants.py``'s table of the spec's and the encoding's mutants.

Each row names a defect, says what it plants and where (the side module that plants it), and
the finding kinds that must catch it on ``layout`` of ``release``; a job asks for one with the
engine parameter ``mutant`` (tests only), and the side refuses a name the table lacks
(``planted``). Standard library only.
"""

import collections

Defect = collections.namedtuple("Defect", "name plants module catches layout release")

REQUEST_TIER_POINT = "full-tiering-fs@prefix_burst_p=0.5,request_tier_p=0.5"

DEFECTS = (
    Defect("dst_off_by_one", "every captured load's destination block ids one higher (a wrong load plan)",
           "engine", ("plan:spec_disagreement", "lifecycle:load_into_foreign_block"), "full", "0.33.0"),
    Defect("lost_store", "a store job the fake transfer engine never completes",
           "fakes", ("lifecycle:not_drained",), "full", "0.33.0"),
    Defect("evict_at_lookup", "the scripted tier evicts a chunk right after answering HIT for it",
           "fakes", ("lifecycle:load_key_not_confirmed", "crash:exception"), "full", "0.33.0"),
    Defect("store_past_horizon", "_calc_num_offloadable_tokens one chunk past the computed tokens",
           "tier", ("store:foreign_source", "data:wrong_kv"), "full", "0.30.0"),
    Defect("skip_fence", "jobs_to_flush dropped: block reuse no longer waits for its store",
           "tier", ("store:source_rewritten",), "full", "0.30.0"),
    Defect("load_dst_shift", "every load job's GPU destination one block off",
           "tier", ("data:wrong_kv",), "full", "0.30.0"),
    Defect("drop_store", "the last key of each multi-key prepare_store never offered to the tier",
           "tier", ("store:lost_chunk",), "full", "0.30.0"),
    Defect("allocate_past_lookahead", "allocate_slots reserves two blocks past the lookahead slots it is asked for"
           " (an allocator that holds blocks for tokens never scheduled)", "engine",
           ("premise:store-allocated-scheduled",), "full", "0.33.0"),
    Defect("lookup_drop_last_chunk", "the lookup's hit loses its last chunk",
           "lookups", ("lookup:lost_hit",), "full", "0.33.0"),
    Defect("lookup_defer_any_pending", "the lookup defers while the tier holds any key pending, needed or not",
           "lookups", ("lookup:needless_deferral",), "full-scripted", "0.33.0"),
    Defect("lookup_never_return", "a request the lookup deferred once is deferred for ever",
           "lookups", ("liveness:stuck_request",), "full-scripted", "0.33.0"),
    Defect("pd_finish_before_write", "the P/D consumer beside the OffloadingConnector reports a load finished a"
           " step before it writes its blocks", "pd_connector", ("data:wrong_kv",), "full-multi-pd", "0.33.0"),
    Defect("promote_reversed_keys", "the file-system tier promotes a multi-key job's files in reverse order (each"
           " chunk gets another key's file)", "tier", ("data:wrong_kv",), "full-tiering-fs", "0.33.0"),
    Defect("lookup_extra_chunk", "the lookup's hit claims one more chunk than the tier holds",
           "lookups", ("lookup:false_hit",), "full", "0.33.0"),
    Defect("lookup_extra_key", "the lookup also asks the tier, first, for the key of the request's last block"
           " hash (the hit unchanged)", "lookups", ("lookup:keys_disagreement",), "full", "0.33.0"),
    # the faults (engine settings refuse_p, late_p, store_fail_p / fail_p; docs/trace.md "Faults")
    Defect("failed_transfer_reported_ok", "one transfer job in five moves nothing yet is reported a success"
           " (a connector that ignores a failed load or store)", "fakes", ("data:wrong_kv",), "full", "0.33.0"),
    Defect("late_reported_on_time", "a late job is reported finished at its on-time step while its copy"
           " still lands late", "fakes", ("data:wrong_kv",), "full-faults", "0.33.0"),
    Defect("advance_on_refusal", "a refused prepare_store taken for stored: the connector advances past"
           " the chunks and never retries them", "tier", ("store:spec_disagreement",), "full-faults", "0.33.0"),
    Defect("drafter_skips_trailing", "a finished request's drafter (EAGLE/MTP) group stops one chunk short of the"
           " chunks it stored (0.29's trailing-chunk hold-back at finish, on 0.30+)", "store_contract",
           ("store:spec_disagreement",), "eagle@offload_prompt_only=false", "0.33.0"),
    Defect("window_frontier_ahead", "a running request's sliding-window group advances its next_stored_chunk_idx"
           " one chunk past the chunks it stored", "store_contract", ("store:spec_disagreement",), "swa", "0.33.0"),
    Defect("event_drop_removed", "the CPU tier drops its first removal event (an eviction it never announces)",
           "kv_events", ("store:stale_event",), "full@cpu_chunks=32,kv_events=true", "0.33.0"),
    Defect("event_drop_stored", "the CPU tier drops its first stored event (a completed store it never announces)",
           "kv_events", ("store:stale_event",), "full@cpu_chunks=32,kv_events=true", "0.33.0"),
    Defect("failed_store_announced", "the file-system tier announces a store job that failed (a BlockStored of"
           " the storage medium for keys whose file never landed)", "kv_events", ("store:stale_event",),
           "full-tiering-fs@tier_store_fail_p=0.3,kv_events=true", "0.32.0"),
    Defect("stats_drop_interval", "the connector loses the first stats it would hand over that count"
           " transferred bytes (its scheduler side's get_stats answers None once; before 0.24 its worker"
           " side's get_kv_connector_stats)", "stats_logger",
           ("lifecycle:transfer_stats_mismatch",), "full@log_stats=true", "0.33.0"),
    Defect("lost_read_reported_ok", "the file-system tier reports a promotion whose read failed at a lost file a"
           " success (its primary chunks made ready with nothing read into them)", "tier_faults",
           ("data:wrong_kv",), "full-tiering-fs@tier_lose_p=0.1", "0.33.0"),
    Defect("torn_file_kept", "the file-system tier's read leaves a file it found short in place (vLLM removes a"
           " short-read file, 0.33.0 tiering/fs/io.py:152-160): the tier goes on answering its key held",
           "tier_faults", ("store:torn_file_kept",), "full-tiering-fs@tier_torn_p=0.1", "0.33.0"),
    Defect("stale_lookup_applied", "the file-system tier's lookup cache as 0.24-0.29 kept it (0.28-0.29 assert on"
           " it): a request's cleanup drops a key's state while its probe is in flight, and answers apply by key alone,"
           " so a late answer lands on the state a later lookup of the key made", "tier_clock", ("crash:exception",),
           "full-tiering-fs@shadow=false,prefix_burst_p=0.5,abort_p=0.2,tier_lookup_late_p=0.5", "0.33.0"),
    Defect("promotion_never_reported", "a secondary tier never reports a promotion finished: the primary chunks"
           " it fills stay pending for ever", "tier_faults", ("liveness:stuck_request",),
           "full@offload_spec=tiering-example,shadow=false,cpu_chunks=32", "0.22.1"),
    Defect("backpressure_ignored", "the tiering manager asks the file tier's backpressure detector before a store"
           " and stores all the same when it refuses", "tier_pressure", ("store:backpressure_bypassed",),
           "full-tiering-fs@tier_backpressure=throttled,tier_store_slow_p=0.3", "0.32.0"),
    Defect("failed_promotion_never_reported", "the example tier never reports a promotion that failed (a key it"
           " lost): the primary chunks it was to fill stay pending for ever", "tier_faults",
           ("liveness:stuck_request",),
           "full@offload_spec=tiering-example,shadow=false,tier_lose_p=0.1,cpu_chunks=32,log_stats=true", "0.22.1"),
    Defect("failed_store_never_reported", "the file-system tier never reports a store job that failed: the primary"
           " chunks it reads stay pinned", "tier_faults", ("lifecycle:tier_chunks_pinned",),
           "full-tiering-fs@shadow=false,tier_store_fail_p=0.3", "0.32.0"),
    Defect("request_cascade_drops_pending", "the tiering manager cascades to a request-level tier only the chunks"
           " the primary holds ready, dropping those whose primary write is in flight (0.23.0 - 0.28.0, vLLM #53062)",
           "request_tier", ("store:request_tier_incomplete",), REQUEST_TIER_POINT, "0.33.0"),
    Defect("tier_finish_dropped", "the tiering manager never tells a secondary tier of every fifth request it"
           " finished", "tier_lifecycle", ("lifecycle:tier_request_not_finished",), "full-tiering-fs", "0.33.0"),
    Defect("failed_start_keeps_region", "the CPU primary tier's shutdown leaves its shared region mapped and its"
           " file in /dev/shm (a failed start's clean-up releases the tiers, not the region)", "failed_start",
           ("lifecycle:failed_start_unclean",), "full-tiering-fs@shadow=false,tier_start_fail=true", "0.33.0"),
    Defect("failed_stop_ends_early", "the tiering manager's teardown stops at the first secondary tier whose"
           " shutdown fails: the tiers after it run on (vLLM before #52290)", "failed_start",
           ("lifecycle:failed_stop_unclean",), "full-tiering-fs@shadow=false,tier_stop_fail=true", "0.33.0"),
    Defect("unbounded_load", "the OffloadingConnector beside HiSparse loads as far as its tier hits, past the source"
           " pages the host pool still holds (_max_loadable_tokens unbounded)", "hisparse",
           ("data:load_past_unfilled_group",), "hisparse", "0.33.0"),
    Defect("refusal_leaks", "the tier refuses a store after allocating it: its chunks stay write-pending"
           " for ever", "fakes", ("liveness:stuck_request",), "full-faults", "0.33.0"),
)
BY_NAME = {d.name: d for d in DEFECTS}


def planted(name):
    """The planted defect a job's ``mutant`` names (None: none); a name the table lacks is
    refused (``ValueError``: a harness fault, never a run without the defect)."""
    if name is None or name in BY_NAME:
        return name
    raise ValueError("unknown planted defect %r: kvbound/side/defects.py DEFECTS has %s"
                     % (name, ", ".join(BY_NAME)))
