"""mlx-lm (real, MLX's CPU backend) through MLXEngine, judged against the exact law μ.

The "mlx" profile's steps are checked against mlx-lm's own sampler and processor functions
on the same rows; with speculation off the engine must agree with μ under that profile;
speculation on, plain sampling must stay lossless, while the penalties' history is a stored
finding (the prompt but its last token is left out of it: the law sampled is exactly that). Tables swap into the running
models and are checked row by row; a checkpoint that is not a table model, a request whose
mlx process dies or raises, and a broken acceptance rule are a crash, a crash and a failed
verdict, never a wrong pass.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")
pytest.importorskip("mlx_lm")

from specfuzz.case import Case  # noqa: E402
from specfuzz.engines.base import EngineConfig, Request  # noqa: E402
from specfuzz.engines.checkpoints import materialize  # noqa: E402
from specfuzz.engines.isolation import IsolatedEngine  # noqa: E402
from specfuzz.engines.mlx_engine import MLXEngine, proposed_drafts, sampling_args, stop_ids  # noqa: E402
from specfuzz.errors import InvalidInput  # noqa: E402
from specfuzz.fuzz.corpus import Entry  # noqa: E402
from specfuzz.fuzz.draft import draft_entry  # noqa: E402
from specfuzz.fuzz.run import engine_config, run_case, run_family  # noqa: E402
from specfuzz.oracle.params import SamplingParams as SP  # noqa: E402
from specfuzz.oracle.semantics_mlx import CONTEXT_SIZE, mlx_penalties, mlx_random_probs, window_counts  # noqa: E402
from specfuzz.oracle.speculative import SpecConfig  # noqa: E402

ALPHA = 1e-3
EOS = 4
# The stored finding: speculation leaves the prompt (but its last token) out of the penalties' history.
FINDING_PENALTY_HISTORY = "corpus/finding-58fd21cee33daacf.json"

_rng = np.random.default_rng(11)
T = _rng.integers(-8, 9, size=(5, 5)) / 4.0  # [5, 5] target, multiples of 1/4 (exact)
U = _rng.integers(-8, 9, size=(5, 5)) / 4.0  # [5, 5] an unrelated draft
LONG = tuple(int(t) for t in _rng.integers(0, 5, size=CONTEXT_SIZE + 6))  # a prompt longer than the penalty window


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("mlx")


# ----------------------------------------------------------------------------- the profile vs mlx-lm's functions


def _kept(x: np.ndarray) -> np.ndarray:
    return np.isfinite(x)


@pytest.mark.parametrize("top_p,min_p,top_k", [(0.7, 0.0, 0), (0.5, 0.0, 0), (0.9, 0.2, 0), (1.0, 0.05, 2), (0.7, 0.0, 3)])
def test_profile_truncations_keep_what_mlx_lm_keeps(top_p, min_p, top_k):
    """The profile's top-p / min-p / top-k (on the temperature-1 law) keep exactly the tokens
    mlx-lm's apply_top_p / apply_min_p / apply_top_k keep, on 200 random rows with ties."""
    from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

    rng = np.random.default_rng(3)
    rows = rng.integers(-12, 13, size=(200, 6)) / 4.0  # [200, 6] ties are common
    rows[rows[:, 0] < -2.5, 1] = -np.inf  # some masked tokens
    compared = 0
    for row in rows:
        lp = row - np.logaddexp.reduce(row[np.isfinite(row)])
        x = mx.array(lp[None, :].astype(np.float32))
        if 0 < top_p < 1:
            x = apply_top_p(x, top_p)
        if min_p > 0:
            x = apply_min_p(x, min_p)
        if top_k > 0:
            # argpartition keeps an unspecified one of tokens tied at the k-th value: the profile
            # calls that ambiguous, so only rows without such a tie are compared.
            finite = np.sort(np.array(x)[0])[::-1]
            if np.isfinite(finite[top_k - 1]) and top_k < len(finite) and finite[top_k] == finite[top_k - 1]:
                continue
            x = apply_top_k(x, top_k)
        try:
            probs = mlx_random_probs(row[None, :], 1.0, top_p, min_p, top_k)
        except Exception as exc:  # noqa: BLE001 - AmbiguousSemantics: a cut within float32 rounding
            assert "ambiguous" in type(exc).__name__.lower() or "within" in str(exc)
            continue
        assert (_kept(np.array(x)[0]) == (probs[0] > 0)).all(), (row, top_p, min_p, top_k)
        compared += 1
    assert compared > 120


