"""The "llamacpp" semantics profile and the GGUF table models, without an engine.

Each expected law below is worked out by hand from llama.cpp's sampler code (see
oracle/semantics_llamacpp.py); the engine-level check of the same profile against
llama-server's own post-sampling probabilities is in tests/test_engine_llamacpp.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from specfuzz.errors import AmbiguousSemantics, InvalidInput
from specfuzz.oracle.law import TargetLaw
from specfuzz.oracle.params import SamplingParams
from specfuzz.oracle.semantics_llamacpp import PENALTY_LAST_N, window_counts
from specfuzz.tablegen.gguf_model import gguf_vocab_size, read_gguf_info, read_gguf_table, write_gguf


def cond(table, prompt, params, out=(), eos=None):
    return TargetLaw(np.asarray(table, dtype=float), prompt, params, eos_token_id=eos, profile="llamacpp").conditional(tuple(out))


def test_temperature_comes_after_top_p_so_the_kept_set_is_the_untempered_one():
    # p = softmax([0, -1, -3]) = [0.705, 0.259, 0.035]: top_p=0.9 keeps the first two at T=1.
    # At T=0.25 vLLM would decide top-p on softmax([0,-4,-12]) = [0.982, ...] and keep one.
    row = [0.0, -1.0, -3.0]
    law = cond([row] * 3, (0,), SamplingParams(temperature=0.25, top_p=0.9))
    w = np.exp(np.array([0.0, -1.0]) / 0.25)
    assert np.allclose(law, [w[0] / w.sum(), w[1] / w.sum(), 0.0], atol=1e-12)
    vllm = TargetLaw(np.asarray([row] * 3), (0,), SamplingParams(temperature=0.25, top_p=0.9), eos_token_id=None).conditional(())
    assert vllm[1] == 0.0  # the profiles really differ here


def test_top_p_keeps_the_shortest_prefix_that_reaches_top_p():
    row = np.log([0.5, 0.3, 0.2])
    law = cond([row] * 3, (0,), SamplingParams(top_p=0.7))
    assert np.allclose(law, [0.5 / 0.8, 0.3 / 0.8, 0.0])


def test_min_p_is_decided_before_temperature():
    # p/max p = e^-1 = 0.37 for token 1: min_p=0.3 keeps it whatever the temperature.
    law = cond([[0.0, -1.0, -5.0]] * 3, (0,), SamplingParams(temperature=0.1, min_p=0.3))
    assert law[2] == 0.0 and law[1] > 0.0
    assert np.isclose(law[1], 1 / (1 + np.exp(10.0)))


def test_penalties_count_the_prompt_within_the_last_64_tokens():
    V = 4
    table = np.zeros((V, V))
    p = SamplingParams(frequency_penalty=1.0)
    # Token 1 twice and token 0 once in the prompt: logits 0 - 2 * 1 and 0 - 1.
    law = cond(table, (1, 1, 0), p)
    w = np.exp([-1.0, -2.0, 0.0, 0.0])
    assert np.allclose(law, w / w.sum())
    # A token older than the window does not count.
    prompt = (1,) + (0,) * PENALTY_LAST_N
    law = cond(table, prompt, p)
    assert law[1] == pytest.approx(law[2])


def test_window_counts_cover_prompt_and_output():
    outs = np.array([[2, 2], [3, 1]])
    c = window_counts((1, 2), outs, 4, last_n=3)
    assert c.tolist() == [[0, 0, 3, 0], [0, 1, 1, 1]]


def test_repetition_multiplies_non_positive_logits_and_divides_positive_ones():
    table = np.array([[2.0, -1.0, 0.0]] * 3)
    law = cond(table, (0, 1), SamplingParams(repetition_penalty=2.0))
    w = np.exp([1.0, -2.0, 0.0])
    assert np.allclose(law, w / w.sum())


def test_ignore_eos_masks_eos():
    law = cond(np.zeros((3, 3)), (0,), SamplingParams(ignore_eos=True), eos=2)
    assert law[2] == 0.0 and np.isclose(law[0], 0.5)


def test_logit_bias_comes_before_the_penalties():
    # Bias +2 makes token 0's logit 2 > 0, then repetition 2 divides it: 1 (not 2/2 + ... ).
    law = cond(np.zeros((2, 2)), (0,), SamplingParams(logit_bias={0: 2.0}, repetition_penalty=2.0))
    w = np.exp([1.0, 0.0])
    assert np.allclose(law, w / w.sum())


@pytest.mark.parametrize("field, value", [("min_tokens", 1), ("stop_token_ids", (1,)), ("allowed_token_ids", (0,)),
                                          ("bad_words", ((1,),))])
def test_options_llama_server_lacks_are_refused(field, value):
    with pytest.raises(InvalidInput, match=field):
        cond(np.zeros((3, 3)), (0,), SamplingParams(max_tokens=2, **{field: value}))


def test_greedy_ties_are_ambiguous_once_top_k_sorted_the_candidates():
    row = [1.0, 1.0, 0.0]
    assert cond([row] * 3, (0,), SamplingParams(temperature=0.0)).tolist() == [1.0, 0.0, 0.0]
    with pytest.raises(AmbiguousSemantics, match="greedy"):
        cond([row] * 3, (0,), SamplingParams(temperature=0.0, top_k=2))


def test_gguf_table_round_trips_with_its_pad_token(tmp_path):
    T = (np.arange(16, dtype=np.float32).reshape(4, 4) - 8) / 4
    T[1, 2] = -np.inf
    p = write_gguf(tmp_path / "t.gguf", T, eos_token_id=3)
    info = read_gguf_info(p)
    assert info == {"table_model": True, "architecture": "llama", "vocab_size": 4}
    got = read_gguf_table(p)
    assert got[1, 2] == -32768.0 and np.array_equal(np.delete(got.ravel(), 6), np.delete(T.ravel(), 6))
    assert gguf_vocab_size(4) == 5


def test_a_gguf_that_is_not_a_table_model_is_named_as_such(tmp_path):
    from specfuzz.compare.models import embedded_gguf
    from specfuzz.engines.llamacpp_engine import model_gguf

    with pytest.raises(InvalidInput, match="table-model GGUF"):
        model_gguf(embedded_gguf(), "target_dir")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all")
    with pytest.raises(InvalidInput, match="GGUF"):
        model_gguf(junk, "target_dir")


def test_a_missing_llama_server_makes_the_engine_unavailable_by_name(monkeypatch, tmp_path):
    from specfuzz.engines.availability import missing_packages, require_engine
    from specfuzz.errors import EngineUnavailable

    monkeypatch.setenv("SPECFUZZ_LLAMA_SERVER", str(tmp_path / "no-such-llama-server"))
    assert missing_packages("llamacpp") == ["llama-server"]
    with pytest.raises(EngineUnavailable, match="llama-server.*bin/setup"):
        require_engine("llamacpp")


def test_the_build_is_cached_per_release_flags_and_cpu(monkeypatch, tmp_path):
    from specfuzz.engines import llamacpp_build as b

    monkeypatch.setenv("SPECFUZZ_CACHE", str(tmp_path))
    monkeypatch.delenv("SPECFUZZ_LLAMA_SERVER", raising=False)
    assert b.server_path("0.3.36") != b.server_path("0.3.35")
    assert b.server_path("0.3.36").is_relative_to(tmp_path / "llama.cpp")
    assert b.find_server("0.3.36") is None
    fake = b.server_path("0.3.36")
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    assert b.find_server("0.3.36") == fake and b.ensure_server("0.3.36") == fake  # found: nothing is built
    with pytest.raises(InvalidInput, match="llama-cpp-python version"):
        b.ensure_server("0.3.36; rm -rf /")


def test_a_llama_cpp_python_release_environment_is_its_built_server(monkeypatch, tmp_path):
    """bisect's release environment for llama-cpp-python: this interpreter, pointed at the
    llama-server built from that release's sdist (here a cached one: nothing is built)."""
    from specfuzz.engines import llamacpp_build as b
    from specfuzz.fuzz.release_envs import ENGINE_PACKAGES, Release, ReleaseEnvs, package_for_entry

    monkeypatch.setenv("SPECFUZZ_CACHE", str(tmp_path))
    fake = b.server_path("0.3.30")
    fake.parent.mkdir(parents=True)
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    env = ReleaseEnvs(tmp_path / "envs").ensure("llama-cpp-python", Release("0.3.30", None))
    assert env.status == "ready" and env.env == {b.SERVER_ENV: str(fake)} and env.info["engine_version"] == "0.3.30"
    assert package_for_entry({"name": "llama.cpp"}) == "llama-cpp-python"
    assert ENGINE_PACKAGES["llama-cpp-python"].engine == "llamacpp"


def test_options_are_renamed_or_dropped_for_an_older_server_build():
    from specfuzz.engines.llamacpp_engine import for_server

    old_help = "-md, --model-draft FNAME\n--draft-max N\n--draft-min N\n--draft-p-min P\n--no-warmup\n"
    args = ["-md", "d.gguf", "--spec-type", "draft-simple", "--spec-draft-n-max", "3", "--no-webui", "--no-warmup"]
    assert for_server(args, old_help) == ["-md", "d.gguf", "--draft-max", "3", "--no-warmup"]
    # n-gram drafting the old build lacks stays on the command line: the server refuses it (cannot run).
    assert for_server(["--spec-type", "ngram-simple"], old_help) == ["--spec-type", "ngram-simple"]
    assert for_server(args, "") == args
