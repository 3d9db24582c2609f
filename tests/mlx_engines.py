"""mlx-lm with one deliberate bug in its acceptance rule, for the power check of the mlx adapter.

:class:`ArgmaxAcceptMLX` is specfuzz's mlx adapter running mlx-lm's own
``speculative_generate_step`` with one change: a draft token is also kept when it is the
target's most likely token at its position, not only when it equals the target's sample
(a plausible slip: greedy verification mixed into sampled verification). Everything else
(drafting, KV caches, logits processors, sampling, stopping) is mlx-lm's. The function is
mlx-lm's source with those two lines replaced, installed only while this engine generates.
"""

from __future__ import annotations

import contextlib
import inspect
import textwrap
from typing import Sequence

from specfuzz.engines.base import Completion, Request
from specfuzz.engines.mlx_engine import MLXEngine

# mlx-lm 0.32.2's acceptance test and emission inside speculative_generate_step, and the bug.
ACCEPT = "if tn != dtn:"
BUGGY_ACCEPT = "if tn != dtn and dtn != int(mx.argmax(lpn).item()):"
EMIT = "yield tn, lpn, True"
BUGGY_EMIT = "yield dtn, lpn, True"


def _generate_module():
    """The module mlx_lm.generate (``import mlx_lm.generate as m`` gives the function of that
    name, which mlx_lm's package exports)."""
    import importlib

    return importlib.import_module("mlx_lm.generate")


def argmax_accepting_step():
    """mlx-lm's speculative_generate_step with the acceptance rule above (defined in
    mlx_lm.generate's namespace, so it sees the same helpers)."""
    gen = _generate_module()
    src = textwrap.dedent(inspect.getsource(gen.speculative_generate_step))
    if src.count(ACCEPT) != 1 or src.count(EMIT) != 1:
        raise RuntimeError("mlx-lm's speculative_generate_step changed: the acceptance lines to patch are not there")
    src = src.replace(ACCEPT, BUGGY_ACCEPT).replace(EMIT, BUGGY_EMIT)
    ns: dict = {}
    exec(compile(src, gen.__file__, "exec"), gen.__dict__, ns)  # noqa: S102 - mlx-lm's own source, two lines changed
    return ns["speculative_generate_step"]


@contextlib.contextmanager
def _patched():
    gen = _generate_module()
    original = gen.speculative_generate_step
    gen.speculative_generate_step = argmax_accepting_step()
    try:
        yield
    finally:
        gen.speculative_generate_step = original


class ArgmaxAcceptMLX(MLXEngine):
    """mlx-lm whose verification also keeps a draft equal to the target's argmax (a deliberate bug)."""

    name = "mlx-argmax-accept"

    def generate(self, requests: Sequence[Request]) -> list[Completion]:
        with _patched():
            return super().generate(requests)

    def version(self):
        return {**dict(super().version()), "name": self.name, "bug": "a draft equal to the target's argmax is kept"}


class DyingMLX(MLXEngine):
    """mlx-lm whose process dies (``mode="abort"``) or raises (``mode="raise"``) inside
    ``stream_generate``, at the ``fail_at``-th sampling step of its life: a request that
    has already produced tokens never returns."""

    name = "mlx-dying"

    def __init__(self, mode: str = "abort", fail_at: int = 5, **kw) -> None:
        super().__init__(**kw)
        self.mode = mode
        self.fail_at = fail_at
        self.steps = 0

    def _sampling(self, params):
        sampler, processors = super()._sampling(params)

        def dying(logprobs):
            self.steps += 1
            if self.steps >= self.fail_at:
                if self.mode == "abort":
                    import os

                    os.abort()
                raise RuntimeError("[metal::malloc] Attempting to allocate 137438953472 bytes which is greater than the maximum allowed")
            return sampler(logprobs)

        return dying, processors
