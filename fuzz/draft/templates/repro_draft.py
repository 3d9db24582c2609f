# Template: the checkpoints of a repro.py whose draft (if any) is a plain table checkpoint
# (specfuzz.fuzz.draft.repro renders it after repro_common). The imports above the "repro.py
# begins" line are for linting and testing this file alone; the script defines those names itself.
import os

from specfuzz.fuzz.draft.templates.repro_common import (
    DRAFT_EOS_TOKEN_ID, DRAFT_TABLE, DRAFT_TOKENIZER, EOS_TOKEN_ID, TARGET_TABLE, TOKENIZER, write_checkpoint,
)

# ---- repro.py begins ----


class Checkpoints:
    def __init__(self, root):
        self.target = write_checkpoint(os.path.join(root, "target"), TARGET_TABLE, EOS_TOKEN_ID, TOKENIZER)
        self.draft = None
        if DRAFT_TABLE is not None:
            self.draft = write_checkpoint(os.path.join(root, "draft"), DRAFT_TABLE, DRAFT_EOS_TOKEN_ID, DRAFT_TOKENIZER)
