"""A finite serving job on an in-flight engine: ``N`` requests, ``C`` clients.

Steady state (``latency._continuous``) describes a server that never drains.
A benchmark or a batch job does: ``N`` requests with spread lengths
(``autoconfig.inference.lengths``), sent by ``C`` clients that each send the
next request when their last one finishes (``C = N``: all at once, the
offline case of vLLM's ``benchmark_serving --request-rate inf`` and MLPerf's
Offline scenario; ``C < N``: LMDeploy's ``profile_throughput --concurrency``,
``--max-concurrency``). Three effects steady state misses:

- **the drain:** the job ends when its last request does. Once the queue is
  empty the engine runs ever smaller batches; with a long-tailed output length
  the longest request alone can take a large share of the run, at the low
  throughput of a small batch.
- **queueing:** requests that wait for a free sequence slot count the wait in
  their TTFT (the engine caps running sequences at ``max_num_seqs``, and at the
  KV cache it has room for).
- **length spread:** longer requests hold their slot and their KV cache longer.

The engine is simulated step by step (iteration-level scheduling, Yu et al.
2022, Orca): each step, every running request past its prompt decodes one
token; waiting requests are admitted first-come first-served while a slot is
free and the KV cache can hold the request's whole prompt and output (the
reservation TensorRT-LLM's GUARANTEED_NO_EVICT policy makes; a benchmark
sends each request's output length as its token limit); prompts are
prefilled in chunks filling the step's token budget beside the decodes
(Sarathi-Serve), or whole where the engine does not chunk; a prompt's last
chunk also yields its first token. Which requests run in which step depends
only on counts, not on time, so the schedule is built first (``schedule``)
and timed afterwards in one vectorised call of the step model
(``latency.stage_seconds``), steps with the same requests grouped into one
segment. Every request's TTFT and latency are counted from when its client
sent it; TPOT is its decode time over its output tokens after the first.
"""

from collections import deque
from dataclasses import dataclass

import numpy as np
import pandas as pd

from autoconfig.errors import MAX_COUNT, InputError, shown
from autoconfig.inference.lengths import request_lengths
from autoconfig.inference.memory import kv_capacity_tokens


@dataclass(frozen=True)
class Job:
    """``requests`` sent by ``clients`` closed-loop clients (None: all at once)."""

    requests: int
    clients: int | None = None

    def __post_init__(self) -> None:
        for name, flag in (("requests", "--num-requests"), ("clients", "--concurrency")):
            value = getattr(self, name)
            if value is None and name == "clients":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
                    or not 1 <= value <= MAX_COUNT:
                raise InputError(f"invalid {flag} {shown(value)}: must be a positive integer "
                                 f"up to {MAX_COUNT}")

    def per_replica(self, replicas: int) -> "Job":
        """The share of one of ``replicas`` replicas (requests spread evenly)."""
        clients = None if self.clients is None else max(1, round(self.clients / replicas))
        return Job(max(1, round(self.requests / replicas)), clients)


@dataclass(frozen=True)
class Schedule:
    """Engine steps of a job, grouped in segments of identical steps (arrays, one
    entry per segment) and, per request, the segments that bound its life."""

    steps: np.ndarray
    decode_seqs: np.ndarray
    decode_context: np.ndarray
    """Mean tokens of KV each decoding sequence reads over the segment."""
    prefill_tokens: np.ndarray
    prefill_context: np.ndarray
    """Mean causal context of the prompt tokens prefilled."""
    logits_rows: np.ndarray
    sent_after: np.ndarray
    """Per request: the segment whose end its client sent it at (-1: at the start)."""
    first_token: np.ndarray
    """Per request: the segment whose end produced its first token."""
    finished: np.ndarray
    """Per request: the segment whose end produced its last token."""
    peak_kv_tokens: float
    """Most KV tokens reserved at once."""


class _Segments:
    def __init__(self) -> None:
        self.rows: list[tuple] = []

    def add(self, steps, decode_seqs, decode_context, prefill_tokens, prefill_context,
            logits_rows) -> int:
        self.rows.append((steps, decode_seqs, decode_context, prefill_tokens, prefill_context,
                          logits_rows))
        return len(self.rows) - 1