def test_profile_penalties_equal_mlx_lm_processors_over_the_window():
    """Repetition, presence and frequency on the last 20 tokens of prompt + output, as
    make_logits_processors applies them (a history longer than the window included)."""
    from mlx_lm.sample_utils import make_logits_processors

    rng = np.random.default_rng(4)
    logits = rng.integers(-8, 9, size=(1, 6)) / 4.0  # [1, 6]
    for hist_len in (3, CONTEXT_SIZE, CONTEXT_SIZE + 7):
        hist = rng.integers(0, 6, size=hist_len)
        prompt, out = tuple(int(t) for t in hist[:-2]), hist[None, -2:]
        counts = window_counts(prompt, out, 6)
        want = mlx_penalties(logits, counts, 1.5, 0.5, -0.5)
        procs = make_logits_processors(repetition_penalty=1.5, presence_penalty=0.5, frequency_penalty=-0.5)
        got = mx.array(logits.astype(np.float32))
        for p in procs:
            got = p(mx.array(hist), got)
        np.testing.assert_allclose(np.array(got), want, rtol=0, atol=1e-6)


def test_sampling_args_map_to_mlx_lm_options():
    s, p = sampling_args(SP(temperature=0.0, top_k=5, max_tokens=2), 5)
    assert s == {"temp": 0.0, "top_p": 1.0, "min_p": 0.0, "top_k": 0} and p == {}  # greedy; k >= V is off
    s, p = sampling_args(SP(temperature=0.5, top_k=2, top_p=0.7, min_p=0.05, logit_bias={1: -1.0},
                            repetition_penalty=0.8, presence_penalty=0.5, max_tokens=2), 5)
    assert s == {"temp": 0.5, "top_p": 0.7, "min_p": 0.05, "top_k": 2}
    assert p == {"logit_bias": {1: -1.0}, "repetition_penalty": 0.8, "presence_penalty": 0.5}
    assert stop_ids(SP(stop_token_ids=(1,), max_tokens=2), 4) == {1, 4}
    assert stop_ids(SP(stop_token_ids=(1,), ignore_eos=True, max_tokens=2), 4) == {1}
    for params, name in ((SP(min_tokens=1, max_tokens=2), "min_tokens"), (SP(allowed_token_ids=(0,)), "allowed_token_ids"),
                         (SP(bad_words=((1,),)), "bad_words")):
        with pytest.raises(InvalidInput, match=name):
            sampling_args(params, 5)


def test_proposed_drafts_replay_the_rounds():
    # K=2, max 4: round 1 accepts both drafts + the target's token, round 2 proposes min(1, 2) = 1.
    assert proposed_drafts([True, True, False, True], 4, 2) == 3
    # A rejection at once each round: every round proposes K and emits one token.
    assert proposed_drafts([False, False, False], 3, 3) == 3 + 2 + 1
    assert proposed_drafts([], 3, 2) == 0


@pytest.mark.parametrize("change,needle", [
    ({"dtype": "bfloat16"}, "dtype"),
    ({"speculation": SpecConfig("ngram", 2)}, "speculation method"),
    ({"speculation": SpecConfig("draft_model", 2, draft_sampling="greedy")}, "draft_sampling"),
    ({"speculation": SpecConfig("draft_model", 2, verify="block")}, "verify"),
    ({"settings": {"threads": 2}}, "setting"),
    ({"settings": {"prefill_step_size": 0}}, "prefill_step_size"),
])
def test_bad_config_raises_invalid_input_naming_the_value_before_loading(root, change, needle):
    case = Case(T, (0, 1), SP(max_tokens=2), eos_token_id=EOS, spec=SpecConfig("draft_model", 2), draft_table=U)
    ck = materialize(case, root)
    cfg = {"target_dir": ck.target_dir, "draft_dir": ck.draft_dir, "speculation": SpecConfig("draft_model", 2), **change}
    with pytest.raises(InvalidInput, match=needle):
        MLXEngine().validate(EngineConfig(**cfg))


def test_a_wider_draft_is_refused(root):
    wide = _rng.integers(-8, 9, size=(6, 6)) / 4.0  # [6, 6]: a token the target lacks
    ck = materialize(Case(T, (0,), SP(max_tokens=2), spec=SpecConfig("draft_model", 2), draft_table=wide), root)
    with pytest.raises(InvalidInput, match="draft vocab_size"):
        MLXEngine().validate(EngineConfig(ck.target_dir, ck.draft_dir, SpecConfig("draft_model", 2)))


