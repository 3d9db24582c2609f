"""llama.cpp (llama-server built by bin/setup) through LlamaCppEngine, judged against μ.

* The "llamacpp" profile equals llama-server's own sampler chain: for random tables and
  sampling options, the post-sampling probabilities the server reports at every step of an
  output (``post_sampling_probs``) equal the profile's conditional at that prefix.
* Speculation off and on (draft model, n-gram lookup) sample μ.
* A broken acceptance rule on top of the adapter (llama-server's own synthetic acceptance,
  ``--spec-synth-len``: drafts accepted at random) is found.
* Bad input: a GGUF that is not a table model, a missing server binary, a port already
  taken, a server that dies mid-request: clear errors or crashes, never a verdict.
"""

from __future__ import annotations

import socket
from pathlib import Path

import numpy as np
import pytest

from specfuzz.engines.llamacpp_build import find_server

if find_server() is None:  # pragma: no cover - bin/setup builds it
    pytest.skip("llama-server is not built (bin/setup builds it)", allow_module_level=True)

from specfuzz.case import Case  # noqa: E402
from specfuzz.engines.base import EngineConfig, Request  # noqa: E402
from specfuzz.engines.checkpoints import materialize  # noqa: E402
from specfuzz.engines.isolation import IsolatedEngine  # noqa: E402
from specfuzz.engines.llamacpp_engine import LlamaCppEngine, completion_body  # noqa: E402
from specfuzz.errors import AmbiguousSemantics, InvalidInput  # noqa: E402
from specfuzz.fuzz.run import run_case  # noqa: E402
from specfuzz.oracle.law import TargetLaw  # noqa: E402
from specfuzz.oracle.params import SamplingParams as SP  # noqa: E402
from specfuzz.oracle.speculative import SpecConfig  # noqa: E402

pytestmark = pytest.mark.slow

ALPHA = 1e-3
EOS = 4
_rng = np.random.default_rng(11)
T = np.round(_rng.standard_normal((5, 5)) * 1.5, 3).astype(np.float32)  # [5, 5] target
D = np.round(_rng.standard_normal((5, 5)) * 1.5, 3).astype(np.float32)  # [5, 5] unrelated draft
# Profile check: random options per case; ambiguous cases are skipped, most must be checked.
N_PROFILE_CASES = 120
MIN_CHECKED_FRACTION = 0.7
PROFILE_ATOL = 2e-6


def _config(tmp_path: Path, case: Case, **settings) -> EngineConfig:
    ck = materialize(case, tmp_path / "ckpt")
    return EngineConfig(target_dir=ck.target_dir, draft_dir=ck.draft_dir, speculation=case.spec, max_model_len=64,
                        settings=settings)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    eng = LlamaCppEngine(slots=4)
    root = tmp_path_factory.mktemp("llamacpp")
    eng.start(_config(root, Case(T, (1, 2), SP(max_tokens=4), eos_token_id=EOS)))
    yield eng
    eng.close()


def _random_params(rng, V: int, eos: int) -> SP:
    kw: dict = {"max_tokens": int(rng.integers(1, 5))}
    if rng.random() < 0.5:
        kw["temperature"] = float(rng.choice([0.0, 0.5, 1.0, 2.0]))
    if rng.random() < 0.4:
        kw["top_k"] = int(rng.integers(1, V + 1))
    if rng.random() < 0.4:
        kw["top_p"] = float(rng.choice([0.3, 0.6, 0.9]))
    if rng.random() < 0.4:
        kw["min_p"] = float(rng.choice([0.05, 0.2, 0.5]))
    if rng.random() < 0.3:
        kw["logit_bias"] = {int(rng.integers(0, V)): float(rng.choice([-2.0, 1.5, 3.0]))}
    if rng.random() < 0.3:
        kw["repetition_penalty"] = float(rng.choice([0.7, 1.3, 2.0]))
    if rng.random() < 0.3:
        kw["frequency_penalty"] = float(rng.choice([-0.5, 0.5, 1.0]))
    if rng.random() < 0.3:
        kw["presence_penalty"] = float(rng.choice([-1.0, 0.5, 1.5]))
    if rng.random() < 0.2:
        kw["ignore_eos"] = True
    return SP(**kw)


