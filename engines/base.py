"""The engine interface: what specfuzz asks of every engine it drives.

An engine is started on one :class:`EngineConfig` (the case's checkpoints, dtype,
speculation settings and engine knobs) and then answers batches of :class:`Request` s
with one :class:`Completion` each. Starting is expensive, so the fuzz loop reuses a
started engine for every case that shares its config.

Third-party engines plug in as ``--engine package.module:Class``: the class must
implement :class:`Engine` (subclassing it is optional). specfuzz never imports an engine
it does not run.
"""

from __future__ import annotations

import abc
import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from specfuzz.errors import InvalidInput
from specfuzz.oracle.params import SamplingParams
from specfuzz.oracle.speculative import SpecConfig

@dataclass(frozen=True)
class EngineConfig:
    """Everything that needs an engine (re)start; two equal configs share an engine."""

    target_dir: Path
    draft_dir: Path | None = None
    speculation: SpecConfig | None = None  # None: speculation off; adapters map it to their knobs
    dtype: str = "float32"
    max_model_len: int = 64
    settings: Mapping[str, Any] = field(default_factory=dict)  # engine knobs (attention backend, eager, ...)
    # The draft's true width and id map when its checkpoint is padded to a square table
    # (a reduced draft vocabulary): what an EAGLE-3 style drafter would carry.
    draft_vocab_size: int | None = None
    draft_d2t: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Request:
    prompt: tuple[int, ...]
    params: SamplingParams
    seed: int | None = None  # per-request seed; None: the engine's own randomness


@dataclass(frozen=True)
class Completion:
    token_ids: tuple[int, ...]
    finish_reason: str  # "stop", "length", or the engine's own word
    num_draft_tokens: int | None = None  # acceptance statistics, where the engine exposes them
    num_accepted_tokens: int | None = None


