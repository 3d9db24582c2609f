"""The tables of a running SGLang engine: loading new ones in place, and checking them.

:class:`SGLangTablesMixin` is the part of :class:`~specfuzz.engines.sglang_engine.SGLangEngine`
that reads SGLang's own log-probabilities and compares them with a table
(:meth:`~SGLangTablesMixin.logits_match_table`, :meth:`~SGLangTablesMixin.check_tables`), and
that swaps a new table model into the running engine and proves each load before any sample
(:meth:`~SGLangTablesMixin.swap`; the plan, SGLang's routes and the proofs are in
:mod:`specfuzz.engines.sglang_swap`).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from specfuzz.engines.base import EngineConfig, SwapReport, SwapUnsupported, TableCheck, first_line, read_config
from specfuzz.engines.sglang_mapping import (
    DEFAULT_LOGPROB_TOLERANCE, FLOAT32_LOG_TINY, compare_rows, mismatch_summary, row_prompts,
)
from specfuzz.engines.vllm_calibration import LogitsReport
from specfuzz.errors import InvalidInput

# Seconds between reset_state's two flushes (check_tables' flush comes tens of ms after a
# swap's, which is what cleared the trie's queued inserts there).
RESET_GAP_S = 0.05


class SGLangTablesMixin:
    """Table checks and in-place table swaps of a started SGLang engine (a part of
    :class:`~specfuzz.engines.sglang_engine.SGLangEngine`)."""

    # -- calibration -----------------------------------------------------------------------

    def logits_match_table(self, prompt_tokens: Sequence[int], *, max_tokens: int = 4, tolerance: float | None = None) -> LogitsReport:
        """Do SGLang's own next-token logprobs reproduce the checkpoint's table?

        One request (temperature 1, ``ignore_eos``) with ``return_logprob=True``,
        ``logprob_start_len=0`` and ``top_logprobs_num=V``: ``meta_info["input_top_logprobs"]``
        gives the row after each prompt token but the last (entry 0 is None),
        ``meta_info["output_top_logprobs"]`` the row after the last prompt token and after
        each generated token. Both must equal the float64 log-softmax of the table the
        checkpoint holds (:func:`specfuzz.tablegen.load_table`, masked entries as
        MASKED_LOGIT) within ``tolerance * max(1, |expected|)`` (default 1e-5: SGLang
        computes in float32); an expected value below log(smallest normal float32) only
        needs an engine value that low too (``log(softmax)`` of the sampler gives -inf
        where the float32 probability underflows).
        """
        self._require_started()
        import numpy as np

        from specfuzz.tablegen import load_table

        assert self._config is not None
        table = load_table(self._config.target_dir).astype(np.float64)  # [V, V]
        V = table.shape[0]
        prompt = [int(t) for t in prompt_tokens]
        if not prompt or any(not 0 <= t < V for t in prompt):
            raise InvalidInput("prompt_tokens", prompt_tokens, f"a non-empty list of token ids in [0, {V})")
        max_tokens = max(1, min(int(max_tokens), self._config.max_model_len - len(prompt)))
        tol = DEFAULT_LOGPROB_TOLERANCE if tolerance is None else float(tolerance)
        return compare_rows(self._logprob_rows([prompt], max_tokens, V), table, tol)

    def _logprob_rows(self, prompts: Sequence[Sequence[int]], max_tokens: int, V: int) -> list[tuple[int, Any]]:
        """(context token, [(logprob, token, text), ...]) of every position SGLang returns
        top-V logprobs for, from one ``generate`` call with one request per prompt."""
        n = len(prompts)
        sp = {"temperature": 1.0, "max_new_tokens": int(max_tokens), "ignore_eos": True}
        outs = self._engine.generate(
            input_ids=[list(p) for p in prompts], sampling_params=[dict(sp) for _ in range(n)],
            return_logprob=True, logprob_start_len=0, top_logprobs_num=V,  # broadcast to every request
        )
        if isinstance(outs, Mapping):
            outs = [outs]
        rows: list[tuple[int, Any]] = []
        for prompt, out in zip(prompts, outs):
            meta = out.get("meta_info") or {}
            generated = [int(t) for t in out.get("output_ids") or ()]
            for i, lp in enumerate(meta.get("input_top_logprobs") or []):
                if lp and i >= 1:  # entry 0 (the first prompt token) has no prediction
                    rows.append((int(prompt[i - 1]), lp))
            context = [int(prompt[-1]), *generated]
            for i, lp in enumerate(meta.get("output_top_logprobs") or []):
                if lp and i < len(context):
                    rows.append((int(context[i]), lp))
        return rows

    def swap(self, config: EngineConfig) -> SwapReport:
        """Load ``config``'s tables into the running engine in place (see
        :mod:`specfuzz.engines.sglang_swap`); :meth:`check_tables` must pass before sampling.

        Raises SwapUnsupported (the caller starts the engine fresh) for what SGLang cannot
        load in place or what could not be proven; InvalidInput for a config this engine
        cannot run at all.
        """
        from specfuzz.engines import sglang_swap as sw

        self._require_started()
        if self._broken:
            raise SwapUnsupported(f"the running engine's weights are in an unknown state ({self._broken})")
        self.check_config(config)
        assert self._config is not None
        plan = sw.plan_swap(self._config, config, self._swap_allowed(), algorithm=self._algorithm)
        t0 = time.perf_counter()
        if not plan.parts:
            return SwapReport(seconds=time.perf_counter() - t0)
        draft_runner = self._algorithm in sw.DRAFT_RUNNER_ALGORITHMS
        if draft_runner and self._draft_sums is None:
            # The reference for every later draft check: what the fresh start loaded.
            sums = sw.checksums(self._engine)
            self._draft_sums = sw.split_checksums(sums)[1] if sums else None
        if (plan.draft_dir is not None or plan.head_weights is not None) and not self._draft_sums:
            raise SwapUnsupported("SGLang gave no draft-runner checksums (check_weights), without which a draft swap cannot be proven")
        try:
            self._load(plan, sw)
        except SwapUnsupported as exc:
            self._broken = f"swap failed: {exc}"
            raise
        except Exception as exc:  # noqa: BLE001 - SGLang raised mid-swap: the weights are unknown
            self._broken = f"swap failed: {first_line(exc)}"
            raise SwapUnsupported(f"SGLang failed mid-swap: {first_line(exc)}") from None
        flushed = sw.flush(self._engine)
        self._config = config
        self._settings = self.settings_for(config)
        self._vocab_size = int(read_config(Path(config.target_dir), "target_dir")["vocab_size"])
        self._spec = config.speculation
        self._unchecked = True
        state = ("prefix cache", "ngram trie") if self._algorithm == "NGRAM" else ("prefix cache",)
        return SwapReport(
            seconds=time.perf_counter() - t0, parts=plan.parts,
            reset=state if flushed else (), kept=() if flushed else state,
        )

    def _load(self, plan, sw) -> None:
        """The loads of a swap plan, each proven before the next (sglang_swap's docstring)."""
        import numpy as np
        from safetensors.torch import load_file

        from specfuzz.tablegen import load_table

        eng = self._engine
        if plan.draft_dir is not None:  # STANDALONE: the draft into both runners
            ok, msg = sw.update_from_disk(eng, plan.draft_dir)
            if not ok:
                raise SwapUnsupported(f"update_weights_from_disk refused the draft: {msg}")
            table = load_table(plan.draft_dir).astype(np.float64)  # [V, V]
            rep = compare_rows(self._logprob_rows(row_prompts(table.shape[0], self._config.max_model_len), 1, table.shape[0]),
                                table, DEFAULT_LOGPROB_TOLERANCE)
            if not rep.ok or set(rep.contexts) != set(range(table.shape[0])):
                raise SwapUnsupported(f"the draft loaded into the target runner does not reproduce the draft table ({mismatch_summary(rep)})")
            self._prove_runner_copy(sw)
        if plan.head_weights is not None:  # EAGLE-3: the head's lm_head into both runners
            lm = load_file(str(plan.head_weights))[sw.LM_HEAD]  # [V, H]
            ok, msg = sw.update_draft_and_target(eng, [(sw.LM_HEAD, lm)])
            if not ok:
                raise SwapUnsupported(f"update_weights_from_tensor refused the head's lm_head: {msg}")
            got = sw.read_weight(eng, sw.LM_HEAD, lm.shape[0])
            want = sw.checkpoint_tensor(plan.head_weights, sw.LM_HEAD)
            if got is None or got.shape != want.shape or not np.array_equal(got, want):
                raise SwapUnsupported("the target runner's lm_head read back is not the head's lm_head just loaded")
            self._prove_runner_copy(sw, names=(sw.LM_HEAD,))
        if plan.target_weights is not None:
            named = list(load_file(str(plan.target_weights)).items())
            ok, msg = sw.update_target(eng, named, keep_draft=self._algorithm in sw.DRAFT_RUNNER_ALGORITHMS)
            if not ok:
                raise SwapUnsupported(f"update_weights_from_tensor refused the target: {msg}")

    def _prove_runner_copy(self, sw, names: Sequence[str] | None = None) -> None:
        """After one load into both runners: the draft runner's tensors (``names``, or all)
        equal the target runner's; they become the proven draft checksums."""
        sums = sw.checksums(self._engine)
        if not sums:
            raise SwapUnsupported("SGLang gave no tensor checksums (check_weights) to prove the draft load")
        if names is None:
            problems = sw.copy_problems(sums)
        else:
            # The named tensors equal the target runner's; every other one is as proven before.
            target, _ = sw.split_checksums(sums)
            reference = {**(self._draft_sums or {}), **{n: target.get(n, "<absent>") for n in names}}
            problems = sw.draft_problems(sums, reference, self._algorithm)
        if problems:
            raise SwapUnsupported(f"the draft runner does not hold what the target runner holds: {problems[0]}")
        self._draft_sums = sw.split_checksums(sums)[1]

    def reset_state(self) -> tuple[str, ...]:
        """Reset the prefix cache and, for NGRAM, the n-gram trie all requests share (the
        state a swap resets), tables unchanged; what was reset. Two flushes
        ``RESET_GAP_S`` apart: ``Ngram::reset`` does not wait for the inserts the last verify
        step queued (sglang_swap's docstring), and the second flush clears those."""
        if self._engine is None:
            return ()
        from specfuzz.engines import sglang_swap as sw

        first = sw.flush(self._engine)
        time.sleep(RESET_GAP_S)
        if not (sw.flush(self._engine) and first):
            return ()
        return ("prefix cache", "ngram trie") if self._algorithm == "NGRAM" else ("prefix cache",)

    def check_tables(self, *, tolerance: float | None = None) -> TableCheck:
        """SGLang's own log-probabilities for every row of the running target table, against
        the table; where a draft or head was swapped in, the proofs of sglang_swap's docstring.

        Rows: prompts that visit every row (:func:`row_prompts`), one token each, top-V
        logprobs (``logits_match_table``'s comparison: within ``tolerance * max(1, |table|)``,
        default 1e-5 — bfloat16/float16 logits of table models are exact and SGLang takes
        their log-softmax in float32 — and, below log(smallest normal float32), only as
        low). A failed check leaves the engine unusable until it is started fresh.
        """
        from specfuzz.engines import sglang_swap as sw

        self._require_started()
        import numpy as np

        from specfuzz.tablegen import load_table

        assert self._config is not None
        tol = DEFAULT_LOGPROB_TOLERANCE if tolerance is None else float(tolerance)
        table = load_table(self._config.target_dir).astype(np.float64)  # [V, V]
        V = table.shape[0]
        prompts = row_prompts(V, self._config.max_model_len)
        problems: list[str] = [self._broken] if self._broken else []
        try:
            rep = compare_rows(self._logprob_rows(prompts, 1, V), table, tol)
        except Exception as exc:  # noqa: BLE001 - SGLang could not answer: not proven
            rep = LogitsReport(ok=False, mode="sglang logprobs", positions=0, max_abs_diff=math.inf, tolerance=tol)
            problems.append(f"logprob request failed: {first_line(exc)}")
        missing = sorted(set(range(V)) - set(rep.contexts))
        if not rep.ok:
            problems.append(mismatch_summary(rep))
        if missing:
            problems.append(f"rows without logprobs: {missing[:10]}")
        extra = []
        if self._algorithm == "EAGLE":  # the head's table lives in the target's lm_head
            want = sw.checkpoint_tensor(Path(self._config.target_dir) / sw.WEIGHTS_FILE, sw.LM_HEAD)  # [V, H]
            got = sw.read_weight(self._engine, sw.LM_HEAD, want.shape[0])
            if got is None or got.shape != want.shape or not np.array_equal(got, want):
                problems.append("the target's lm_head (which carries the EAGLE head's table) read back differs from the checkpoint")
            else:
                extra.append("lm_head read back bit for bit (the EAGLE head's table included)")
        if self._algorithm in sw.DRAFT_RUNNER_ALGORITHMS and self._draft_sums is not None:
            sums = sw.checksums(self._engine)
            bad = ["no tensor checksums"] if not sums else sw.draft_problems(sums, self._draft_sums, self._algorithm)
            if bad:
                problems.append(f"draft runner: {bad[0]}")
            else:
                extra.append(f"draft runner: {len(self._draft_sums)} tensor checksums as proven")
        if not sw.flush(self._engine):
            extra.append("the flush after the check did not happen (scheduler busy)")
        ok = not problems
        if ok:
            self._unchecked = False
        else:
            self._broken = self._broken or f"table check failed: {problems[0]}"
        detail = (f"SGLang logprobs of all {V} rows in {len(prompts)} request(s): max |diff| {rep.max_abs_diff:.3g} "
                  f"(tolerance {tol:g} x max(1, |table|); below {FLOAT32_LOG_TINY} only as low)")
        detail = "; ".join([detail, *extra, *problems])
        return TableCheck(ok=ok, rows=len(set(rep.contexts)), max_abs_diff=float(rep.max_abs_diff), tolerance=tol, detail=detail)
