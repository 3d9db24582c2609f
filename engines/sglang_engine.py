"""The SGLang adapter: SGLang's offline ``sglang.Engine`` on table checkpoints.

:class:`SGLangEngine` starts ``sglang.Engine(model_path=..., skip_tokenizer_init=True,
...)`` once per :class:`~specfuzz.engines.base.EngineConfig` and answers every batch with
**one** ``Engine.generate(input_ids=[...], sampling_params=[...])`` call (one sampling
dict per request). Everything below was read in SGLang 0.5.17's source (file paths under
``python/sglang/srt``, functions in ``backticks``); what ran on the H200 is in
``../shared/gpu/README.md``. SGLang needs CUDA: nothing here was run on a CPU machine.

Engine settings
---------------
Defaults (:data:`DEFAULT_SETTINGS`), overridden by the site-wide ``SPECFUZZ_SGLANG_SETTINGS``
(JSON), then by the constructor's keyword arguments, then by ``EngineConfig.settings``:
``attention_backend="triton"``, ``sampling_backend="pytorch"`` (the FlashAttention 3 and
FlashInfer JIT parts are not shipped to the H200), ``disable_cuda_graph=True``,
``mem_fraction_static=0.15``, ``max_total_tokens=65536``, ``max_running_requests=512`` (SGLang's
own default with speculation is 48; engine-default variants keep SGLang's), ``skip_tokenizer_init=True``,
``log_level="error"``; ``context_length`` is ``EngineConfig.max_model_len`` and ``dtype``
``EngineConfig.dtype``. Every other key goes to ``sglang.Engine`` as is, after a run-time
check against ``dataclasses.fields(ServerArgs)``: a key this SGLang version lacks is an
:class:`~specfuzz.errors.InvalidInput` naming it (an adapter default that a newer SGLang
dropped is left out instead). Adapter-only keys: ``shutdown_timeout_s`` (default 10),
``env`` (environment variables set while the engine starts; its processes inherit them),
``swap`` (the parts a started engine may load in place, a subset of ``("target", "draft",
"head")``, default all: ``Capabilities.swap``). ``speculative_*`` keys apply to speculative
runs only: with speculation off they are left out (recorded in ``ignored_settings``), so one
site-wide ``SPECFUZZ_SGLANG_SETTINGS`` serves a case and its speculation-off calibration.
The keys the speculation mapping sets (:data:`MAPPED_SPEC_KEYS`) are refused in settings.
``random_seed`` (the scheduler's ``torch.manual_seed``): a fresh random value per start
unless given, because per-request seeds are ignored by default: a fixed engine
seed would replay the same random stream on every start, and "fresh" confirmation
samples on a new engine would repeat the old ones (per-request seeds: sglang_mapping). Only ``bfloat16`` and ``float16``:
``float32`` fails inside sgl_kernel's rmsnorm ("failed to dispatch data type Float").

Processes. ``Engine.__init__`` starts the scheduler and detokenizer with multiprocessing
(spawn), so it cannot run in a daemonic process: :class:`~specfuzz.engines.isolation.
IsolatedEngine` hosts it in a non-daemon child. ``Engine.shutdown`` ends with
``kill_process_tree(os.getpid(), include_parent=False, wait_timeout=60)``: it kills
*every* child of the calling process, not only SGLang's, and has been seen to hang.
Hence at most one started :class:`SGLangEngine` per process, and :meth:`SGLangEngine.close`
runs ``shutdown`` in a thread for at most ``shutdown_timeout_s`` and then SIGKILLs the
processes the engine started (recorded with psutil at start). ``restart_in_process`` is
False: each new config gets a fresh process (SGLang keeps per-process state: the
``atexit`` shutdown hook, the ``spawn`` start method it forces, signal handlers).

Speculation and sampling: what a SpecConfig and a Request become in SGLang (and what is
refused) is :mod:`specfuzz.engines.sglang_mapping`.

Table swaps (:mod:`specfuzz.engines.sglang_swap` has the details and source locations):
:meth:`SGLangEngine.swap` loads a new table model into the running engine (target: every
algorithm; STANDALONE draft; EAGLE and full-width EAGLE-3 heads), resets the prefix cache
and the NGRAM trie, and :meth:`SGLangEngine.check_tables` proves the load before any sample:
SGLang's own log-probabilities for every row of the target table, plus, where a draft or head
was loaded, weight read-backs and SGLang's tensor checksums. ``generate`` refuses to run
between a swap and a passed check.

Calibration: :meth:`SGLangEngine.logits_match_table` asks SGLang for its own logprobs
(``return_logprob=True``, ``logprob_start_len=0``, ``top_logprobs_num=V``): prompt
positions from ``log_softmax`` of the float32 logits, sampled positions from
``log(softmax(l / 1))`` of the sampler, compared with the float64 log-softmax of the
table the checkpoint holds.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Mapping, Sequence

from specfuzz.engines import sglang_mapping as _mapping
from specfuzz.engines.base import (
    Capabilities, Completion, Engine, EngineConfig, Request, environ, first_line, gpu_details, read_config,
)
from specfuzz.engines.sglang_mapping import (  # the adapter's public mapping, re-exported (__all__)
    ALGORITHMS, DEFAULT_LOGPROB_TOLERANCE, DTYPES, FLOAT32_LOG_TINY, HEAD_METHODS, MAPPED_SPEC_KEYS, METHODS,
    NEED_TOKENIZER, NOT_WITH_DETERMINISTIC, SAMPLING_FIELDS, SGLANG_DEFAULTS, SPEC_DEFAULTS, SPEC_KNOBS, SPEC_PATHS, SWAPPABLE,
    VERIFY_SAMPLER, VERIFY_SAMPLER_FEATURES,
    compare_rows, completion_from_output, mismatch_summary, row_prompts, sampling_params_dict, speculative_kwargs,
    split_settings,
)
from specfuzz.engines.sglang_tables import SGLangTablesMixin
from specfuzz.engines.vllm_calibration import LogitsReport
from specfuzz.errors import InvalidInput
from specfuzz.oracle.speculative import SpecConfig

__all__ = [
    "SGLangEngine", "CRASH_DIAGNOSTICS_OFF", "DEFAULT_SETTINGS", "DEFAULT_SHUTDOWN_TIMEOUT_S", "SETTINGS_ENV", "LogitsReport",
    "server_args_fields", "unknown_server_args",
    "ALGORITHMS", "DEFAULT_LOGPROB_TOLERANCE", "DTYPES", "FLOAT32_LOG_TINY", "HEAD_METHODS", "MAPPED_SPEC_KEYS", "METHODS",
    "NEED_TOKENIZER", "NOT_WITH_DETERMINISTIC", "SAMPLING_FIELDS", "SGLANG_DEFAULTS", "SPEC_DEFAULTS", "SPEC_KNOBS",
    "SPEC_PATHS", "SWAPPABLE", "VERIFY_SAMPLER", "VERIFY_SAMPLER_FEATURES", "compare_rows", "completion_from_output",
    "mismatch_summary", "row_prompts", "sampling_params_dict", "speculative_kwargs", "split_settings",
]

SETTINGS_ENV = "SPECFUZZ_SGLANG_SETTINGS"
# Adapter defaults (what ran on the H200, ../shared/gpu/README.md).
DEFAULT_SETTINGS: dict[str, Any] = {
    "attention_backend": "triton",
    "sampling_backend": "pytorch",
    "disable_cuda_graph": True,
    "mem_fraction_static": 0.15,
    "max_total_tokens": 65536,
    # SGLang resets an unset max_running_requests to 48 for every speculative algorithm
    # (arg_groups/speculative_hook.py), and a campaign's batch of 3000 requests then runs in
    # ~60 waves; table models are tiny, so the adapter runs up to 512 at once.
    "max_running_requests": 512,
    "skip_tokenizer_init": True,
    "log_level": "error",
}
# Settings the adapter consumes itself (everything else goes to sglang.Engine).
_OWN_SETTINGS = ("shutdown_timeout_s", "env", "swap")
DEFAULT_SHUTDOWN_TIMEOUT_S = 10.0
# SGLang's crash diagnostics (TokenizerManager.dump_requests_before_crash, 0.5.17): when a child
# process fails, the engine process sleeps 5 s, tries py-spy, then waits
# SGLANG_CUDA_COREDUMP_BEFORE_CRASH_WAIT_SECS (default 60) for CUDA core dumps before it exits,
# even where none can be written: a crashed family would hold its worker for over a minute.
# Off in the engine's process (a value the environment already has is kept);
# they change nothing the engine computes, so launch records leave them out.
CRASH_DIAGNOSTICS_OFF = {"SGLANG_PYSPY_DUMP_BEFORE_CRASH": "0", "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0"}

def _swap_setting(settings: Mapping[str, Any]) -> frozenset[str]:
    """The ``swap`` setting (the parts a started engine may load in place); InvalidInput when bad."""
    v = settings.get("swap", tuple(sorted(SWAPPABLE)))
    if isinstance(v, str) or not isinstance(v, (list, tuple, set, frozenset)) or not set(v) <= SWAPPABLE:
        raise InvalidInput("settings['swap']", v, f"a list of parts from {sorted(SWAPPABLE)} (empty: no swaps)")
    return frozenset(v)


def unknown_server_args(keys: Sequence[str], fields: frozenset[str]) -> list[str]:
    """The keys that are not ``ServerArgs`` fields of the running SGLang."""
    return [k for k in keys if k not in fields]


def server_args_fields() -> frozenset[str]:
    """Field names of this SGLang version's ``ServerArgs`` (detected at run time)."""
    import dataclasses

    from sglang.srt.server_args import ServerArgs

    return frozenset(f.name for f in dataclasses.fields(ServerArgs))


