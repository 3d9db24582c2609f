# Template: the engine part of a repro.py for HF transformers' generate() (specfuzz.fuzz.draft.repro
# renders it), with the settings of specfuzz's HF adapter. The imports above the "repro.py begins"
# line are for linting and testing this file alone; in the script these names are its own.
from specfuzz.fuzz.draft.templates.repro_common import (
    DRAFT_TABLE, DTYPE, ENGINE_SETTINGS, ENGINE_VERSION, EOS_TOKEN_ID, PROMPT, SPECULATION, TOKEN_TEXTS, VOCAB_SIZE,
)

# ---- repro.py begins ----

# ---- the engine: HF transformers generate(), with the settings of specfuzz's HF adapter --
DEFAULT_BATCH = 100
GREEDY_TEMPERATURE_EPS = 1e-5
SETTING_DEFAULTS = {"num_assistant_tokens_schedule": "constant", "assistant_confidence_threshold": 0.0,
                    "universal": None, "assistant_vocab_order": "native", "uag_greedy_draft": "separate",
                    "threads": 1, "attn_implementation": "sdpa"}


def add_engine_arguments(ap):
    pass


def describe(args):
    import torch
    import transformers

    return f"engine: transformers {transformers.__version__}, torch {torch.__version__} (the finding: {ENGINE_VERSION})"


def eos_ids(p):
    ids = [] if EOS_TOKEN_ID is None or p["ignore_eos"] else [int(EOS_TOKEN_ID)]
    return ids + [int(t) for t in p["stop_token_ids"] if int(t) not in ids]


def generation_kwargs(p):
    """specfuzz's SamplingParams -> GenerationConfig fields (every non-neutral HF default overridden)."""
    stops = eos_ids(p)
    kw = {"max_new_tokens": int(p["max_tokens"]), "min_new_tokens": int(p["min_tokens"]) or None,
          "eos_token_id": stops or None, "pad_token_id": stops[0] if stops else None,
          "repetition_penalty": float(p["repetition_penalty"]), "num_beams": 1, "use_cache": True}
    if p["temperature"] < GREEDY_TEMPERATURE_EPS:
        kw["do_sample"] = False
    else:
        kw.update(do_sample=True, temperature=float(p["temperature"]), top_k=int(p["top_k"]) if p["top_k"] >= 1 else 0,
                  top_p=float(p["top_p"]), min_p=float(p["min_p"]) if p["min_p"] > 0 else None)
    if p["bad_words"]:
        kw["bad_words_ids"] = [[int(t) for t in w] for w in p["bad_words"]]
    if p["logit_bias"]:
        kw["sequence_bias"] = {(int(t),): float(b) for t, b in p["logit_bias"].items()}
    if p["allowed_token_ids"] is not None:
        others = sorted(set(range(VOCAB_SIZE)) - {int(t) for t in p["allowed_token_ids"]})
        if others:
            kw["suppress_tokens"] = others
    if SPECULATION is not None and SPECULATION["method"] == "ngram":
        kw["prompt_lookup_num_tokens"] = int(SPECULATION["num_speculative_tokens"])
        kw["max_matching_ngram_size"] = int(SPECULATION["ngram_max"])
    return kw


def load_tokenizer(d, vocab_size, order):
    """The checkpoint's tokenizer for universal assisted generation: a normalizer drops
    characters outside the vocabulary (HF encodes " " and the table tokenizer has no unknown
    token); ``order`` "sorted"/"reversed" presents get_vocab() by token id."""
    import re

    import transformers
    from tokenizers import Regex, normalizers

    tok = transformers.AutoTokenizer.from_pretrained(d)
    chars = "".join(re.escape(c) for c in TOKEN_TEXTS[:vocab_size])
    tok.backend_tokenizer.normalizer = normalizers.Replace(Regex(f"[^{chars}]"), "")
    if order != "native":
        base = tok.get_vocab
        tok.get_vocab = lambda: dict(sorted(base().items(), key=lambda kv: kv[1], reverse=order == "reversed"))
    return tok


def start_engine(ckpt, args):
    import warnings

    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    try:
        transformers.utils.logging.disable_progress_bar()
    except AttributeError:
        pass
    s = {**SETTING_DEFAULTS, **ENGINE_SETTINGS}
    torch.set_num_threads(int(s["threads"]))

    def load(d):
        m = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=getattr(torch, DTYPE),
                                                              attn_implementation=s["attn_implementation"])
        m.eval()
        m.generation_config = transformers.GenerationConfig()  # nothing from generation_config.json
        return m

    model = load(ckpt.target)
    extra, greedy_extra = {}, {}
    if SPECULATION is not None and SPECULATION["method"] == "draft_model":
        def assistant():
            a = load(ckpt.draft)
            a.generation_config = transformers.GenerationConfig(
                num_assistant_tokens=int(SPECULATION["num_speculative_tokens"]),
                num_assistant_tokens_schedule=s["num_assistant_tokens_schedule"],
                assistant_confidence_threshold=float(s["assistant_confidence_threshold"]))
            return a

        extra["assistant_model"] = assistant()
        draft_v = len(DRAFT_TABLE)
        universal = draft_v != VOCAB_SIZE if s["universal"] is None else bool(s["universal"])
        if universal:
            extra["tokenizer"] = load_tokenizer(ckpt.target, VOCAB_SIZE, "native")
            extra["assistant_tokenizer"] = load_tokenizer(ckpt.draft, draft_v, s["assistant_vocab_order"])
        greedy_extra = dict(extra)
        if universal and s["uag_greedy_draft"] == "separate":
            greedy_extra["assistant_model"] = assistant()  # HF prunes the sampled assistant's LM head in place
    one_at_a_time = SPECULATION is not None  # assisted generation needs batch size 1

    def call(p, n, seed, prompt=PROMPT):
        kw = generation_kwargs(p)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gc = transformers.GenerationConfig(**kw, num_return_sequences=n)
            torch.manual_seed(int(seed))
            ids = torch.tensor([list(prompt)], dtype=torch.long)
            with torch.no_grad():
                seqs = model.generate(ids, generation_config=gc, **(greedy_extra if not kw["do_sample"] else extra))
        stops = set(eos_ids(p))
        outs = []
        for row in seqs[:, len(prompt):].tolist():
            toks = []
            for t in row[: p["max_tokens"]]:
                toks.append(int(t))
                if int(t) in stops:  # the stop token is part of the output; padding after it dropped
                    break
            outs.append(tuple(toks))
        return outs

    def generate(sampling, seeds, prompts=None):
        if isinstance(sampling, list) or prompts:  # a mixed batch: one request at a time, as the adapter runs them
            samplings = sampling if isinstance(sampling, list) else [sampling] * len(seeds)
            return [call(p, 1, s, pr)[0] for p, s, pr in zip(samplings, seeds, prompts or [PROMPT] * len(seeds))]
        greedy = sampling["temperature"] < GREEDY_TEMPERATURE_EPS
        if one_at_a_time:
            return [call(sampling, 1, s)[0] for s in seeds]
        if greedy:  # deterministic; HF refuses num_return_sequences > 1 without sampling
            return call(sampling, 1, seeds[0]) * len(seeds)
        return call(sampling, len(seeds), seeds[0])

    return generate
