"""Request parameters whose exact law the oracle computes.

A :class:`SamplingParams` is engine-neutral; a semantics profile
(:mod:`specfuzz.oracle.semantics`) says in which order an engine applies them.
Validation is eager: every bad value raises :class:`~specfuzz.errors.InvalidInput`
naming the value and what is allowed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping

from specfuzz.errors import InvalidInput

# vLLM treats temperatures below this as greedy (argmax) sampling.
GREEDY_TEMPERATURE_EPS = 1e-5
# Largest |logit bias| accepted (OpenAI API range).
MAX_ABS_LOGIT_BIAS = 100.0


def _finite(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidInput(name, value, "a finite number")
    return float(value)


@dataclass(frozen=True)
class SamplingParams:
    """One request's sampling and stopping settings.

    Token ids refer to the target vocabulary. ``None``/neutral values switch a feature off.
    """

    temperature: float = 1.0  # 0 (or < 1e-5) = greedy
    top_k: int = -1  # -1 or 0 = off
    top_p: float = 1.0  # in (0, 1]
    min_p: float = 0.0  # in [0, 1]
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    allowed_token_ids: tuple[int, ...] | None = None
    bad_words: tuple[tuple[int, ...], ...] = ()  # token-id sequences never to complete
    repetition_penalty: float = 1.0  # > 0; 1 = off; prompt and output tokens
    frequency_penalty: float = 0.0  # in [-2, 2]; output tokens
    presence_penalty: float = 0.0  # in [-2, 2]; output tokens
    min_tokens: int = 0  # stop tokens masked while len(output) < min_tokens
    max_tokens: int = 4
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # Thinking budget: the output starts inside a thinking section that ends with
    # ``think_end_token_id``; after ``thinking_budget`` thinking tokens without it, the
    # end-of-thinking token is forced.
    thinking_budget: int | None = None
    think_end_token_id: int | None = None
    # Token constraint over the one-character token texts (tablegen.vocab): a regex the
    # whole output (without a final EOS) must match, or a list of allowed outputs.
    regex: str | None = None
    choice: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        t = _finite("temperature", self.temperature)
        if t < 0:
            raise InvalidInput("temperature", self.temperature, "a number >= 0 (0 means greedy)")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            raise InvalidInput("top_k", self.top_k, "-1 or 0 (off) or an integer >= 1")
        p = _finite("top_p", self.top_p)
        if not 0.0 < p <= 1.0:
            raise InvalidInput("top_p", self.top_p, "a number in (0, 1]")
        mp = _finite("min_p", self.min_p)
        if not 0.0 <= mp <= 1.0:
            raise InvalidInput("min_p", self.min_p, "a number in [0, 1]")
        for tok, bias in dict(self.logit_bias).items():
            _token("logit_bias key", tok)
            b = _finite(f"logit_bias[{tok}]", bias)
            if abs(b) > MAX_ABS_LOGIT_BIAS:
                raise InvalidInput(f"logit_bias[{tok}]", bias, f"a number in [-{MAX_ABS_LOGIT_BIAS:g}, {MAX_ABS_LOGIT_BIAS:g}]")
        if self.allowed_token_ids is not None:
            if len(self.allowed_token_ids) == 0:
                raise InvalidInput("allowed_token_ids", self.allowed_token_ids, "None or a non-empty list of token ids")
            for tok in self.allowed_token_ids:
                _token("allowed_token_ids entry", tok)
        for word in self.bad_words:
            if len(word) == 0:
                raise InvalidInput("bad_words entry", word, "a non-empty token-id sequence")
            for tok in word:
                _token("bad_words token", tok)
        rp = _finite("repetition_penalty", self.repetition_penalty)
        if rp <= 0:
            raise InvalidInput("repetition_penalty", self.repetition_penalty, "a number > 0 (1 = off)")
        for name in ("frequency_penalty", "presence_penalty"):
            v = _finite(name, getattr(self, name))
            if not -2.0 <= v <= 2.0:
                raise InvalidInput(name, getattr(self, name), "a number in [-2, 2]")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidInput("max_tokens", self.max_tokens, "an integer >= 1")
        if isinstance(self.min_tokens, bool) or not isinstance(self.min_tokens, int) or not 0 <= self.min_tokens <= self.max_tokens:
            raise InvalidInput("min_tokens", self.min_tokens, f"an integer in [0, max_tokens={self.max_tokens}]")
        for tok in self.stop_token_ids:
            _token("stop_token_ids entry", tok)
        if self.thinking_budget is not None:
            if isinstance(self.thinking_budget, bool) or not isinstance(self.thinking_budget, int) or self.thinking_budget < 0:
                raise InvalidInput("thinking_budget", self.thinking_budget, "None or an integer >= 0")
            if self.think_end_token_id is None:
                raise InvalidInput("think_end_token_id", None, "a token id when thinking_budget is set")
        if self.think_end_token_id is not None:
            _token("think_end_token_id", self.think_end_token_id)
        if self.regex is not None and self.choice is not None:
            raise InvalidInput("choice", self.choice, "None when regex is set (give one constraint)")
        if self.choice is not None and (len(self.choice) == 0 or any(not isinstance(c, str) or c == "" for c in self.choice)):
            raise InvalidInput("choice", self.choice, "a non-empty list of non-empty strings")
        if self.regex is not None:
            import regex as _re

            try:
                _re.compile(self.regex)
            except _re.error as exc:
                raise InvalidInput("regex", self.regex, f"a valid regular expression ({exc})") from None

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE_EPS

    def check_vocab(self, vocab_size: int) -> None:
        """Raise if a token id named by these parameters is outside ``[0, vocab_size)``."""
        ids: list[tuple[str, int]] = [("logit_bias key", t) for t in self.logit_bias]
        ids += [("allowed_token_ids entry", t) for t in (self.allowed_token_ids or ())]
        ids += [("bad_words token", t) for w in self.bad_words for t in w]
        ids += [("stop_token_ids entry", t) for t in self.stop_token_ids]
        if self.think_end_token_id is not None:
            ids.append(("think_end_token_id", self.think_end_token_id))
        for name, tok in ids:
            if not 0 <= tok < vocab_size:
                raise InvalidInput(name, tok, f"a token id in [0, {vocab_size}) for this vocabulary")

    def to_json(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["logit_bias"] = {str(k): v for k, v in dict(self.logit_bias).items()}
        for k in ("allowed_token_ids", "stop_token_ids", "choice"):
            if d[k] is not None:
                d[k] = list(d[k])
        d["bad_words"] = [list(w) for w in self.bad_words]
        return d

    @classmethod
    def from_json(cls, d: Mapping) -> "SamplingParams":
        d = dict(d)
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise InvalidInput("sampling parameter", sorted(unknown)[0], f"one of {sorted(cls.__dataclass_fields__)}")
        if "logit_bias" in d:
            d["logit_bias"] = {int(k): float(v) for k, v in d["logit_bias"].items()}
        for k in ("allowed_token_ids", "stop_token_ids", "choice"):
            if d.get(k) is not None:
                d[k] = tuple(d[k])
        if "bad_words" in d:
            d["bad_words"] = tuple(tuple(w) for w in d["bad_words"])
        return cls(**d)


def _token(name: str, tok: object) -> None:
    if isinstance(tok, bool) or not isinstance(tok, int) or tok < 0:
        raise InvalidInput(name, tok, "a non-negative integer token id")