@dataclass(frozen=True)
class Capabilities:
    """What an engine can run; strategies draw only from this."""

    methods: tuple[str, ...]  # speculation methods (besides off)
    sampling: frozenset[str]  # names of SamplingParams fields the engine honours
    dtypes: tuple[str, ...] = ("float32",)
    profile: str = "vllm"  # semantics profile of its non-speculative sampler
    max_vocab: int | None = None
    draft_vocab: str = "equal"  # "equal", "narrower", "any": which draft widths it accepts
    # Speculation knobs the engine accepts, by SpecConfig field: e.g. {"verify": ("token",),
    # "draft_sampling": ("sampled",), "ngram_min": (1,)}. A field not named is unrestricted.
    spec_knobs: Mapping[str, tuple] = field(default_factory=dict)
    # Whether start() may be called again in the same process with a new config. When
    # False, the isolation layer starts a fresh process for every new config.
    restart_in_process: bool = True
    # SamplingParams fields honoured while speculating, when fewer than ``sampling``.
    sampling_with_speculation: frozenset[str] | None = None
    # Whether drafts are proposed for the first output token. Engines that sample it in
    # the prefill step (vLLM, SGLang) speculate from the second token on, so strategies
    # give their speculative cases max_tokens >= 2.
    speculates_first_token: bool = True
    # The smallest target vocabulary each speculation method starts on, where an engine
    # has a floor above 2 (vLLM's Model Runner V2: its sampler warmup asks for top-5
    # logprobs). Strategies draw only vocabularies a case's method can start on.
    min_vocab: Mapping[str, int] = field(default_factory=dict)
    # What a started engine can load in place instead of restarting (a *swap*): a subset
    # of SWAP_PARTS. "target": the target checkpoint's weights; "draft": a draft model's;
    # "head": an EAGLE/EAGLE-3 head's. Empty: every new table needs a fresh start. An
    # engine that swaps implements swap() and check_tables() (see Engine).
    swap: frozenset[str] = frozenset()
    # The configuration each speculation method runs at when a user turns it on with only
    # the knobs the engine requires, as SpecConfig fields (method -> {field: value}); the
    # strategies draw it as the named variant "engine default" (SpecConfig.engine_default),
    # which the adapter sends with none of those knobs pinned.
    spec_defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # The most prompt tokens a campaign puts into one generate call of seeded requests
    # (None: no limit): an engine that crashes when its scheduler splits a seeded prompt
    # over several steps (chunked prefill; vLLM's CPU build, corpus crash-8364f7220f732b16)
    # gets its batches in several calls, so that a campaign tests long prompts there instead
    # of meeting that known crash again. Recorded in every entry found so
    # (extra.call_prompt_tokens); replays of an entry split as it was run.
    seeded_call_prompt_tokens: int | None = None
    # Pairs of SamplingParams fields the engine does not take together in one request (SGLang:
    # ignore_eos also switches stop_token_ids off, so the adapter refuses the two together):
    # strategies draw at most one of each pair per request (a refused request costs a
    # Hypothesis example).
    sampling_exclusive: tuple[frozenset[str], ...] = ()
    # The engine's implementation each speculation method runs through (method -> a name; a
    # method not named is its own): methods that share one verify and emit the same way, so a
    # stored finding of one is checked against candidates of the others (Campaign._known_finding,
    # with the same symptom required). SGLang 0.5.17 runs STANDALONE, EAGLE and EAGLE3 through
    # one worker (StandaloneWorkerV2 subclasses EAGLEWorkerV2), so a bug stored under one of
    # them is recognised under the others instead of being confirmed, shrunk and stored again.
    spec_paths: Mapping[str, str] = field(default_factory=dict)
    # The code that applies the request's sampling parameters to the target's probabilities when
    # drafts are verified, per method (method -> a name; a method not named has its own), and the
    # SamplingParams fields it applies (or would have to): a stored finding whose sampling
    # features are all among them, one at least, is checked against candidates of every method
    # verified by the same code, whatever implementation drafts and emits for it (the symptom
    # still has to match). SGLang 0.5.17 verifies every method's drafts with one function
    # (eagle_sample, called by EAGLEWorkerV2 and NGRAMWorker), which applies no min_p: its
    # min_p failure is one bug under every method (finding-4074).
    verify_samplers: Mapping[str, str] = field(default_factory=dict)
    verify_sampler_features: frozenset[str] = frozenset()

    def path_of(self, method: str) -> str:
        """The engine implementation ``method`` runs through (:attr:`spec_paths`)."""
        return self.spec_paths.get(method, method)

    def shared_code(self, method: str, other: str, features: Sequence[str]) -> str | None:
        """What ``method`` and ``other`` share that a stored finding of ``other`` with sampling
        ``features`` could be a bug of: their implementation (:attr:`spec_paths`), else, where
        every feature (one at least) is one the verifier's sampler applies, that sampler
        (:attr:`verify_samplers`); None: nothing."""
        if self.path_of(method) == self.path_of(other):
            return self.path_of(method)
        sampler = self.verify_samplers.get(method, method)
        feats = set(features)
        if feats and feats <= self.verify_sampler_features and sampler == self.verify_samplers.get(other, other):
            return f"verify sampler {sampler}"
        return None

    def honoured(self, speculation: bool) -> frozenset[str]:
        """The SamplingParams fields the engine honours, with speculation on or off."""
        if speculation and self.sampling_with_speculation is not None:
            return self.sampling_with_speculation
        return self.sampling


# The parts of a started engine a swap can replace (Capabilities.swap).
SWAP_PARTS: tuple[str, ...] = ("target", "draft", "head")
# Checkpoint files that hold the tables themselves; every other file of a checkpoint
# folder (config.json, generation_config.json, tokenizer files) must be equal for a swap.
TABLE_FILES: frozenset[str] = frozenset({"model.safetensors", "specfuzz_table.json"})


@dataclass(frozen=True)
class SwapReport:
    """What :meth:`Engine.swap` did."""

    seconds: float
    parts: tuple[str, ...] = ()  # what was loaded: "target", "draft", "head"
    reset: tuple[str, ...] = ()  # engine state reset at the swap ("prefix cache", "ngram trie", ...)
    kept: tuple[str, ...] = ()  # engine state that outlived it (recorded with the family)


