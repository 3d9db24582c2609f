"""The engines' own bug-report forms: section names, title prefix, labels, environment command,
and the minimal snippet each form asks for.

vLLM (``.github/ISSUE_TEMPLATE/400-bug-report.yml``): "Your current environment" (the output of
``python collect_env.py``) and "🐛 Describe the bug" (with a minimal snippet); title ``[Bug]: ``,
label ``bug``. SGLang (``1-bug-report.yml``): "Checklist", "Describe the bug", "Reproduction",
"Environment" (``python3 -m sglang.check_env``); title ``[Bug] ``, label ``Bug``. HF transformers
(``bug-report.yml``): "System Info" (``transformers env``), "Information", "Tasks",
"Reproduction", "Expected behavior"; label ``bug``. specfuzz's reference sampler and third-party
engines get a plain form with the same parts.

The environment block is the engine's own command's output, captured when repro.py is verified
(:mod:`specfuzz.fuzz.draft.verify` runs it with the same Python, scrubbed) and kept between the
:data:`ENV_BEGIN` and :data:`ENV_END` markers, so a redraft of an unchanged repro.py keeps it.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Form:
    engine: str  # shown name
    title_prefix: str
    labels: tuple[str, ...]
    url: str  # the new-issue page with the form
    env_display: str  # the environment command as the form names it
    env_argv: tuple[tuple[str, ...], ...]  # module invocations to try, in order (after the Python)


FORMS: dict[str, Form] = {
    "vllm": Form("vLLM", "[Bug]: ", ("bug",), "https://github.com/vllm-project/vllm/issues/new?template=400-bug-report.yml",
                 "python -m vllm.collect_env", (("-m", "vllm.collect_env"),)),
    "sglang": Form("SGLang", "[Bug] ", ("Bug",), "https://github.com/sgl-project/sglang/issues/new?template=1-bug-report.yml",
                   "python3 -m sglang.check_env", (("-m", "sglang.check_env"),)),
    "hf-transformers": Form("transformers", "", ("bug",),
                            "https://github.com/huggingface/transformers/issues/new?template=bug-report.yml",
                            "transformers env", (("-m", "transformers.cli.transformers", "env"),
                                                 ("-m", "transformers.commands.transformers_cli", "env"))),
    "llamacpp": Form("llama.cpp", "Eval bug: ", ("bug-unconfirmed",),
                     "https://github.com/ggml-org/llama.cpp/issues/new?template=011-bug-results.yml", "llama-server --version",
                     (("-c", "import subprocess; r = subprocess.run(['llama-server', '--version'], capture_output=True, "
                             "text=True); print(r.stdout + r.stderr)"),)),
    "mlx": Form("mlx-lm", "", (), "https://github.com/ml-explore/mlx-lm/issues/new",
                "python -c (platform, Python, mlx, mlx-lm, transformers versions, mlx's device)",
                (("-c", "import platform, mlx.core as mx, mlx_lm, transformers; print(platform.platform(), '| Python', "
                        "platform.python_version(), '| mlx', mx.__version__, '| mlx-lm', mlx_lm.__version__, "
                        "'| transformers', transformers.__version__, '|', mx.default_device())"),)),
    "reference": Form("specfuzz", "", (), "", "python -m specfuzz --version", (("-m", "specfuzz", "--version"),)),
    "generic": Form("the engine", "", (), "", "pip list", (("-m", "pip", "list"),)),
}
ENV_BEGIN = "<!-- environment begins -->"
ENV_END = "<!-- environment ends -->"
SGLANG_CHECKLIST = (
    "I searched related issues but found no solution.",
    "The bug persists in the latest version.",
    "Issues without environment info and a minimal reproducible demo are hard to resolve and may receive no feedback.",
    "If this is not a bug report but a general question, please start a discussion at "
    "https://github.com/sgl-project/sglang/discussions. Otherwise, it will be closed.",
    "Please use English. Otherwise, it will be closed.",
)
# Engines whose environment command prints this line when it names the engine it found.
ENV_ENGINE_LINES = {"vllm": "vLLM Version", "sglang": "sglang", "hf-transformers": "`transformers` version"}


def form_for(engine_kind: str) -> Form:
    return FORMS.get(engine_kind, FORMS["generic"])


def env_block(form: Form, captured: str | None, recorded_rows: list[tuple[str, str]]) -> list[str]:
    """The environment block: the command's captured output, or (before a verification) the
    environment the finding recorded and how the block gets filled."""
    L = [f"<details><summary>The output of <code>{form.env_display}</code></summary>", "", ENV_BEGIN, ""]
    if captured:
        L += ["```text", captured.strip("\n"), "```"]
    else:
        L += [f"*Not captured yet: `{form.env_display}` runs when `repro.py` is verified on the engine "
              "(`specfuzz draft ENTRY --verify`). What the finding recorded:*", "", "| | |", "|---|---|"]
        L += [f"| {k} | {v} |" for k, v in recorded_rows]
    return L + ["", ENV_END, "", "</details>"]


def captured_env(text: str) -> str | None:
    """The captured environment output between the markers of an ISSUE.md (None: not captured)."""
    i, j = text.find(ENV_BEGIN), text.find(ENV_END)
    if i < 0 or j < i:
        return None
    inner = text[i + len(ENV_BEGIN):j].strip("\n")
    if not inner.startswith("```text"):
        return None
    return inner[len("```text"):].strip("\n").removesuffix("```").strip("\n")


def replace_env(text: str, captured: str) -> str:
    """``text`` with its environment block's content replaced by ``captured``."""
    i, j = text.find(ENV_BEGIN), text.find(ENV_END)
    if i < 0 or j < i:
        return text
    return text[:i + len(ENV_BEGIN)] + "\n\n```text\n" + captured.strip("\n") + "\n```\n\n" + text[j:]


