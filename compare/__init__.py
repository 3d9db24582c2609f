"""``specfuzz compare``: baseline vs speculative decoding on a real model and real prompts.

Data flow (one module per step):
``models`` (the embedded default model, drafts, tokenizer checks) ->
``prompts`` (built-in and user prompt sets, chat formatting) ->
``runs`` (baseline and speculative runs on an engine, JSONL records) ->
``reference`` (teacher-forced next-token laws of the model, HF float32) ->
``greedy`` (exact match, divergence, nondeterminism) and ``sampled`` (randomized PIT
into an anytime-valid test of the model's own conditional laws) ->
``report`` (terminal table, report.md, plots, JSON).
"""
