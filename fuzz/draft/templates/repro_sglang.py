# Template: the engine part of a repro.py for SGLang's offline sglang.Engine (specfuzz.fuzz.draft.repro
# renders it). LAUNCH holds the ServerArgs fields specfuzz's SGLang adapter passed when the finding was
# made, LAUNCH_ENV the environment it set; SAMPLING is SGLang's sampling-params dict as the adapter
# mapped the request. The imports above the "repro.py begins" line are for linting this file alone.
import os

from specfuzz.fuzz.draft.templates.repro_common import (
    ENGINE_VERSION, launch, with_checkpoints,
)

# ---- repro.py begins ----


# ---- the engine: SGLang's offline sglang.Engine, started as specfuzz's SGLang adapter started it --
def start_engine(dirs, args):
    """generate(seeds, requests): one request per seed, requests = [(prompt, sampling), ...]."""
    import threading

    kwargs, started = launch(args)  # sets the environment first
    import sglang

    print(f"engine: SGLang {sglang.__version__} (the finding: {ENGINE_VERSION}); {started}", flush=True)
    kwargs.setdefault("random_seed", int.from_bytes(os.urandom(4), "little") >> 1)  # fresh per start, as the adapter
    engine = sglang.Engine(**with_checkpoints(kwargs, dirs))

    def generate(seeds, requests):
        outs = engine.generate(input_ids=[p for p, _ in requests],
                               sampling_params=[{**s, "sampling_seed": seed} for (_, s), seed in zip(requests, seeds)])
        return [tokens(o) for o in outs]

    def close():  # SGLang's shutdown can hang: 30 s at most
        (t := threading.Thread(target=engine.shutdown, daemon=True)).start()
        t.join(30)

    generate.close = close
    return generate


def tokens(out):
    """An output's token ids, ending with the stop token that matched (if SGLang left it out)."""
    toks, fr = tuple(out["output_ids"]), out["meta_info"].get("finish_reason") or {}
    if fr.get("type") == "abort":
        raise RuntimeError(f"SGLang aborted a request: {fr.get('message') or fr}")
    stop = fr.get("matched") if fr.get("type") == "stop" else None
    return toks + (stop,) if type(stop) is int and toks[-1:] != (stop,) else toks