def test_profile_equals_the_servers_post_sampling_probabilities(engine):
    """At every step of sampled outputs, llama-server's post-sampling probabilities (the
    candidates its chain kept, normalised by its dist sampler) equal the profile's law."""
    V = T.shape[0]
    rng = np.random.default_rng(3)
    checked = steps = 0
    for i in range(N_PROFILE_CASES):
        params = _random_params(rng, V, EOS)
        prompt = tuple(int(x) for x in rng.integers(0, V, int(rng.integers(1, 6))))
        law = TargetLaw(T, prompt, params, eos_token_id=EOS, profile="llamacpp")
        body = completion_body(Request(prompt, params, seed=i), V)
        body.update(n_probs=V + 1, post_sampling_probs=True)
        out = engine._post("/completion", body)
        try:
            for t, step in enumerate(out["completion_probabilities"]):
                prefix = tuple(out["tokens"][:t])
                want = law.conditional(prefix)
                got = np.zeros(V + 1)
                for e in step["top_probs"]:
                    got[int(e["id"])] = float(e["prob"])
                assert got[V] == 0.0, "the pad token was kept"
                assert np.allclose(got[:V], want, atol=PROFILE_ATOL, rtol=0), (params, prompt, prefix, got, want)
                steps += 1
        except AmbiguousSemantics:
            continue
        checked += 1
    assert checked >= MIN_CHECKED_FRACTION * N_PROFILE_CASES and steps > checked


def test_start_reads_every_row_back_and_greedy_follows_the_table(engine):
    check = engine.check_tables()
    assert check.ok and check.rows == 5 and check.max_abs_diff < 1e-5, check
    outs = engine.generate([Request((0,), SP(temperature=0.0, max_tokens=4, ignore_eos=True))] * 3)
    path, last = [], 0
    for _ in range(4):
        row = T[last].copy()
        row[EOS] = -np.inf
        last = int(np.argmax(row))
        path.append(last)
    assert all(list(o.token_ids) == path for o in outs), (outs, path)


@pytest.mark.parametrize("spec", [None, SpecConfig("draft_model", 3, draft_sampling="greedy"),
                                  SpecConfig("ngram", 2, draft_sampling="greedy", ngram_max=1)],
                         ids=["off", "draft_model", "ngram"])
def test_samples_mu(tmp_path, spec):
    params = SP(max_tokens=4, temperature=0.8, top_p=0.9, repetition_penalty=1.3)
    case = Case(T, (1, 2, 1, 2), params, eos_token_id=EOS, spec=spec, draft_table=D if spec and spec.uses_draft_model else None)
    with IsolatedEngine("llamacpp", log_dir=tmp_path / "logs") as eng:
        run = run_case(eng, case, ckpt_root=tmp_path / "ckpt", alpha=ALPHA, max_samples=2000, batch=500,
                       speculation=spec is not None, profile="llamacpp")
    assert run.crash is None, run.crash
    assert run.judgement.verdict.status != "fail", run.judgement.verdict
    if spec is not None:
        assert run.proposed > 0, "the server never drafted"


def test_random_acceptance_on_top_of_the_adapter_is_found(tmp_path):
    """llama-server's synthetic acceptance (benchmarking: drafts accepted at random, not by
    agreement with the target) breaks the acceptance rule; the verdict must fail."""
    case = Case(T, (1, 2), SP(max_tokens=6, ignore_eos=True), eos_token_id=EOS,
                spec=SpecConfig("draft_model", 2, draft_sampling="greedy"), draft_table=D)
    with IsolatedEngine("example_engines:SynthAcceptLlamaCpp", log_dir=tmp_path / "logs") as eng:
        run = run_case(eng, case, ckpt_root=tmp_path / "ckpt", alpha=ALPHA, max_samples=2000, batch=500,
                       speculation=True, profile="llamacpp")
    assert run.crash is None and run.judgement.verdict.status == "fail", run.judgement.verdict


def test_bad_input_is_refused_by_name(tmp_path):
    case = Case(T, (1,), SP(max_tokens=2), eos_token_id=EOS)
    cfg = _config(tmp_path, case)
    with pytest.raises(InvalidInput, match="server="):
        LlamaCppEngine(server=str(tmp_path / "no-such-llama-server")).start(cfg)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        with pytest.raises(InvalidInput, match=f"port={port}"):
            LlamaCppEngine(port=port).start(cfg)
    from specfuzz.compare.models import embedded_gguf

    with pytest.raises(InvalidInput, match="table-model GGUF"):
        LlamaCppEngine().start(EngineConfig(target_dir=embedded_gguf()))
    with pytest.raises(InvalidInput, match="min_tokens"):
        completion_body(Request((1,), SP(max_tokens=2, min_tokens=1)), 5)
    with pytest.raises(InvalidInput, match="dtype"):
        LlamaCppEngine().start(EngineConfig(target_dir=cfg.target_dir, dtype="bfloat16"))


def test_a_server_that_dies_mid_request_is_a_crash_not_a_verdict(tmp_path):
    case = Case(T, (1,), SP(max_tokens=4), eos_token_id=EOS)
    with IsolatedEngine("example_engines:DyingLlamaCpp", log_dir=tmp_path / "logs") as eng:
        run = run_case(eng, case, ckpt_root=tmp_path / "ckpt", alpha=ALPHA, max_samples=400, batch=200,
                       speculation=False, profile="llamacpp")
    assert run.crash is not None and run.judgement is None or run.n == 0, run
    assert "llama-server" in run.crash.detail or "llama-server" in run.crash.log_tail