def schedule(inputs: np.ndarray, outputs: np.ndarray, clients: int, max_seqs: int,
             kv_capacity_tokens: float, budget_tokens: int | None, chunked: bool,
             reserve_output: bool = True) -> Schedule:
    """Which requests every engine step runs (module doc). ``budget_tokens``: the
    tokens one step may process, decodes included (None: no cap); ``chunked``:
    prompts are split to fill it, else whole prompts go while they fit (at least
    one per step). ``reserve_output``: a request is admitted against its whole
    prompt and output; else against its prompt, the cache grows a token per
    decode, and when it overflows the newest running request is preempted: its
    cache freed, it goes back to the head of the queue and is recomputed (its
    prompt and the tokens it had generated prefilled again), as vLLM does."""
    n = len(inputs)
    sent_after = np.full(n, -1, dtype=np.int64)
    first_token = np.full(n, -1, dtype=np.int64)
    finished = np.full(n, -1, dtype=np.int64)
    waiting = deque(range(min(clients, n)))
    next_sent = min(clients, n)
    prompt = inputs.astype(np.int64).copy()     # tokens to prefill (grows when recomputed)
    resume = outputs.astype(np.int64) - 1       # tokens to generate after the prompt's
    prefilling: list[list[int]] = []            # [request, prompt tokens done]
    ids = np.empty(0, dtype=np.int64)           # decoding requests, oldest first
    left = np.empty(0, dtype=np.int64)          # their tokens still to generate
    context = np.empty(0, dtype=np.float64)     # their KV tokens so far
    reserved = peak = 0.0
    segments = _Segments()

    def need(r: int) -> float:
        return float(prompt[r] + (resume[r] + 1 if reserve_output else 0))

    while waiting or prefilling or len(ids):
        while waiting and len(prefilling) + len(ids) < max_seqs:
            r = waiting[0]
            if reserved + need(r) > kv_capacity_tokens and (prefilling or len(ids)):
                break                           # waits for KV room (alone, it runs anyway)
            waiting.popleft()
            reserved += need(r)
            prefilling.append([r, 0])
        peak = max(peak, reserved)
        if prefilling:
            room = np.inf if budget_tokens is None else max(0, budget_tokens - len(ids))
            tokens, weighted, first = 0, 0.0, []
            for entry in prefilling:
                r, done = entry
                rest = int(prompt[r] - done)
                whole = tokens == 0 or tokens + rest <= room
                take = int(min(rest, room - tokens)) if chunked else (rest if whole else 0)
                if take <= 0:
                    break
                weighted += take * (done + take / 2.0)
                tokens += take
                entry[1] += take
                if entry[1] >= prompt[r]:
                    first.append(r)
            prefilling = [e for e in prefilling if e[1] < prompt[e[0]]]
            decoders = len(ids)
            seg = segments.add(1, decoders, float(context.mean() + 0.5) if decoders else 0.0,
                               tokens, weighted / tokens if tokens else 0.0,
                               decoders + len(first))
            for r in first:
                if first_token[r] < 0:
                    first_token[r] = seg
            new = np.array(first, dtype=np.int64)
            ids = np.concatenate([ids, new])
            left = np.concatenate([left, resume[new] + 1])
            context = np.concatenate([context, prompt[new].astype(np.float64)])
            left -= 1                           # a decode each, the new ones' from the prompt
            context += 1.0
        else:
            steps = int(left.min())
            if not reserve_output:              # stop where the cache would overflow
                steps = max(1, min(steps, int((kv_capacity_tokens - reserved) // len(ids))))
            seg = segments.add(steps, len(ids), float(context.mean() + steps / 2.0),
                               0, 0.0, len(ids))
            left -= steps
            context += steps
        ending = left <= 0
        done_now = int(ending.sum())
        if done_now:
            finished[ids[ending]] = seg
            ids, left, context = ids[~ending], left[~ending], context[~ending]
        reserved = _held(ids, context, prefilling, prompt, inputs, outputs, reserve_output)
        while not reserve_output and reserved > kv_capacity_tokens and len(ids) > 1:
            r = int(ids[-1])                    # the newest running request is preempted
            prompt[r], resume[r] = int(context[-1]), int(left[-1]) - 1
            ids, left, context = ids[:-1], left[:-1], context[:-1]
            waiting.appendleft(r)
            reserved = _held(ids, context, prefilling, prompt, inputs, outputs, reserve_output)
        peak = max(peak, reserved)
        for _ in range(done_now):           # each client sends its next request
            if next_sent < n:
                sent_after[next_sent] = seg
                waiting.append(next_sent)
                next_sent += 1
    columns = list(zip(*segments.rows)) if segments.rows else [()] * 6
    arrays = [np.asarray(c, dtype=float) for c in columns]
    return Schedule(*arrays, sent_after=sent_after, first_token=first_token, finished=finished,
                    peak_kv_tokens=peak)


def _held(ids, context, prefilling, prompt, inputs, outputs, reserve_output: bool) -> float:
    """KV tokens the admitted requests have reserved (whole requests) or hold
    (the tokens written so far, and the prompts being prefilled)."""
    waiting_prefill = [r for r, _ in prefilling]
    if reserve_output:
        both = inputs + outputs
        return float(both[ids].sum() + both[waiting_prefill].sum())
    return float(context.sum() + prompt[waiting_prefill].sum())


@dataclass(frozen=True)
class JobTiming:
    """Means over the job's requests, and the job's length."""

    ttft_s: float
    tpot_s: float
    latency_s: float
    duration_s: float
    output_tokens: int


def timing(plan: Schedule, step_s: np.ndarray, outputs: np.ndarray) -> JobTiming:
    """Times of a schedule whose segments each take ``steps * step_s`` seconds."""
    ends = np.cumsum(plan.steps * step_s)
    sent = np.where(plan.sent_after >= 0, ends[np.maximum(plan.sent_after, 0)], 0.0)
    first = ends[plan.first_token]
    last = ends[plan.finished]
    many = outputs > 1
    tpot = (last[many] - first[many]) / (outputs[many] - 1) if many.any() else np.zeros(1)
    return JobTiming(ttft_s=float(np.mean(first - sent)), tpot_s=float(np.mean(tpot)),
                     latency_s=float(np.mean(last - sent)), duration_s=float(ends[-1]),
                     output_tokens=int(outputs.sum()))


def activation_tokens(engine, workload, count: int) -> np.ndarray:
    """Tokens of a job step's largest forward pass, per plan: the engine's step budget,
    or a whole prompt where it sets none."""
    return np.full(count, float(engine.max_batched_tokens or workload.input_len_tokens))


def run(model, workload, plans, cluster, constants, engine, job: Job) -> pd.DataFrame:
    """Each plan (``plans.batch``: its engine's cap on running sequences) serving
    ``job``: mean TTFT, TPOT and latency, the job's duration and its output
    tokens/s per replica, and whether its largest request fits the KV cache at all."""
    from autoconfig.inference.latency import StepLoad, stage_seconds

    capacity = kv_capacity_tokens(model, workload, plans,
                                  activation_tokens(engine, workload, len(plans)), cluster.gpu)
    rows = []
    for i in range(len(plans)):
        one = plans.take([i])
        share = job.per_replica(int(one.replicas[0]))
        inputs = request_lengths(workload.input_len_tokens, workload.input_len_std_tokens,
                                 share.requests, seed=1)
        outputs = request_lengths(workload.output_len_tokens, workload.output_len_std_tokens,
                                  share.requests, seed=2)
        largest = float((inputs + outputs).max())
        plan = schedule(inputs, outputs, share.clients or share.requests, int(one.batch[0]),
                        float(capacity[i]), engine.max_batched_tokens, engine.chunked_prefill,
                        engine.kv_reserves_output)
        pp = float(one.pp[0])
        stage, _ = stage_seconds(model, workload, one, cluster, constants, engine, StepLoad(
            decode_seqs=plan.decode_seqs[None, :] / pp, decode_context=plan.decode_context[None, :],
            prefill_tokens=plan.prefill_tokens[None, :] / pp,
            prefill_context=plan.prefill_context[None, :],
            logits_rows=plan.logits_rows[None, :] / pp))
        step_s = pp * stage[0] + engine.step_overhead_s
        t = timing(plan, step_s, outputs)
        rows.append({"ttft_ms": t.ttft_s * 1e3, "tpot_ms": t.tpot_s * 1e3,
                     "latency_ms": t.latency_s * 1e3, "duration_s": t.duration_s,
                     "tokens_per_s_per_replica": t.output_tokens / t.duration_s,
                     "requests_per_s_per_replica": share.requests / t.duration_s,
                     "kv_capacity_tokens": float(capacity[i]),
                     "peak_kv_tokens": plan.peak_kv_tokens,
                     "fits": bool(capacity[i] >= largest)})
    return pd.DataFrame(rows)