# ----------------------------------------------------------------------------- helpers


def _child_pids() -> set[int]:
    try:
        import psutil
    except ImportError:  # pragma: no cover - SGLang itself depends on psutil
        return set()
    try:
        return {c.pid for c in psutil.Process().children(recursive=True)}
    except Exception:  # noqa: BLE001
        return set()


def _kill_pids(pids: set[int]) -> None:
    """SIGKILL these processes and whatever they started, if still alive."""
    try:
        import psutil
    except ImportError:  # pragma: no cover
        import signal

        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        return
    procs = []
    for pid in pids:
        with contextlib.suppress(Exception):
            p = psutil.Process(pid)
            procs += [p, *p.children(recursive=True)]
    for p in procs:
        with contextlib.suppress(Exception):
            p.kill()
    with contextlib.suppress(Exception):
        psutil.wait_procs(procs, timeout=5)


def _short_config(kwargs: Mapping[str, Any]) -> dict:
    keep = ("dtype", "context_length", "attention_backend", "sampling_backend", "speculative_algorithm",
            "speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
    return {k: kwargs[k] for k in keep if k in kwargs}


# Started engines of this process (at most one: SGLang's shutdown kills every child of its process).
_RUNNING: "weakref.WeakSet[SGLangEngine]" = weakref.WeakSet()
# Shutdown threads that outlived close(): a new engine must not start under them.
_PENDING_SHUTDOWNS: list[threading.Thread] = []


# ----------------------------------------------------------------------------- the engine


class SGLangEngine(SGLangTablesMixin, Engine):
    """SGLang's offline ``sglang.Engine`` behind the :class:`~specfuzz.engines.base.Engine` interface."""

    name = "sglang"

    def __init__(self, **settings: Any) -> None:
        """``settings``: defaults for :attr:`EngineConfig.settings` (which take precedence)."""
        env = os.environ.get(SETTINGS_ENV)
        try:
            base = json.loads(env) if env else {}
        except json.JSONDecodeError:
            base = None
        if not isinstance(base, dict):
            raise InvalidInput(SETTINGS_ENV, env, "a JSON object of SGLang settings")
        self._default_settings = {**base, **settings}
        self._engine = None
        self._config: EngineConfig | None = None
        self._settings: dict[str, Any] = {}
        self._vocab_size: int | None = None
        self._spec: SpecConfig | None = None
        self._algorithm: str | None = None  # SGLang's speculative_algorithm of the running config
        self._pids: set[int] = set()
        self._shutdown_timeout_s = DEFAULT_SHUTDOWN_TIMEOUT_S
        self.start_seconds: float | None = None
        self.random_seed: int | None = None
        self.dropped_defaults: tuple[str, ...] = ()  # adapter defaults this SGLang has no field for
        self.ignored_settings: dict[str, Any] = {}  # speculative_* settings left out (speculation off)
        self.close_timed_out = False
        self._reset_swap_state()

    def _reset_swap_state(self) -> None:
        self._broken = ""  # why the weights are in an unknown state (a failed swap or check): restart
        self._unchecked = False  # swapped, not yet checked: generate() refuses
        self._draft_sums: dict[str, str] | None = None  # proven draft-runner tensor checksums

    # -- description ---------------------------------------------------------------------

    def _effective_settings(self) -> dict[str, Any]:
        return {**DEFAULT_SETTINGS, **(self._settings if self._config is not None else self._default_settings)}

    def capabilities(self) -> Capabilities:
        """What this engine runs. Before start from the default settings, once started from
        the running config (a tokenizer adds ``min_tokens``; deterministic inference drops ``min_p``)."""
        st = self._effective_settings()
        sampling = set(SAMPLING_FIELDS)
        if not st.get("skip_tokenizer_init", True):
            sampling |= NEED_TOKENIZER
        if st.get("enable_deterministic_inference"):
            sampling -= NOT_WITH_DETERMINISTIC
        methods = METHODS + (HEAD_METHODS if _mapping.HEADS_ENABLED else ())
        return Capabilities(
            methods=methods,
            sampling=frozenset(sampling),
            dtypes=DTYPES,
            profile="sglang",
            max_vocab=None,
            draft_vocab="narrower",
            spec_knobs=dict(SPEC_KNOBS),
            restart_in_process=False,
            # SGLang refuses none of them with speculation on (what it does with them: module docstring).
            sampling_with_speculation=frozenset(sampling),
            speculates_first_token=False,  # the prefill (extend) step samples the first token
            swap=_swap_setting(st),
            spec_defaults={m: dict(v) for m, v in SPEC_DEFAULTS.items() if m in methods},
            # SGLang's ignore_eos also switches stop_token_ids off (sglang_mapping.sampling_params_dict refuses both).
            sampling_exclusive=(frozenset({"ignore_eos", "stop_token_ids"}),),
            spec_paths={m: SPEC_PATHS[m] for m in methods},
            verify_samplers={m: VERIFY_SAMPLER for m in methods},
            verify_sampler_features=VERIFY_SAMPLER_FEATURES,
        )

    def version(self) -> Mapping[str, str]:
        import sglang
        import torch

        out = {
            "name": "sglang",
            "version": str(sglang.__version__),
            "torch": str(torch.__version__),
            "python": platform.python_version(),
            "platform": f"{platform.system()} {platform.release()} {platform.machine()}",
        }
        out.update(gpu_details())  # device; on CUDA driver, runtime, compute capability, memory
        with contextlib.suppress(Exception):
            from importlib.metadata import version as _pkg_version

            out["sglang_kernel"] = _pkg_version("sglang-kernel")
        return out

    # -- start / stop --------------------------------------------------------------------

    @property
    def started(self) -> bool:
        return self._engine is not None

    @property
    def engine(self):
        """The underlying ``sglang.Engine`` (for benchmarks)."""
        self._require_started()
        return self._engine

    def settings_for(self, config: EngineConfig) -> dict:
        """The settings in force for ``config``: constructor/env defaults, then ``config.settings``,
        without ``speculative_*`` keys when speculation is off."""
        return split_settings({**self._default_settings, **dict(config.settings)}, config.speculation is not None)[0]

    def check_config(self, config: EngineConfig) -> dict[str, Any]:
        """Validate ``config`` without importing SGLang; return the ``sglang.Engine`` keyword
        arguments (before the run-time ServerArgs field check). Raises InvalidInput."""
        if config.dtype not in DTYPES:
            raise InvalidInput(
                "dtype", config.dtype,
                f"one of {DTYPES} (float32 fails in sgl_kernel's rmsnorm: 'failed to dispatch data type Float')",
            )
        if isinstance(config.max_model_len, bool) or not isinstance(config.max_model_len, int) or config.max_model_len < 2:
            raise InvalidInput("max_model_len", config.max_model_len, "an integer >= 2")
        target = read_config(Path(config.target_dir), "target_dir")
        tv = target.get("vocab_size")
        if not isinstance(tv, int) or tv < 2:
            raise InvalidInput("target vocab_size", tv, "an integer >= 2 in the target's config.json")
        raw = {**self._default_settings, **dict(config.settings)}
        mapped = sorted(k for k in raw if k in MAPPED_SPEC_KEYS)
        if mapped:
            raise InvalidInput(f"settings[{mapped[0]!r}]", raw[mapped[0]], "unset: the adapter maps EngineConfig.speculation onto it")
        settings = self.settings_for(config)
        spec = config.speculation
        _swap_setting(settings)
        dv = None
        if isinstance(spec, SpecConfig) and spec.method in METHODS and spec.uses_draft_model and config.draft_dir is not None:
            dv = read_config(Path(config.draft_dir), "draft_dir").get("vocab_size")
        if isinstance(spec, SpecConfig) and spec.method in HEAD_METHODS and _mapping.HEADS_ENABLED and config.draft_dir is not None:
            head = read_config(Path(config.draft_dir), "draft_dir")
            if head.get("vocab_size") != tv:
                raise InvalidInput("head vocab_size", head.get("vocab_size"), f"the target's vocab_size={tv}")
            dv = head.get("draft_vocab_size") or head.get("vocab_size")
        spec_kw = speculative_kwargs(spec, draft_dir=config.draft_dir, target_vocab=tv, draft_vocab=dv)
        t = settings.get("shutdown_timeout_s", DEFAULT_SHUTDOWN_TIMEOUT_S)
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0:
            raise InvalidInput("settings['shutdown_timeout_s']", t, "a number of seconds > 0")
        env = settings.get("env") or {}
        if not isinstance(env, Mapping):
            raise InvalidInput("settings['env']", env, "a dict of environment variables")
        kwargs: dict[str, Any] = {
            **DEFAULT_SETTINGS,
            "model_path": str(config.target_dir),
            "dtype": config.dtype,
            "context_length": int(config.max_model_len),
            **spec_kw,
        }
        kwargs.update({k: v for k, v in settings.items() if k not in _OWN_SETTINGS})
        if isinstance(spec, SpecConfig) and spec.engine_default and "max_running_requests" not in raw:
            # An engine-default variant runs as a user's does: SGLang's own max_running_requests
            # (48 under speculation), not the adapter's 512 (corpus/h200/sglang/finding-065f698102ca951f
            # fails with 512 and passes with 48).
            kwargs.pop("max_running_requests", None)
        return kwargs

    def launch_args(self, config: EngineConfig) -> tuple[dict[str, str], dict[str, Any]]:
        """What :meth:`start` applies for ``config``: (environment variables, ``sglang.Engine``
        keyword arguments = ServerArgs fields), less ``random_seed`` (fresh per start unless
        set) and with the EAGLE head's SGLang-layout path. Validates (InvalidInput), starts
        and writes nothing; drafts replay it. Needs SGLang (the ServerArgs field check)."""
        kwargs = self.check_config(config)
        settings = self.settings_for(config)
        fields = server_args_fields()
        user_keys = set(settings) - set(_OWN_SETTINGS)
        unknown = unknown_server_args(sorted(user_keys), fields)
        if unknown:
            raise InvalidInput(f"settings[{unknown[0]!r}]", settings[unknown[0]], "a ServerArgs field of this SGLang version")
        mapped_missing = unknown_server_args(sorted(k for k in kwargs if k not in user_keys and k not in DEFAULT_SETTINGS), fields)
        if mapped_missing:
            raise InvalidInput("ServerArgs field", mapped_missing[0], "a field this SGLang version has (the adapter maps onto it)")
        self.dropped_defaults = tuple(unknown_server_args(sorted(k for k in DEFAULT_SETTINGS if k not in user_keys), fields))
        for k in self.dropped_defaults:
            kwargs.pop(k, None)
        if isinstance(config.speculation, SpecConfig) and config.speculation.method in HEAD_METHODS:
            kwargs["speculative_draft_model_path"] = str(Path(config.draft_dir).with_name(Path(config.draft_dir).name + "-sglang"))
        env = {str(k): str(v) for k, v in dict(settings.get("env") or {}).items()}
        return env, kwargs

    def preload(self) -> None:
        """The imports a start makes (SGLang's engine and server arguments), made ahead of it
        by a spare engine process (IsolatedEngine(spare=True))."""
        import sglang  # noqa: F401
        from sglang.srt.entrypoints.engine import Engine  # noqa: F401
        from sglang.srt.server_args import ServerArgs  # noqa: F401

    def start(self, config: EngineConfig) -> None:
        """Start SGLang on ``config``; raise InvalidInput (before starting) for a bad config."""
        if self._engine is not None:
            if config == self._config and not self._broken and not self._unchecked:
                return
            self.close()
        self.check_config(config)
        settings = self.settings_for(config)
        if any(e._engine is not None for e in _RUNNING):
            raise RuntimeError(
                "SGLangEngine: another SGLang engine is running in this process, and SGLang's Engine.shutdown kills "
                "every child process of its process; close it first or run each engine in its own process (IsolatedEngine)"
            )
        for th in list(_PENDING_SHUTDOWNS):
            th.join(DEFAULT_SHUTDOWN_TIMEOUT_S)
            if th.is_alive():
                raise RuntimeError(
                    "SGLangEngine: the shutdown of a previous SGLang engine is still running in this process "
                    "(it would kill the new engine's processes); start the engine in a fresh process"
                )
            _PENDING_SHUTDOWNS.remove(th)
        env, kwargs = self.launch_args(config)
        if kwargs.get("random_seed") is None:
            kwargs["random_seed"] = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
        self.random_seed = int(kwargs["random_seed"])
        if isinstance(config.speculation, SpecConfig) and config.speculation.method in HEAD_METHODS:
            from specfuzz.tablegen.eagle import sglang_head

            kwargs["speculative_draft_model_path"] = str(sglang_head(config.draft_dir))
        self._shutdown_timeout_s = float(settings.get("shutdown_timeout_s", DEFAULT_SHUTDOWN_TIMEOUT_S))

        import sglang
        from sglang.srt.server_args import ServerArgs

        for key, value in CRASH_DIAGNOSTICS_OFF.items():
            os.environ.setdefault(key, value)  # read when a child fails, after the start's own env is gone
        before = _child_pids()
        t0 = time.perf_counter()
        with environ(env):
            # As sglang.Engine does before building ServerArgs (plugins may hook its __post_init__).
            with contextlib.suppress(ImportError):
                from sglang.srt.plugins import load_plugins

                load_plugins()
            try:
                server_args = ServerArgs(**kwargs)
            except (ValueError, TypeError, NotImplementedError, AssertionError) as exc:
                # Anything SGLang refuses at configuration time: one line, not a traceback.
                msg = " ".join(str(exc).strip().split())[:600]
                raise InvalidInput("engine config", _short_config(kwargs), f"a config SGLang accepts (SGLang said: {msg})") from None
            try:
                self._engine = sglang.Engine(server_args=server_args)
            except BaseException:
                _kill_pids(_child_pids() - before)
                raise
        self._pids = _child_pids() - before
        self._server_args = server_args
        self.start_seconds = time.perf_counter() - t0
        _RUNNING.add(self)
        self._config = config
        self._settings = settings
        self.ignored_settings = split_settings({**self._default_settings, **dict(config.settings)}, config.speculation is not None)[1]
        self._vocab_size = int(read_config(Path(config.target_dir), "target_dir")["vocab_size"])
        self._spec = config.speculation
        self._algorithm = str(kwargs.get("speculative_algorithm")) if kwargs.get("speculative_algorithm") else None
        self._reset_swap_state()
        self.close_timed_out = False

    def close(self) -> None:
        """Shut SGLang down within ``settings['shutdown_timeout_s']`` (default 10 s), then
        SIGKILL whatever of the processes it started is still alive."""
        eng, self._engine = self._engine, None
        self._config = None
        self._spec = None
        self._algorithm = None
        self._reset_swap_state()
        _RUNNING.discard(self)
        if eng is None:
            return
        pids, self._pids = self._pids, set()

        def _shutdown() -> None:
            with contextlib.suppress(BaseException):
                eng.shutdown()

        th = threading.Thread(target=_shutdown, daemon=True, name="specfuzz-sglang-shutdown")
        th.start()
        th.join(self._shutdown_timeout_s)
        self.close_timed_out = th.is_alive()
        if th.is_alive():
            _PENDING_SHUTDOWNS.append(th)
        _kill_pids(pids)
        del eng
        import gc

        gc.collect()

    def __del__(self) -> None:  # pragma: no cover - interpreter shutdown
        try:
            self.close()
        except Exception:  # noqa: BLE001
            pass

    # -- sampling ------------------------------------------------------------------------

    def _require_started(self) -> None:
        if self._engine is None:
            raise RuntimeError("SGLangEngine: call start(config) first")

    def _require_sampling_ready(self) -> None:
        self._require_started()
        if self._broken:
            raise RuntimeError(f"SGLangEngine: the weights are in an unknown state ({self._broken}); start the engine fresh")
        if self._unchecked:
            raise RuntimeError("SGLangEngine: call check_tables() after swap() before sampling")

    def sampling_params(self, request: Request) -> dict[str, Any]:
        """The SGLang sampling-params dict for one request (validated; raises InvalidInput)."""
        self._require_started()
        assert self._config is not None and self._vocab_size is not None
        st = self._effective_settings()
        return sampling_params_dict(
            request, vocab_size=self._vocab_size, max_model_len=int(self._config.max_model_len),
            tokenizer=not st.get("skip_tokenizer_init", True),
            deterministic=bool(st.get("enable_deterministic_inference")),
        )

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        """One ``Engine.generate`` call for the batch; completions in request order."""
        self._require_sampling_ready()
        if not requests:
            return []
        # Requests sharing a SamplingParams object and no seed share one dict (SGLang
        # itself repeats one dict for a batch; it builds its SamplingParams from a copy).
        cache: dict[int, dict] = {}
        params = []
        for r in requests:
            if r.seed is None:
                sp = cache.get(id(r.params))
                if sp is None:
                    sp = cache[id(r.params)] = self.sampling_params(r)
            else:
                sp = self.sampling_params(r)
            params.append(sp)
        ids = [list(r.prompt) for r in requests]
        try:
            outs = self._engine.generate(input_ids=ids, sampling_params=params)
        except ValueError as exc:  # SGLang's request validation (TokenizerManager, SamplingParams.verify)
            raise InvalidInput("request", first_line(exc), "a request SGLang accepts") from None
        if isinstance(outs, Mapping):
            outs = [outs]
        if len(outs) != len(requests):
            raise RuntimeError(f"SGLang returned {len(outs)} outputs for {len(requests)} requests")
        spec_on = self._spec is not None
        return [completion_from_output(o, speculation=spec_on) for o in outs]

    def warm_up(self) -> dict:
        """Run once through the sampling paths that SGLang compiles on first use, then reset the
        prefix cache and the NGRAM trie: returns ``{"seconds", "requests", "reset"}``.

        SGLang 0.5.17 wraps parts of its sampler in ``torch.compile(dynamic=True)``:
        ``apply_scaling_penalties`` (repetition penalty, ``sampling/penaltylib/
        repetition_penalty.py``), ``multinomial_with_seed`` (per-request seeds,
        ``layers/sampler.py``), and, while speculating, ``create_num_accept_tokens_filter`` and
        ``_select_top_k_tokens_later`` (``speculative/spec_utils.py``). Each compiles in the
        scheduler process at its first call, which takes tens of seconds where sampling a family
        takes a few. A prestarted engine
        (IsolatedEngine.prestart) runs this in the background, so that no family's sampling
        waits for it. One batch, one request per sampling feature the engine honours (the
        features alone and all together, seeded and not), 3 tokens each; its samples are not
        used. The reset leaves the engine as a fresh start does (a swap resets it again)."""
        from specfuzz.engines import sglang_swap as sw
        from specfuzz.oracle.params import SamplingParams

        self._require_sampling_ready()
        assert self._config is not None and self._vocab_size is not None
        t0 = time.perf_counter()
        V = int(self._vocab_size)
        caps = self.capabilities()
        honoured = caps.honoured(self._spec is not None)
        one: dict[str, Any] = {
            "repetition_penalty": 1.3, "frequency_penalty": 0.5, "presence_penalty": 0.5, "min_p": 0.05,
            "top_k": 2, "top_p": 0.9, "logit_bias": {0: 1.0}, "stop_token_ids": (V - 1,),
        }
        one = {k: v for k, v in one.items() if k in honoured}
        variants = [SamplingParams(max_tokens=3)] + [SamplingParams(max_tokens=3, **{k: v}) for k, v in one.items()]
        variants.append(SamplingParams(max_tokens=3, **one))
        variants.append(SamplingParams(max_tokens=3, temperature=0.0))
        requests = [Request(prompt=(i % V, (i + 1) % V), params=p, seed=seed)
                    for i, p in enumerate(variants) for seed in (None, 1234 + i)]
        kept: list[Request] = []
        for r in requests:
            try:
                self.sampling_params(r)
            except InvalidInput:
                continue  # a combination this engine refuses: not warmed up
            kept.append(r)
        self.generate(kept)
        reset = sw.flush(self._engine)
        if not reset:
            raise RuntimeError("SGLang did not reset its prefix cache and n-gram trie after the warm-up")
        return {"seconds": round(time.perf_counter() - t0, 3), "requests": len(kept), "reset": reset}

    def resolved_speculation(self) -> dict[str, Any]:
        """The speculation settings SGLang resolved for the running engine (``ServerArgs``
        after its own defaults and derivations), for the keys of :data:`SGLANG_DEFAULTS`."""
        self._require_started()
        keys = sorted({k for d in SGLANG_DEFAULTS.values() for k in d} | {"speculative_algorithm", "speculative_use_rejection_sampling"})
        return {k: getattr(self._server_args, k, None) for k in keys}

    # -- table swaps ---------------------------------------------------------------------

    def _swap_allowed(self) -> frozenset[str]:
        return _swap_setting(self._settings if self._config is not None else self._default_settings)
