"""The one-character-per-token tokenizer files of a table checkpoint.

Token ``i`` is the text ``token_text(i)``. A WordLevel model over exactly V entries, no
normalizer, a pre-tokenizer that isolates every character, no post-processor (nothing is
prepended or appended on encode) and a Fuse decoder (tokens are joined without spaces).
EOS/BOS are ordinary vocabulary entries that are also registered as special tokens, so
the vocabulary size stays exactly V. Characters outside the first V of the alphabet are
not encodable (WordLevel has no unknown token here, so encoding them raises).
"""

from __future__ import annotations

import json
from pathlib import Path

from specfuzz.tablegen.vocab import token_text

# Split on every character; each match is its own pre-token.
_ONE_CHAR_PATTERN = "."


def _tokenizer_json(vocab_size: int, special_ids: list[int]) -> str:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    vocab = {token_text(i): i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(_ONE_CHAR_PATTERN), behavior="isolated")
    tok.decoder = decoders.Fuse()
    if special_ids:
        tok.add_special_tokens(
            [AddedToken(token_text(i), special=True, normalized=False) for i in special_ids]
        )
    assert tok.get_vocab_size(with_added_tokens=True) == vocab_size
    return tok.to_str(pretty=True)


def write_tokenizer_files(
    out_dir: Path,
    vocab_size: int,
    *,
    eos_token_id: int | None,
    bos_token_id: int | None,
    model_max_length: int,
) -> None:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json."""
    special: dict[str, str] = {}
    if bos_token_id is not None:
        special["bos_token"] = token_text(bos_token_id)
    if eos_token_id is not None:
        special["eos_token"] = token_text(eos_token_id)
    special_ids = sorted({i for i in (bos_token_id, eos_token_id) if i is not None})

    (out_dir / "tokenizer.json").write_text(
        _tokenizer_json(vocab_size, special_ids), encoding="utf-8"
    )
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
        **special,
    }
    _write_json(out_dir / "tokenizer_config.json", config)
    _write_json(out_dir / "special_tokens_map.json", special)


def _write_json(path: Path, obj: object) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
