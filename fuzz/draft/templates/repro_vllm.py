# Template: the engine part of a repro.py for vLLM's offline LLM API (specfuzz.fuzz.draft.repro
# renders it). The engine is started exactly as specfuzz's vLLM adapter started it when the finding
# was made: LAUNCH holds the environment variables the adapter set and the vllm.LLM keyword
# arguments it passed (model runner, attention backend, logprobs mode, KV cache, eager mode,
# speculative_config, ...), recorded with the entry or, for entries older than that record,
# reconstructed from the entry's engine version and case. The imports above the "repro.py begins"
# line are for linting and testing this file alone; in the script these names are its own.
import os

from specfuzz.fuzz.draft.templates.repro_common import (
    ENGINE_VERSION, EOS_TOKEN_ID, LAUNCH, PROMPT, add_launch_arguments, launch_kwargs, launch_line,
)

# ---- repro.py begins ----

# ---- the engine: vLLM (offline LLM API), started as specfuzz's vLLM adapter started it -------
DEFAULT_BATCH = 200
GREEDY_TEMPERATURE_EPS = 1e-5  # temperatures below this are greedy (temperature=0)
CHECKPOINT_PLACEHOLDERS = ("{target}", "{draft}")  # LAUNCH's names for the checkpoint folders


def add_engine_arguments(ap):
    add_launch_arguments(ap)


def launch_environment():
    """The environment the adapter ran vLLM in: its own variables as set, inherited ones unless set here."""
    env = {k: v for k, v in LAUNCH.get("inherited_env", {}).items() if k not in os.environ}
    env.update(LAUNCH["env"])
    return env


def describe(args):
    import vllm

    env = " ".join(f"{k}={v}" for k, v in sorted(launch_environment().items()))
    return f"engine: vLLM {vllm.__version__} (the finding: {ENGINE_VERSION}); " + launch_line(args, env)


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


def vllm_sampling_params(sampling, seed):
    from vllm import SamplingParams

    p = sampling
    kw = dict(
        temperature=0.0 if p["temperature"] < GREEDY_TEMPERATURE_EPS else float(p["temperature"]),
        top_k=int(p["top_k"]) if p["top_k"] >= 1 else 0, top_p=float(p["top_p"]), min_p=float(p["min_p"]),
        repetition_penalty=float(p["repetition_penalty"]), frequency_penalty=float(p["frequency_penalty"]),
        presence_penalty=float(p["presence_penalty"]), min_tokens=int(p["min_tokens"]), max_tokens=int(p["max_tokens"]),
        stop_token_ids=[int(t) for t in p["stop_token_ids"]] or None, ignore_eos=bool(p["ignore_eos"]),
        seed=seed, detokenize=False,
    )
    if p["logit_bias"]:
        kw["logit_bias"] = {int(k): float(v) for k, v in p["logit_bias"].items()}
    if p["allowed_token_ids"] is not None:
        kw["allowed_token_ids"] = [int(t) for t in p["allowed_token_ids"]]
    if p["regex"] is not None or p["choice"] is not None:
        from vllm.sampling_params import StructuredOutputsParams

        kw["structured_outputs"] = (StructuredOutputsParams(regex=p["regex"]) if p["regex"] is not None
                                    else StructuredOutputsParams(choice=list(p["choice"])))
    sp = SamplingParams(**kw)
    if p["bad_words"]:
        # token-id sequences, as SamplingParams.update_from_tokenizer would produce from strings
        sp._bad_words_token_ids = [[int(t) for t in w] for w in p["bad_words"]]
    return sp



def start_engine(ckpt, args):
    os.environ.update(launch_environment())  # before vLLM is imported: it reads them at start
    from vllm import LLM
    from vllm.inputs import TokensPrompt

    llm = LLM(**with_checkpoints(launch_kwargs(args), ckpt))
    eos = EOS_TOKEN_ID

    def generate(sampling, seeds, prompts=None):
        # one request per seed; sampling and prompts may also be lists, one per seed (a mixed batch)
        samplings = sampling if isinstance(sampling, list) else [sampling] * len(seeds)
        params = [vllm_sampling_params(p, s) for p, s in zip(samplings, seeds)]
        outs = llm.generate([TokensPrompt(prompt_token_ids=list(pr)) for pr in (prompts or [PROMPT] * len(seeds))],
                            params, use_tqdm=False)
        result = []
        for o in outs:
            c = o.outputs[0]
            toks = tuple(int(t) for t in c.token_ids)
            if c.finish_reason == "stop":  # the output includes the stop token that ended it
                want = c.stop_reason if isinstance(c.stop_reason, int) else (eos if c.stop_reason is None else None)
                if want is not None and (not toks or toks[-1] != want):
                    toks = toks + (int(want),)
            result.append(toks)
        return result

    def close():
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:  # noqa: BLE001 - best effort
            pass

    generate.close = close
    return generate
