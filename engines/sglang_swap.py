"""Table swaps in a running SGLang engine: what loads in place, and how each load is proven.

:meth:`specfuzz.engines.sglang_engine.SGLangEngine.swap` loads a new table model into the
running ``sglang.Engine`` through SGLang's own weight-update requests, and
:meth:`~specfuzz.engines.sglang_engine.SGLangEngine.check_tables` proves what was loaded
before any sample counts. This module holds the parts that do not need a GPU (the plan:
which files, which steps, and every reason to refuse) and thin wrappers around the
SGLang calls. Everything below was read in SGLang 0.5.17 (paths under ``python/sglang/srt``).

How SGLang routes a weight update (``managers/scheduler_components/weight_updater.py``)
-------------------------------------------------------------------------------------
* ``update_weights_from_tensor`` goes to ``draft_worker or tp_worker``, or to the target
  worker alone when the request says ``disable_draft_model`` (``UpdateWeightsFromTensorReqInput``,
  ``managers/io_struct.py``; ``Engine.update_weights_from_tensor`` does not expose that field,
  so the adapter sends the same request through ``Engine.tokenizer_manager``, as the Engine
  method and the HTTP endpoint do). For NGRAM the "draft worker" is ``NGRAMWorker``, whose
  ``update_weights_from_tensor`` forwards to the target (``speculative/ngram_worker.py``). For
  EAGLE, EAGLE-3 and STANDALONE it is ``EAGLEWorkerV2.update_weights_from_tensor``
  (``speculative/eagle_worker_v2.py``), which loads *the same tensors* into the draft runner
  and then into the target runner (built for MTP heads that share names with the target).
  For STANDALONE that path raises ``AttributeError`` (``StandaloneWorkerV2.__init__`` never
  sets ``self.ps``, which that method reads), and a plain Llama draft would take the target's
  tables anyway (same names); for EAGLE-3 the head would take the target's ``lm_head`` and
  layer-0 weights. So **target swaps always say ``disable_draft_model``** when a draft model
  runs, and the draft parts below take their own routes.
* ``update_weights_from_disk`` loads one folder into the target runner and then into every
  draft runner (``BaseSpecWorker.update_weights_from_disk``, ``speculative/base_spec_worker.py``).
* ``flush_cache`` (``Scheduler.flush_cache``, ``managers/scheduler.py``) resets the radix
  (prefix) cache and the KV pools and calls ``draft_worker.clear_cache_pool()``, which for
  NGRAM resets the n-gram trie shared by all requests (``NgramCorpus.reset`` -> C++
  ``Ngram::reset``, ``kernels/jit/csrc/ngram_corpus/ngram.h``; external corpora are kept, the
  adapter loads none). The adapter sends its updates with ``flush_cache=False`` and flushes
  with ``FlushCacheReqInput(timeout_s=...)`` (waits for the scheduler to be idle,
  ``flush_wrapper.py``): the update's own flush *asserts* success inside the scheduler.
  ``Ngram::reset`` does not wait for inserts still queued by the last verify step; the
  flush at the end of ``check_tables`` (tens of milliseconds later) clears those too.

What swaps, per algorithm
-------------------------
* **target** (every algorithm, speculation off included): the new target's
  ``model.safetensors`` through ``update_weights_from_tensor`` (``disable_draft_model`` when
  a draft model runs). Proven by ``check_tables``: SGLang's own log-probabilities for every
  row of the table.
* **draft** (STANDALONE): ``update_weights_from_disk(new draft folder)`` loads the draft into
  *both* runners; then (i) the target runner's log-probabilities for every row must equal
  the *draft's* table, and (ii) SGLang's per-tensor checksums (``check_weights``, action
  "checksum": ``draft.<name>`` for the draft runner, ``utils/weight_checker.py``) must be
  equal for every tensor of the two runners: the draft runner holds, bit for bit, weights
  that reproduce the draft table. Then the target is loaded (``disable_draft_model``) and
  ``check_tables`` finds the draft's checksums unchanged. Needs the draft and target
  checkpoints to have the same tensors (names, shapes, dtypes): tablegen writes them so.
* **head**, EAGLE (EAGLE-1): the head stores no table (it shares the target's embedding and
  ``lm_head``: ``EAGLEWorkerV2.init_lm_head`` -> ``set_embed_and_head``; tablegen puts the
  draft table in the target's spare ``lm_head`` columns, :mod:`specfuzz.tablegen.eagle`), so
  the new head's weights must equal the running head's bit for bit (they do for every table
  of one shape) and the table comes with the target. ``check_tables`` reads the target's
  ``lm_head`` back (``Engine.get_weights_by_name``) and compares it bit for bit with the new
  checkpoint (the head's columns included), and finds the head's ``lm_head`` and embedding
  checksums equal to the target's (still shared).
* **head**, EAGLE-3: the head's own ``lm_head`` is its table; every other head tensor (``d2t``
  included: SGLang copies the id map into the worker once, ``init_lm_head``) must equal the
  running head's. ``update_weights_from_tensor([("lm_head.weight", ...)])`` without
  ``disable_draft_model`` loads it into the head and, by the route above, into the target;
  then the target's ``lm_head`` read back must equal it and the head's checksum the
  target's; then the target is reloaded. Only for full-width heads: a reduced vocabulary's
  ``lm_head`` has another shape than the target's, and that route would fail inside SGLang.

Anything else raises :class:`~specfuzz.engines.base.SwapUnsupported` before a weight is
touched; a failure after one was touched marks the engine for a fresh start.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from specfuzz.engines.base import TABLE_FILES, EngineConfig, SwapUnsupported, swap_key, swap_parts

WEIGHTS_FILE = "model.safetensors"
# Algorithms whose draft model has a runner (and weights) of its own.
DRAFT_RUNNER_ALGORITHMS: tuple[str, ...] = ("STANDALONE", "EAGLE", "EAGLE3")
# Draft tensors SGLang replaces by the target's own (eagle_worker_v2.py, init_lm_head):
# EAGLE shares embedding and lm_head (set_embed_and_head), EAGLE-3 the embedding (set_embed).
SHARED_WITH_TARGET: Mapping[str, tuple[str, ...]] = {
    "EAGLE": ("model.embed_tokens.weight", "lm_head.weight"),
    "EAGLE3": ("model.embed_tokens.weight",),
}
# check_weights names the draft runner's tensors "draft.<name>" (_merge_checksum_payloads).
DRAFT_PREFIX = "draft."
LM_HEAD = "lm_head.weight"
# How long a flush waits for the scheduler to be idle (seconds).
FLUSH_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class SwapPlan:
    """The steps of one swap (see the module docstring)."""

    parts: tuple[str, ...]  # swap_parts(old, new)
    algorithm: str | None  # SGLang's speculative_algorithm; None: speculation off
    target_weights: Path | None  # the target file to load last (None: nothing to load)
    draft_dir: Path | None = None  # STANDALONE: loaded into both runners first
    head_weights: Path | None = None  # EAGLE-3: its lm_head loaded into both runners first


# ----------------------------------------------------------------------------- files


def header(path: Path | str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (dtype, shape) of every tensor of a safetensors file (its JSON header only)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        meta = json.loads(f.read(n))
    return {k: (v["dtype"], tuple(v["shape"])) for k, v in meta.items() if k != "__metadata__"}


def differing_tensors(a: Path | str, b: Path | str, skip: Sequence[str] = ()) -> list[str]:
    """Names of the tensors (except ``skip``) that two safetensors files do not hold
    bit for bit alike, or hold only one of."""
    from safetensors.torch import load_file

    ta, tb = load_file(str(a)), load_file(str(b))
    out = sorted((set(ta) ^ set(tb)) - set(skip))
    for name in sorted((set(ta) & set(tb)) - set(skip)):
        x, y = ta[name], tb[name]
        if x.dtype != y.dtype or x.shape != y.shape or _bytes(x) != _bytes(y):
            out.append(name)
    return out


def _bytes(t) -> bytes:
    import torch

    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _changed_config_files(old: Path | None, new: Path | None) -> list[str]:
    def files(p: Path | None) -> dict[str, bytes]:
        if p is None or not Path(p).is_dir():
            return {}
        return {f.name: f.read_bytes() for f in sorted(Path(p).iterdir()) if f.is_file() and f.name not in TABLE_FILES}

    a, b = files(old), files(new)
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def shape_difference(old: EngineConfig, new: EngineConfig) -> str:
    """Why ``swap_key`` differs, in words ("" when it does not)."""
    if swap_key(old) == swap_key(new):
        return ""
    fields = [f for f in old.__dataclass_fields__ if f not in ("target_dir", "draft_dir") and getattr(old, f) != getattr(new, f)]
    if fields:
        return f"EngineConfig.{fields[0]} differs ({getattr(old, fields[0])!r} -> {getattr(new, fields[0])!r})"
    for name, a, b in (("target", old.target_dir, new.target_dir), ("draft", old.draft_dir, new.draft_dir)):
        changed = _changed_config_files(a, b)
        if changed:
            return f"the {name} checkpoints differ in {changed[0]} (vocabulary, EOS or architecture)"
    return "the draft checkpoint is present in one config only"


# ----------------------------------------------------------------------------- the plan


def plan_swap(old: EngineConfig, new: EngineConfig, allowed: frozenset[str] | set[str], *, algorithm: str | None,
              head_twin=None) -> SwapPlan:
    """The steps that load ``new`` into an engine running ``old``; SwapUnsupported (with the
    reason) when SGLang cannot do it or it could not be proven. Reads checkpoint files only.

    ``head_twin``: maps a tablegen EAGLE head folder to the folder SGLang loads
    (:func:`specfuzz.tablegen.eagle.sglang_head`, the default; it writes the twin once).
    """
    why = shape_difference(old, new)
    if why:
        raise SwapUnsupported(f"a swap needs the running engine's shapes: {why}")
    parts = swap_parts(old, new)
    refused = [p for p in parts if p not in allowed]
    if refused:
        raise SwapUnsupported(f"this engine does not swap the {refused[0]} (swaps: {sorted(allowed) or 'none'})")
    if not parts:
        return SwapPlan((), algorithm, None)
    new_target = Path(new.target_dir) / WEIGHTS_FILE
    if header(Path(old.target_dir) / WEIGHTS_FILE) != header(new_target):
        raise SwapUnsupported("the new target's tensors differ in name, shape or dtype from the running target's")
    if "draft" in parts:
        if algorithm != "STANDALONE" or new.draft_dir is None:
            raise SwapUnsupported(f"draft swaps are for STANDALONE draft models (running: {algorithm})")
        if header(Path(new.draft_dir) / WEIGHTS_FILE) != header(new_target):
            raise SwapUnsupported(
                "the draft's tensors differ in name, shape or dtype from the target's: the draft is proven by "
                "loading it into both runners and comparing them"
            )
        return SwapPlan(parts, algorithm, new_target, draft_dir=Path(new.draft_dir))
    if "head" in parts:
        if algorithm not in ("EAGLE", "EAGLE3") or new.draft_dir is None or old.draft_dir is None:
            raise SwapUnsupported(f"head swaps are for EAGLE/EAGLE-3 heads (running: {algorithm})")
        if head_twin is None:
            from specfuzz.tablegen.eagle import sglang_head as head_twin
        old_w = Path(head_twin(old.draft_dir)) / WEIGHTS_FILE
        new_w = Path(head_twin(new.draft_dir)) / WEIGHTS_FILE
        if algorithm == "EAGLE":
            diff = differing_tensors(old_w, new_w)
            if diff:
                raise SwapUnsupported(
                    f"the new EAGLE head's {diff[0]} differs from the running head's: an EAGLE head swap only "
                    "re-points the table the head shares with the target's lm_head"
                )
            return SwapPlan(parts, algorithm, new_target)
        diff = differing_tensors(old_w, new_w, skip=(LM_HEAD,))
        if diff:
            raise SwapUnsupported(
                f"the new EAGLE-3 head's {diff[0]} differs from the running head's: only its lm_head (the table) swaps"
            )
        if header(new_w).get(LM_HEAD, (None, None))[1] != header(new_target)[LM_HEAD][1]:
            raise SwapUnsupported(
                "a reduced EAGLE-3 draft vocabulary: SGLang's only route into the head also writes its lm_head into "
                "the target's, which needs equal shapes"
            )
        return SwapPlan(parts, algorithm, new_target, head_weights=new_w)
    return SwapPlan(parts, algorithm, new_target)


# ----------------------------------------------------------------------------- checksums


def split_checksums(sums: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(target runner's, draft runner's) tensor checksums, by tensor name."""
    target = {k: v for k, v in sums.items() if not k.startswith(DRAFT_PREFIX)}
    draft = {k[len(DRAFT_PREFIX):]: v for k, v in sums.items() if k.startswith(DRAFT_PREFIX)}
    return target, draft


