# Template: the engine part of a repro.py for vLLM's offline LLM API (specfuzz.fuzz.draft.repro renders
# it). LAUNCH, LAUNCH_ENV and INHERITED_ENV are what specfuzz's vLLM adapter passed and set when the
# finding was made; SAMPLING holds vllm.SamplingParams' arguments as the adapter mapped the request.
# The imports above the "repro.py begins" line are for linting and testing this file alone.
from specfuzz.fuzz.draft.templates.repro_common import (
    ENGINE_VERSION, EOS_TOKEN_ID, launch, with_checkpoints,
)

BAD_WORDS = None
STRUCTURED = None

# ---- repro.py begins ----


# ---- the engine: vLLM's offline LLM, started as specfuzz's vLLM adapter started it ----------
def start_engine(dirs, args):
    """generate(seeds, requests): one request per seed, requests = [(prompt, sampling), ...]."""
    kwargs, started = launch(args)  # sets the environment first: vLLM reads it at import and start
    import vllm
    from vllm.inputs import TokensPrompt

    print(f"engine: vLLM {vllm.__version__} (the finding: {ENGINE_VERSION}); {started}", flush=True)
    llm = vllm.LLM(**with_checkpoints(kwargs, dirs))

    def generate(seeds, requests):
        # [if not structured]
        params = [vllm.SamplingParams(**s, seed=seed) for (_, s), seed in zip(requests, seeds)]
        # [end structured]
        # [if structured]
        from vllm.sampling_params import StructuredOutputsParams
        params = [vllm.SamplingParams(**s, seed=seed, structured_outputs=StructuredOutputsParams(**STRUCTURED))
                  for (_, s), seed in zip(requests, seeds)]
        # [end structured]
        # [if bad_words]
        for sp in params:
            sp._bad_words_token_ids = BAD_WORDS  # words as token ids: SamplingParams takes strings only
        # [end bad_words]
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p, _ in requests], params, use_tqdm=False)
        return [tokens(o.outputs[0]) for o in outs]

    generate.close = llm.llm_engine.engine_core.shutdown  # its shutdown messages before the verdict
    return generate


def tokens(c):
    """An output's token ids, ending with the stop token that ended it (vLLM's token_ids leave it out)."""
    toks = tuple(c.token_ids)
    stop = c.stop_reason if isinstance(c.stop_reason, int) else EOS_TOKEN_ID if c.stop_reason is None else None
    return toks + (stop,) if c.finish_reason == "stop" and stop is not None and toks[-1:] != (stop,) else toks