@dataclass(frozen=True)
class TableCheck:
    """What :meth:`Engine.check_tables` found: the running engine's own next-token
    logits (or log-probabilities) for every row of its target table, against the table."""

    ok: bool
    rows: int  # table rows compared
    max_abs_diff: float
    tolerance: float  # 0: bit for bit
    detail: str = ""  # how the values were read; the first mismatches when not ok

    def to_json(self) -> dict:
        return {"ok": self.ok, "rows": self.rows, "max_abs_diff": self.max_abs_diff,
                "tolerance": self.tolerance, "detail": self.detail}


class SwapUnsupported(Exception):
    """An engine cannot swap to this config now (the caller starts it fresh instead)."""


def _checkpoint_shape_digest(path: Path | None, h) -> None:
    if path is None:
        h.update(b"<none>")
        return
    path = Path(path)
    for f in sorted(path.iterdir()) if path.is_dir() else ():
        if f.is_file() and f.name not in TABLE_FILES:
            h.update(f.name.encode())
            h.update(f.read_bytes())


def swap_key(config: EngineConfig) -> str:
    """What must be equal between two configs for one started engine to serve both by a
    swap: every EngineConfig field but the checkpoint folders, and every file of those
    folders but the weights (so vocabulary, EOS, architecture and tokenizer are equal)."""
    import hashlib

    h = hashlib.sha256()
    rest = {k: getattr(config, k) for k in config.__dataclass_fields__ if k not in ("target_dir", "draft_dir")}
    h.update(json.dumps(rest, sort_keys=True, default=repr).encode())
    _checkpoint_shape_digest(config.target_dir, h)
    _checkpoint_shape_digest(config.draft_dir, h)
    return h.hexdigest()[:20]


def _draft_part(config: EngineConfig) -> str:
    """The swap part (SWAP_PARTS) that holds ``config``'s draft checkpoint."""
    spec = config.speculation
    return "head" if spec is not None and spec.method in ("eagle", "eagle3") else "draft"


def swap_parts(old: EngineConfig, new: EngineConfig) -> tuple[str, ...]:
    """The parts a swap from ``old`` to ``new`` must load (see SWAP_PARTS)."""
    parts = []
    if Path(old.target_dir) != Path(new.target_dir):
        parts.append("target")
    if old.draft_dir != new.draft_dir:
        parts.append(_draft_part(new))
    return tuple(parts)


def table_parts(config: EngineConfig) -> tuple[str, ...]:
    """Every part holding one of ``config``'s tables: what a swap into it from other tables loads."""
    return ("target",) + ((_draft_part(config),) if config.speculation is not None and config.draft_dir is not None else ())


class Engine(abc.ABC):
    """Base class for engines (optional for third parties: duck typing is enough)."""

    name: str = "engine"

    @abc.abstractmethod
    def capabilities(self) -> Capabilities: ...

    @abc.abstractmethod
    def version(self) -> Mapping[str, str]:
        """Engine name, version, and the software/hardware it runs on (torch, device, ...)."""

    @abc.abstractmethod
    def start(self, config: EngineConfig) -> None:
        """Load the checkpoints; raise InvalidInput for a config this engine cannot run.

        May be called again with another config on the same instance: release the
        previous model first.
        """

    @abc.abstractmethod
    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        """One completion per request, in order."""

    # Optional, for engines whose Capabilities.swap is not empty:
    #
    # def swap(self, config: EngineConfig) -> SwapReport:
    #     """Load ``config``'s checkpoints into the running engine in place (called only when
    #     swap_key(config) equals the running config's and every part in swap_parts() is in
    #     Capabilities.swap), reset the engine state that outlives it where the engine allows
    #     (prefix cache, n-gram trie) and say what was kept. Raise SwapUnsupported when it
    #     cannot; the caller then starts the engine fresh."""
    #
    # def check_tables(self) -> TableCheck:
    #     """The running engine's own logits for every row of its target table, against the
    #     table. Called after every swap before any sample is taken: a failed check means a
    #     fresh start, never a finding about speculation."""
    #
    # Optional, for engines with state that outlives a request and changes what gets drafted
    # (the prefix cache; SGLang's n-gram trie, shared by all requests):
    #
    # def reset_state(self) -> tuple[str, ...]:
    #     """Reset that state in the running engine, tables unchanged, and say what was reset
    #     (() where nothing could be). A campaign calls it before it runs a candidate again on
    #     the running engine (a stored finding met again), so that the run starts from the
    #     state the candidate's own run started from (a swap's or a start's)."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free the engine's resources."""

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _cpu_model() -> str:
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_details() -> dict[str, str]:
    """Device, driver, CUDA runtime and compute capability, for every corpus entry."""
    import torch

    if not torch.cuda.is_available():
        return {"device": f"cpu {_cpu_model()}"}
    out = {
        "device": f"cuda {torch.cuda.get_device_name(0)}",
        "cuda_runtime": str(torch.version.cuda),
        "compute_capability": ".".join(str(x) for x in torch.cuda.get_device_capability(0)),
        "gpu_memory_gib": f"{torch.cuda.get_device_properties(0).total_memory / 2**30:.1f}",
    }
    try:
        import subprocess

        drv = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10,
        ).stdout.strip().splitlines()
        if drv:
            out["driver"] = drv[0].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return out