def copy_problems(sums: Mapping[str, str]) -> list[str]:
    """Tensors the draft runner does not hold exactly as the target runner does (after
    one folder was loaded into both)."""
    target, draft = split_checksums(sums)
    if not draft:
        return ["SGLang reported no draft-runner checksums"]
    out = [f"{n}: only in the {'target' if n in target else 'draft'} runner" for n in sorted(set(target) ^ set(draft))]
    out += [f"{n}: draft {draft[n]} != target {target[n]}" for n in sorted(set(target) & set(draft)) if draft[n] != target[n]]
    return out


def draft_problems(sums: Mapping[str, str], reference: Mapping[str, str], algorithm: str | None) -> list[str]:
    """Draft-runner tensors that are not what was proven: every tensor equal to its
    ``reference`` checksum, except those SGLang shares with the target, which must equal
    the target's (they follow the target, proven by the table check)."""
    target, draft = split_checksums(sums)
    shared = set(SHARED_WITH_TARGET.get(algorithm or "", ()))
    out = [f"{n}: missing from the draft runner" for n in sorted(set(reference) - set(draft))]
    for n in sorted(draft):
        if n in shared:
            if draft[n] != target.get(n):
                out.append(f"{n}: the draft's {draft[n]} is no longer the target's {target.get(n)} (not shared any more)")
        elif n not in reference:
            out.append(f"{n}: a draft tensor without a proven checksum")
        elif draft[n] != reference[n]:
            out.append(f"{n}: {draft[n]} != proven {reference[n]}")
    return out


