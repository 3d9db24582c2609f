"""In-place table swaps inside vLLM's workers (``worker_extension_cls``).

vLLM mixes :class:`TableSwapExtension` into its worker class when an engine is started
with ``worker_extension_cls="specfuzz.engines.vllm_worker.TableSwapExtension"`` (the path
RL frameworks use to push new weights into a running engine), and
``LLM.collective_rpc("specfuzz_load_tables", args=...)`` then runs
:meth:`TableSwapExtension.specfuzz_load_tables` on every worker.

A parameter the drafter shares with the target (vLLM shares the target's ``lm_head`` with an
EAGLE head whose own lm_head was identical at start) is copied before a new head is loaded
into it: otherwise the load would write the target's table too (vLLM 0.25, EAGLE-3: the
table check after such a swap finds the head's table in the target's rows).

A swap loads only the tensors that differ between the running checkpoint and the new one
(for table checkpoints: the ``lm_head`` that holds the table, and an EAGLE-3 head's
``lm_head``/``d2t``), through the model's own ``load_weights`` (what vLLM's loader calls
at start), then re-runs each touched layer's ``process_weights_after_loading`` so that
derived copies follow the new weights (vLLM's CPU backend packs linear and ``lm_head``
weights into oneDNN / sgl-kernel handles at load time; on CUDA this is a no-op for
unquantized layers). A layer whose weight vLLM dropped after packing (CPU linear layers,
``remove_weight=True``) cannot be reloaded: the swap is refused and the engine restarts.

Loaded tensors are read back from the model's parameters where a parameter has the
tensor's own name (a weights-level check; the engine-level check is the adapter's
``check_tables``, which compares the engine's own logits with the table).

This module must import without vLLM (it is imported by name in vLLM's worker process).
"""

from __future__ import annotations

from typing import Any


def _changed_tensors(old_file: str | None, new_file: str) -> dict:
    """{name: tensor} of ``new_file`` whose value differs from ``old_file``'s (all when no old file)."""
    import torch
    from safetensors.torch import load_file

    new = load_file(new_file)
    if not old_file:
        return new
    old = load_file(old_file)
    return {k: v for k, v in new.items() if k not in old or old[k].shape != v.shape or not torch.equal(old[k], v)}


def _touched_modules(model, before: dict) -> list:
    """Modules with a parameter whose value changed since ``before`` ({name: clone})."""
    import torch

    changed = set()
    for name, p in model.named_parameters():
        b = before.get(name)
        if b is None or b.shape != p.shape or not torch.equal(b, p.detach()):
            changed.add(name.rsplit(".", 1)[0])
    return [m for n, m in model.named_modules() if n in changed]


def _load(model, tensors: dict) -> dict[str, Any]:
    """Load ``tensors`` into ``model`` (vLLM's load_weights), re-process touched layers,
    read back what has a parameter of its own name."""
    import torch

    params = dict(model.named_parameters())
    before = {n: p.detach().clone() for n, p in params.items() if p.numel() <= 1 << 22}
    with torch.no_grad():
        try:
            model.load_weights(iter(tensors.items()))
        except Exception as exc:  # noqa: BLE001 - e.g. a weight vLLM dropped after packing it
            return {"error": f"load_weights raised {type(exc).__name__}: {str(exc)[:300]}"}
        for module in _touched_modules(model, before):
            qm = getattr(module, "quant_method", None)
            if qm is not None and hasattr(qm, "process_weights_after_loading"):
                qm.process_weights_after_loading(module)
    read, bad = 0, []
    params = dict(model.named_parameters())
    for name, t in tensors.items():
        p = params.get(name)
        if p is None or p.ndim != t.ndim or p.numel() == 0:
            continue
        rows = min(int(p.shape[0]), int(t.shape[0]))
        got = p.detach()[:rows].to("cpu", torch.float32)
        want = t[:rows].to(p.dtype).to(torch.float32)
        read += 1
        if got.shape != want.shape or not torch.equal(got, want):
            bad.append(name)
    return {"loaded": sorted(tensors), "read_back": read, "mismatched": bad}


def _unshare(draft, target, names) -> list[str]:
    """Give the draft its own copy of every parameter it shares with the target (vLLM shares
    the target's ``lm_head`` with an EAGLE head whose lm_head was identical at start,
    ``_maybe_share_lm_head``) that one of ``names`` (tensors about to be loaded) writes:
    loading a new head in place must not change the target, and a fresh start with a
    different head keeps separate weights too. Returns what was unshared; raises
    ValueError for a shared parameter outside a module that can be copied."""
    target_ptrs = {p.data_ptr() for p in target.parameters()}
    out = []
    for pname, p in list(draft.named_parameters()):
        if p.data_ptr() not in target_ptrs:
            continue
        if not any(pname == n or pname.endswith("." + n) or n.endswith("." + pname) for n in names):
            continue
        mod_name = pname.rsplit(".", 1)[0] if "." in pname else ""
        parent_name, _, attr = mod_name.rpartition(".")
        parent = draft.get_submodule(parent_name) if parent_name else draft
        if not attr or not hasattr(parent, attr):
            raise ValueError(f"the draft shares {pname} with the target")
        setattr(parent, attr, _own_copy(getattr(parent, attr)))
        out.append(pname)
    return out


def _own_copy(module):
    """``module`` with its own copies of its parameters and buffers. A parameter keeps its
    attributes (vLLM's ``weight_loader``, which pads the vocabulary rows; deepcopy drops them)."""
    import copy

    import torch

    new = copy.copy(module)  # the same attributes, the same submodules
    new._parameters = {}
    for k, v in module._parameters.items():
        if v is None:
            new._parameters[k] = None
            continue
        q = torch.nn.Parameter(v.detach().clone(), requires_grad=v.requires_grad)
        q.__dict__.update(v.__dict__)
        new._parameters[k] = q
    new._buffers = {k: (None if b is None else b.clone()) for k, b in module._buffers.items()}
    return new


def _draft_model(runner):
    """The drafter's model: Model Runner V1 ``drafter.model``, V2 ``speculator.model``."""
    for attr in ("drafter", "speculator"):
        d = getattr(runner, attr, None)
        m = getattr(d, "model", None) if d is not None else None
        if m is not None:
            return m
    return None


class TableSwapExtension:
    """Worker methods for specfuzz's table swaps (mixed into vLLM's worker)."""

    def specfuzz_load_tables(self, target: tuple[str | None, str] | None, draft: tuple[str | None, str] | None) -> dict:
        """Load new table checkpoints in place. ``target`` / ``draft``: (the running
        checkpoint's weights file, the new one) or None to leave that model alone.
        Returns {"target": report, "draft": report} or {"error": why}."""
        runner = self.model_runner  # type: ignore[attr-defined]
        out: dict[str, Any] = {}
        if target is not None:
            model = runner.get_model()
            out["target"] = _load(model, _changed_tensors(*target))
            if "error" in out["target"]:
                return {"error": "target: " + out["target"]["error"]}
        if draft is not None:
            model = _draft_model(runner)
            if model is None:
                return {"error": "this engine's drafter has no model to load (no draft model or head)"}
            tensors = _changed_tensors(*draft)
            try:
                unshared = _unshare(model, runner.get_model(), list(tensors))
            except ValueError as exc:
                return {"error": f"draft: {exc}: loading it in place would change the target"}
            out["draft"] = _load(model, tensors)
            if "error" in out["draft"]:
                return {"error": "draft: " + out["draft"]["error"]}
            out["draft"]["unshared"] = unshared
        return out
