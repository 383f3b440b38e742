"""Rank profiled plans by what they measured.

``throughput`` ranks by measured tokens/s per GPU (highest first), which for
plans on the same GPU count orders them like total tokens/s; ``latency`` ranks
by measured step time (lowest first). Only plans that ran (status ok) get a
rank; ties keep the predicted order.
"""

import numpy as np
import pandas as pd

from autoconfig.errors import InputError

OBJECTIVES = ("throughput", "latency")


def rank_measured(results: pd.DataFrame, objective: str = "throughput") -> pd.DataFrame:
    """The ok rows, best first, with a ``measured_rank`` column (1 = best)."""
    if objective not in OBJECTIVES:
        raise InputError(f"invalid objective {objective!r}: allowed are {', '.join(OBJECTIVES)}")
    if results.empty or "status" not in results:
        return results.iloc[0:0].assign(measured_rank=pd.Series(dtype=int))
    ok = results[results["status"] == "ok"].copy()
    if objective == "throughput":
        key = -pd.to_numeric(ok.get("tokens_per_s_per_gpu"), errors="coerce")
    else:
        key = pd.to_numeric(ok.get("step_time_s"), errors="coerce")
    ok["_key"] = key.fillna(np.inf)
    tie = "predicted_rank" if "predicted_rank" in ok else None
    ok = ok.sort_values(["_key"] + ([tie] if tie else []), kind="stable").drop(columns="_key")
    ok["measured_rank"] = np.arange(1, len(ok) + 1)
    return ok.reset_index(drop=True)