# ----------------------------------------------------------------------------- SGLang calls


def _run(engine, coro):
    return engine.loop.run_until_complete(coro)


def update_target(engine, named: list[tuple[str, Any]], *, keep_draft: bool) -> tuple[bool, str]:
    """Load tensors into the target runner only; the prefix cache is flushed separately."""
    if not keep_draft:
        out = engine.update_weights_from_tensor(named, flush_cache=False)
        return bool(out[0]), str(out[1])
    from sglang.srt.managers.io_struct import UpdateWeightsFromTensorReqInput
    from sglang.srt.utils import MultiprocessingSerializer

    tp = int(getattr(getattr(engine, "server_args", None), "tp_size", 1) or 1)
    req = UpdateWeightsFromTensorReqInput(
        serialized_named_tensors=[MultiprocessingSerializer.serialize(named) for _ in range(tp)],
        flush_cache=False, disable_draft_model=True,
    )
    out = _run(engine, engine.tokenizer_manager.update_weights_from_tensor(req, None))
    return bool(out[0]), str(out[1])


def update_draft_and_target(engine, named: list[tuple[str, Any]]) -> tuple[bool, str]:
    """EAGLE/EAGLE-3: the draft runner, then the target runner, take the same tensors."""
    out = engine.update_weights_from_tensor(named, flush_cache=False)
    return bool(out[0]), str(out[1])


