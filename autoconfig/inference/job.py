"""A finite serving job on an in-flight engine: ``N`` requests, ``C`` clients.

Steady state (``latency._continuous``) describes a server that never drains.
A benchmark or a batch job does: ``N`` requests with spread lengths
(``autoconfig.inference.lengths``), sent by ``C`` clients that each send the
next request when their last one finishes (``C = N``: all at once, the
offline case of vLLM's ``benchmark_serving --request-rate inf`` and MLPerf's
Offline scenario; ``C < N``: LMDeploy's ``profile_throughput --concurrency``,
``--max-concurrency``), or sent at a request rate as a Poisson process
(``benchmark_serving --request-rate R``, MLPerf's Server scenario). Three
effects steady state misses:

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

from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from autoconfig.errors import MAX_COUNT, InputError, shown
from autoconfig.inference.dispatch import replica_arrivals_s
from autoconfig.inference.lengths import check_rate, request_lengths
from autoconfig.inference.memory import kv_capacity_tokens, pool_tokens


@dataclass(frozen=True)
class Job:
    """``requests`` sent by ``clients`` closed-loop clients, or at ``rate_per_s``
    requests/s (Poisson, over the whole cluster), or all at once (neither)."""

    requests: int
    clients: int | None = None
    rate_per_s: float | None = None
    rate_search: bool = False
    """Sent at the largest Poisson rate at which the job meets the search's latency
    limits (``infer --request-rate max``; ``autoconfig.inference.rate_search``)."""
    steady: bool = False
    """Latencies over the requests that arrive once the server has filled and
    before it drains (``steady_requests``): a long-running server's view, which
    ``--request-rate max`` asks for, where a job's own start and end are not."""

    def __post_init__(self) -> None:
        for name, flag in (("requests", "--num-requests"), ("clients", "--concurrency")):
            value = getattr(self, name)
            if value is None and name == "clients":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
                    or not 1 <= value <= MAX_COUNT:
                raise InputError(f"invalid {flag} {shown(value)}: must be a positive integer "
                                 f"up to {MAX_COUNT}")
        if self.rate_per_s is not None:
            check_rate(self.rate_per_s)
        if (self.rate_per_s is not None or self.rate_search) and self.clients is not None:
            raise InputError("give a job either --concurrency (closed-loop clients) or "
                             "--request-rate (arrivals at a rate), not both")
        if self.rate_search and self.rate_per_s is not None:
            raise ValueError("a job searched for its rate has no rate of its own")

    def per_replica(self, replicas: int) -> "Job":
        """The share of one of ``replicas`` replicas (requests and rate spread evenly)."""
        clients = None if self.clients is None else max(1, round(self.clients / replicas))
        rate = None if self.rate_per_s is None else self.rate_per_s / replicas
        return Job(max(1, round(self.requests / replicas)), clients, rate, steady=self.steady)


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
    not_before_s: np.ndarray | None = None
    """Per segment: the latest send time of the requests it admits (arrivals at a
    rate; the segment cannot start before it), else None."""
    sent_at_s: np.ndarray | None = None
    """Per request: its send time (arrivals at a rate), else None."""
    stalled: np.ndarray | None = None
    """Per segment: running requests that wait through it without a token (a
    prefill step that does not mix), else None (none anywhere)."""
    opened: np.ndarray | None = None
    """Per segment: requests whose first token a decode step samples (an engine
    whose prefill stops a token short), which are no gap; else None (none anywhere)."""


class _Segments:
    def __init__(self) -> None:
        self.rows: list[tuple] = []
        self.stalled: list[int] = []
        self.opened: list[int] = []

    def add(self, steps, decode_seqs, decode_context, prefill_tokens, prefill_context,
            logits_rows, stalled: int = 0, opened: int = 0) -> int:
        self.rows.append((steps, decode_seqs, decode_context, prefill_tokens, prefill_context,
                          logits_rows))
        self.stalled.append(stalled)
        self.opened.append(opened)
        return len(self.rows) - 1