def env_commands(engine_kind: str, python: str | None = None) -> list[list[str]]:
    return [[python or sys.executable, *argv] for argv in form_for(engine_kind).env_argv]


# ----------------------------------------------------------------------------- snippets


def _py_value(v) -> str:
    """A JSON-like value as Python source (True/False/None, dicts, lists)."""
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_py_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ", ".join(_py_value(x) for x in v) + "]"
    return repr(v)


def _kwargs(d: dict, skip: tuple[str, ...] = ()) -> str:
    return ", ".join(f"{k}={_py_value(v)}" for k, v in d.items() if k not in skip)


def _paths(v):
    """LAUNCH values with the checkpoint placeholders as the folder names the snippet uses."""
    if isinstance(v, dict):
        return {k: _paths(x) for k, x in v.items()}
    return {"{target}": "target", "{draft}": "draft"}.get(v, v) if isinstance(v, str) else v


def snippet(d: dict, engine_kind: str, n: int) -> list[str]:
    """The engine call of repro.py as a few lines (its data block's names filled in), for the
    form's "minimal snippet"; repro.py writes the table checkpoints ``target`` / ``draft`` first."""
    prompt, sampling = d["PROMPT"], d["SAMPLING"]
    env = {**d.get("INHERITED_ENV", {}), **d.get("LAUNCH_ENV", {})}
    L = [f"# environment: {' '.join(f'{k}={v}' for k, v in env.items())}"] if env else []
    launch = _paths(d.get("LAUNCH") or {})
    if engine_kind == "vllm":
        L += ["import vllm", "from vllm.inputs import TokensPrompt", "",
              f"llm = vllm.LLM({_kwargs(launch)})",
              f"params = [vllm.SamplingParams({_kwargs(sampling)}, seed=i) for i in range({n})]",
              f"outs = llm.generate([TokensPrompt(prompt_token_ids={prompt})] * {n}, params)",
              "counts = collections.Counter(tuple(o.outputs[0].token_ids) for o in outs)"]
    elif engine_kind == "sglang":
        L += ["import sglang", "", f"engine = sglang.Engine({_kwargs(launch)})",
              f"sampling = {_py_value(sampling)}",
              f"outs = engine.generate(input_ids=[{prompt}] * {n}, sampling_params=[{{**sampling, \"sampling_seed\": i}} for i in range({n})])",
              "counts = collections.Counter(tuple(o[\"output_ids\"]) for o in outs)"]
    elif engine_kind == "hf-transformers":
        a = d.get("ASSISTANT")
        L += ["import torch, transformers", "",
              "model = transformers.AutoModelForCausalLM.from_pretrained(\"target\", dtype=torch." + d["DTYPE"] + ")"]
        extra = ""
        if a:
            L += [f"assistant = transformers.AutoModelForCausalLM.from_pretrained(\"draft\", dtype=torch.{d['DTYPE']})",
                  f"assistant.generation_config = transformers.GenerationConfig({_kwargs(a['generation_config'])})"]
            extra = ", assistant_model=assistant"
            if a.get("universal"):
                L += ["# universal assisted generation: tokenizer=, assistant_tokenizer= as repro.py builds them"]
                extra += ", tokenizer=tok, assistant_tokenizer=assistant_tok"
        L += [f"config = transformers.GenerationConfig({_kwargs(sampling)})",
              f"for i in range({n}):",
              "    torch.manual_seed(i)",
              f"    out = model.generate(torch.tensor([{prompt}]), generation_config=config{extra})"]
    elif engine_kind == "mlx":
        procs = f", logits_processors=make_logits_processors({_kwargs(sampling['processors'])})" if sampling["processors"] else ""
        k = d.get("DRAFT_TOKENS")
        spec = (", draft_model=draft" + ("" if k is None else f", num_draft_tokens={k}")) if d.get("DRAFT_TABLE") else ""
        prefill = "" if d.get("PREFILL_STEP_SIZE") is None else f", prefill_step_size={d['PREFILL_STEP_SIZE']}"
        L += ["import mlx.core as mx",
              "from mlx_lm import stream_generate",
              "from mlx_lm.sample_utils import make_logits_processors, make_sampler",
              "from mlx_lm.tokenizer_utils import TokenizerWrapper",
              "from mlx_lm.utils import load_model", "",
              "model = load_model(Path(\"target\"))[0]"]
        if spec:
            L += ["draft = load_model(Path(\"draft\"))[0]"]
        L += ["tokenizer = TokenizerWrapper(table_tokenizer(\"target\"))  # repro.py: the table tokenizer, out-of-vocabulary text dropped",
              f"tokenizer.eos_token_ids = {set(sampling['stop_ids']) or 'set()'}  # EOS unless ignore_eos, and stop_token_ids",
              "counts = collections.Counter()",
              f"for i in range({n}):",
              "    mx.random.seed(i)",
              f"    out = {{r.generation_tokens: r.token for r in stream_generate(model, tokenizer, {prompt}, max_tokens={d['MAX_TOKENS']}, "
              f"sampler=make_sampler({_kwargs(sampling['sampler'])}){procs}{prefill}{spec})}}",
              "    counts[tuple(out.values())] += 1"]
    else:
        L += [f"# the engine's generate() on prompt {prompt} with {sampling}, one seed per request"]
    if L and L[0].startswith("# environment"):
        return ["```python", L[0], "import collections", *L[1:], "```"]
    return ["```python", "import collections", *(["from pathlib import Path"] if engine_kind == "mlx" else []), *L, "```"]