def update_from_disk(engine, folder: Path) -> tuple[bool, str]:
    """Load a checkpoint folder into the target runner and every draft runner."""
    from sglang.srt.managers.io_struct import UpdateWeightFromDiskReqInput

    req = UpdateWeightFromDiskReqInput(model_path=str(folder), flush_cache=False)
    out = _run(engine, engine.tokenizer_manager.update_weights_from_disk(req, None))
    return bool(out[0]), str(out[1])


def flush(engine, timeout_s: float = FLUSH_TIMEOUT_S) -> bool:
    """Reset the prefix cache and the draft worker's state (the NGRAM trie), waiting up to
    ``timeout_s`` for the scheduler to be idle; whether it happened."""
    try:
        out = _run(engine, engine.tokenizer_manager.flush_cache(timeout_s=timeout_s))
    except TypeError:  # an SGLang without the timeout
        out = engine.flush_cache()
    return bool(getattr(out, "success", out))


def checksums(engine) -> dict[str, str] | None:
    """SGLang's per-tensor checksums of both runners (``draft.<name>`` for the draft), or
    None when this SGLang cannot give them."""
    try:
        from sglang.srt.managers.io_struct import CheckWeightsReqInput

        out = _run(engine, engine.tokenizer_manager.check_weights(CheckWeightsReqInput(action="checksum"), None))
    except Exception:  # noqa: BLE001 - an SGLang without check_weights: no draft proofs
        return None
    success, ranks = out[0], out[2] if len(out) > 2 else None
    if not success or not ranks:
        return None
    sums = ranks[0].get("checksums") if isinstance(ranks[0], Mapping) else None
    return {str(k): str(v) for k, v in sums.items()} if isinstance(sums, Mapping) else None


def read_weight(engine, name: str, rows: int) -> np.ndarray | None:
    """The target runner's tensor ``name``, its first ``rows`` rows, as float32 ([rows, ...])."""
    got = engine.get_weights_by_name(name, truncate_size=int(rows))
    if got is None:
        return None
    return np.asarray(got, dtype=np.float32)


def checkpoint_tensor(path: Path, name: str) -> np.ndarray:
    """A checkpoint tensor as float32 (exact for bfloat16 and float16)."""
    from safetensors.torch import load_file

    import torch

    return load_file(str(path))[name].to(torch.float32).numpy()