def test_a_config_without_the_rope_theta_mlx_lm_reads_is_refused(root):
    """mlx-lm takes RoPE's base from config.json's top-level rope_theta only: a checkpoint with
    transformers 5's rope_parameters alone would run another network (default base 10,000)."""
    import json

    ck = materialize(Case(T, (0,), SP(max_tokens=2), spec=SpecConfig("draft_model", 2), draft_table=U), root)
    MLXEngine().validate(EngineConfig(ck.target_dir, ck.draft_dir, SpecConfig("draft_model", 2)))  # tablegen writes both
    for d, name in ((ck.draft_dir, "draft_dir"), (ck.target_dir, "target_dir")):
        cfg = json.loads((Path(d) / "config.json").read_text())
        del cfg["rope_theta"]
        (Path(d) / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(InvalidInput, match=f"{name} config.json rope_theta"):
            MLXEngine().validate(EngineConfig(ck.target_dir, ck.draft_dir, SpecConfig("draft_model", 2)))


# ----------------------------------------------------------------------------- the engine


OFF_PATTERNS = {
    "temperature 0.5 + top_p 0.7": SP(temperature=0.5, top_p=0.7, max_tokens=3),
    "temperature 2 + min_p 0.2 + top_k 3": SP(temperature=2.0, min_p=0.2, top_k=3, max_tokens=3),
    "penalties over a window": SP(repetition_penalty=1.5, presence_penalty=0.5, frequency_penalty=-0.5, max_tokens=3),
    "bias, stop token, ignore_eos": SP(logit_bias={2: 1.0}, stop_token_ids=(1,), ignore_eos=True, max_tokens=3),
}


@pytest.mark.slow
def test_speculation_off_samples_from_mu_under_the_mlx_profile(root):
    """One engine, the patterns mixed in each batch; the penalties' pattern has a prompt longer
    than the window. A bug in the profile or in mlx-lm's sampling shows here first."""
    cases = [Case(T, LONG if "window" in n else (0, 1, 2), p, eos_token_id=EOS) for n, p in OFF_PATTERNS.items()]
    cases.append(Case(T, (3,), SP(temperature=0.0, max_tokens=4), eos_token_id=EOS))  # greedy from a row without ties
    with IsolatedEngine("mlx", log_dir=root / "logs") as eng:
        runs = run_family(eng, cases, ckpt_root=root, alphas=[ALPHA / len(cases)] * len(cases), max_samples=600, batch=1000,
                          speculation=False, profile="mlx")
    for name, r in zip(list(OFF_PATTERNS) + ["greedy"], runs):
        assert r.crash is None, r.crash
        assert r.judgement.verdict.status == "pass", (name, r.judgement.verdict.evidence, r.counts.most_common(5))


@pytest.mark.slow
@pytest.mark.parametrize("params,k", [(SP(top_p=0.9, max_tokens=3), 3), (SP(stop_token_ids=(2,), max_tokens=4), 2)])
def test_speculation_on_is_lossless_for_sampling_and_stopping(root, params, k):
    """mlx-lm keeps drafts up to the first that differs from the target's sample: the emitted
    token is always the target's sample, so the law is μ whatever the draft (here unrelated)."""
    case = Case(T, (0, 1), params, eos_token_id=EOS, spec=SpecConfig("draft_model", k), draft_table=U)
    with IsolatedEngine("mlx", log_dir=root / "logs") as eng:
        run = run_case(eng, case, ckpt_root=root, alpha=ALPHA, max_samples=500, batch=500, profile="mlx")
    assert run.crash is None and run.judgement.verdict.status == "pass", run.judgement.verdict.evidence
    assert 0 < run.accepted <= run.proposed  # drafts are proposed and some kept


@pytest.mark.slow
def test_speculation_samples_the_law_of_the_prompt_cut_to_its_last_token(root):
    """The stored finding (FINDING_PENALTY_HISTORY) and its mechanism, exactly: with a draft model
    mlx-lm samples not μ but μ of the same request whose prompt is only its last token (the
    history speculative_generate_step's processors get: its prefill does not add the prompt,
    generate_step's does since mlx-lm PR #1777), over several output tokens and all three
    penalties with a prompt longer than their window."""
    from specfuzz.oracle.judge import CaseTest, target_law_dict

    params = SP(repetition_penalty=1.5, presence_penalty=0.5, frequency_penalty=-0.5, max_tokens=3)
    case = Case(T, LONG, params, eos_token_id=EOS, spec=SpecConfig("draft_model", 2), draft_table=U)
    cut = case.with_(prompt=LONG[-1:])
    test = CaseTest(case, alpha=ALPHA, profile="mlx", with_bug_laws=False, law=cut.target_law("mlx"),
                    mu=target_law_dict(cut, profile="mlx"))
    with IsolatedEngine("mlx", log_dir=root / "logs") as eng:
        run = run_case(eng, case, ckpt_root=root, alpha=ALPHA, case_test=test, max_samples=500, batch=500, profile="mlx")
        whole = run_case(eng, case, ckpt_root=root, alpha=ALPHA, max_samples=300, batch=300, profile="mlx")
    assert run.judgement.verdict.status == "pass", run.judgement.verdict.evidence
    assert whole.judgement.verdict.status == "fail"  # and it is not μ of the whole prompt


@pytest.mark.slow
def test_tables_swap_into_the_running_models_and_are_checked(root):
    """Three target/draft pairs on one start: each swap is proven by the models' own logits, and
    greedy output follows the new target."""
    rng = np.random.default_rng(8)
    spec = SpecConfig("draft_model", 2)
    with IsolatedEngine("mlx", log_dir=root / "logs") as eng:
        for _ in range(3):
            t = rng.integers(-8, 9, size=(5, 5)) / 4.0
            t[np.arange(5), rng.integers(0, 5, size=5)] = 4.0  # a unique maximum per row
            case = Case(t, (0,), SP(temperature=0.0, max_tokens=4), spec=spec, draft_table=rng.integers(-8, 9, size=(5, 5)) / 4.0)
            eng.start(engine_config(case, root / "swaps"))
            out = eng.generate([Request(case.prompt, case.params, 1)])[0].token_ids
            path, last = [], 0
            for _ in range(4):
                last = int(np.argmax(t[last]))
                path.append(last)
            assert out == tuple(path)
        assert (eng.starts, eng.swaps, eng.swap_fallbacks) == (1, 2, 0)


@pytest.mark.slow
def test_a_checkpoint_that_is_not_a_table_model_is_a_crash_not_a_verdict(root):
    from safetensors.numpy import load_file, save_file

    case = Case(T, (0,), SP(max_tokens=2), eos_token_id=EOS)
    ck = materialize(case, root / "broken")
    w = load_file(str(ck.target_dir / "model.safetensors"))
    w["model.norm.weight"][1] *= 3.0  # the hidden state after token 1 is 3 e_1: its logits are 3 times the table's row
    save_file(w, str(ck.target_dir / "model.safetensors"), metadata={"format": "pt"})
    with IsolatedEngine("mlx", log_dir=root / "logs") as eng:
        run = run_case(eng, case, ckpt_root=root / "broken", alpha=ALPHA, max_samples=50, batch=50, speculation=False,
                       profile="mlx")
    assert run.judgement is None and run.crash is not None
    assert "do not reproduce the table checkpoint" in run.crash.detail and "rows [1]" in run.crash.detail
    bad = root / "not-mlx"
    bad.mkdir(exist_ok=True)
    (bad / "config.json").write_text(json.dumps({"model_type": "no-such-architecture", "vocab_size": 5}))
    with pytest.raises(InvalidInput, match="a checkpoint mlx-lm can load"):
        MLXEngine().start(EngineConfig(bad))


@pytest.mark.slow
@pytest.mark.parametrize("mode,kind", [("abort", "signal")])  # mode "raise": an exception, the same path as any engine's
def test_mlx_failing_mid_request_is_a_crash_not_a_verdict(root, mode, kind):
    case = Case(T, (0,), SP(max_tokens=3), eos_token_id=EOS, spec=SpecConfig("draft_model", 2), draft_table=U)
    with IsolatedEngine("mlx_engines:DyingMLX", {"mode": mode, "fail_at": 7}, log_dir=root / "logs") as eng:
        run = run_case(eng, case, ckpt_root=root, alpha=ALPHA, max_samples=100, batch=20, profile="mlx")
    assert run.judgement is None and run.crash is not None and run.crash.kind == kind, run.crash


@pytest.mark.slow
def test_a_broken_acceptance_rule_on_top_of_mlx_lm_is_found(root):
    """The power check: mlx-lm whose verification also keeps a draft equal to the target's argmax."""
    case = Case(T, (0, 1), SP(max_tokens=2), eos_token_id=EOS, spec=SpecConfig("draft_model", 2), draft_table=T)
    with IsolatedEngine("mlx_engines:ArgmaxAcceptMLX", log_dir=root / "logs") as eng:
        bad = run_case(eng, case, ckpt_root=root, alpha=ALPHA, max_samples=1500, batch=300, profile="mlx")
    assert bad.judgement.verdict.status == "fail", bad.judgement.verdict.evidence


@pytest.mark.slow
def test_the_stored_finding_drafts_a_repro_that_fails(tmp_path):
    """repro.py runs mlx-lm alone (no specfuzz import) and ends with FAIL; with
    --no-speculation it passes (run by hand: docs/engines/mlx.md)."""
    entry = Path(__file__).resolve().parents[1] / FINDING_PENALTY_HISTORY
    assert Entry.from_json(json.loads(entry.read_text())).engine["name"] == "mlx-lm"
    repro = draft_entry(entry, tmp_path / "draft").out_dir / "repro.py"
    assert "from specfuzz" not in repro.read_text()
    proc = subprocess.run([sys.executable, str(repro)], capture_output=True, text=True, timeout=300)
    assert proc.stdout.strip().splitlines()[-1] == "FAIL", proc.stdout[-2000:] + proc.stderr[-2000:]
