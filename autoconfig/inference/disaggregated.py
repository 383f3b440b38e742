"""Disaggregated serving: prompts on a prefill pool, generation on a decode pool.

Splitting the phases (Zhong et al. 2024, DistServe; Patel et al. 2024,
Splitwise) removes the prefill interference from every decode step and lets
each pool take its own layout. Per pair of layouts:

- a prefill instance runs static batches of ``b_p`` prompts back to back
  (``b_p`` up to one engine step's token budget); a request waits on average
  half a batch, then its batch's prefill, then the KV transfer:
  ``TTFT = 1.5 t_prefill(b_p) + t_kv``. It serves ``b_p / t_prefill(b_p)``
  requests/s.
- the KV transfer moves the prompt's whole KV cache (every layer,
  ``kv_bytes_per_token * s_in``) from the prefill instance's GPUs to the decode
  instance's, each GPU over its own link: NVLink when both pools sit in one
  NVLink domain, else the scale-out network.
- a decode instance at concurrency ``C`` runs pure decode steps (the static
  model's decode step at context ``s_in + s_out/2``): ``TPOT = t_decode(C)``,
  serving ``C / (s_out TPOT)`` requests/s.
- with ``x`` prefill and ``y`` decode instances on the cluster, the pools serve
  ``min(x R_p, y R_d)`` requests/s; ``x`` and ``y`` are the integers that
  maximise it within the GPUs.

Each decode layout keeps its largest concurrency meeting --max-tpot-ms, paired
with the prefill layout and batch serving the most requests/s per GPU within
--max-ttft-ms.
"""

import numpy as np
import pandas as pd

from autoconfig.core.hardware import Cluster
from autoconfig.core.model import ModelSpec
from autoconfig.inference.engine import Engine
from autoconfig.inference.memory import kv_bytes_per_token_per_gpu
from autoconfig.inference.plan import InferencePlan, InferencePlanTable, InferenceWorkload

def kv_transfer_s(model: ModelSpec, workload: InferenceWorkload, cluster: Cluster,
                  prefill_gpus, link_efficiency: float):
    """Seconds to move one prompt's KV cache out of a prefill instance of
    ``prefill_gpus`` GPUs (each sends its share over its own link)."""
    total = kv_bytes_per_token_per_gpu(model, 1, 1, workload.kv_bytes_per_value) \
        * workload.input_len_tokens
    gpu = cluster.gpu
    link = (gpu.nvlink_bandwidth_gb_per_s if cluster.num_gpus <= cluster.nvlink_domain_gpus
            else gpu.internode_bandwidth_gb_per_s) * 1e9 * link_efficiency
    return total / (np.asarray(prefill_gpus, dtype=float) * link)


def _prefill_batches(engine: Engine, workload: InferenceWorkload) -> list[int]:
    budget = engine.max_batched_tokens or workload.input_len_tokens
    top = max(1, budget // workload.input_len_tokens)
    return sorted({2 ** i for i in range(int(np.log2(top)) + 1)} | {top})


def disaggregated_rows(model: ModelSpec, workload: InferenceWorkload, cluster: Cluster,
                       engine: Engine, layouts: list[tuple[int, int, int]],
                       concurrencies: list[int], predict, max_ttft_ms: float | None, max_tpot_ms: float | None,
                       link_efficiency: float) -> pd.DataFrame:
    """One row per decode layout (module doc); empty when nothing fits the limits.
    ``predict(plans, mode)`` is the search's own prediction of a plan table."""
    n = cluster.num_gpus
    batches = _prefill_batches(engine, workload)
    pre_plans = [InferencePlan(t, p, b, 1, e) for t, p, e in layouts for b in batches]
    pre = predict(InferencePlanTable.from_plans(pre_plans), "static")
    gpus = pre["gpus_per_replica"].to_numpy(dtype=float)
    pre = pre.assign(kv_ms=kv_transfer_s(model, workload, cluster, gpus, link_efficiency) * 1e3)
    pre = pre.assign(first_ms=1.5 * pre["ttft_ms"] + pre["kv_ms"],
                     rate=pre["batch"] / (pre["ttft_ms"] / 1e3))
    pre = pre[pre["fits"] & ((pre["first_ms"] <= max_ttft_ms) if max_ttft_ms else True)]
    if pre.empty:
        return pd.DataFrame()
    pre = pre.assign(rate_per_gpu=pre["rate"] / pre["gpus_per_replica"])
    best_pre = pre.sort_values("rate_per_gpu", ascending=False).iloc[0]

    dec_plans = [InferencePlan(t, p, c, 1, e) for t, p, e in layouts for c in concurrencies]
    dec = predict(InferencePlanTable.from_plans(dec_plans), "static")
    dec = dec[dec["fits"] & ((dec["tpot_ms"] <= max_tpot_ms) if max_tpot_ms else True)]
    if dec.empty:
        return pd.DataFrame()
    dec = dec.sort_values("batch").groupby(["tp", "pp", "ep"], sort=False).tail(1)
    rows = []
    g_p, r_p = int(best_pre["gpus_per_replica"]), float(best_pre["rate"])
    for d in dec.itertuples(index=False):
        g_d = int(d.gpus_per_replica)
        r_d = d.batch / (workload.output_len_tokens * d.tpot_ms / 1e3)
        best = None
        for x in range(1, (n - g_d) // g_p + 1):
            y = (n - x * g_p) // g_d
            served = min(x * r_p, y * r_d)
            if y >= 1 and (best is None or served > best[0]):
                best = (served, x, y)
        if best is None:
            continue
        served, x, y = best
        used = x * g_p + y * g_d
        ttft = float(best_pre["first_ms"])
        tokens = served * workload.output_len_tokens
        rows.append({
            "serving": "disaggregated", "tp": d.tp, "pp": d.pp, "ep": d.ep, "batch": d.batch,
            "replicas": y, "gpus_per_replica": g_d,
            "prefill_tp": int(best_pre["tp"]), "prefill_pp": int(best_pre["pp"]),
            "prefill_batch": int(best_pre["batch"]), "prefill_instances": x,
            "kv_transfer_ms": float(best_pre["kv_ms"]),
            "ttft_ms": ttft, "tpot_ms": d.tpot_ms,
            "latency_ms": ttft + (workload.output_len_tokens - 1) * d.tpot_ms,
            "tokens_per_s_per_user": 1e3 / d.tpot_ms,
            "tokens_per_s_per_replica": tokens / y, "requests_per_s_per_replica": served / y,
            "tokens_per_s_per_gpu": tokens / used, "requests_per_s_per_gpu": served / used,
            "tokens_per_s_total": tokens, "requests_per_s_total": served,
            "memory_gib": max(float(best_pre["memory_gib"]), d.memory_gib),
            "weights_gib": d.weights_gib, "kv_cache_gib": d.kv_cache_gib,
            "prefill_microbatches": int(best_pre["prefill_microbatches"]),
            "decode_microbatches": d.decode_microbatches, "fits": True})
    return pd.DataFrame(rows)

