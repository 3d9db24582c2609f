"""MkDocs hooks for the docs site (mkdocs.yml: ``hooks``).

* The code's docstrings cross-reference with Sphinx roles (``:class:`Request```); mkdocstrings
  renders the role's name literally before the code span: it is dropped.
* click 8.3 gives flags without a default the ``Sentinel.UNSET`` marker, which mkdocs-click
  prints in the CLI reference's Default column: shown as an empty cell.
"""

from __future__ import annotations

import re

_ROLE = re.compile(r":(?:class|meth|func|mod|attr|data|exc|obj):(?=<code>)")
_UNSET = "<code>Sentinel.UNSET</code>"


def on_page_content(html: str, **kwargs) -> str:
    return _ROLE.sub("", html).replace(_UNSET, "")
