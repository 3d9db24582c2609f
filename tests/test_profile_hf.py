"""The "hf" semantics profile equals HF transformers' own logits processors.

Independent check: for random table rows and random options, HF's processor list is
built by HF itself (``GenerationMixin._prepare_generation_config`` +
``_prepare_special_tokens`` + ``_get_logits_processor``, exactly as ``generate()`` does,
from a hand-written :class:`transformers.GenerationConfig`), applied to the float32
row, and turned into a next-token law the way ``_sample`` does (softmax, or argmax when
``do_sample=False``). The profile's conditional must agree to 1e-6 everywhere.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from specfuzz.errors import AmbiguousSemantics, InvalidInput  # noqa: E402
from specfuzz.oracle.law import TargetLaw  # noqa: E402
from specfuzz.oracle.params import SamplingParams  # noqa: E402
from specfuzz.oracle.semantics import PROFILES, HFProfile, get_profile  # noqa: E402

transformers.logging.set_verbosity_error()

ATOL = 1e-6
N_RANDOM_CASES = 400
# Random cases whose law is ambiguous (ties at a top-p cut, ...) are skipped; at least
# this fraction must be checked.
MIN_CHECKED_FRACTION = 0.8


@pytest.fixture(scope="module")
def hf_model():
    """A tiny Llama: only its generation machinery is used (weights never run)."""
    cfg = transformers.LlamaConfig(
        vocab_size=16, hidden_size=16, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=1, num_key_value_heads=1, head_dim=16,
    )
    model = transformers.LlamaForCausalLM(cfg)
    model.generation_config = transformers.GenerationConfig()  # nothing injected from a checkpoint
    return model


def hf_next_token_law(model, row: np.ndarray, prompt, out, gen_kwargs: dict) -> np.ndarray:
    """HF's next-token law [V] for the float32 logits ``row`` [V] after ``prompt + out``."""
    V = row.shape[0]
    model.config.vocab_size = V
    gc, _ = model._prepare_generation_config(transformers.GenerationConfig(**gen_kwargs))
    model._prepare_special_tokens(gc, kwargs_has_attention_mask=False, device="cpu", batch_size=1)
    procs = model._get_logits_processor(
        generation_config=gc, input_ids_seq_length=len(prompt), encoder_input_ids=None,
        prefix_allowed_tokens_fn=None, logits_processor=transformers.LogitsProcessorList(), device="cpu",
        model_kwargs={},
    )
    ids = torch.tensor([list(prompt) + list(out)], dtype=torch.long)  # [1, P+t]
    scores = procs(ids, torch.from_numpy(row.astype(np.float32))[None].clone())  # [1, V]
    if gc.do_sample:
        return torch.softmax(scores, dim=-1)[0].double().numpy()
    law = np.zeros(V)
    law[int(torch.argmax(scores, dim=-1)[0])] = 1.0
    return law


def gen_kwargs_for(params: SamplingParams, eos: int | None, V: int) -> dict:
    """The generate() options for ``params``, written from HF's documentation (not the adapter)."""
    stops = ([eos] if eos is not None and not params.ignore_eos else []) + list(params.stop_token_ids)
    kw: dict = {
        "do_sample": not params.greedy,
        "temperature": 1.0 if params.greedy else float(params.temperature),
        "top_k": params.top_k if params.top_k >= 1 else 0,
        "top_p": float(params.top_p),
        "min_p": float(params.min_p) if params.min_p > 0 else None,
        "repetition_penalty": float(params.repetition_penalty),
        "min_new_tokens": params.min_tokens or None,
        "max_new_tokens": params.max_tokens,
        "eos_token_id": stops or None,
        "pad_token_id": stops[0] if stops else None,
    }
    if params.bad_words:
        kw["bad_words_ids"] = [list(w) for w in params.bad_words]
    if params.logit_bias:
        kw["sequence_bias"] = {(int(t),): float(b) for t, b in params.logit_bias.items()}
    if params.allowed_token_ids is not None:
        others = sorted(set(range(V)) - set(params.allowed_token_ids))
        kw["suppress_tokens"] = others or None
    return kw


