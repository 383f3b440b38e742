"""Steady-state serving predictions at the load each published run held.

``autoconfig infer --concurrency C`` (and the concurrency search under
``--max-ttft-ms`` / ``--max-tpot-ms``) predicts a server at steady state. The
published runs asked at a request rate (MLPerf Server, vLLM / SGLang online
benchmarks) held, by Little's law, ``rate x mean latency`` requests in flight
per replica; this script asks the steady-state model at that concurrency, through
the CLI as a user would, with each run's engine settings, and prints the TTFT,
TPOT and throughput errors. It isolates the step and first-token model from
the rate search: ``infer-validate`` asks the same rows as finite jobs at the rate
it finds, where a few percent of capacity moves the latencies by a factor.

    python benchmarks/infer_steady_state.py
"""

import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd

POINTS = Path(__file__).with_name("published_inference.csv")
FLAGS = (("max_batched_tokens", "--max-batched-tokens", int),
         ("kv_memory_fraction", "--kv-memory-fraction", float),
         ("cuda_graph_max_batch", "--cuda-graph-max-batch", int),
         ("decode_steps", "--decode-steps", int))
SWITCHES = (("chunked_prefill", "chunked-prefill"), ("overlap_schedule", "overlap-schedule"),
            ("mixed_prefill", "mixed-prefill"))


def command(row, held: int) -> list[str]:
    tp, pp = int(row.tp), 1 if pd.isna(row.pp) else int(row.pp)
    args = [sys.executable, "-m", "autoconfig", "infer", "--model", row.model, "--gpu", row.gpu,
            "--gpus", str(tp * pp), "--engine", row.engine, "--tp", str(tp), "--pp", str(pp),
            "--input-len", str(round(row.input_len_tokens)),
            "--output-len", str(round(row.output_len_tokens)), "--precision", row.precision,
            "--concurrency", str(held), "--no-plots", "--format", "json", "--top", "1"]
    for column, flag, kind in FLAGS:
        if not pd.isna(row[column]):
            args += [flag, str(kind(row[column]))]
    for column, name in SWITCHES:
        if str(row[column]) in ("True", "False"):
            args.append(f"--{name}" if str(row[column]) == "True" else f"--no-{name}")
    return args


def main() -> None:
    points = pd.read_csv(POINTS)
    rated = points[points.request_rate_per_s.apply(math.isfinite) & points.latency_ms.notna()
                   & points.ttft_ms.notna() & points.tpot_ms.notna()
                   & (points.batching == "continuous")]
    out, errors = [], []
    for _, row in rated.iterrows():
        per_replica = int(row.tp) * (1 if pd.isna(row.pp) else int(row.pp))
        replicas = int(row.num_gpus) // per_replica if not pd.isna(row.num_gpus) else 1
        held = max(1, round(row.request_rate_per_s / replicas * row.latency_ms / 1e3))
        done = subprocess.run(command(row, held), capture_output=True, text=True)
        if done.returncode:
            errors.append(f"{row.point_id}: {done.stderr.strip().splitlines()[-1]}")
            continue
        plan = json.JSONDecoder().raw_decode(done.stdout.lstrip())[0]["plans"][0]
        out.append({"point": row.point_id, "engine": row.engine, "model": row.model,
                    "gpu": row.gpu, "held": held,
                    "ttft_err_%": 100 * (plan["ttft_ms"] / row.ttft_ms - 1),
                    "tpot_err_%": 100 * (plan["tpot_ms"] / row.tpot_ms - 1)})
    table = pd.DataFrame(out)
    print(table.to_string(index=False, float_format=lambda v: f"{v:+.0f}"))
    print()
    summary = table.groupby("engine").agg(
        points=("point", "size"),
        ttft_mape=("ttft_err_%", lambda e: e.abs().mean()),
        ttft_median=("ttft_err_%", "median"),
        tpot_mape=("tpot_err_%", lambda e: e.abs().mean()))
    print(summary.to_string(float_format=lambda v: f"{v:.1f}"))
    for line in errors:
        print("not asked:", line)


if __name__ == "__main__":
    main()
