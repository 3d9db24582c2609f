"""The built-in reference engine: the reference speculative sampler behind the Engine interface.

It reads the same checkpoints a real engine gets (the table is read back from
``lm_head``), samples with :class:`~specfuzz.oracle.speculative.MonteCarloDriver` under
the oracle's "vllm" semantics, and can inject any catalogued bug (``inject="N3"``) or mutant (``inject="M05"``, :mod:`specfuzz.oracle.mutants`).
With no injection it is correct by construction and by test, so every campaign against
it must come back empty; with one it is the positive control.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

import time

from specfuzz.engines.base import (
    Capabilities, Completion, Engine, EngineConfig, Request, SwapReport, TableCheck, swap_parts,
)
from specfuzz.errors import InvalidInput
from specfuzz.oracle.law import TargetLaw
from specfuzz.oracle.events import event_law
from specfuzz.oracle.params import SamplingParams
from specfuzz.oracle.speculative import (
    BUG_CLASSES, METHODS, DraftModel, MonteCarloDriver, SpecConfig, SpeculativeProcess,
)

ALL_SAMPLING = frozenset(SamplingParams.__dataclass_fields__)
# "simulate": run the sampler round by round with random numbers (MonteCarloDriver).
# "exact": compute the exact law of that same process once per request pattern
# (oracle/events.event_law) and draw outputs from it: the same distribution, hundreds of times
# faster; tests check that simulation and exact law agree. Falls back to simulation
# when the process is too large to enumerate.
SAMPLING_MODES = ("exact", "simulate")
# Replays per round / states per step beyond which "exact" falls back to simulation.
EXACT_MODE_MAX_STATES = 20_000
# Round replays in all beyond which "exact" falls back to simulation (~0.2 s of replays):
# enumerating a large injected process (V=5, K=3 sampled drafts: ~500,000 replays, 7 s) costs
# more than simulating its samples (~50 µs each). Lossless chains with token verification take
# the analytic walk of oracle/events.py instead (0.3 s there).
EXACT_MODE_MAX_REPLAYS = 10_000


def _eos_of(ckpt: Path) -> int | None:
    cfg = json.loads((Path(ckpt) / "config.json").read_text())
    eos = cfg.get("eos_token_id")
    if isinstance(eos, list):
        eos = eos[0] if eos else None
    return eos


class ReferenceEngine(Engine):
    name = "reference"

    def __init__(self, inject: str | None = None, mode: str = "exact") -> None:
        from specfuzz.oracle.mutants import CONTROLS, MUTANTS

        if inject is not None and inject not in {**BUG_CLASSES, **MUTANTS, **CONTROLS}:
            raise InvalidInput("inject", inject,
                               f"None or one of {sorted(BUG_CLASSES)}, a mutant {sorted(MUTANTS)} or a control {sorted(CONTROLS)}")
        if mode not in SAMPLING_MODES:
            raise InvalidInput("mode", mode, f"one of {SAMPLING_MODES}")
        self.inject = inject
        self.mode = mode
        self._process_laws: dict[tuple, tuple[list, np.ndarray] | None] = {}
        self._config: EngineConfig | None = None
        self._laws: dict[tuple, TargetLaw] = {}

    def capabilities(self) -> Capabilities:
        # eagle/eagle3 run as draft_model chains here: campaigns need not draw them twice.
        return Capabilities(methods=tuple(m for m in METHODS if m not in ("eagle", "eagle3")), sampling=ALL_SAMPLING, dtypes=("float32", "bfloat16", "float16"),
                            profile="vllm", draft_vocab="any", swap=frozenset({"target", "draft"}))

    def version(self) -> Mapping[str, str]:
        import specfuzz

        return {
            "name": "reference" + (f"+{self.inject}" if self.inject else ""),
            "version": specfuzz.__version__,
            "numpy": np.__version__,
            "device": "cpu",
            "python": platform.python_version(),
        }

    def start(self, config: EngineConfig) -> None:
        from specfuzz.tablegen import load_table

        self._table = load_table(config.target_dir)  # [V, V]
        self._eos = _eos_of(config.target_dir)
        spec = config.speculation
        self._draft = None
        if spec is not None:
            own = self.capabilities().methods
            if spec.method not in own:
                # eagle/eagle3 cases have EAGLE-head checkpoints; their draft_model twin runs here.
                raise InvalidInput("speculation method", spec.method, f"one of {own} for the reference engine")
            if spec.uses_draft_model:
                if config.draft_dir is None:
                    raise InvalidInput("draft_dir", None, f"a draft checkpoint for method {spec.method!r}")
                draft = load_table(config.draft_dir)  # [R, R], reduced vocabularies padded with masked columns
                width = int(config.draft_vocab_size or draft.shape[1])
                d2t = config.draft_d2t
                self._draft = DraftModel(draft[:, :width], None if d2t is None else tuple(d2t))
        self._spec = spec
        self._config = config
        self._laws.clear()
        self._process_laws.clear()

    def swap(self, config: EngineConfig) -> SwapReport:
        """New tables in place: read them from the new checkpoints, drop every cached law."""
        t0 = time.perf_counter()
        parts = swap_parts(self._config, config) if self._config is not None else ("target",)
        self.start(config)
        return SwapReport(seconds=time.perf_counter() - t0, parts=parts, reset=("cached laws",))

    def check_tables(self) -> TableCheck:
        """The table this engine samples from, row by row, against its target checkpoint."""
        from specfuzz.tablegen import load_table

        assert self._config is not None
        want = load_table(self._config.target_dir)  # [V, V]
        same = want.shape == self._table.shape and bool(np.array_equal(want, self._table))
        diff = float(np.max(np.abs(np.nan_to_num(want - self._table)))) if want.shape == self._table.shape else float("inf")
        return TableCheck(ok=same, rows=int(want.shape[0]), max_abs_diff=diff, tolerance=0.0,
                          detail="the engine's in-memory table against the checkpoint's lm_head")

    def _law(self, prompt: tuple[int, ...], params: SamplingParams) -> TargetLaw:
        key = (prompt, json.dumps(params.to_json(), sort_keys=True))
        law = self._laws.get(key)
        if law is None:
            if len(self._laws) > 256:
                self._laws.clear()
                self._process_laws.clear()
            law = TargetLaw(self._table, prompt, params, eos_token_id=self._eos)
            self._laws[key] = law
        return law

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        if self._config is None:
            raise RuntimeError("generate() before start()")
        out: list[Completion] = []
        for req in requests:
            law = self._law(tuple(req.prompt), req.params)
            rng = np.random.default_rng(req.seed)
            if self._spec is None:
                exact = self._exact_target(law) if self.mode == "exact" else None
                tokens = self._draw(exact, rng) if exact is not None else self._plain_sample(law, rng)
                proposed = accepted = None
            else:
                spec = self._spec
                if self.inject is not None:
                    spec = SpecConfig.from_json({**spec.to_json(), "inject": self.inject})
                proc = SpeculativeProcess(law, req.prompt, req.params.max_tokens, spec, self._draft, req.params.temperature)
                exact = self._exact_law(proc, law) if self.mode == "exact" else None
                if exact is not None:
                    tokens = self._draw(exact, rng)
                    proposed = accepted = None
                else:
                    driver = MonteCarloDriver(proc, rng)
                    tokens = driver.sample()
                    proposed, accepted = driver.stats.proposed, driver.stats.accepted
            last = tokens[-1] if tokens else None
            stopped = last is not None and 0 <= last < law.vocab_size and law.is_stop_token(last)
            out.append(Completion(tokens, "stop" if stopped else "length", proposed, accepted))
        return out

    def _exact_law(self, proc: SpeculativeProcess, law: TargetLaw) -> tuple[list, np.ndarray] | None:
        key = (id(law), json.dumps(proc.spec.to_json(), sort_keys=True))
        if key not in self._process_laws:
            try:
                d = event_law(proc, EXACT_MODE_MAX_STATES, max_replays=EXACT_MODE_MAX_REPLAYS).law
                outputs = list(d)
                self._process_laws[key] = (outputs, np.cumsum([d[o] for o in outputs]))  # [M]
            except RuntimeError:
                self._process_laws[key] = None
        return self._process_laws[key]

    def _exact_target(self, law: TargetLaw) -> tuple[list, np.ndarray] | None:
        from specfuzz.oracle.law import OutputSpaceTooLarge

        key = (id(law), None)
        if key not in self._process_laws:
            try:
                o = law.enumerate(max_outcomes=EXACT_MODE_MAX_STATES)
                self._process_laws[key] = (list(o.outputs), np.cumsum(o.probs))
            except OutputSpaceTooLarge:
                self._process_laws[key] = None
        return self._process_laws[key]

    @staticmethod
    def _draw(exact: tuple[list, np.ndarray], rng: np.random.Generator) -> tuple[int, ...]:
        outputs, cum = exact
        return tuple(outputs[min(int(np.searchsorted(cum, rng.random() * cum[-1], side="right")), len(outputs) - 1)])

    @staticmethod
    def _plain_sample(law: TargetLaw, rng: np.random.Generator) -> tuple[int, ...]:
        """Speculation off: one token at a time from the exact conditional."""
        out: tuple[int, ...] = ()
        while not (out and law.is_terminal(out)):
            p = law.conditional(out)  # [V]
            c = np.cumsum(p)
            out = out + (int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), len(c) - 1)),)
        return out
