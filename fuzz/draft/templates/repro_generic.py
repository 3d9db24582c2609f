# Template: the engine part of a repro.py for a third-party engine driven through specfuzz's Engine
# interface (specfuzz.fuzz.draft.repro renders it). The imports above the "repro.py begins" line are
# for linting and testing this file alone; in the script these names are its own.
from specfuzz.fuzz.draft.templates.repro_common import (
    DRAFT_D2T, DRAFT_WIDTH, DTYPE, ENGINE_SETTINGS, MAX_MODEL_LEN, PROMPT, SPECULATION,
)

# ---- repro.py begins ----

# ---- the engine: a third-party engine through specfuzz's Engine interface ---------------
DEFAULT_BATCH = 200
ENGINE_CLASS = None  # set to "package.module:Class" (the engine's specfuzz adapter)


def add_engine_arguments(ap):
    ap.add_argument("--engine-class", default=ENGINE_CLASS, required=ENGINE_CLASS is None,
                    help="package.module:Class implementing specfuzz's Engine interface")


def describe(args):
    return f"engine: {args.engine_class}"


def start_engine(ckpt, args):
    from specfuzz.engines.base import EngineConfig, Request
    from specfuzz.engines.isolation import load_engine_class
    from specfuzz.oracle.params import SamplingParams
    from specfuzz.oracle.speculative import SpecConfig

    engine = load_engine_class(args.engine_class)()
    settings = dict(ENGINE_SETTINGS)
    if DRAFT_WIDTH is not None:
        settings.setdefault("draft_vocab_size", DRAFT_WIDTH)
    if DRAFT_D2T is not None:
        settings.setdefault("draft_d2t", tuple(DRAFT_D2T))
    engine.start(EngineConfig(target_dir=ckpt.target, draft_dir=ckpt.draft,
                              speculation=None if SPECULATION is None else SpecConfig.from_json(SPECULATION),
                              dtype=DTYPE, max_model_len=MAX_MODEL_LEN, settings=settings))

    def generate(sampling, seeds, prompts=None):
        # one request per seed; sampling and prompts may also be lists, one per seed (a mixed batch)
        samplings = sampling if isinstance(sampling, list) else [sampling] * len(seeds)
        reqs = [Request(tuple(pr), SamplingParams.from_json(p), s)
                for pr, p, s in zip(prompts or [PROMPT] * len(seeds), samplings, seeds)]
        return [tuple(c.token_ids) for c in engine.generate(reqs)]

    return generate
