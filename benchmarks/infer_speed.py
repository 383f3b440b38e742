"""Time ``autoconfig infer``'s search: Llama 3 70B on 8 H100 served by vLLM under
TTFT and TPOT limits (continuous batching: every layout at the largest
concurrency meeting both).

Target (inference realism issue): under 2 s on a 2-core machine, through the
real CLI as a user types it (process start, imports, search, report files and
the Pareto plot), the same with ``--no-plots``, and the library call alone; and
the whole of ``autoconfig infer-validate``. Prints the figures;
nothing is asserted.

    python benchmarks/infer_speed.py [--repeat N]
"""

import argparse
import subprocess
import sys
import tempfile
import time

from autoconfig.core.catalog import get_gpu, get_model
from autoconfig.core.hardware import Cluster
from autoconfig.inference.engine import get_engine
from autoconfig.inference.plan import InferenceWorkload
from autoconfig.inference.search import Limits, search

ARGS = ["--model", "llama3-70b", "--gpu", "h100-80gb", "--gpus", "8", "--engine", "vllm",
        "--input-len", "2048", "--output-len", "256", "--max-ttft-ms", "1000",
        "--max-tpot-ms", "50"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    repeat = parser.parse_args().repeat
    model, gpu = get_model("llama3-70b"), get_gpu("h100-80gb")
    cluster = Cluster(gpu=gpu, nodes=1, gpus_per_node=8)
    workload = InferenceWorkload(2048, 256)
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        result = search(model, workload, cluster, "throughput",
                        Limits(max_ttft_ms=1000, max_tpot_ms=50), engine=get_engine("vllm"))
        best = min(best, time.perf_counter() - start)
    print(f"library search: {best:.3f} s (best of {repeat}), {result.candidates} layouts, "
          f"{len(result.table)} kept, rejected {result.rejected}")
    for extra in ([], ["--no-plots"]):
        runs = []
        for _ in range(repeat):
            with tempfile.TemporaryDirectory() as out:
                start = time.perf_counter()
                subprocess.run([sys.executable, "-m", "autoconfig", "infer", *ARGS, *extra,
                                "-o", out], check=True, capture_output=True)
                runs.append(time.perf_counter() - start)
        print(f"CLI end to end: {min(runs):.3f}-{max(runs):.3f} s over {repeat} runs "
              f"(autoconfig infer {' '.join(ARGS + extra)})")
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "autoconfig", "infer-validate"], check=True,
                   capture_output=True)
    print(f"infer-validate (every published serving point, jobs simulated step by step): "
          f"{time.perf_counter() - start:.3f} s")


if __name__ == "__main__":
    main()
