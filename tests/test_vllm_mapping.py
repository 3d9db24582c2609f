"""The vLLM adapter's pure mapping, without starting vLLM: every start shape and case family a
campaign draws from vLLM's capabilities is one the adapter takes (a case it refuses costs a
Hypothesis example, a refused start shape a whole search), vLLM's own ``SamplingParams``
accepts what the adapter builds, and an engine-default variant sends only the knobs a user
must give (issue 13: "no pinned knobs the engine does not pin").

The same check for SGLang is tests/test_engine_sglang.py
(test_every_case_the_campaign_draws_for_sglang_passes_the_adapters_own_checks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specfuzz.engines.base import EngineConfig, Request
from specfuzz.engines.vllm_engine import NGRAM_DEFAULT_WINDOW, VLLMEngine, sampling_kwargs
from specfuzz.errors import InvalidInput
from specfuzz.fuzz.run import max_model_len
from specfuzz.oracle.params import SamplingParams as SP
from specfuzz.strategies import case_families, start_shapes


def _checkpoint(root: Path, name: str, vocab_size: int) -> Path:
    """A checkpoint folder as check_config reads it (its config.json)."""
    d = root / name
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({"vocab_size": vocab_size}))
    return d


@pytest.mark.parametrize("engine_default", [False, True])
def test_every_case_the_campaign_draws_for_vllm_is_taken_by_the_adapter_and_by_vllm(tmp_path, engine_default, monkeypatch):
    monkeypatch.delenv("SPECFUZZ_VLLM_SETTINGS", raising=False)
    try:
        from vllm import SamplingParams as VSP
    except ImportError:  # the mapping is still checked; vLLM's own validation needs vLLM
        VSP = None
    eng = VLLMEngine()
    caps = eng.capabilities()
    defaults = dict(caps.spec_defaults)
    methods = tuple(m for m in caps.methods if not engine_default or m in defaults)
    seen: set = set()

    @st.composite
    def families(draw):
        method = draw(st.sampled_from(methods + ((None,) if not engine_default else ())))
        if method is None:  # speculation off (`--method none`, and every calibration run)
            shape = draw(start_shapes(speculation=False, max_vocab=6, min_vocab=dict(caps.min_vocab)))
        else:
            shape = draw(start_shapes(methods=(method,), draft_vocab=caps.draft_vocab, spec_knobs=dict(caps.spec_knobs),
                                      spec_defaults=defaults, engine_default=engine_default, max_vocab=6, max_k=5,
                                      min_vocab=dict(caps.min_vocab)))
        speculating = shape.spec is not None
        fam = draw(case_families(max_patterns=6, shape=shape, max_tokens=4, sampling=caps.honoured(speculating),
                                 min_tokens_speculating=1 if caps.speculates_first_token else 2,
                                 exclusive=tuple(caps.sampling_exclusive or ())))
        return shape, fam

    @settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(families())
    def check(drawn):
        shape, fam = drawn
        spec, V = shape.spec, shape.vocab_size
        limit = max_model_len(max(len(c.prompt) + c.params.max_tokens for c in fam))
        target = _checkpoint(tmp_path, f"target-{V}", V)
        draft = _checkpoint(tmp_path, f"draft-{V}", V) if spec is not None and spec.uses_draft_model else None
        out = eng.check_config(EngineConfig(target, draft, spec, "float32", limit))
        if spec is None:
            assert out == {}
        else:
            k = spec.num_speculative_tokens
            if engine_default:
                # What the oracle assumes of the default is what vLLM's defaults are...
                assert all(getattr(spec, f) == v for f, v in defaults[spec.method].items()), (spec, defaults[spec.method])
                # ...and only the required knobs go to vLLM: the rest are vLLM's own.
                required = {"num_speculative_tokens": k}
                if spec.method != "draft_model":  # vLLM infers draft_model from a plain model path
                    required["method"] = spec.method
                if draft is not None:
                    required["model"] = str(draft)
                assert out == required, (spec, out)
            else:
                assert out["method"] == spec.method and out["num_speculative_tokens"] == k
                if spec.method == "ngram":
                    assert (out["prompt_lookup_min"], out["prompt_lookup_max"]) == (spec.ngram_min, spec.ngram_max)
                else:
                    sampled = "probabilistic" if spec.draft_sampling == "sampled" else "greedy"
                    assert out["model"] == str(draft) and out["draft_sample_method"] == sampled
                assert out.get("rejection_sample_method", "standard") == (
                    "block" if spec.verify == "block" else "standard")
        for c in fam:
            kw = sampling_kwargs(Request(c.prompt, c.params, seed=1), vocab_size=V, max_model_len=limit,
                                 speculating=spec is not None, sampling=caps.sampling)
            if VSP is not None:
                kw.pop("bad_words_token_ids", None)
                kw.pop("structured_outputs", None)
                VSP(**kw)  # vLLM's own checks (its __post_init__ raises on what it refuses)
        seen.add((spec.method if spec is not None else None))

    check()
    assert set(methods) <= seen  # every method was drawn (and taken)
    assert engine_default or None in seen


def test_the_default_ngram_window_is_vllms():
    """The engine-default n-gram variant's window (the oracle's) is what vLLM sets when a user
    gives neither prompt_lookup_min nor prompt_lookup_max."""
    assert VLLMEngine.spec_defaults()["ngram"]["ngram_min"] == VLLMEngine.spec_defaults()["ngram"]["ngram_max"] == NGRAM_DEFAULT_WINDOW
    speculative = pytest.importorskip("vllm.config.speculative")
    import inspect

    src = inspect.getsource(speculative.SpeculativeConfig)
    # vLLM 0.25-0.32 (__post_init__): both unset -> both NGRAM_DEFAULT_WINDOW.
    assert f"self.prompt_lookup_min = {NGRAM_DEFAULT_WINDOW}" in src and f"self.prompt_lookup_max = {NGRAM_DEFAULT_WINDOW}" in src


@pytest.mark.parametrize(("params", "speculating", "needle"), [
    (SP(min_p=0.1), True, "min_p=0.1"),
    (SP(logit_bias={1: 2.0}), True, "logit_bias"),
    (SP(temperature=2.5), False, "temperature=2.5"),
    (SP(max_tokens=60), False, "max_tokens=60"),
    (SP(regex="a"), False, "regex='a'"),
])
def test_requests_vllm_cannot_run_are_refused_naming_the_value(params, speculating, needle):
    # regex: the engine runs without a tokenizer (sampling lacks it).
    sampling = frozenset({"temperature"}) if params.regex else VLLMEngine().capabilities().sampling
    with pytest.raises(InvalidInput, match=needle.replace("(", r"\(").replace(".", r"\.")):
        sampling_kwargs(Request((0, 1), params), vocab_size=3, max_model_len=32, speculating=speculating, sampling=sampling)
