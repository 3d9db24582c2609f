# Template: the engine part of a repro.py for specfuzz's reference sampler (specfuzz.fuzz.draft.repro
# renders it). The sampler reads the tables directly (no checkpoint: no engine loads one); it can
# inject a catalogued bug. The imports above the "repro.py begins" line are for linting this file alone.
from specfuzz.fuzz.draft.templates.repro_common import DRAFT_TABLE, EOS_TOKEN_ID, TARGET_TABLE

SPECULATION = None
INJECT_AS_FOUND = None
DRAFT_D2T = None

# ---- repro.py begins ----


# ---- the engine: specfuzz's reference speculative sampler -----------------------------------
def start_engine(dirs, args):
    """generate(seeds, requests): each call one random stream, seeded by its first seed."""
    import numpy as np

    import specfuzz
    from specfuzz.oracle.law import TargetLaw
    from specfuzz.oracle.params import SamplingParams
    from specfuzz.oracle.speculative import DraftModel, MonteCarloDriver, SpecConfig, SpeculativeProcess

    inject = None if args.correct else args.inject
    print(f"engine: specfuzz {specfuzz.__version__} reference sampler, " + (f"bug {inject} injected" if inject else "correct"))
    spec = None if SPECULATION is None else SpecConfig.from_json({**SPECULATION, "inject": inject})
    draft = None if DRAFT_TABLE is None else DraftModel(np.array(DRAFT_TABLE), None if DRAFT_D2T is None else tuple(DRAFT_D2T))

    def generate(seeds, requests):
        prompt, sampling = requests[0]  # one request pattern per call
        params, rng = SamplingParams.from_json(sampling), np.random.default_rng(seeds[0])
        law = TargetLaw(np.array(TARGET_TABLE), tuple(prompt), params, eos_token_id=EOS_TOKEN_ID)
        if spec is None:
            return [plain_sample(law, rng) for _ in seeds]
        proc = SpeculativeProcess(law, tuple(prompt), params.max_tokens, spec, draft, params.temperature)
        return MonteCarloDriver(proc, rng).sample_many(len(seeds))

    return generate


def write_checkpoints(root):
    return {}  # the reference sampler reads the tables above directly: no checkpoint to write


def plain_sample(law, rng):
    out = ()
    while not (out and law.is_terminal(out)):
        c = law.conditional(out).cumsum()
        out += (int(min((c <= rng.random() * c[-1]).sum(), len(c) - 1)),)
    return out


def add_engine_arguments(ap):
    g = ap.add_mutually_exclusive_group()
    g.add_argument("--inject", default=INJECT_AS_FOUND, help="catalogued bug class to inject (default: as found)")
    g.add_argument("--correct", action="store_true", help="no injected bug: the correct sampler")
