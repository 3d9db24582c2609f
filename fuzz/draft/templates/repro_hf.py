# Template: the engine part of a repro.py for HF transformers' generate() (specfuzz.fuzz.draft.repro
# renders it), with the settings of specfuzz's HF adapter: SAMPLING holds the GenerationConfig fields
# the adapter set for the request, ASSISTANT the assistant model's settings (assisted generation).
# The imports above the "repro.py begins" line are for linting and testing this file alone.
from specfuzz.fuzz.draft.templates.repro_common import DTYPE, ENGINE_VERSION

ASSISTANT = None
THREADS = 1
ATTENTION = "sdpa"

# ---- repro.py begins ----


# ---- the engine: HF transformers generate(), with the settings of specfuzz's HF adapter --------
def start_engine(dirs, args):
    """generate(seeds, requests): one generate() call per request (assisted generation takes batch size 1)."""
    import warnings

    import torch
    import transformers

    print(f"engine: transformers {transformers.__version__}, torch {torch.__version__} (the finding: {ENGINE_VERSION})")
    transformers.logging.set_verbosity_error()
    torch.set_num_threads(THREADS)

    def load(folder, generation=None):
        m = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, DTYPE), attn_implementation=ATTENTION)
        m.generation_config = transformers.GenerationConfig(**(generation or {}))  # nothing from the checkpoint's file
        return m.eval()

    model, extra, greedy_extra = load(dirs["{target}"]), {}, {}
    # [if assistant]
    extra["assistant_model"] = load(dirs["{draft}"], ASSISTANT["generation_config"])
    # [if universal]
    extra["tokenizer"] = uag_tokenizer(dirs["{target}"], "native")
    extra["assistant_tokenizer"] = uag_tokenizer(dirs["{draft}"], ASSISTANT["vocab_order"])
    # [end universal]
    greedy_extra = dict(extra)
    if ASSISTANT["greedy_separate"]:  # HF prunes a universal assistant's lm_head in place when it samples
        greedy_extra["assistant_model"] = load(dirs["{draft}"], ASSISTANT["generation_config"])
    # [end assistant]

    def generate(seeds, requests):
        outs = []
        for seed, (prompt, sampling) in zip(seeds, requests):
            torch.manual_seed(seed)
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                row = model.generate(torch.tensor([prompt]), generation_config=transformers.GenerationConfig(**sampling),
                                     **(extra if sampling.get("do_sample") else greedy_extra))[0, len(prompt):].tolist()
            stops = sampling["eos_token_id"] or []  # the stop token that ends an output is part of it
            outs.append(tuple(row[:next((i + 1 for i, t in enumerate(row) if t in stops), len(row))]))
        return outs

    return generate


# [if universal]
def uag_tokenizer(folder, order):
    """For universal assisted generation (tokens mapped by text): drop what the table tokenizer cannot encode."""
    import re

    import transformers
    from tokenizers import Regex, normalizers

    tok = transformers.AutoTokenizer.from_pretrained(folder)
    chars = "".join(re.escape(t) for t in tok.get_vocab())
    tok.backend_tokenizer.normalizer = normalizers.Replace(Regex(f"[^{chars}]"), "")
    if order != "native":
        vocab = tok.get_vocab
        tok.get_vocab = lambda: dict(sorted(vocab().items(), key=lambda kv: kv[1], reverse=order == "reversed"))
    return tok
# [end universal]
