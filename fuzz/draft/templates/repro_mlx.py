# Template: the engine part of a repro.py for mlx-lm's stream_generate (specfuzz.fuzz.draft.repro
# renders it), called as specfuzz's mlx adapter calls it: one stream_generate call per sample,
# make_sampler / make_logits_processors for the request's settings, mx.random.seed per request.
# The imports above the "repro.py begins" line are for linting and testing this file alone; in
# the script these names are its own.
from specfuzz.fuzz.draft.templates.repro_common import (
    EOS_TOKEN_ID, ENGINE_SETTINGS, ENGINE_VERSION, PROMPT, SPECULATION, TOKEN_TEXTS, VOCAB_SIZE,
)

# ---- repro.py begins ----

# ---- the engine: mlx-lm stream_generate, as specfuzz's mlx adapter calls it -------------
DEFAULT_BATCH = 100
GREEDY_TEMPERATURE_EPS = 1e-5  # temperatures below this are greedy (temp=0)


def add_engine_arguments(ap):
    ap.add_argument("--no-speculation", action="store_true", help="run without the draft model (speculation off)")


def speculating(args):
    return SPECULATION is not None and not args.no_speculation


def describe(args):
    import mlx.core as mx
    import mlx_lm

    if not speculating(args):
        how = "speculation off"
    elif SPECULATION.get("engine_default"):
        how = "draft_model= (num_draft_tokens: mlx-lm's default)"
    else:
        how = f"draft_model=, num_draft_tokens={SPECULATION['num_speculative_tokens']}"
    return (f"engine: mlx-lm {mlx_lm.__version__}, mlx {mx.__version__} on {mx.default_device()} "
            f"(the finding: {ENGINE_VERSION}); stream_generate with {how}")


def table_tokenizer(d):
    """The checkpoint's tokenizer for mlx-lm: the table tokenizer has no unknown token, which
    mlx-lm's detokenizer probes for, so a normalizer drops characters outside the vocabulary."""
    import re

    import transformers
    from tokenizers import Regex, normalizers

    tok = transformers.AutoTokenizer.from_pretrained(d)
    chars = "".join(re.escape(c) for c in TOKEN_TEXTS[:VOCAB_SIZE])
    tok.backend_tokenizer.normalizer = normalizers.Replace(Regex(f"[^{chars}]"), "")
    return tok


def mlx_arguments(p):
    """specfuzz's SamplingParams -> (make_sampler kwargs, make_logits_processors kwargs)."""
    k = int(p["top_k"])
    sampler = {"temp": 0.0 if p["temperature"] < GREEDY_TEMPERATURE_EPS else float(p["temperature"]),
               "top_p": float(p["top_p"]), "min_p": float(p["min_p"]), "top_k": k if 1 <= k < VOCAB_SIZE else 0}
    procs = {}
    if p["logit_bias"]:
        procs["logit_bias"] = {int(t): float(b) for t, b in p["logit_bias"].items()}
    if p["repetition_penalty"] != 1.0:
        procs["repetition_penalty"] = float(p["repetition_penalty"])
    if p["presence_penalty"] != 0.0:
        procs["presence_penalty"] = float(p["presence_penalty"])
    if p["frequency_penalty"] != 0.0:
        procs["frequency_penalty"] = float(p["frequency_penalty"])
    return sampler, procs


def start_engine(ckpt, args):
    from pathlib import Path

    import mlx.core as mx
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_logits_processors, make_sampler
    from mlx_lm.tokenizer_utils import TokenizerWrapper
    from mlx_lm.utils import load_model

    model, _ = load_model(Path(ckpt.target))
    draft = load_model(Path(ckpt.draft))[0] if speculating(args) else None
    tokenizer = TokenizerWrapper(table_tokenizer(ckpt.target))
    if ENGINE_SETTINGS.get("seed") is not None:
        mx.random.seed(int(ENGINE_SETTINGS["seed"]))

    def call(p, seed, prompt):
        s_kw, p_kw = mlx_arguments(p)
        # stream_generate stops on the tokenizer's eos_token_ids: EOS unless ignore_eos, plus the stop ids.
        stops = {int(t) for t in p["stop_token_ids"]}
        if EOS_TOKEN_ID is not None and not p["ignore_eos"]:
            stops.add(int(EOS_TOKEN_ID))
        tokenizer.eos_token_ids = stops
        kw = {"max_tokens": int(p["max_tokens"]), "sampler": make_sampler(s_kw.pop("temp"), **s_kw)}
        if p_kw:
            kw["logits_processors"] = make_logits_processors(**p_kw)
        if ENGINE_SETTINGS.get("prefill_step_size") is not None:
            kw["prefill_step_size"] = int(ENGINE_SETTINGS["prefill_step_size"])
        if draft is not None:
            kw["draft_model"] = draft
            if not SPECULATION.get("engine_default"):
                kw["num_draft_tokens"] = int(SPECULATION["num_speculative_tokens"])
        mx.random.seed(int(seed))
        out = {}
        for r in stream_generate(model, tokenizer, list(prompt), **kw):
            out[r.generation_tokens] = int(r.token)  # keyed by its position in the output
        return tuple(out[i] for i in sorted(out))

    def generate(sampling, seeds, prompts=None):
        samplings = sampling if isinstance(sampling, list) else [sampling] * len(seeds)
        return [call(p, s, pr) for p, s, pr in zip(samplings, seeds, prompts or [PROMPT] * len(seeds))]

    return generate
