"""Prompt sets for ``specfuzz compare``.

Built in: ``data/prompts.jsonl`` (shipped with the package), 64 prompts written for this
project: a trivial ``Hello`` sanity prompt, then 7 each of factual, creative and code
prompts at three lengths (short: one sentence; medium: a paragraph; long: several
paragraphs).

``--prompts FILE``: a ``.jsonl`` file with one object per line (``{"id": ..., "text": ...}``;
optional ``kind`` and ``length``), or any other text file with one prompt per line (ids
``line-N``; blank lines skipped). A user prompt without a length class gets one from its
token count (:data:`LENGTH_CLASSES`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Sequence

from specfuzz.errors import InvalidInput

BUILTIN_FILE = "prompts.jsonl"
# Length classes of prompts without one: the most prompt tokens (after chat formatting) of each.
LENGTH_CLASSES: tuple[tuple[str, int], ...] = (("short", 48), ("medium", 120), ("long", 1 << 30))
LENGTHS = ("short", "medium", "long")


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    kind: str = "custom"  # factual, creative, code, sanity, custom
    length: str | None = None  # short, medium, long; None: from the token count

    def to_json(self) -> dict:
        return {"id": self.id, "text": self.text, "kind": self.kind, "length": self.length}


@dataclass(frozen=True)
class EncodedPrompt:
    prompt: Prompt
    token_ids: tuple[int, ...]
    length: str  # the length class used in the report

    @property
    def id(self) -> str:
        return self.prompt.id


def _from_jsonl(lines: Sequence[str], source: str) -> list[Prompt]:
    out: list[Prompt] = []
    seen: set[str] = set()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidInput("--prompts", f"{source}:{n}", f"one JSON object per line ({exc.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str) or not obj["text"].strip():
            raise InvalidInput("--prompts", f"{source}:{n}", 'an object with a non-empty "text" string')
        pid = str(obj.get("id", f"line-{n}"))
        if pid in seen:
            raise InvalidInput("--prompts", f"{source}:{n}", f"unique ids (id {pid!r} repeats)")
        seen.add(pid)
        length = obj.get("length")
        if length is not None and length not in LENGTHS:
            raise InvalidInput("--prompts", f"{source}:{n}", f"length one of {LENGTHS} or absent")
        out.append(Prompt(pid, obj["text"], str(obj.get("kind", "custom")), length))
    return out


def builtin_prompts() -> list[Prompt]:
    text = resources.files("specfuzz.compare").joinpath("data", BUILTIN_FILE).read_text(encoding="utf-8")
    return _from_jsonl(text.splitlines(), BUILTIN_FILE)


def load_prompts(path: Path) -> list[Prompt]:
    """Prompts from a user file (InvalidInput when missing, unreadable or empty)."""
    p = Path(path)
    if not p.is_file():
        raise InvalidInput("--prompts", str(path), "an existing file: JSONL with {\"id\", \"text\"} per line, or one prompt per line")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidInput("--prompts", str(path), f"a readable UTF-8 text file ({type(exc).__name__})") from None
    lines = text.splitlines()
    if p.suffix == ".jsonl":
        prompts = _from_jsonl(lines, p.name)
    else:
        prompts = [Prompt(f"line-{n}", line.strip()) for n, line in enumerate(lines, 1) if line.strip()]
    if not prompts:
        raise InvalidInput("--prompts", str(path), "a file with at least one non-empty prompt")
    return prompts


def subset(prompts: Sequence[Prompt], limit: int | None) -> list[Prompt]:
    """At most ``limit`` prompts, spread over the (length, kind) groups: the sanity prompt
    first, then one prompt of each group in turn, in file order within a group."""
    if limit is None or limit >= len(prompts):
        return list(prompts)
    groups: dict[tuple, list[Prompt]] = {}
    for p in prompts:
        groups.setdefault((p.kind == "sanity", p.length, p.kind), []).append(p)
    order = sorted(groups, key=lambda g: not g[0])  # sanity groups first, otherwise file order
    out: list[Prompt] = []
    i = 0
    while len(out) < limit:
        added = False
        for g in order:
            if i < len(groups[g]) and len(out) < limit:
                out.append(groups[g][i])
                added = True
        if not added:
            break
        i += 1
    return out


def length_class(n_tokens: int) -> str:
    for name, most in LENGTH_CLASSES:
        if n_tokens <= most:
            return name
    return LENGTH_CLASSES[-1][0]


def encode(prompts: Sequence[Prompt], tokenizer, chat: bool) -> list[EncodedPrompt]:
    """Token ids of each prompt: as a user message in the tokenizer's chat template (with
    the assistant turn opened) when ``chat``, else the plain text."""
    out = []
    for p in prompts:
        if chat:
            enc = tokenizer.apply_chat_template([{"role": "user", "content": p.text}], add_generation_prompt=True, tokenize=True)
            ids = enc["input_ids"] if not isinstance(enc, list) else enc
        else:
            ids = tokenizer(p.text)["input_ids"]
        ids = tuple(int(t) for t in ids)
        out.append(EncodedPrompt(p, ids, p.length or length_class(len(ids))))
    return out


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))