def random_case(rng: np.random.Generator):
    V = int(rng.integers(3, 9))
    table = (rng.standard_normal((V, V)) * rng.choice([0.5, 2.0, 4.0])).astype(np.float32)  # [V, V]
    if rng.random() < 0.3:
        table[rng.random((V, V)) < 0.2] = -np.inf
        table[np.arange(V), rng.integers(0, V, V)] = rng.standard_normal(V).astype(np.float32)  # one finite per row
    eos = int(rng.integers(0, V)) if rng.random() < 0.8 else None
    prompt = tuple(int(x) for x in rng.integers(0, V, int(rng.integers(1, 5))))
    t = int(rng.integers(0, 4))
    out = tuple(int(x) for x in rng.integers(0, V, t))
    greedy = rng.random() < 0.15
    kw: dict = {"max_tokens": 6}
    kw["temperature"] = 0.0 if greedy else float(rng.choice([1.0, 0.5, 0.7, 1.5, 2.0]))
    if rng.random() < 0.4:
        kw["top_k"] = int(rng.integers(1, V + 1))
    if rng.random() < 0.4:
        kw["top_p"] = float(rng.choice([0.3, 0.5, 0.75, 0.9, 0.95]))
    if rng.random() < 0.4:
        kw["min_p"] = float(rng.choice([0.05, 0.1, 0.2, 0.5]))
    if rng.random() < 0.4:
        kw["repetition_penalty"] = float(rng.choice([0.5, 0.8, 1.3, 2.0]))
    if rng.random() < 0.3:
        kw["logit_bias"] = {int(rng.integers(0, V)): float(rng.choice([-3.0, -1.0, 1.5, 4.0])) for _ in range(2)}
    if rng.random() < 0.4:
        words = []
        for _ in range(int(rng.integers(1, 4))):
            words.append(tuple(int(x) for x in rng.integers(0, V, int(rng.integers(1, 4)))))
        kw["bad_words"] = tuple(words)
    if rng.random() < 0.3:
        kw["stop_token_ids"] = tuple(sorted({int(x) for x in rng.integers(0, V, 2)}))
    if rng.random() < 0.4:
        kw["min_tokens"] = int(rng.integers(1, 5))
    if rng.random() < 0.2:
        kw["ignore_eos"] = True
    if rng.random() < 0.2:
        kw["allowed_token_ids"] = tuple(sorted({int(x) for x in rng.integers(0, V, int(rng.integers(1, V)))}))
    return table, eos, prompt, out, SamplingParams(**kw)


def test_hf_profile_is_registered():
    assert PROFILES["hf"] is HFProfile
    assert get_profile("hf").name == "hf"


def test_hf_profile_equals_hf_logits_processors_on_random_rows(hf_model):
    rng = np.random.default_rng(20261129)
    checked = skipped = 0
    for i in range(N_RANDOM_CASES):
        table, eos, prompt, out, params = random_case(rng)
        law = TargetLaw(table, prompt, params, eos_token_id=eos, profile="hf")
        try:
            mine = law.conditional(out)  # [V]
        except AmbiguousSemantics:
            skipped += 1
            continue
        row = table[(prompt + out)[-1]]  # [V]
        theirs = hf_next_token_law(hf_model, row, prompt, out, gen_kwargs_for(params, eos, table.shape[0]))
        assert np.abs(mine - theirs).max() <= ATOL, (
            f"case {i}: params={params} eos={eos} prompt={prompt} out={out}\nrow={row}\nhf profile={mine}\nHF        ={theirs}"
        )
        checked += 1
    assert checked >= MIN_CHECKED_FRACTION * N_RANDOM_CASES, (checked, skipped)


# Hand-picked rows where the hf and vllm orders give different laws, each checked against HF.
def _row_case(row, prompt, out, **kw):
    V = len(row)
    table = np.tile(np.asarray(row, dtype=np.float32), (V, 1))  # every row the same: L[last] = row
    return table, prompt, out, SamplingParams(max_tokens=6, **kw)


