"""The panel's Content-Security-Policy: no script runs on its pages but the inline scripts
its own templates wrote and files from its own origin.

Escaping is the first defence (every value shown is user data: a job's id, description,
report). This is the second, for the day an escape is missed: an injected attribute
handler (``onfocus=``, ``onerror=``) or ``javascript:`` link never runs, since the policy
allows no inline handler, and an injected ``<script>`` never runs either, since inline
scripts are allowed by their SHA-256 alone.

Which inline scripts are trusted is read from the page rendered *without* any data read
from Redis (:func:`trusted_script_hashes`): the scripts there come from the templates
(rq-dashboard's ``base.html`` and its settings, our navigation link, our refresh loop)
and nothing else, so no value from Redis can reach the list of hashes. rq-dashboard's
inline script holds its settings (the poll interval, the URL prefix), so its hash is
taken from each render rather than fixed here.
"""

from __future__ import annotations

import base64
import hashlib
from html.parser import HTMLParser

#: What a page of the panel may load: its own origin's styles, images, fonts and fetches;
#: styles may be inline (rq-dashboard's templates carry ``style=`` attributes; a style
#: cannot run code); no plugin, no frame, no foreign form target, no ``<base>``.
BASE_POLICY = (
    "default-src 'self'",
    "img-src 'self' data:",
    "style-src 'self' 'unsafe-inline'",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
)


#: The ``type`` values a browser runs a ``<script>`` of (``module`` too).
JAVASCRIPT_TYPES = frozenset({"text/javascript", "application/javascript", "module", ""})


class _InlineScripts(HTMLParser):
    """The text of every inline ``<script>`` element a browser runs (no ``src``, a script
    type), exactly as written."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=False)
        self.scripts: list[str] = []
        self._current: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        given = dict(attrs)
        kind = (given.get("type") or "text/javascript").strip().lower()
        # a script of another type (rq-dashboard's row templates, text/template) never runs
        if tag == "script" and "src" not in given and kind in JAVASCRIPT_TYPES:
            self._current = []

    def handle_data(self, data: str) -> None:
        if self._current is not None:
            self._current.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "script" and self._current is not None:
            self.scripts.append("".join(self._current))
            self._current = None


def trusted_script_hashes(page_without_data: str) -> list[str]:
    """The CSP source (``'sha256-...'``) of each inline script in a page rendered with no
    data from Redis in it."""
    parser = _InlineScripts()
    parser.feed(page_without_data)
    parser.close()
    return sorted(
        {
            "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"
            for text in parser.scripts
        }
    )


def policy(script_hashes: list[str] | None, templates_compile: bool = False) -> str:
    """The header's value: scripts from this origin and the given inline ones; with None,
    no script at all (the panels' refresh fragment, which the page inserts as HTML).

    ``templates_compile``: the page's scripts compile templates into functions (rq-dashboard
    builds its rows with underscore's ``_.template``, a ``Function`` constructor), so
    ``'unsafe-eval'`` is allowed. What it compiles is the page's own template text; values
    from Redis are only ever passed to the compiled functions, never compiled, and the
    markup they insert still runs no handler and no ``<script>``."""
    sources = ["'self'", *(script_hashes or ())] + (["'unsafe-eval'"] if templates_compile else [])
    scripts = "'none'" if script_hashes is None else " ".join(sources)
    return "; ".join([*BASE_POLICY, f"script-src {scripts}"])
