"""``specfuzz draft ENTRY --format github``: the issue ready to paste into the engine's form.

The title line (the form's prefix, e.g. vLLM's ``[Bug]: ``), the labels the form sets, the form's
address, then the body: ISSUE.md without its heading and drafting note, the plot as an attachment
to add, and repro.py inlined in a collapsed block (GitHub does not take ``.py`` attachments) as long
as the body stays within GitHub's limit.
"""

from __future__ import annotations

import re

from specfuzz.fuzz.draft.forms import Form

# GitHub's largest issue body (characters).
GITHUB_BODY_LIMIT = 65536


def github_text(issue_md: str, repro: str, form: Form) -> str:
    """Title, labels, form address and body of a drafted issue."""
    lines = issue_md.splitlines()
    title = lines[0].removeprefix("# ").strip() if lines and lines[0].startswith("# ") else ""
    body = "\n".join(lines[1:]).lstrip("\n")
    if body.startswith("*Drafted by specfuzz"):
        body = body.split("\n\n", 1)[1] if "\n\n" in body else ""
    body = re.sub(r"!\[([^\]]*)\]\(plot\.png\)", r"*(attach plot.png here: \1)*", body)
    inline = (f"\n\n<details><summary>repro.py ({len(repro.splitlines())} lines)</summary>\n\n```python\n"
              f"{repro.rstrip()}\n```\n\n</details>\n")
    if len(body) + len(inline) <= GITHUB_BODY_LIMIT:
        body = body.rstrip("\n") + inline
    else:
        body = body.rstrip("\n") + "\n\n*(repro.py is too long to inline within GitHub's body limit: attach it as repro.txt)*\n"
    head = [f"Title: {title}", f"Labels: {', '.join(form.labels) or '(none)'}"]
    if form.url:
        head.append(f"Form: {form.url}")
    return "\n".join(head) + "\n\n" + body