DIFFERS_FROM_VLLM = {
    # p = (.5, .25, .12, .08, .05), top_p=0.6, min_p=0.3. vLLM: min-p keeps {0, 1}, then
    # top-p on (2/3, 1/3) keeps {0}. HF: top-p on p keeps {0, 1}, then min-p keeps both.
    "min_p_after_top_p": (_row_case(np.log([0.5, 0.25, 0.12, 0.08, 0.05]), (1,), (), top_p=0.6, min_p=0.3), None),
    # A bad word whose prefix is the prompt's last token: HF masks, vLLM (output only) does not.
    "bad_word_prefix_in_prompt": (_row_case([1.0, 0.5, 0.0, -1.0], (2,), (), bad_words=((2, 0),)), None),
    # A one-token bad word equal to EOS is dropped by HF; vLLM masks EOS.
    "bad_word_eos_dropped": (_row_case([1.0, 0.5, 0.0, -1.0], (1,), (), bad_words=((3,),)), 3),
}


@pytest.mark.parametrize("name", sorted(DIFFERS_FROM_VLLM))
def test_hf_profile_differs_from_vllm_where_hf_does_and_matches_hf(hf_model, name):
    (table, prompt, out, params), eos = DIFFERS_FROM_VLLM[name]
    hf = TargetLaw(table, prompt, params, eos_token_id=eos, profile="hf").conditional(out)
    vllm = TargetLaw(table, prompt, params, eos_token_id=eos, profile="vllm").conditional(out)
    theirs = hf_next_token_law(hf_model, table[0], prompt, out, gen_kwargs_for(params, eos, table.shape[0]))
    assert np.abs(hf - theirs).max() <= ATOL
    assert np.abs(hf - vllm).max() > 1e-3, "the example must separate the two profiles"


@pytest.mark.parametrize(
    "field,value",
    [("frequency_penalty", 0.5), ("presence_penalty", -1.0), ("regex", "a+"), ("choice", ("ab",))],
)
def test_hf_profile_rejects_options_hf_does_not_have(field, value):
    table = np.zeros((4, 4), np.float32)
    law = TargetLaw(table, (0,), SamplingParams(**{field: value}), eos_token_id=3, profile="hf")
    with pytest.raises(InvalidInput, match=field):
        law.conditional(())


def test_hf_profile_rejects_thinking_budget():
    law = TargetLaw(np.zeros((4, 4), np.float32), (0,), SamplingParams(thinking_budget=1, think_end_token_id=2),
                    eos_token_id=3, profile="hf")
    with pytest.raises(InvalidInput, match="thinking_budget"):
        law.enumerate()


def test_hf_profile_laws_sum_to_one_and_enumerate():
    rng = np.random.default_rng(7)
    for _ in range(50):
        table, eos, prompt, _, params = random_case(rng)
        try:
            mu = TargetLaw(table, prompt, params, eos_token_id=eos, profile="hf").enumerate()
        except AmbiguousSemantics:
            continue
        assert abs(mu.total - 1.0) < 1e-9


def test_hf_profile_stale_min_tokens_view_unmasks_eos_early():
    """A stale min_tokens processor (N2-style lag) sees a shorter output and unmasks EOS sooner."""
    table = np.zeros((3, 3), np.float32)
    params = SamplingParams(min_tokens=2, max_tokens=4)
    law = TargetLaw(table, (0,), params, eos_token_id=2, profile="hf")
    assert law.conditional((1,))[2] == 0.0
    assert law.conditional((1, 1))[2] > 0.0
    assert law.conditional((1,), stale={"min_tokens": 1})[2] == 0.0
    assert law.conditional((1, 1, 1), stale={"min_tokens": 2})[2] == 0.0
    # HF has no thinking budget: a stale thinking view changes nothing.
    assert np.array_equal(law.conditional((1, 1), stale={"thinking": 1}), law.conditional((1, 1)))
    with pytest.raises(InvalidInput):
        law.conditional((1,), stale={"sampler": 1})