@contextlib.contextmanager
def environ(values: Mapping[str, str]) -> Iterator[None]:
    """Set environment variables for the duration of the block, then restore them."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update({k: str(v) for k, v in values.items()})
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def read_config(path: Path | str, name: str) -> dict:
    """A checkpoint's config.json (InvalidInput naming ``name`` when missing or unreadable)."""
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        raise InvalidInput(name, str(path), "a checkpoint folder containing config.json")
    try:
        return json.loads(cfg.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise InvalidInput(name, str(path), f"a checkpoint folder with a readable config.json ({exc})") from None


def refuse_unsupported(params: SamplingParams, unsupported: Mapping[str, object], engine: str, vocab_size: int) -> None:
    """Raise InvalidInput for the first field of ``unsupported`` (name -> its off value) that
    ``params`` sets, naming ``engine``, or for a token id outside ``[0, vocab_size)``."""
    for name, off in unsupported.items():
        value = getattr(params, name)
        if value != off:
            raise InvalidInput(name, value, f"{off!r} (off): {engine} has no {name}")
    params.check_vocab(vocab_size)


def check_speculation(spec: object, methods: Sequence[str], engine: str) -> None:
    """Raise InvalidInput unless ``spec`` is a SpecConfig of one of ``methods`` with K >= 1
    (``engine``: what the engine's methods are, for the message)."""
    if not isinstance(spec, SpecConfig):
        raise InvalidInput("speculation", type(spec).__name__, "None or a SpecConfig")
    if spec.method not in methods:
        raise InvalidInput("speculation method", spec.method, f"one of {tuple(methods)} ({engine})")
    K = spec.num_speculative_tokens
    if isinstance(K, bool) or not isinstance(K, int) or K < 1:
        raise InvalidInput("num_speculative_tokens", K, "an integer >= 1")


def merged_settings(table: Mapping[str, tuple[Any, str]], *layers: Mapping[str, Any],
                    passthrough: Sequence[str] = ()) -> dict[str, Any]:
    """An adapter's engine settings: ``table``'s defaults (name -> (default, what is allowed)),
    overridden by each of ``layers`` in turn; a name outside ``table`` and ``passthrough`` is
    InvalidInput naming it (passthrough names are accepted and left out)."""
    out = {k: v[0] for k, v in table.items()}
    for layer in layers:
        for k, v in dict(layer).items():
            if k in passthrough:
                continue
            if k not in table:
                raise InvalidInput("setting", k, f"one of {sorted(table) + list(passthrough)}")
            out[k] = v
    return out


def first_line(exc: BaseException) -> str:
    """An exception's first message line (at most 500 characters), or its type's name."""
    lines = str(exc).strip().splitlines()
    return lines[0][:500] if lines else type(exc).__name__
