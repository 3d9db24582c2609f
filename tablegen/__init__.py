"""specfuzz.tablegen: Llama checkpoints whose next-token logits are exactly a table.

See :mod:`specfuzz.tablegen.checkpoint` for the construction and why it is exact.
torch, safetensors and tokenizers are imported only when a checkpoint is written/read.
"""

from specfuzz.tablegen.checkpoint import (
    RMS_NORM_EPS,
    CheckpointInfo,
    default_hidden_size,
    load_table,
    write_checkpoint,
    write_pair,
)
from specfuzz.tablegen.rounding import DTYPES, MASKED_LOGIT, round_table
from specfuzz.tablegen.vocab import MAX_VOCAB, text_token, token_text, tokens_text

__all__ = [
    "CheckpointInfo",
    "DTYPES",
    "MASKED_LOGIT",
    "MAX_VOCAB",
    "RMS_NORM_EPS",
    "default_hidden_size",
    "load_table",
    "round_table",
    "text_token",
    "token_text",
    "tokens_text",
    "write_checkpoint",
    "write_pair",
]
