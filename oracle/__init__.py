"""specfuzz.oracle: the exact target law μ of a lookup-table model.

Main names: :class:`TargetLaw` (per-request law: conditionals, enumeration),
:class:`OutputLaw` (μ over complete outputs), :class:`SamplingParams`, semantics profiles
(:class:`Profile`, :class:`VLLMProfile`) and the token-constraint automaton
(:class:`TokenDFA`).
"""

from .constraint import TokenDFA, compile_constraint
from .law import OutputLaw, OutputSpaceTooLarge, TargetLaw
from .params import SamplingParams
from .semantics import PROCESSORS, PROFILES, Profile, VLLMProfile, get_profile

__all__ = [
    "PROCESSORS",
    "PROFILES",
    "OutputLaw",
    "OutputSpaceTooLarge",
    "Profile",
    "SamplingParams",
    "TargetLaw",
    "TokenDFA",
    "VLLMProfile",
    "compile_constraint",
    "get_profile",
]
