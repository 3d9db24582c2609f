"""What specfuzz's speculation configs and requests become in SGLang 0.5.17 (pure mapping).

Read in SGLang 0.5.17's source (file paths under ``python/sglang/srt``, functions in
``backticks``); used by :mod:`specfuzz.engines.sglang_engine`. Nothing here imports SGLang.

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
  ``tree_budget + 1`` (tree); ``max_bfs_breadth = 1`` (chain) or ``tree_topk``;
  ``min_bfs_breadth = 1`` (chain) or ``tree_topk_min`` (``tree_topk`` when None: a
  constant breadth); ``max_trie_depth = ngram_max + K`` (no exact equivalent: SGLang has
  no minimum or maximum match length and bounds drafts by node count, not depth, so
  ``ngram_min`` must be 1 and a "chain" may branch at the root when several suffixes
  match; any depth >= 2 is reachable through ``ngram_max`` and K);
  ``speculative_num_steps = max(1, num_draft_tokens // max_bfs_breadth)`` (SGLang's own
  derivation, ``_handle_ngram``, kept >= 1). SGLang's breadth at a node is
  ``max(1, int(b))`` where ``b`` starts at ``min + (max - min) * (D - d) / D`` for a match
  of depth d (``D = max_trie_depth - 1``) and falls by ``(max - min) / D`` per level
  (``Trie::buildRecency``); the reference sampler gives every node ``tree_topk`` children
  (``tree_topk_min`` is not modelled: μ does not depend on it, only bug-law attribution
  does). Not modelled, left to settings (speculative runs only): ``_match_type``
  ("PROB"), ``_capacity``, external corpora.
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
* Engine defaults (``SpecConfig.engine_default``): only the required knobs are sent,
  ``speculative_algorithm`` and, for STANDALONE/EAGLE/EAGLE3, ``speculative_draft_model_path``;
  SGLang then runs :data:`SGLANG_DEFAULTS`. NGRAM: ``ServerArgs`` defaults
  (``server_args.py``) ``speculative_ngram_min_bfs_breadth=1``, ``_max_bfs_breadth=10``,
  ``_max_trie_depth=18``, ``_match_type="BFS"``, ``_capacity=10**7``, and ``_handle_ngram``
  (``arg_groups/speculative_hook.py``) sets ``speculative_num_draft_tokens=12`` when unset,
  ``speculative_eagle_topk = max_bfs_breadth`` and ``speculative_num_steps = 12 // 10 = 1``.
  STANDALONE, EAGLE, EAGLE3: ``_handle_eagle_family`` calls ``_auto_choose_speculative_params``
  when ``speculative_num_steps`` is unset: (steps, topk, draft tokens) = (3, 1, 4) for
  STANDALONE and (5, 4, 8) for a ``LlamaForCausalLM`` target (every table target) under
  EAGLE/EAGLE3; ``speculative_use_rejection_sampling`` defaults to False (greedy top-k
  drafts). As SpecConfig fields (:data:`SPEC_DEFAULTS`, ``Capabilities.spec_defaults``): NGRAM
  is the tree ``ngram_tree`` K=11, ngram_max=7 (trie depth 7 + 11 = 18), tree_topk=10,
  tree_topk_min=1, tree_budget=11 (its explicit mapping gives exactly the values above);
  STANDALONE the greedy chain ``draft_model`` K=3 (exact); EAGLE/EAGLE3 ``eagle``/``eagle3``
  K=5, tree_topk=4, tree_budget=7 with greedy drafts: SGLang's default head runs a top-4
  tree of 7 nodes, which SpecConfig cannot state for a head (``eagle``/``eagle3`` are chain
  methods; the reference sampler runs a greedy chain of 5), so that variant's bug-law
  attribution is approximate while its verdict, which depends only on μ, is exact. The
  EAGLE default needs a draft vocabulary of at least 4 (``torch.topk``): refused below.
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
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from specfuzz.engines.base import Completion, Request
from specfuzz.engines.vllm_calibration import LogitsReport
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
# The worker each algorithm runs through: in 0.5.17 (speculative/spec_info.py,
# SpeculativeAlgorithm.create_worker) EAGLE and EAGLE3 get EAGLEWorkerV2, STANDALONE
# StandaloneWorkerV2, a subclass of it (standalone_worker_v2.py), NGRAM NGRAMWorker: the first
# three verify and emit through the same code, so they share a name here.
ALGORITHM_WORKERS: dict[str, str] = {
    "NGRAM": "NGRAMWorker", "STANDALONE": "EAGLEWorkerV2", "EAGLE": "EAGLEWorkerV2", "EAGLE3": "EAGLEWorkerV2",
}
# Per method (Capabilities.spec_paths).
SPEC_PATHS: dict[str, str] = {m: ALGORITHM_WORKERS[a] for m, a in ALGORITHMS.items()}
# The function every worker above verifies drafts with (speculative/eagle_utils.py, called by
# eagle_worker_common.py for EAGLEWorkerV2 and by ngram_worker.py): it applies the request's
# logit_bias, penalties (a relaxed version, its own comment says), temperature, top-k and top-p to
# the target's logits before accepting drafts, and no min_p. Capabilities.verify_samplers and the
# SamplingParams fields whose handling in verification is its (verify_sampler_features).
VERIFY_SAMPLER = "eagle_sample"
VERIFY_SAMPLER_FEATURES: frozenset[str] = frozenset({
    "logit_bias", "repetition_penalty", "frequency_penalty", "presence_penalty", "temperature", "top_k", "top_p", "min_p",
})
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
# ServerArgs fields the speculation mapping sets; settings may not override them.
MAPPED_SPEC_KEYS = frozenset(
    {
        "speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps", "speculative_eagle_topk",
        "speculative_num_draft_tokens", "speculative_ngram_min_bfs_breadth", "speculative_ngram_max_bfs_breadth",
        "speculative_ngram_max_trie_depth", "speculative_use_rejection_sampling",
    }
)
# Settings with this prefix apply to speculative runs only.
SPEC_SETTING_PREFIX = "speculative_"
# What SGLang 0.5.17 runs when a method is turned on with only its required knobs (the
# resolved ServerArgs; module docstring, "Engine defaults").
SGLANG_DEFAULTS: dict[str, dict[str, Any]] = {
    "NGRAM": {
        "speculative_num_draft_tokens": 12, "speculative_ngram_min_bfs_breadth": 1,
        "speculative_ngram_max_bfs_breadth": 10, "speculative_ngram_max_trie_depth": 18, "speculative_num_steps": 1,
        "speculative_eagle_topk": 10, "speculative_ngram_match_type": "BFS", "speculative_ngram_capacity": 10_000_000,
    },
    "STANDALONE": {"speculative_num_steps": 3, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4},
    "EAGLE": {"speculative_num_steps": 5, "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8},
    "EAGLE3": {"speculative_num_steps": 5, "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8},
}
# The same as SpecConfig fields, by the method that draws each default (Capabilities.spec_defaults).
SPEC_DEFAULTS: dict[str, dict[str, Any]] = {
    "ngram_tree": {"num_speculative_tokens": 11, "ngram_min": 1, "ngram_max": 7, "tree_topk": 10, "tree_topk_min": 1,
                   "tree_budget": 11},
    "draft_model": {"num_speculative_tokens": 3, "draft_sampling": "greedy"},
    "eagle": {"num_speculative_tokens": 5, "draft_sampling": "greedy", "tree_topk": 4, "tree_budget": 7},
    "eagle3": {"num_speculative_tokens": 5, "draft_sampling": "greedy", "tree_topk": 4, "tree_budget": 7},
}
# SpecConfig fields every SGLang configuration has (the defaults included).
_FIXED_SPEC_FIELDS: dict[str, Any] = {"verify": "token", "draft_temperature": None, "inject": None}
# SGLang's default EAGLE tree takes the top-4 draft tokens (torch.topk needs that many).
EAGLE_DEFAULT_TOPK = SGLANG_DEFAULTS["EAGLE"]["speculative_eagle_topk"]
# The parts a started engine can load in place (sglang_swap's docstring says how).
SWAPPABLE: frozenset[str] = frozenset({"target", "draft", "head"})
# Speculation knobs, by SpecConfig field ("method.field" for one method): what SGLang
# accepts and what strategies draw, up to SGLang's default sizes (Capabilities.spec_knobs).
SPEC_KNOBS: dict[str, tuple] = {
    "verify": ("token",), "draft_sampling": ("greedy",), "draft_temperature": (None,),
    "inject": (None,), "ngram_min": (1,),
    # EAGLE heads also draft by rejection sampling (speculative_use_rejection_sampling).
    "eagle.draft_sampling": ("greedy", "sampled"), "eagle3.draft_sampling": ("greedy", "sampled"),
    # ... only where the head's vocabulary is the target's (speculative_kwargs refuses the rest).
    "eagle.draft_sampling_reduced": ("greedy",), "eagle3.draft_sampling_reduced": ("greedy",),
    # NGRAM up to its default: 12 draft tokens (root + 11), BFS breadth 10 down to 1, trie depth 18.
    "ngram.num_speculative_tokens": tuple(range(1, 12)),
    "ngram_tree.num_speculative_tokens": tuple(range(1, 12)),
    "ngram_max": tuple(range(1, 8)),
    "ngram_tree.tree_topk": tuple(range(1, 11)),
    "ngram_tree.tree_topk_min": (None, *range(1, 11)),
    "ngram_tree.tree_budget": tuple(range(1, 12)),
    # STANDALONE / EAGLE up to the EAGLE default: 5 steps, top-4, 8 draft tokens (root + 7).
    "draft_model.num_speculative_tokens": tuple(range(1, 6)),
    "eagle.num_speculative_tokens": tuple(range(1, 6)),
    "eagle3.num_speculative_tokens": tuple(range(1, 6)),
    "eagle_tree.num_speculative_tokens": tuple(range(1, 6)),
    "eagle_tree.tree_topk": tuple(range(1, 5)),
    "eagle_tree.tree_budget": tuple(range(1, 8)),
}
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
    if spec.engine_default:
        return _engine_default_kwargs(spec, algo, draft_dir=draft_dir, target_vocab=target_vocab, draft_vocab=draft_vocab)
    if algo == "NGRAM":
        if spec.ngram_min != 1:
            raise InvalidInput(
                "speculation.ngram_min", spec.ngram_min,
                "1 (SGLang's NGRAM trie matches every suffix length from 1 up to speculative_ngram_max_trie_depth)",
            )
        chain = spec.method == "ngram"
        widest = 1 if chain else int(spec.tree_topk)
        narrowest = 1 if chain else int(spec.tree_topk if spec.tree_topk_min is None else spec.tree_topk_min)
        nodes = K if chain else int(spec.tree_budget)
        return {
            "speculative_algorithm": algo,
            "speculative_num_draft_tokens": nodes + 1,
            "speculative_ngram_min_bfs_breadth": narrowest,
            "speculative_ngram_max_bfs_breadth": widest,
            "speculative_ngram_max_trie_depth": int(spec.ngram_max) + K,
            "speculative_num_steps": max(1, (nodes + 1) // widest),
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


def _engine_default_kwargs(spec: SpecConfig, algo: str, *, draft_dir: Path | None, target_vocab: int | None,
                           draft_vocab: int | None) -> dict[str, Any]:
    """The required knobs only (``SpecConfig.engine_default``), after checking that ``spec``
    states what SGLang then runs (:data:`SPEC_DEFAULTS`)."""
    want = SPEC_DEFAULTS.get(spec.method)
    if want is None:
        raise InvalidInput(
            "speculation.engine_default", True,
            f"False for method {spec.method!r}: SGLang's defaults are the methods {sorted(SPEC_DEFAULTS)} "
            "(NGRAM's default is a tree, STANDALONE's a chain)",
        )
    for k, v in {**_FIXED_SPEC_FIELDS, **want}.items():
        if getattr(spec, k) != v:
            raise InvalidInput(
                f"speculation.{k}", getattr(spec, k),
                f"{v!r}: SGLang's default {algo} runs that (engine_default=True; Capabilities.spec_defaults)",
            )
    out: dict[str, Any] = {"speculative_algorithm": algo}
    if algo == "NGRAM":
        return out
    if draft_dir is None:
        raise InvalidInput("draft_dir", None, f"a draft checkpoint folder for method {spec.method!r}")
    if algo == "STANDALONE" and target_vocab is not None and draft_vocab != target_vocab:
        raise InvalidInput(
            "draft vocab_size", draft_vocab,
            f"equal to the target's vocab_size={target_vocab}: SGLang's STANDALONE needs equal vocabulary sizes",
        )
    if algo in ("EAGLE", "EAGLE3"):
        smallest = min(v for v in (draft_vocab, target_vocab, EAGLE_DEFAULT_TOPK) if v is not None)
        if smallest < EAGLE_DEFAULT_TOPK:
            raise InvalidInput(
                "speculation.engine_default", True,
                f"False for a draft vocabulary of {smallest} < {EAGLE_DEFAULT_TOPK} tokens: SGLang's default {algo} "
                f"tree takes the top {EAGLE_DEFAULT_TOPK} draft tokens (_auto_choose_speculative_params)",
            )
    out["speculative_draft_model_path"] = str(draft_dir)
    return out


def split_settings(settings: Mapping[str, Any], speculation: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """(settings in force, settings left out): ``speculative_*`` keys apply to speculative
    runs only. Pure."""
    if speculation:
        return dict(settings), {}
    kept = {k: v for k, v in settings.items() if not str(k).startswith(SPEC_SETTING_PREFIX)}
    return kept, {k: v for k, v in settings.items() if k not in kept}


def row_prompts(vocab_size: int, max_model_len: int) -> list[list[int]]:
    """Prompts that visit every row of a [V, V] table once: each prompt of length L, with
    one generated token, reads L rows (L - 1 prompt positions and the first output
    position) and fits in ``max_model_len``. Pure."""
    c = max(1, min(int(vocab_size), int(max_model_len) - 1))
    return [list(range(i, min(i + c, vocab_size))) for i in range(0, vocab_size, c)]


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


def mismatch_summary(rep: LogitsReport) -> str:
    if rep.ok:
        return ""
    first = rep.mismatches[:3]
    return f"{len(rep.mismatches)} logprobs off the table (context, token, engine, table): {first}" if first else "no rows compared"


def compare_rows(rows: Sequence[tuple[int, Any]], table, tol: float) -> LogitsReport:
    """Every row's top-V logprobs against the float64 log-softmax of ``table`` [V, V]. Pure."""
    import numpy as np

    V = table.shape[0]
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