class _Clock:
    """Time as a schedule with arrivals at a rate sees it: advanced by a cheap
    estimate of each segment (``estimate(decode_seqs, prefill_tokens)``, seconds
    of one step), and every ``SYNC`` segments set to the exact end of the
    segments so far (``exact``: the step model on their arrays, vectorised), the
    estimate rescaled by how far it was off, so its errors never add up over a
    long job."""

    SYNC = 16

    def __init__(self, estimate, exact) -> None:
        self.estimate, self.exact = estimate, exact
        self.now = self.end = 0.0
        self.ratio = 1.0
        self.synced = 0
        self.guessed = 0.0

    def step_s(self, decode_seqs, prefill_tokens) -> float:
        return self.ratio * self.estimate(decode_seqs, prefill_tokens)

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.guessed += seconds

    def sync(self, rows: list, not_before: list) -> None:
        if len(rows) - self.synced < self.SYNC:
            return
        steps, seqs, context, tokens, prefill_context, logits = \
            (np.asarray(c, dtype=float) for c in zip(*rows[self.synced:]))
        exact = steps * self.exact(seqs, context, tokens, prefill_context, logits)
        self.end = float(segment_ends(exact, np.asarray(not_before[self.synced:]),
                                      self.end)[-1])
        if self.guessed > 0:
            self.ratio *= float(exact.sum()) / self.guessed
        self.now, self.guessed, self.synced = self.end, 0.0, len(rows)


def _mark_first_tokens(first_token: np.ndarray, requests, segment: int) -> None:
    """Record ``segment`` as the step that gave ``requests`` their first token,
    for those that have none yet (a recomputed request keeps its first)."""
    for r in requests:
        if first_token[r] < 0:
            first_token[r] = segment


