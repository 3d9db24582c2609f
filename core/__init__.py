"""specfuzz: does an engine's speculative decoding sample exactly from the target law?

The package layout follows the data flow (design card):
strategies (draw a case) -> tablegen (write its checkpoints) -> engines (sample) ->
oracle (exact law, verdict) -> fuzz (shrink, store) -> corpus / triage / draft.

The top-level folders of the repository are the subpackages: ``specfuzz.oracle`` lives in
``oracle/``, ``specfuzz.tablegen`` in ``tablegen/``, and this root package in ``core/``.
"""

__version__ = "0.1.0"
