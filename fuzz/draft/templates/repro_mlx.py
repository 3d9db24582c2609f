# Template: the engine part of a repro.py for mlx-lm's stream_generate (specfuzz.fuzz.draft.repro renders
# it), called as specfuzz's mlx adapter calls it: one stream_generate call per sample, the request's
# make_sampler / make_logits_processors arguments and stop ids in SAMPLING (the adapter's sampling_args and
# stop_ids), mx.random.seed per request. The imports above the "repro.py begins" line are for linting this
# file alone.
from specfuzz.fuzz.draft.templates.repro_common import ENGINE_VERSION, MAX_TOKENS

DRAFT_TOKENS = None
PREFILL_STEP_SIZE = None
ENGINE_SEED = None

# ---- repro.py begins ----


# ---- the engine: mlx-lm stream_generate, as specfuzz's mlx adapter calls it --------------------
def start_engine(dirs, args):
    """generate(seeds, requests): one stream_generate call per request."""
    from pathlib import Path

    import mlx.core as mx
    import mlx_lm
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_logits_processors, make_sampler
    from mlx_lm.tokenizer_utils import TokenizerWrapper
    from mlx_lm.utils import load_model

    speculating = dirs.get("{draft}") is not None and not args.no_speculation
    print(f"engine: mlx-lm {mlx_lm.__version__}, mlx {mx.__version__} on {mx.default_device()} (the finding: "
          f"{ENGINE_VERSION}); " + (f"draft_model=, num_draft_tokens={DRAFT_TOKENS or 'default'}" if speculating else "speculation off"))
    model = load_model(Path(dirs["{target}"]))[0]
    draft = load_model(Path(dirs["{draft}"]))[0] if speculating else None
    tokenizer = TokenizerWrapper(table_tokenizer(dirs["{target}"]))
    if ENGINE_SEED is not None:
        mx.random.seed(ENGINE_SEED)

    def call(seed, prompt, s):
        tokenizer.eos_token_ids = set(s["stop_ids"])  # stream_generate stops on these: EOS unless ignore_eos, stop ids
        kw = {"max_tokens": MAX_TOKENS, "sampler": make_sampler(**s["sampler"])}
        if s["processors"]:
            kw["logits_processors"] = make_logits_processors(**s["processors"])
        if PREFILL_STEP_SIZE is not None:
            kw["prefill_step_size"] = PREFILL_STEP_SIZE
        if draft is not None:
            kw.update(draft_model=draft, **({} if DRAFT_TOKENS is None else {"num_draft_tokens": DRAFT_TOKENS}))
        mx.random.seed(seed)
        out = {r.generation_tokens: int(r.token) for r in stream_generate(model, tokenizer, list(prompt), **kw)}
        return tuple(out[i] for i in sorted(out))  # keyed by position in the output

    return lambda seeds, requests: [call(seed, p, s) for seed, (p, s) in zip(seeds, requests)]


def table_tokenizer(folder):
    """The table tokenizer has no unknown token, which mlx-lm's detokenizer probes for: a normalizer drops
    the characters outside the vocabulary."""
    import re

    from tokenizers import Regex, normalizers
    from transformers import AutoTokenizer  # as mlx_lm.tokenizer_utils loads tokenizers

    tok = AutoTokenizer.from_pretrained(folder)
    tok.backend_tokenizer.normalizer = normalizers.Replace(Regex(f"[^{''.join(map(re.escape, tok.get_vocab()))}]"), "")
    return tok


def add_engine_arguments(ap):
    ap.add_argument("--no-speculation", action="store_true", help="the same requests without the draft model")
