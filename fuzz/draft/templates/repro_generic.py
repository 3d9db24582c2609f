# Template: the engine part of a repro.py for a third-party engine driven through specfuzz's Engine
# interface (specfuzz.fuzz.draft.repro renders it). The imports above the "repro.py begins" line are
# for linting and testing this file alone.
from specfuzz.fuzz.draft.templates.repro_common import DTYPE

SPECULATION = None
ENGINE_SETTINGS = {}
MAX_MODEL_LEN = 64

# ---- repro.py begins ----


# ---- the engine: a third-party engine through specfuzz's Engine interface --------------------
ENGINE_CLASS = None  # "package.module:Class": the engine's specfuzz adapter (or --engine-class)


def start_engine(dirs, args):
    """generate(seeds, requests): one engine call, one request per seed."""
    from specfuzz.engines.base import EngineConfig, Request
    from specfuzz.engines.isolation import load_engine_class
    from specfuzz.oracle.params import SamplingParams
    from specfuzz.oracle.speculative import SpecConfig

    print(f"engine: {args.engine_class}")
    engine = load_engine_class(args.engine_class)()
    engine.start(EngineConfig(target_dir=dirs["{target}"], draft_dir=dirs.get("{draft}"), dtype=DTYPE,
                              speculation=None if SPECULATION is None else SpecConfig.from_json(SPECULATION),
                              max_model_len=MAX_MODEL_LEN, settings=dict(ENGINE_SETTINGS)))

    def generate(seeds, requests):
        reqs = [Request(tuple(p), SamplingParams.from_json(s), seed) for seed, (p, s) in zip(seeds, requests)]
        return [tuple(c.token_ids) for c in engine.generate(reqs)]

    return generate


def add_engine_arguments(ap):
    ap.add_argument("--engine-class", default=ENGINE_CLASS, required=ENGINE_CLASS is None,
                    help="package.module:Class implementing specfuzz's Engine interface")
