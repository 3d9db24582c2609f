# Template: the engine part of a repro.py for SGLang's offline sglang.Engine (specfuzz.fuzz.draft.repro
# renders it). The engine is started exactly as specfuzz's SGLang adapter started it when the finding
# was made: LAUNCH["kwargs"] are the ServerArgs fields it passed (attention and sampling backends,
# dtype, memory fraction, CUDA graphs, speculative_* fields, ...) and LAUNCH["env"] the environment
# it set, recorded with the entry or reconstructed for older entries. The imports above the
# "repro.py begins" line are for linting and testing this file alone.
import os

from specfuzz.fuzz.draft.templates.repro_common import (
    ENGINE_VERSION, LAUNCH, PROMPT, add_launch_arguments, launch_kwargs, launch_line,
)

# ---- repro.py begins ----

# ---- the engine: SGLang (offline sglang.Engine), started as specfuzz's SGLang adapter started it --
DEFAULT_BATCH = 200
GREEDY_TEMPERATURE_EPS = 1e-5  # temperatures below this are greedy (temperature=0)
CHECKPOINT_PLACEHOLDERS = ("{target}", "{draft}")  # LAUNCH's names for the checkpoint folders
SHUTDOWN_TIMEOUT_S = 30.0  # SGLang's shutdown has been seen to hang: wait this long, then move on
HARD_EXIT = True  # leave without interpreter-exit hooks (SGLang's can hang); the verdict is printed first
CRASH_DIAGNOSTICS_OFF = {"SGLANG_PYSPY_DUMP_BEFORE_CRASH": "0", "SGLANG_CUDA_COREDUMP_BEFORE_CRASH": "0"}


def add_engine_arguments(ap):
    add_launch_arguments(ap)


def launch_environment():
    """The environment the adapter ran SGLang in: its own variables as set, inherited ones unless set here.
    SGLang's crash diagnostics are off unless set here, as the adapter runs it (they change nothing
    the engine computes): when its scheduler fails, the engine first tries py-spy dumps and waits up
    to 60 s for CUDA core dumps, which held a crash repro for minutes before it could print FAIL."""
    env = {k: v for k, v in CRASH_DIAGNOSTICS_OFF.items() if k not in os.environ}
    env.update({k: v for k, v in LAUNCH.get("inherited_env", {}).items() if k not in os.environ})
    env.update(LAUNCH["env"])
    return env


def describe(args):
    import sglang

    kw = launch_kwargs(args)
    shown = {k: kw[k] for k in ("dtype", "attention_backend", "sampling_backend", "disable_cuda_graph",
                                "speculative_algorithm") if k in kw}
    return f"engine: SGLang {sglang.__version__} (the finding: {ENGINE_VERSION}); " + launch_line(args, shown)


def with_checkpoints(value, ckpt):
    """LAUNCH's keyword arguments with the checkpoint folders filled in."""
    if isinstance(value, dict):
        return {k: with_checkpoints(v, ckpt) for k, v in value.items()}
    if isinstance(value, list):
        return [with_checkpoints(v, ckpt) for v in value]
    if value == CHECKPOINT_PLACEHOLDERS[0]:
        return ckpt.target
    if value == CHECKPOINT_PLACEHOLDERS[1]:
        return ckpt.draft
    return value


def sglang_sampling_params(p, seed):
    """specfuzz's SamplingParams -> SGLang's sampling-params dict, as the adapter maps them."""
    d = {
        "max_new_tokens": int(p["max_tokens"]),
        "temperature": 0.0 if p["temperature"] < GREEDY_TEMPERATURE_EPS else float(p["temperature"]),
        "top_k": int(p["top_k"]) if p["top_k"] >= 1 else -1,
        "top_p": float(p["top_p"]),
        "min_p": float(p["min_p"]),
        "repetition_penalty": float(p["repetition_penalty"]),
        "frequency_penalty": float(p["frequency_penalty"]),
        "presence_penalty": float(p["presence_penalty"]),
        "min_new_tokens": int(p["min_tokens"]),
        "ignore_eos": bool(p["ignore_eos"]),
    }
    if p["stop_token_ids"]:
        d["stop_token_ids"] = sorted({int(t) for t in p["stop_token_ids"]})
    if p["logit_bias"]:
        d["logit_bias"] = {str(int(k)): float(v) for k, v in p["logit_bias"].items()}
    # Honoured only with enable_deterministic_inference; otherwise the scheduler's global RNG samples.
    d["sampling_seed"] = int(seed)
    return d


def start_engine(ckpt, args):
    import threading

    os.environ.update(launch_environment())
    import sglang

    kwargs = with_checkpoints(launch_kwargs(args), ckpt)
    if kwargs.get("random_seed") is None:
        # As the adapter does: a fresh engine seed per start (per-request seeds are ignored by default).
        kwargs["random_seed"] = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF
    engine = sglang.Engine(**kwargs)

    def generate(sampling, seeds, prompts=None):
        # one request per seed; sampling and prompts may also be lists, one per seed (a mixed batch)
        samplings = sampling if isinstance(sampling, list) else [sampling] * len(seeds)
        outs = engine.generate(input_ids=[list(pr) for pr in (prompts or [PROMPT] * len(seeds))],
                               sampling_params=[sglang_sampling_params(p, s) for p, s in zip(samplings, seeds)])
        if isinstance(outs, dict):
            outs = [outs]
        result = []
        for o in outs:
            toks = tuple(int(t) for t in o.get("output_ids") or ())
            fr = (o.get("meta_info") or {}).get("finish_reason")
            if isinstance(fr, dict) and fr.get("type") == "abort":
                raise RuntimeError(f"SGLang aborted a request: {fr.get('message') or fr}")
            matched = fr.get("matched") if isinstance(fr, dict) and fr.get("type") == "stop" else None
            if isinstance(matched, int) and not isinstance(matched, bool) and (not toks or toks[-1] != matched):
                toks = toks + (matched,)  # the output includes the stop token that ended it
            result.append(toks)
        return result

    def close():
        th = threading.Thread(target=engine.shutdown, daemon=True)
        th.start()
        th.join(SHUTDOWN_TIMEOUT_S)

    generate.close = close
    return generate
