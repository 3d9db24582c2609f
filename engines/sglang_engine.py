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
``mem_fraction_static=0.15``, ``max_total_tokens=65536``, ``skip_tokenizer_init=True``,
``log_level="error"``; ``context_length`` is ``EngineConfig.max_model_len`` and ``dtype``
``EngineConfig.dtype``. Every other key goes to ``sglang.Engine`` as is, after a run-time
check against ``dataclasses.fields(ServerArgs)``: a key this SGLang version lacks is an
:class:`~specfuzz.errors.InvalidInput` naming it (an adapter default that a newer SGLang
dropped is left out instead). Adapter-only keys: ``shutdown_timeout_s`` (default 10),
``env`` (environment variables set while the engine starts; its processes inherit them).
``random_seed`` (the scheduler's ``torch.manual_seed``): a fresh random value per start
unless given, because per-request seeds are ignored by default (below): a fixed engine
seed would replay the same random stream on every start, and "fresh" confirmation
samples on a new engine would repeat the old ones. Only ``bfloat16`` and ``float16``:
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

Speculation (``SpecConfig`` -> ``ServerArgs``)
----------------------------------------------
* ``ngram`` / ``ngram_tree`` -> ``speculative_algorithm="NGRAM"`` (``speculative/ngram_worker.py``,
  C++ ``kernels/jit/csrc/ngram_corpus``). The drafter is a *trie shared by all requests*
  (``Trie::insert``: every suffix, up to ``speculative_ngram_max_trie_depth`` tokens, of
  the last ``max_trie_depth`` tokens of each request's prompt + output, inserted after
  every verify step and kept across requests and batches). ``Trie::buildRecency`` (match
  type "BFS") matches every suffix of the context from length 1 up to the trie depth,
  longest first, and grows one draft tree breadth-first from the matches: at most
  ``breadth`` children per node (most recent first), breadth falling from ``max_bfs_breadth``
  to ``min_bfs_breadth`` with match depth, until ``speculative_num_draft_tokens - 1``
  nodes. ``fillResult`` puts the last verified token at the root (it counts as one of the
  ``speculative_num_draft_tokens``) and pads unused slots with token 0 as *children of
  the root* (the N4 mechanism). Mapping: ``num_draft_tokens = K + 1`` (chain) or
  ``tree_budget + 1`` (tree); ``min = max bfs breadth = 1`` (chain) or ``tree_topk``;
  ``max_trie_depth = ngram_max + K`` (no exact equivalent: SGLang has no minimum or
  maximum match length and bounds drafts by node count, not depth, so ``ngram_min`` must
  be 1 and a "chain" may branch at the root when several suffixes match);
  ``speculative_num_steps = max(1, num_draft_tokens // breadth)`` (SGLang's own
  derivation, ``_handle_ngram``, kept >= 1). Not modelled, left to settings:
  ``speculative_ngram_min_bfs_breadth``, ``_match_type`` ("PROB"), ``_capacity``,
  ``_max_trie_depth``, external corpora.
* ``draft_model`` / ``eagle_tree`` -> ``speculative_algorithm="STANDALONE"`` with
  ``speculative_draft_model_path=draft_dir`` (``standalone_worker_v2.py``, drafting in
  ``EagleDraftWorker.draft_forward``, ``eagle_worker_v2.py``). The drafter is
  deterministic: top-k of ``softmax(draft logits)`` (``fast_topk``; argmax when topk=1;
  the request temperature is not applied, ``spec_utils.renorm_draft_probs``), the tree
  kept as a beam of ``topk`` nodes per step (``select_top_k_tokens``) and the best
  ``num_draft_tokens - 1`` candidates by cumulative draft probability
  (``organize_draft_results``). So ``draft_sampling`` must be "greedy" (SGLang samples a
  draft only with ``speculative_use_rejection_sampling``, EAGLE/EAGLE3 with topk=1).
  Mapping: ``speculative_num_steps = K``, ``speculative_eagle_topk = tree_topk`` (1 for a
  chain), ``speculative_num_draft_tokens = K + 1`` for chains (SGLang forces it when
  topk=1) and ``min(tree_budget, topk + (K-1) * topk**2) + 1`` for trees (the candidate
  count ``organize_draft_results`` picks from); a topk-1 "tree" is a chain of
  ``min(K, tree_budget)``. ``STANDALONE`` requires the draft's vocab_size to equal the
  target's (``StandaloneWorkerV2._validate_vocab_compatibility``): specfuzz writes a
  narrower draft padded with masked columns, so ``draft_vocab="narrower"``; wider
  drafts are refused.
* Verification (``eagle_utils.eagle_sample``, NGRAM and STANDALONE alike): when every
  request of the batch is greedy, ``verify_tree_greedy_func`` on the target argmax;
  otherwise ``sgl_kernel.tree_speculative_sampling_target_only`` with all-zero draft
  probabilities, i.e. the deterministic-tree scheme (one uniform per level against the
  cumulative target mass of the children, residual = target restricted to non-children;
  ``speculative_accept_threshold_single/acc`` = 1 by default) on ``softmax(l / T)``
  followed by ``top_k_renorm_prob`` then ``top_p_renorm_prob`` (top-p on the top-k
  renormalised distribution, unlike the non-speculative sampler). Token-wise only:
  ``verify`` must be "token". Seen in the source and left for the fuzzer to confirm:
  ``min_p`` is not applied in verification at all; penalties and min_new_tokens are a
  "relaxed version" (``eagle_prepare_for_decode``: one penalty update per verify round
  with the round's last token, the same penalty for every draft position, and the
  min_new_tokens counter counting rounds). SGLang refuses none of these, so
  ``sampling_with_speculation`` equals ``sampling``.
* ``eagle`` / ``eagle3`` -> ``EAGLE`` / ``EAGLE3`` chains (``models/llama_eagle.py``,
  ``llama_eagle3.py``; topk 1, ``speculative_num_steps = K``, ``num_draft_tokens = K + 1``).
  ``EngineConfig.draft_dir`` is a head written by :mod:`specfuzz.tablegen.eagle`; the
  adapter hands SGLang its SGLang-layout twin (:func:`~specfuzz.tablegen.eagle.sglang_head`:
  architecture names, a zero ``fc.bias``). The head drafts from exactly its table's row of
  the current token, whatever hidden states SGLang feeds it (checked with greedy runs:
  ``bench/check_heads.py``). ``draft_sampling="greedy"`` is SGLang's default drafter
  (argmax); ``"sampled"`` sets ``speculative_use_rejection_sampling=True`` (draft
  ``q = softmax(l / T_request)``, ``spec_utils.sample_draft_proposal``), which SGLang refuses
  for a reduced EAGLE-3 vocabulary ("requires the draft and target to share one vocab",
  ``EagleWorkerV2.__init__``): refused here with that reason.
* Acceptance statistics per request from ``meta_info``: ``spec_num_proposed_drafts``
  (``spec_verify_ct * (num_draft_tokens - 1)``, padding included) and
  ``spec_num_correct_drafts`` (``TokenizerManager._calculate_spec_decoding_metrics``).

Sampling parameters (``sampling/sampling_params.py``; profile "sglang" in
:mod:`specfuzz.oracle.semantics`)
---------------------------------------------------------------------------------
temperature (ours ``< 1e-5`` is sent as 0; SGLang turns ``< 1e-6`` into ``top_k=1``),
top_k (``-1`` = off), top_p, min_p, repetition_penalty (SGLang accepts (0, 2]),
frequency/presence_penalty, max_new_tokens, stop_token_ids, ignore_eos, logit_bias (a
dict ``str(token) -> bias``). ``min_new_tokens`` needs the tokenizer
(``raise_if_tokenizer_required``): only with ``settings={"skip_tokenizer_init": False}``.
Not available: allowed_token_ids, bad_words, thinking budgets (no per-request equivalent
without a custom logit processor), regex / choice (the grammar backend needs a real
tokenizer). ``ignore_eos`` also disables ``stop_token_ids`` (``Req._check_token_based_finish``
returns early), which the oracle's stopping rule cannot express: the combination is
refused. Outputs: ``output_ids`` already end with the matched stop token
(``Req.output_ids_through_stop``); ``meta_info["finish_reason"]`` is ``{"type": "stop",
"matched": id}`` or ``{"type": "length", ...}``; an "abort" raises.

Penalties under SGLang's default overlap scheduler: ``ScheduleBatch.prepare_for_decode``
feeds the penalizers from ``req.output_ids`` before the previous step's result has been
processed (``Scheduler.event_loop_overlap``), so the first decode step penalises the last
prompt token and later steps miss the newest output token. The "sglang" profile models
the documented semantics; expect the calibration's "penalties" setting to show it
(``settings={"disable_overlap_schedule": True}`` takes the synchronous loop).

Per-request seeds: ``Request.seed`` is sent as ``sampling_seed``, which SGLang honours only
with ``enable_deterministic_inference=True`` (``SamplingBatchInfo.from_schedule_batch``;
otherwise the scheduler's global torch RNG samples). In that mode an unseeded request
gets seed 42, and ``min_p`` crashes the pytorch sampler (an ``assert sampling_seed is
None`` in ``top_k_top_p_min_p_sampling_from_probs_torch``), so min_p is refused there.

Calibration: :meth:`SGLangEngine.logits_match_table` asks SGLang for its own logprobs
(``return_logprob=True``, ``logprob_start_len=0``, ``top_logprobs_num=V``): prompt
positions from ``log_softmax`` of the float32 logits, sampled positions from
``log(softmax(l / 1))`` of the sampler, compared with the float64 log-softmax of the
table the checkpoint holds.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import threading
import time
import weakref
from pathlib import Path
from typing import Any, Mapping, Sequence

from specfuzz.engines.base import (
    Capabilities, Completion, Engine, EngineConfig, Request, environ, first_line, gpu_details, read_config,
)
from specfuzz.engines.vllm_engine import LogitsReport
from specfuzz.errors import InvalidInput
from specfuzz.oracle.params import SamplingParams
from specfuzz.oracle.speculative import ENGINE_METHODS, SpecConfig

# Speculation methods this adapter maps onto SGLang (and for which specfuzz writes checkpoints).
METHODS: tuple[str, ...] = ("draft_model", "ngram", "eagle_tree", "ngram_tree")
# EAGLE heads (EngineConfig.draft_dir is a tablegen.eagle head; SGLang gets its
# SGLang-layout twin, tablegen.eagle.sglang_head).
HEAD_METHODS: tuple[str, ...] = ("eagle", "eagle3")
# A switch for a SGLang whose EAGLE loaders stop matching the heads (the check is
# bench/check_heads.py --engine sglang): False refuses eagle/eagle3 with the reason.
HEADS_ENABLED = True
ALGORITHMS: dict[str, str] = {
    "ngram": "NGRAM", "ngram_tree": "NGRAM",
    "draft_model": "STANDALONE", "eagle_tree": "STANDALONE",
    "eagle": "EAGLE", "eagle3": "EAGLE3",
}
# SamplingParams fields SGLang honours with speculation off and no tokenizer.
SAMPLING_FIELDS: frozenset[str] = frozenset(
    {
        "temperature", "top_k", "top_p", "min_p", "logit_bias", "repetition_penalty", "frequency_penalty",
        "presence_penalty", "max_tokens", "stop_token_ids", "ignore_eos",
    }
)
# Need the tokenizer (skip_tokenizer_init=False).
NEED_TOKENIZER: frozenset[str] = frozenset({"min_tokens"})
# Crash SGLang's pytorch sampler under enable_deterministic_inference.
NOT_WITH_DETERMINISTIC: frozenset[str] = frozenset({"min_p"})
DTYPES: tuple[str, ...] = ("bfloat16", "float16")
# SGLang's SamplingParams.verify accepts repetition penalties in (0, MAX_REPETITION_PENALTY].
MAX_REPETITION_PENALTY = 2.0
# sampling_seed travels as int64 and is hashed as uint64.
MAX_SEED = 2**63 - 1

SETTINGS_ENV = "SPECFUZZ_SGLANG_SETTINGS"
# Adapter defaults (what ran on the H200, ../shared/gpu/README.md).
DEFAULT_SETTINGS: dict[str, Any] = {
    "attention_backend": "triton",
    "sampling_backend": "pytorch",
    "disable_cuda_graph": True,
    "mem_fraction_static": 0.15,
    "max_total_tokens": 65536,
    "skip_tokenizer_init": True,
    "log_level": "error",
}
# Settings the adapter consumes itself (everything else goes to sglang.Engine).
_OWN_SETTINGS = ("shutdown_timeout_s", "env")
# ServerArgs fields the speculation mapping sets; settings may not override them.
MAPPED_SPEC_KEYS = frozenset(
    {
        "speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps", "speculative_eagle_topk",
        "speculative_num_draft_tokens", "speculative_ngram_max_bfs_breadth", "speculative_use_rejection_sampling",
    }
)
DEFAULT_SHUTDOWN_TIMEOUT_S = 10.0
# log(smallest normal float32): below it a float32 probability has lost its precision
# (or underflowed to 0, so log gives -inf).
FLOAT32_LOG_TINY = -87.3
DEFAULT_LOGPROB_TOLERANCE = 1e-5


# ----------------------------------------------------------------------------- pure mapping


def speculative_kwargs(spec: SpecConfig | None, *, draft_dir: Path | None = None, target_vocab: int | None = None,
                       draft_vocab: int | None = None) -> dict[str, Any]:
    """The ``ServerArgs`` speculation fields for ``spec`` (``{}`` when off); see the module docstring.

    Pure: reads nothing. Raises InvalidInput for what SGLang cannot run as specified.
    """
    if spec is None:
        return {}
    if not isinstance(spec, SpecConfig):
        raise InvalidInput("speculation", spec, "None or a SpecConfig")
    if spec.method in HEAD_METHODS and not HEADS_ENABLED:
        raise InvalidInput(
            "speculation.method", spec.method,
            f"one of {METHODS}: the SGLang adapter's EAGLE heads are switched off (HEADS_ENABLED)",
        )
    if spec.method not in METHODS + (HEAD_METHODS if HEADS_ENABLED else ()):
        raise InvalidInput("speculation.method", spec.method, f"one of {METHODS} (the SGLang adapter maps these; of {ENGINE_METHODS})")
    if spec.inject is not None:
        raise InvalidInput("speculation.inject", spec.inject, "None (bugs are injected into the reference sampler only, not into SGLang)")
    if spec.verify != "token":
        raise InvalidInput("speculation.verify", spec.verify, "'token' (SGLang verifies token-wise: eagle_utils.eagle_sample)")
    K = int(spec.num_speculative_tokens)
    algo = ALGORITHMS[spec.method]
    if algo == "NGRAM":
        if spec.ngram_min != 1:
            raise InvalidInput(
                "speculation.ngram_min", spec.ngram_min,
                "1 (SGLang's NGRAM trie matches every suffix length from 1 up to speculative_ngram_max_trie_depth)",
            )
        breadth = 1 if spec.method == "ngram" else int(spec.tree_topk)
        nodes = K if spec.method == "ngram" else int(spec.tree_budget)
        return {
            "speculative_algorithm": algo,
            "speculative_num_draft_tokens": nodes + 1,
            "speculative_ngram_min_bfs_breadth": breadth,
            "speculative_ngram_max_bfs_breadth": breadth,
            "speculative_ngram_max_trie_depth": int(spec.ngram_max) + K,
            "speculative_num_steps": max(1, (nodes + 1) // breadth),
        }
    if algo in ("EAGLE", "EAGLE3"):
        # A chain from an EAGLE head (the draft vocabulary is the head's: no equality check).
        # SGLang samples the draft (and verifies against q) only with rejection sampling, topk=1.
        if spec.draft_temperature is not None:
            raise InvalidInput("speculation.draft_temperature", spec.draft_temperature, "None (SGLang scales the draft by the request's temperature)")
        if draft_dir is None:
            raise InvalidInput("draft_dir", None, f"an EAGLE head checkpoint folder for method {spec.method!r}")
        if spec.draft_sampling == "sampled" and None not in (draft_vocab, target_vocab) and draft_vocab != target_vocab:
            raise InvalidInput(
                "speculation.draft_sampling", spec.draft_sampling,
                f"'greedy' for a reduced draft vocabulary ({draft_vocab} of {target_vocab}): SGLang's rejection sampling "
                "'requires the draft and target to share one vocab' (EagleWorkerV2)",
            )
        return {
            "speculative_algorithm": algo,
            "speculative_draft_model_path": str(draft_dir),
            "speculative_num_steps": K,
            "speculative_eagle_topk": 1,
            "speculative_num_draft_tokens": K + 1,
            "speculative_use_rejection_sampling": spec.draft_sampling == "sampled",
        }
    # STANDALONE: a draft checkpoint proposing top-k deterministically.
    if spec.draft_sampling != "greedy":
        raise InvalidInput(
            "speculation.draft_sampling", spec.draft_sampling,
            "'greedy' (SGLang's STANDALONE drafter proposes the top-k of the draft distribution: "
            "EagleDraftWorker.draft_forward, fast_topk)",
        )
    if spec.draft_temperature is not None:
        raise InvalidInput("speculation.draft_temperature", spec.draft_temperature, "None (SGLang's drafter ranks softmax(draft logits))")
    if draft_dir is None:
        raise InvalidInput("draft_dir", None, f"a draft checkpoint folder for method {spec.method!r}")
    if target_vocab is not None and draft_vocab != target_vocab:
        raise InvalidInput(
            "draft vocab_size", draft_vocab,
            f"equal to the target's vocab_size={target_vocab}: SGLang's STANDALONE needs equal vocabulary sizes "
            "(write a narrower draft padded with masked columns)",
        )
    if spec.method == "draft_model" or spec.tree_topk == 1:
        steps = K if spec.method == "draft_model" else min(K, int(spec.tree_budget))
        topk, nodes = 1, steps
    else:
        topk, steps = int(spec.tree_topk), K
        if target_vocab is not None and topk > target_vocab:
            raise InvalidInput(
                "speculation.tree_topk", topk,
                f"at most the vocab_size={target_vocab} (SGLang's drafter takes torch.topk of the draft distribution)",
            )
        nodes = min(int(spec.tree_budget), topk + (K - 1) * topk * topk)
    return {
        "speculative_algorithm": algo,
        "speculative_draft_model_path": str(draft_dir),
        "speculative_num_steps": steps,
        "speculative_eagle_topk": topk,
        "speculative_num_draft_tokens": nodes + 1,
    }


def sampling_params_dict(
    request: Request, *, vocab_size: int, max_model_len: int, tokenizer: bool = False, deterministic: bool = False,
) -> dict[str, Any]:
    """The SGLang sampling-params dict for one request (validated; raises InvalidInput). Pure."""
    p: SamplingParams = request.params
    V = vocab_size
    if not request.prompt or any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < V for t in request.prompt):
        raise InvalidInput("prompt", request.prompt, f"a non-empty sequence of token ids in [0, {V})")
    if len(request.prompt) + p.max_tokens > max_model_len:
        raise InvalidInput(
            "max_tokens", p.max_tokens,
            f"at most max_model_len - len(prompt) = {max_model_len - len(request.prompt)} (SGLang's context_length)",
        )
    p.check_vocab(V)
    if p.allowed_token_ids is not None:
        raise InvalidInput("allowed_token_ids", p.allowed_token_ids, "None (SGLang has no allowed-token list)")
    if p.bad_words:
        raise InvalidInput("bad_words", p.bad_words, "() (SGLang has no bad-words option)")
    if p.thinking_budget is not None:
        raise InvalidInput("thinking_budget", p.thinking_budget, "None (the SGLang adapter does not run thinking budgets)")
    if p.regex is not None or p.choice is not None:
        name = "regex" if p.regex is not None else "choice"
        raise InvalidInput(name, getattr(p, name), "None (SGLang's grammar backend needs a real tokenizer)")
    if p.min_tokens and not tokenizer:
        raise InvalidInput(
            "min_tokens", p.min_tokens,
            "0 when SGLang runs without a tokenizer (skip_tokenizer_init=True: SamplingParams.normalize raises); "
            "start it with settings={'skip_tokenizer_init': False}",
        )
    if p.min_p > 0.0 and deterministic:
        raise InvalidInput(
            "min_p", p.min_p,
            "0 with enable_deterministic_inference (SGLang's pytorch sampler asserts sampling_seed is None under min_p)",
        )
    if p.ignore_eos and p.stop_token_ids:
        raise InvalidInput(
            "ignore_eos", True,
            "False when stop_token_ids are set (SGLang's ignore_eos also disables stop_token_ids: Req._check_token_based_finish)",
        )
    if p.repetition_penalty > MAX_REPETITION_PENALTY:
        raise InvalidInput("repetition_penalty", p.repetition_penalty, f"in (0, {MAX_REPETITION_PENALTY:g}] (SamplingParams.verify)")
    seed = request.seed
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED):
        raise InvalidInput("seed", seed, f"None or an integer in [0, {MAX_SEED}]")
    d: dict[str, Any] = {
        "max_new_tokens": int(p.max_tokens),
        "temperature": 0.0 if p.greedy else float(p.temperature),
        "top_k": int(p.top_k) if p.top_k >= 1 else -1,
        "top_p": float(p.top_p),
        "min_p": float(p.min_p),
        "repetition_penalty": float(p.repetition_penalty),
        "frequency_penalty": float(p.frequency_penalty),
        "presence_penalty": float(p.presence_penalty),
        "min_new_tokens": int(p.min_tokens),
        "ignore_eos": bool(p.ignore_eos),
    }
    if p.stop_token_ids:
        d["stop_token_ids"] = sorted({int(t) for t in p.stop_token_ids})
    if p.logit_bias:
        d["logit_bias"] = {str(int(k)): float(v) for k, v in dict(p.logit_bias).items()}
    if seed is not None:
        d["sampling_seed"] = int(seed)
    return d


def completion_from_output(out: Mapping[str, Any], *, speculation: bool) -> Completion:
    """A Completion from one ``Engine.generate`` output dict (``output_ids``, ``meta_info``). Pure."""
    toks = tuple(int(t) for t in out.get("output_ids") or ())
    meta = out.get("meta_info") or {}
    fr = meta.get("finish_reason")
    kind = fr.get("type") if isinstance(fr, Mapping) else (fr if isinstance(fr, str) else None)
    if kind == "abort":
        msg = fr.get("message") if isinstance(fr, Mapping) else None
        raise RuntimeError(f"SGLang aborted a request: {msg or fr}")
    reason = str(kind or "unknown")
    if reason == "stop" and isinstance(fr, Mapping):
        matched = fr.get("matched")
        # The oracle's convention: a complete output includes its stop token (SGLang's does).
        if isinstance(matched, int) and not isinstance(matched, bool) and (not toks or toks[-1] != matched):
            toks = toks + (matched,)
    drafted = accepted = None
    if speculation:
        drafted = int(meta.get("spec_num_proposed_drafts", meta.get("spec_proposed_drafts", 0)) or 0)
        accepted = int(meta.get("spec_num_correct_drafts", meta.get("spec_accepted_drafts", 0)) or 0)
    return Completion(toks, reason, drafted, accepted)


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


class SGLangEngine(Engine):
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
        self._pids: set[int] = set()
        self._shutdown_timeout_s = DEFAULT_SHUTDOWN_TIMEOUT_S
        self.start_seconds: float | None = None
        self.random_seed: int | None = None
        self.dropped_defaults: tuple[str, ...] = ()  # adapter defaults this SGLang has no field for
        self.close_timed_out = False

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
        return Capabilities(
            methods=METHODS + (HEAD_METHODS if HEADS_ENABLED else ()),
            sampling=frozenset(sampling),
            dtypes=DTYPES,
            profile="sglang",
            max_vocab=None,
            draft_vocab="narrower",
            spec_knobs={
                "verify": ("token",), "draft_sampling": ("greedy",), "draft_temperature": (None,),
                "inject": (None,), "ngram_min": (1,),
                # EAGLE heads also draft by rejection sampling (speculative_use_rejection_sampling).
                "eagle.draft_sampling": ("greedy", "sampled"), "eagle3.draft_sampling": ("greedy", "sampled"),
            },
            restart_in_process=False,
            # SGLang refuses none of them with speculation on (what it does with them: module docstring).
            sampling_with_speculation=frozenset(sampling),
            speculates_first_token=False,  # the prefill (extend) step samples the first token
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
        """The settings in force for ``config``: constructor/env defaults, then ``config.settings``."""
        return {**self._default_settings, **dict(config.settings)}

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
        settings = self.settings_for(config)
        spec = config.speculation
        spec_settings = sorted(k for k in settings if str(k).startswith("speculative_"))
        if spec is None and spec_settings:
            raise InvalidInput(f"settings[{spec_settings[0]!r}]", settings[spec_settings[0]], "unset when speculation is off (use EngineConfig.speculation)")
        mapped = [k for k in spec_settings if k in MAPPED_SPEC_KEYS]
        if mapped:
            raise InvalidInput(f"settings[{mapped[0]!r}]", settings[mapped[0]], "unset: the adapter maps EngineConfig.speculation onto it")
        dv = None
        if isinstance(spec, SpecConfig) and spec.method in METHODS and spec.uses_draft_model and config.draft_dir is not None:
            dv = read_config(Path(config.draft_dir), "draft_dir").get("vocab_size")
        if isinstance(spec, SpecConfig) and spec.method in HEAD_METHODS and HEADS_ENABLED and config.draft_dir is not None:
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

    def start(self, config: EngineConfig) -> None:
        """Start SGLang on ``config``; raise InvalidInput (before starting) for a bad config."""
        if self._engine is not None:
            if config == self._config:
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
        self.start_seconds = time.perf_counter() - t0
        _RUNNING.add(self)
        self._config = config
        self._settings = settings
        self._vocab_size = int(read_config(Path(config.target_dir), "target_dir")["vocab_size"])
        self._spec = config.speculation
        self.close_timed_out = False

    def close(self) -> None:
        """Shut SGLang down within ``settings['shutdown_timeout_s']`` (default 10 s), then
        SIGKILL whatever of the processes it started is still alive."""
        eng, self._engine = self._engine, None
        self._config = None
        self._spec = None
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
        self._require_started()
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
        sp = {"temperature": 1.0, "max_new_tokens": max_tokens, "ignore_eos": True}
        out = self._engine.generate(
            input_ids=[prompt], sampling_params=[sp], return_logprob=True, logprob_start_len=0, top_logprobs_num=V,
        )
        out = out[0] if isinstance(out, list) else out
        meta = out.get("meta_info") or {}
        generated = [int(t) for t in out.get("output_ids") or ()]
        rows: list[tuple[int, Any]] = []  # (context token, [(logprob, token, text), ...])
        for i, lp in enumerate(meta.get("input_top_logprobs") or []):
            if lp and i >= 1:  # entry 0 (the first prompt token) has no prediction
                rows.append((prompt[i - 1], lp))
        context = [prompt[-1], *generated]
        for i, lp in enumerate(meta.get("output_top_logprobs") or []):
            if lp and i < len(context):
                rows.append((int(context[i]), lp))
        m = table.max(axis=1, keepdims=True)
        expect = table - m - np.log(np.exp(table - m).sum(axis=1, keepdims=True))  # [V, V]
        worst = 0.0
        bad: list[tuple[int, int, float, float]] = []
        for ctx, lp in rows:
            got = {int(entry[1]): float(entry[0]) for entry in lp if entry is not None}
            for tok in range(V):
                g = got.get(tok, -math.inf)
                e = float(expect[ctx, tok])
                if e < FLOAT32_LOG_TINY:
                    ok = g < FLOAT32_LOG_TINY + 1.0
                    d = 0.0 if ok else abs(g - e)
                else:
                    d = abs(g - e) if math.isfinite(g) else math.inf
                    ok = d <= tol * max(1.0, abs(e))
                if math.isnan(d):
                    d, ok = math.inf, False
                worst = max(worst, d)
                if not ok:
                    bad.append((ctx, tok, g, e))
        return LogitsReport(
            ok=not bad and len(rows) > 0, mode="sglang logprobs", positions=len(rows), max_abs_diff=worst,
            tolerance=tol, contexts=tuple(c for c, _ in rows), mismatches=tuple(bad),
        )