def schedule(inputs: np.ndarray, outputs: np.ndarray, clients: int, max_seqs: int,
             kv_capacity_tokens: float, budget_tokens: int | None, chunked: bool,
             reserve_output: bool = True, arrivals_s: np.ndarray | None = None,
             clock: "_Clock | None" = None, decode_steps: int = 1,
             mixed: bool = True, first_in_prefill: bool = True,
             overlap: bool = False, admission: str = "", ratio=None) -> Schedule:
    """Which requests every engine step runs (module doc). ``budget_tokens``: the
    tokens one step may process, decodes included (None: no cap); ``chunked``:
    prompts are split to fill it, else whole prompts go while they fit (at least
    one per step). ``reserve_output``: a request is admitted against its whole
    prompt and output; else against its prompt, the cache grows a token per
    decode, and when it overflows the newest running request is preempted: its
    cache freed, it goes back to the head of the queue and is recomputed (its
    prompt and the tokens it had generated prefilled again), as vLLM does.

    ``arrivals_s``: requests are sent at these times instead of by clients, so
    which step admits them depends on time, kept by ``clock`` (``_Clock``):
    decode runs stop at the next arrival, and an idle engine waits for it. Each
    segment keeps the latest send time of what it admits (``not_before_s``), so
    the exact timing afterwards never starts work before its request was sent.

    ``decode_steps``: decode steps run in whole runs of this many (multi-step
    scheduling, ``Engine.decode_steps``): the scheduler only acts between runs,
    so an arrival or a freed slot waits for the run to end, and a request that
    finishes mid-run keeps its slot (and its share of the compute) until then.

    ``mixed``: a step that prefills also decodes the running requests
    (``Engine.mixed_prefill``); else the prefill forward runs alone and they
    wait for it, a token later.

    ``first_in_prefill``: the step that finishes a prompt samples its first
    token (``Engine.prefill_samples_first_token``); else the prompt joins the
    decoders without it and the next decode step, one step after every prompt
    admitted with it is prefilled, samples it (TurboMind before its unified pass).

    ``overlap``: the scheduler builds each step while the one before runs
    (``Engine.overlap_schedule``), so the step that starts at a boundary took only
    the requests sent before the step that just ended began: an arrival waits for
    the step under way and the one already built (a decode run stops one step
    after it), and a closed-loop client's next request joins a step later than it
    would. An idle engine builds at once.

    ``admission`` (with ``reserve_output`` False): ``"exact"``, a request joins
    only if every admitted request can still finish without an eviction, their
    output lengths known (``_finishes``); ``"estimate"``, against its prompt and
    whole output plus, for each running request, ``ratio`` (a
    ``engines.NewTokenRatio``) times its remaining output, the ratio decaying a
    decode step and reset when a retraction frees room for ``retract_steps``
    steps (SGLang's ``PrefillAdder`` and ``retract_decode``); else on the prompt."""
    timed = arrivals_s is not None
    n = len(inputs)
    sent_after = np.full(n, -1, dtype=np.int64)
    first_token = np.full(n, -1, dtype=np.int64)
    finished = np.full(n, -1, dtype=np.int64)
    waiting = deque() if timed else deque(range(min(clients, n)))
    next_sent = 0 if timed else min(clients, n)
    not_before = []
    prompt = inputs.astype(np.int64).copy()     # tokens to prefill (grows when recomputed)
    resume = outputs.astype(np.int64) - 1       # tokens to generate after the prompt's
    prefilling: list[list[int]] = []            # [request, prompt tokens done]
    ids = np.empty(0, dtype=np.int64)           # decoding requests, oldest first
    left = np.empty(0, dtype=np.int64)          # their tokens still to generate
    context = np.empty(0, dtype=np.float64)     # their KV tokens so far
    reserved = peak = 0.0
    segments = _Segments()
    opening: list[int] = []                     # prefilled, first token from the next decode
    whole_request = inputs + outputs            # once: a job may hold tens of thousands
    deferred: list[int] = []                    # sent, for the step after the one built
    lag = 0.0                                   # seconds of the step that just ended

    exact = admission == "exact" and not reserve_output
    estimate = ratio if admission == "estimate" and not reserve_output else None
    share = estimate.initial if estimate else 0.0
    clip = estimate.clip_tokens if estimate else 0
    joining: list[int] = []                     # admitted in the step being built
    blocked = False                             # exact: refused, nothing finished since

    def need(r: int) -> float:
        return float(prompt[r] + (resume[r] + 1 if reserve_output else 0))

    def outputs_to_come(r) -> object:
        """Output tokens request(s) ``r`` will still write once prefilled, clipped as
        the estimate clips them."""
        return np.minimum(resume[r] + 1, clip)

    def admits(r: int) -> bool:
        """Whether ``r`` may join the running requests (``admission``)."""
        if exact:
            pre = [e[0] for e in prefilling]
            return _finishes(kv_capacity_tokens - reserved - prompt[r],
                             np.concatenate([left, resume[pre] + 1, [resume[r] + 1]]),
                             np.concatenate([context, prompt[pre], [prompt[r]]]))
        if estimate:
            # Admitted before this step: a share of their outputs; in it: the whole.
            pre = [e[0] for e in prefilling[:len(prefilling) - len(joining)]]
            held_back = share * float(np.minimum(left, clip).sum()
                                      + outputs_to_come(pre).sum())
            whole = float(outputs_to_come(joining).sum())
            return reserved + held_back + whole + prompt[r] + outputs_to_come(r) \
                < kv_capacity_tokens
        return reserved + need(r) <= kv_capacity_tokens

    while waiting or prefilling or len(ids) or deferred or (timed and next_sent < n):
        idle = not (waiting or prefilling or len(ids))
        if idle:                                # an idle scheduler builds at once
            lag = 0.0
            waiting.extend(deferred)
            deferred = []
        if timed:                               # (timed jobs defer nothing: still idle)
            clock.sync(segments.rows, not_before)
            if idle:
                clock.now = max(clock.now, float(arrivals_s[next_sent]))    # idle till then
            built = clock.now - (lag if overlap else 0.0)   # what the starting step saw
            while next_sent < n and arrivals_s[next_sent] <= built:
                waiting.append(next_sent)
                next_sent += 1
        latest = 0.0
        joining = []
        while waiting and len(prefilling) + len(ids) < max_seqs and not blocked:
            r = waiting[0]
            if (prefilling or len(ids)) and not admits(r):
                # Exact: until a request finishes, each step costs the free pool as much as
                # it brings every finish nearer, so the refusal stands (no need to re-sort).
                blocked = exact
                break                           # waits for KV room (alone, it runs anyway)
            waiting.popleft()
            reserved += need(r)
            prefilling.append([r, 0])
            joining.append(r)
            if timed:
                latest = max(latest, float(arrivals_s[r]))
        peak = max(peak, reserved)
        if prefilling:
            # a mixed step's budget also holds the decodes; a prefill that runs alone has it all
            room = np.inf if budget_tokens is None else max(
                0, budget_tokens - (len(ids) if mixed else 0))
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
            decoders = len(ids) if mixed else 0
            own = first if first_in_prefill else []     # prompts this step samples
            # A mixed step also decodes the prompts still waiting for their first token;
            # a step that does not mix holds the running requests, those apart.
            opened, held_back = (opening, 0) if mixed else ([], len(ids) - len(opening))
            seg = segments.add(1, decoders, float(context.sum() / decoders + 0.5) if decoders
                               else 0.0,
                               tokens, weighted / tokens if tokens else 0.0,
                               decoders + len(own), held_back, opened=len(opened))
            if timed:
                row = segments.rows[seg]
                lag = clock.step_s(row[1], row[3])
                clock.advance(lag)
            _mark_first_tokens(first_token, own + opened, seg)
            if mixed:
                opening = []
            new = np.array(first, dtype=np.int64)
            if mixed:                           # the running requests decoded a token each
                left -= 1
                context += 1.0
            # The new ones' first token is the prompt's, or the next decode step's.
            held = 0 if first_in_prefill else 1
            opening.extend([] if first_in_prefill else first)
            ids = np.concatenate([ids, new])
            left = np.concatenate([left, resume[new] + held])
            context = np.concatenate([context, prompt[new].astype(np.float64) + 1.0 - held])
        else:
            # first tokens, or a request for the next step: one step, then on
            steps = 1 if opening or deferred else int(left.min())
            if timed:
                one = lag = clock.step_s(len(ids), 0)
                if next_sent < n:               # stop at the next arrival (overlap: a step on)
                    wait = arrivals_s[next_sent] - clock.now
                    steps = max(1, min(steps, int(np.ceil(wait / one)) + int(overlap)))
            if decode_steps > 1:                # the scheduler acts between whole runs
                steps = decode_steps * int(np.ceil(steps / decode_steps))
            if not reserve_output and len(ids) > 1:     # stop where the cache would overflow
                steps = max(1, min(steps, int((kv_capacity_tokens - reserved) // len(ids))))
            if estimate and waiting and steps > 1 and len(ids) < max_seqs:
                steps = _estimate_opens(steps, kv_capacity_tokens - reserved, left, clip,
                                        share, estimate, need(waiting[0])
                                        + outputs_to_come(waiting[0]))
            if estimate:
                share = max(share - estimate.decay_per_step * steps, estimate.minimum)
            if timed:
                clock.advance(steps * one)
            seg = segments.add(steps, len(ids), float(context.sum() / len(ids) + steps / 2.0),
                               0, 0.0, len(ids), opened=len(opening))
            _mark_first_tokens(first_token, opening, seg)
            opening = []
            left -= steps
            context += steps
        ending = left <= 0
        done_now = int(ending.sum())
        blocked = blocked and not done_now
        if done_now:
            finished[ids[ending]] = seg
            if reserve_output:                  # whole requests: what they reserved leaves
                reserved -= float(whole_request[ids[ending]].sum())
            ids, left, context = ids[~ending], left[~ending], context[~ending]
        if not reserve_output:                  # the cache grew by a token per decode
            reserved = _held(ids, context, prefilling, prompt, whole_request, reserve_output)
        # SGLang retracts until the next retract_steps decode steps fit, not just the next.
        retracting = estimate is not None and len(ids) > 1 \
            and reserved + len(ids) > kv_capacity_tokens
        room = estimate.retract_steps if retracting else 0
        while not reserve_output and len(ids) > 1 \
                and reserved + room * len(ids) > kv_capacity_tokens:
            r = int(ids[-1])                    # the newest running request is preempted
            prompt[r], resume[r] = int(context[-1]), int(left[-1]) - 1
            ids, left, context = ids[:-1], left[:-1], context[:-1]
            if r in opening:                    # its first token comes after its recompute
                opening.remove(r)
            waiting.appendleft(r)
            blocked = False
            reserved = _held(ids, context, prefilling, prompt, whole_request, reserve_output)
        if retracting:                          # the decoded share of what remains, and room
            total = np.minimum(outputs[ids], clip)
            share = min(1.0, float((total - np.minimum(left, clip)).sum() + room * len(ids))
                        / (float(total.sum()) + 1.0))
        peak = max(peak, reserved)
        not_before.append(latest)              # one segment per pass
        waiting.extend(deferred)                # now for the step being built
        deferred = []
        for _ in range(0 if timed else done_now):   # each client sends its next request
            if next_sent < n:
                sent_after[next_sent] = seg
                (deferred if overlap else waiting).append(next_sent)
                next_sent += 1
    columns = list(zip(*segments.rows)) if segments.rows else [()] * 6
    arrays = [np.asarray(c, dtype=float) for c in columns]
    return Schedule(*arrays, sent_after=sent_after, first_token=first_token, finished=finished,
                    peak_kv_tokens=peak,
                    not_before_s=np.asarray(not_before, dtype=float) if timed else None,
                    sent_at_s=np.asarray(arrivals_s, dtype=float) if timed else None,
                    stalled=np.asarray(segments.stalled, dtype=float)
                    if any(segments.stalled) else None,
                    opened=np.asarray(segments.opened, dtype=float)
                    if any(segments.opened) else None)


def _finishes(free_tokens: float, left: np.ndarray, held: np.ndarray) -> bool:
    """Whether requests that each hold ``held`` KV tokens and will write ``left``
    more can all finish in ``free_tokens`` of free KV: taken in the order they
    finish, when the ``i``-th does, the ``n - i`` still running have each written
    its ``left`` more, and those finished before have freed what they held; one
    token a running request is kept spare (SGLang ``add_one_req_ignore_eos``,
    ``IGNORE_EOS_RESERVE_TOKENS``)."""
    order = np.argsort(left, kind="stable")
    left, held = left[order].astype(float), held[order].astype(float)
    running = len(left) - np.arange(len(left))
    freed = np.concatenate([[0.0], np.cumsum(held)[:-1]])
    return bool(np.all(free_tokens + freed - left * running > running))


def _estimate_opens(steps: int, free_tokens: float, left: np.ndarray, clip: int,
                    share: float, ratio, need: float) -> int:
    """Decode steps, at most ``steps``, until the estimate admits a request needing
    ``need`` tokens: each step the running requests write a token each and the
    share held back for their outputs decays (``schedule``'s ``estimate``)."""
    k = np.arange(1, steps + 1, dtype=float)
    rest = np.maximum(float(np.minimum(left, clip).sum()) - len(left) * k, 0.0)
    kept = np.maximum(share - ratio.decay_per_step * k, ratio.minimum) * rest
    opens = np.nonzero(free_tokens - len(left) * k - kept > need)[0]
    return int(k[opens[0]]) if len(opens) else steps


def _held(ids, context, prefilling, prompt, whole_request, reserve_output: bool) -> float:
    """KV tokens the admitted requests have reserved (``whole_request``: prompt
    plus output of each) or hold (the tokens written so far, and the prompts
    being prefilled)."""
    waiting_prefill = [r for r, _ in prefilling]
    if reserve_output:
        return float(whole_request[ids].sum() + whole_request[waiting_prefill].sum())
    return float(context.sum() + prompt[waiting_prefill].sum())


def segment_ends(durations: np.ndarray, not_before: np.ndarray,
                 start: float = 0.0) -> np.ndarray:
    """Ends of segments run one after another from ``start``, none begun before
    its ``not_before``: end_k = max(end_{k-1}, not_before_k) + d_k, in closed
    form the cumulative busy time plus the largest lead any segment so far had
    to wait for."""
    busy = np.cumsum(durations)
    return busy + np.maximum.accumulate(np.maximum(not_before - (busy - durations), start))


PERCENTILES = (50, 99)
"""Per-request percentiles a job reports beside its means: the median serving
benchmarks print (vLLM's and SGLang's bench_serving) and the tail that MLPerf's
Server and Interactive constraints bound (p99 TTFT and TPOT)."""

PERCENTILE_COLUMNS = tuple(f"{name}_p{q}_ms" for name in ("ttft", "tpot", "latency", "itl")
                           for q in PERCENTILES)
"""Columns of a job's table with its percentiles (ms); ``itl``: the gaps between
consecutive tokens of a request, pooled over all requests (``inter_token_gaps``)."""


@dataclass(frozen=True)
class JobTiming:
    """Means over the job's requests, their percentiles and the job's length."""

    ttft_s: float
    tpot_s: float
    latency_s: float
    duration_s: float
    output_tokens: int
    percentiles_s: dict = field(default_factory=dict)
    """``{"ttft_p50": s, "tpot_p99": s, "itl_p50": s, ...}`` over the job's requests
    (TPOT over those with more than one output token; ITL over every gap between
    two tokens of a request)."""


MIN_STEADY_REQUESTS = 100
"""Fewest requests the steady window must hold for its statistics to stand; a
shorter job keeps them over all its requests."""


def steady_requests(sent: np.ndarray, latency: np.ndarray) -> np.ndarray:
    """Which requests arrived in the steady part of a job sent at a rate: at least
    one median latency after the first arrival and before the last. A server
    that starts empty holds its steady population only after about one request
    lifetime (Little's law, L = rate x W, fills in W), and the last W of
    arrivals meet a server that empties behind them; a long-running server (an
    MLPerf Server run lasts 10 to 40 minutes) spends nearly all its time in
    between. All requests where the window holds fewer than
    ``MIN_STEADY_REQUESTS``."""
    fill = float(np.median(latency))
    keep = (sent >= sent.min() + fill) & (sent <= sent.max() - fill)
    return keep if keep.sum() >= MIN_STEADY_REQUESTS else np.ones_like(keep)


def timing(plan: Schedule, step_s: np.ndarray, outputs: np.ndarray,
           steady: bool = False, lag_s: np.ndarray | None = None) -> JobTiming:
    """Times of a schedule whose segments each take ``steps * step_s`` seconds;
    ``steady``: means and percentiles over the requests that arrived in the
    job's steady part (``steady_requests``); duration, tokens and the pooled
    inter-token gaps over all. ``lag_s``: per segment, how much later than its end
    a prompt finished in it gives its first token (``prompt_lag_s``): the
    request's first and later tokens all come that much later."""
    durations = plan.steps * step_s
    if plan.sent_at_s is not None:
        ends = segment_ends(durations, plan.not_before_s)
        sent = plan.sent_at_s
    else:
        ends = np.cumsum(durations)
        sent = np.where(plan.sent_after >= 0, ends[np.maximum(plan.sent_after, 0)], 0.0)
    first = ends[plan.first_token]
    last = ends[plan.finished]
    if lag_s is not None:
        first, last = first + lag_s[plan.first_token], last + lag_s[plan.first_token]
    duration = float(max(ends[-1], last.max()))
    counted = outputs
    if steady and plan.sent_at_s is not None:
        keep = steady_requests(sent, last - sent)
        first, last, sent, counted = first[keep], last[keep], sent[keep], outputs[keep]
    many = counted > 1
    tpot = (last[many] - first[many]) / (counted[many] - 1) if many.any() else np.zeros(1)
    per_request = {"ttft": first - sent, "tpot": tpot, "latency": last - sent}
    percentiles = {f"{name}_p{q}": float(np.percentile(values, q))
                   for name, values in per_request.items() for q in PERCENTILES}
    gaps, counts = inter_token_gaps(plan, step_s)
    percentiles.update({f"itl_p{q}": weighted_percentile(gaps, counts, q) for q in PERCENTILES})
    return JobTiming(ttft_s=float(np.mean(first - sent)), tpot_s=float(np.mean(tpot)),
                     latency_s=float(np.mean(last - sent)), duration_s=duration,
                     output_tokens=int(outputs.sum()), percentiles_s=percentiles)


def activation_tokens(engine, workload, count: int) -> np.ndarray:
    """Tokens of a job step's largest forward pass, per plan: the engine's step budget,
    or a whole prompt where it sets none."""
    return np.full(count, float(engine.max_batched_tokens or workload.input_len_tokens))


def run(model, workload, plans, cluster, constants, engine, job: Job) -> pd.DataFrame:
    """Each plan (``plans.batch``: its engine's cap on running sequences) serving
    ``job``: mean TTFT, TPOT and latency, the job's duration and its output
    tokens/s per replica, and whether its largest request fits the KV cache at all."""
    forward = activation_tokens(engine, workload, len(plans))
    capacity = kv_capacity_tokens(model, workload, plans, forward, cluster.gpu,
                                  pool_tokens(model, workload, plans, forward, cluster.gpu,
                                              engine), engine=engine)
    rows = []
    for i in range(len(plans)):
        one = plans.take([i])
        share = job.per_replica(int(one.replicas[0]))
        inputs = request_lengths(workload.input_len_tokens, workload.input_len_std_tokens,
                                 share.requests, seed=1, dist=workload.length_dist)
        outputs = request_lengths(workload.output_len_tokens, workload.output_len_std_tokens,
                                  share.requests, seed=2, dist=workload.length_dist)
        largest = float((inputs + outputs).max())

        def seconds(decode_seqs, decode_context, prefill_tokens, prefill_context, logits_rows):
            return step_seconds(model, workload, one, cluster, constants, engine, decode_seqs,
                                decode_context, prefill_tokens, prefill_context, logits_rows)
        arrivals, clock = None, None
        if share.rate_per_s is not None:
            arrivals = replica_arrivals_s(job.rate_per_s, share.requests, int(one.replicas[0]),
                                          workload.dispatch, seed=3)
            clock = _Clock(step_estimator(seconds, int(one.batch[0]), float(largest),
                                          engine.max_batched_tokens or int(inputs.max()),
                                          workload.input_len_tokens, workload.output_len_tokens),
                           seconds)
        plan = schedule(inputs, outputs, share.clients or share.requests, int(one.batch[0]),
                        float(capacity[i]), engine.max_batched_tokens, engine.chunked_prefill,
                        engine.kv_reserves_output, arrivals, clock, engine.decode_steps,
                        engine.mixed_prefill, engine.prefill_samples_first_token,
                        engine.overlap_schedule, engine.kv_policy, engine.new_token_ratio)
        step_s = seconds(plan.decode_seqs, plan.decode_context, plan.prefill_tokens,
                         plan.prefill_context, plan.logits_rows)
        t = timing(plan, step_s, outputs, share.steady,
                   prompt_lag_s(seconds, engine.pipeline_split.lanes(float(one.pp[0])),
                                plan, step_s))
        rows.append({"ttft_ms": t.ttft_s * 1e3, "tpot_ms": t.tpot_s * 1e3,
                     "latency_ms": t.latency_s * 1e3,
                     **{f"{k}_ms": v * 1e3 for k, v in t.percentiles_s.items()},
                     "duration_s": t.duration_s,
                     "tokens_per_s_per_replica": t.output_tokens / t.duration_s,
                     "requests_per_s_per_replica": share.requests / t.duration_s,
                     "kv_capacity_tokens": float(capacity[i]),
                     "peak_kv_tokens": plan.peak_kv_tokens,
                     "fits": bool(capacity[i] >= largest)})
    return pd.DataFrame(rows)


def step_seconds(model, workload, one, cluster, constants, engine, decode_seqs, decode_context,
                 prefill_tokens, prefill_context, logits_rows) -> np.ndarray:
    """Seconds of engine steps of one plan (``one``) with these loads (arrays of a
    replica's step): every pipeline stage in turn, plus the engine's host cost
    (a run of ``Engine.decode_steps`` decode steps pays it once)."""
    from autoconfig.inference.latency import StepLoad, stage_seconds

    pp = float(one.pp[0])
    lanes = engine.pipeline_split.lanes(pp)
    row = lambda values: np.asarray(values, dtype=float)[None, :]   # noqa: E731
    stage, _ = stage_seconds(model, workload, one, cluster, constants, engine, StepLoad(
        decode_seqs=row(decode_seqs) / lanes, decode_context=row(decode_context),
        prefill_tokens=row(prefill_tokens) / lanes, prefill_context=row(prefill_context),
        logits_rows=row(logits_rows) / lanes))
    return pp * stage[0] + host_step_s(engine, np.asarray(prefill_tokens, dtype=float))


def prompt_lag_s(seconds, lanes: float, plan: Schedule, step_s: np.ndarray) -> np.ndarray:
    """Per segment: how much later than the end of its step a prompt finished in it
    gives its first token, with ``lanes`` micro-batches in flight over the
    pipeline stages (``PipelineSplit.lanes``: the stage count ``pp`` for an
    in-flight engine, 1 where each step passes whole).

    A step of a pipelined replica is a round of ``pp`` micro-batches, and its
    length (``step_seconds``, here ``step_s``) spreads the step's prompt tokens
    over them: right for throughput, since each stage works through all of them
    either way. But a prompt rides in one micro-batch and crosses the ``pp``
    stages one after another (vLLM and TensorRT-LLM put a request in one in-flight
    micro-batch at a time), so its first token comes ``pp * t_stage(its
    micro-batch)`` after the round began: with the step's prompts split over ``k
    = min(pp, prompts)`` micro-batches, the step as ``seconds`` times it with
    ``pp / k`` times the prompt tokens, less ``step_s``. One Llama 3 70B prompt of
    2,048 tokens on 4 H100s took 195 ms to its first token at TP 1 PP 4 against
    181 ms at TP 4, where the stages in turn take 570 ms (the static model's
    GPipe fill). 0 with one lane: without pipeline stages, or where each step
    is one pass of the whole batch through them."""
    if lanes == 1:
        return np.zeros(len(plan.steps))
    prompts = np.maximum(np.asarray(plan.logits_rows, dtype=float)
                         - np.asarray(plan.decode_seqs, dtype=float), 1.0)
    spread = lanes / np.minimum(lanes, prompts)
    lane = seconds(plan.decode_seqs, plan.decode_context,
                   np.asarray(plan.prefill_tokens, dtype=float) * spread,
                   plan.prefill_context, plan.logits_rows)
    return np.where(np.asarray(plan.prefill_tokens) > 0, lane - step_s, 0.0)


def host_step_s(engine, prefill_tokens):
    """The engine's host time per step: a step that prefills pays the scheduler's
    whole ``step_overhead_s``, a decode-only step its share of a run
    (``Engine.decode_step_overhead_s``)."""
    return np.where(np.asarray(prefill_tokens) > 0, engine.step_overhead_s,
                    engine.decode_step_overhead_s)


def step_estimator(seconds, max_seqs: int, max_context: float, max_prefill_tokens: int,
                   input_len: float, output_len: float):
    """A cheap stand-in for the step model while a timed schedule is built
    (``_Clock``): the exact seconds of one step on a grid of decode sequences x
    prefill tokens (at the job's mean contexts), read by bilinear interpolation.
    It only decides which step an arrival lands in; the schedule is timed
    exactly afterwards."""
    seqs = np.unique(np.concatenate([[0.0], np.geomspace(1, max(max_seqs, 1), 12).round()]))
    tokens = np.unique(np.concatenate(
        [[0.0], np.geomspace(16, max(max_prefill_tokens, 16), 10).round()]))
    grid_d, grid_p = np.meshgrid(seqs, tokens, indexing="ij")
    decode_context = min(input_len + output_len / 2.0, max_context)
    flat = seconds(grid_d.ravel(), np.full(grid_d.size, decode_context), grid_p.ravel(),
                   np.full(grid_d.size, input_len / 2.0), grid_d.ravel() + (grid_p.ravel() > 0))
    table = flat.reshape(grid_d.shape)
    seq_list, token_list = seqs.tolist(), tokens.tolist()

    def weights(axis: list, value: float) -> tuple:
        j = min(max(bisect_right(axis, value) - 1, 0), len(axis) - 2)
        w = (value - axis[j]) / (axis[j + 1] - axis[j])
        return j, max(w, 0.0)           # past the last point: extrapolated

    def estimate(decode_seqs, prefill_tokens) -> float:
        i, a = weights(seq_list, float(decode_seqs))
        j, b = weights(token_list, float(prefill_tokens))
        return float((1 - a) * ((1 - b) * table[i, j] + b * table[i, j + 1])
                     + a * ((1 - b) * table[i + 1, j] + b * table[i + 1, j + 1]))
    return estimate


def inter_token_gaps(plan: Schedule, step_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The gaps between consecutive tokens of each request, pooled over the job,
    as (gap seconds, how many): what a per-token latency percentile measures
    (LMDeploy's ``profile_generation``, vLLM's ITL), where TPOT averages each
    request's gaps first. A step that decodes gives each of its decoders one gap
    of its length. A run of prefill steps that do not mix holds the running
    requests: each gets one long gap, the run plus the decode step after it,
    in place of that step's ordinary gap. Preempted requests' waits are not
    counted apart (few gaps, where the pooled median does not see them)."""
    counts = plan.decode_seqs * plan.steps
    if plan.opened is not None:                 # a first token sampled by a decode step
        counts = counts - plan.opened
    gaps, counts = list(step_s), list(counts.astype(float))
    if plan.stalled is not None:
        durations = plan.steps * step_s
        run, held = 0.0, 0.0
        for k in range(len(step_s)):
            if plan.stalled[k] > 0 and plan.decode_seqs[k] == 0:
                run, held = run + durations[k], plan.stalled[k]
                continue
            if held and plan.decode_seqs[k] > 0:
                moved = min(held, counts[k])
                counts[k] -= moved
                gaps.append(run + step_s[k])
                counts.append(moved)
            run, held = 0.0, 0.0
    return np.asarray(gaps, dtype=float), np.asarray(counts, dtype=float)


def weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The ``q``-th percentile of ``values`` each repeated ``weights`` times (the
    lower value at a tie); NaN when nothing is weighted."""
    keep = weights > 0
    if not keep.any():
        return float("nan")
    order = np.argsort(values[keep], kind="stable")
    ranked, cumulative = values[keep][order], np.cumsum(weights[keep][order])
    return float(ranked[np.searchsorted(cumulative, q / 100.0 * cumulative[-1])])
