# Template: the engine part of a repro.py for specfuzz's reference sampler (specfuzz.fuzz.draft.repro
# renders it). The imports above the "repro.py begins" line are for linting and testing this file
# alone; in the script these names are its own.
import json
import os

import numpy as np

from specfuzz.fuzz.draft.templates.repro_common import (
    DRAFT_D2T, DRAFT_WIDTH, INJECT_AS_FOUND, PROMPT, SPECULATION, read_table,
)

# ---- repro.py begins ----

# ---- the engine: specfuzz's reference speculative sampler -----------------------------
# It samples from the checkpoint's table (read back from model.safetensors) with the
# reference speculative sampler, which can inject a catalogued bug (--inject N1..N7).
# Only the sampler is used from specfuzz; the expected law above is data.
DEFAULT_BATCH = 250


def add_engine_arguments(ap):
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--inject", default=INJECT_AS_FOUND,
                   help=f"catalogued bug class to inject (default: {INJECT_AS_FOUND}, as found)")
    g.add_argument("--correct", action="store_true", help="no injected bug: the correct sampler")


def describe(args):
    import specfuzz

    inject = None if args.correct else args.inject
    return (f"engine: specfuzz {specfuzz.__version__} reference sampler, "
            + (f"bug {inject} injected" if inject else "correct (no injected bug)"))


def start_engine(ckpt, args):
    from specfuzz.oracle.law import TargetLaw
    from specfuzz.oracle.params import SamplingParams
    from specfuzz.oracle.speculative import DraftModel, MonteCarloDriver, SpecConfig, SpeculativeProcess

    inject = None if args.correct else args.inject
    table = read_table(ckpt.target)  # [V, V]
    with open(os.path.join(ckpt.target, "config.json")) as f:
        eos = json.load(f)["eos_token_id"]
    spec = None if SPECULATION is None else SpecConfig.from_json({**SPECULATION, "inject": inject})
    draft = None
    if spec is not None and spec.uses_draft_model:
        d = read_table(ckpt.draft)[:, :DRAFT_WIDTH]  # [R, V_draft]: the draft's true width
        draft = DraftModel(d, None if DRAFT_D2T is None else tuple(DRAFT_D2T))
    laws = {}

    def batch(sampling, seeds, prompt):
        key = json.dumps([sampling, prompt], sort_keys=True)
        if key not in laws:
            params = SamplingParams.from_json(sampling)
            laws[key] = (params, TargetLaw(table, tuple(prompt), params, eos_token_id=eos))
        params, law = laws[key]
        rng = np.random.default_rng(seeds[0])  # one stream per batch, seeded by its first seed
        if spec is None:
            return [plain_sample(law, rng) for _ in seeds]
        proc = SpeculativeProcess(law, tuple(prompt), params.max_tokens, spec, draft, params.temperature)
        return MonteCarloDriver(proc, rng).sample_many(len(seeds))

    def generate(sampling, seeds, prompts=None):
        if isinstance(sampling, list) or prompts:  # a mixed batch: each request on its own
            samplings = sampling if isinstance(sampling, list) else [sampling] * len(seeds)
            return [batch(p, [s], list(pr))[0] for p, s, pr in zip(samplings, seeds, prompts or [PROMPT] * len(seeds))]
        return batch(sampling, seeds, list(PROMPT))

    return generate


def plain_sample(law, rng):
    out = ()
    while not (out and law.is_terminal(out)):
        c = np.cumsum(law.conditional(out))
        out = out + (int(min(np.searchsorted(c, rng.random() * c[-1], side="right"), len(c) - 1)),)
    return out
