"""What makes a dashboard app safe to open in an operator's browser: every request passes
the guard before any view (rq-dashboard's and the panel's alike) and every response leaves
with the headers that keep another site's page out.

- **Host.** A request whose ``Host`` names this server by a name it was not given is
  refused (400): a DNS-rebinding page (a name of the attacker's that resolves to this host)
  cannot read or drive it. An IP address, ``localhost`` (and ``*.localhost``) and the names
  in ``allowed_hosts`` pass; ``*`` lets every name pass (a proxy in front checks them).
- **Writes.** rq-dashboard's actions (delete, requeue, empty, compact) carry no CSRF token
  and a browser sends an operator's basic-auth credentials with any site's form. So every
  request to an endpoint that changes state, and every request with an unsafe method, must
  be a POST (405 otherwise: rq-dashboard's requeue-all also answers GET, which an ``<img>``
  on any page would send) and must show that it comes from this origin: ``Sec-Fetch-Site:
  same-origin``, or where a browser sends no fetch metadata, an ``Origin`` (else a
  ``Referer``) whose host and port are the request's ``Host``. A request that shows no
  origin at all is refused too (403): a script of one's own sends an ``Origin`` header.
- **Pages.** Every HTML page gets a Content-Security-Policy (:mod:`.csp`) unless its view
  set one (the panel's pages set a stricter one): no inline handler, no ``javascript:``
  link and no injected ``<script>`` runs. rq-dashboard builds its rows in the browser from
  JSON with underscore templates whose ``<%= %>`` inserts values unescaped (a queue name,
  a worker name, a job's description or exception text); under the policy such markup
  shows, but none of it runs. Every response is ``nosniff`` and is never framed.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from flask import Flask, Request, Response, request

from .csp import policy, trusted_script_hashes

#: Methods that change nothing, for an endpoint that changes nothing.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: The names every dashboard answers to besides IP addresses.
LOCAL_NAMES = frozenset({"localhost"})


def protect(app: Flask, allowed_hosts: Iterable[str] = ()) -> None:
    """Guard every request of ``app`` and set the safety headers on every response (see the
    module's docstring). ``allowed_hosts``: the names besides IP addresses and ``localhost``
    that ``Host`` may carry (``*``: any)."""
    allowed = {_name(host) for host in allowed_hosts if host.strip()}
    writers: set[str] | None = None

    def guard() -> Response | None:
        if "*" not in allowed and not _host_allowed(_name(request.host), allowed):
            return _refuse(
                400,
                f"this dashboard does not answer to the host name {_name(request.host)!r}; "
                "add it with --allowed-host (RQ_EMQ_DASHBOARD_ALLOWED_HOSTS)",
            )
        nonlocal writers
        if writers is None:  # the URL map is complete by the first request
            writers = _state_changing_endpoints(app)
        if request.method in SAFE_METHODS and request.endpoint not in writers:
            return None
        if request.method != "POST":
            return _refuse(405, f"{request.path} changes state: it takes a POST only")
        if not same_origin(request):
            return _refuse(403, "a request that changes state must come from this dashboard's own pages")
        return None

    def headers(response: Response) -> Response:
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        if (
            response.mimetype == "text/html"
            and "Content-Security-Policy" not in response.headers
            and not response.direct_passthrough
        ):
            # rq-dashboard's pages: what the server renders holds only URL values, escaped by
            # Jinja (values from Redis reach the page as JSON, inserted by its scripts), so
            # the inline scripts of the page as served are its templates' own
            scripts = trusted_script_hashes(response.get_data(as_text=True))
            response.headers["Content-Security-Policy"] = policy(scripts, templates_compile=True)
        return response

    app.before_request_funcs.setdefault(None, []).insert(0, guard)
    app.after_request(headers)


def same_origin(req: Request) -> bool:
    """Whether ``req`` shows that this server's own pages sent it: the browser's fetch
    metadata when it sends it, else its ``Origin`` (or ``Referer``) names the host it was
    sent to. No evidence is no proof."""
    site = req.headers.get("Sec-Fetch-Site")
    if site is not None:
        return site == "same-origin"
    source = req.headers.get("Origin") or req.headers.get("Referer")
    if not source or source == "null":
        return False
    parts = urlsplit(source)
    return parts.scheme in ("http", "https") and parts.netloc.lower() == req.host.lower()


def _state_changing_endpoints(app: Flask) -> set[str]:
    """The endpoints that take an unsafe method: rq-dashboard's actions, whatever its version
    names them."""
    return {rule.endpoint for rule in app.url_map.iter_rules() if set(rule.methods or ()) - SAFE_METHODS}


def _host_allowed(name: str, allowed: set[str]) -> bool:
    if name in LOCAL_NAMES or name.endswith(".localhost") or name in allowed:
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True  # a browser that sends an address was pointed at it: no rebinding name


def _name(host: str) -> str:
    """The name in a ``Host`` value (or a setting), without its port, lower case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host[1:]
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")  # a bare name (``example.com.`` is ``example.com``), or IPv6


def _refuse(status: int, message: str) -> Response:
    return Response(message + "\n", status=status, mimetype="text/plain")
