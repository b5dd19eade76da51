"""What a browser may do: the Host header checked against DNS rebinding, a CSP on every reply."""
from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_BINDS = frozenset({"0.0.0.0", "::", ""})


def host_name(host_header: str) -> str:
    """The name in a Host header, without port or IPv6 brackets, lower-case."""
    try:
        return (urlsplit(f"//{host_header}").hostname or "").lower()
    except ValueError:
        return ""


def is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


def allowed_hosts(bind_host: str, extra: tuple[str, ...] = ()) -> frozenset[str]:
    names = set(LOOPBACK_NAMES) | {h.lower() for h in extra}
    if bind_host not in WILDCARD_BINDS:
        names.add(host_name(bind_host) or bind_host.lower())
    return frozenset(names)


def host_allowed(host_header: str | None, allowed: frozenset[str]) -> bool:
    """An IP literal or a name this server was told of; no Host at all (HTTP/1.0 scripts) passes."""
    if host_header is None:
        return True
    name = host_name(host_header)
    return bool(name) and (name in allowed or is_ip(name))


def content_security_policy(host_header: str | None) -> str:
    sockets = f" ws://{host_header} wss://{host_header}" if host_header else ""
    return ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
            "img-src 'self' data: blob:; font-src 'self'; object-src 'none'; base-uri 'self'; "
            f"form-action 'self'; frame-ancestors 'none'; connect-src 'self'{sockets}")


def origin_allowed(origin: str | None, host_header: str | None, extra: tuple[str, ...] = ()) -> bool:
    """The page's own host:port, any localhost, or an --allow-origin; no Origin (not a browser) passes."""
    if origin is None or origin in extra:
        return True
    try:
        parts = urlsplit(origin)
        parts.hostname
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    if parts.hostname in LOOPBACK_NAMES:
        return True
    return host_header is not None and parts.netloc.lower() == host_header.lower()


class SecurityMiddleware:
    """Pure ASGI (it must see WebSocket handshakes too, and must not buffer streams)."""

    def __init__(self, app, bind_host: str, extra_hosts: tuple[str, ...] = ()):
        self.app = app
        self.allowed = allowed_hosts(bind_host, extra_hosts)

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
        host = headers.get("host")
        if not host_allowed(host, self.allowed):
            return await refuse(scope, send, host)
        if scope["type"] == "websocket":
            # the server's own connection, for cutting a peer that never reads (see ws.evict)
            scope["kvscope.transport"] = getattr(getattr(send, "__self__", None), "transport", None)
            return await self.app(scope, receive, send)
        policy = content_security_policy(host if host and host_name(host) else None).encode("latin-1")

        async def with_headers(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []),
                                      (b"content-security-policy", policy),
                                      (b"x-content-type-options", b"nosniff"),
                                      (b"x-frame-options", b"DENY"),
                                      (b"referrer-policy", b"no-referrer")]
            await send(message)
        await self.app(scope, receive, with_headers)


async def refuse(scope, send, host: str | None) -> None:
    name = host_name(host or "")[:80] or "(unreadable)"
    if scope["type"] == "websocket":   # a close before accept is an HTTP 403 to the client
        await send({"type": "websocket.close", "code": 1008, "reason": f"host not allowed: {name}"[:120]})
        return
    body = (f"Host {name!r} is not allowed: start kvscope serve with --allow-host {name} "
            f"if this is the name the class uses\n").encode("utf-8", "backslashreplace")
    await send({"type": "http.response.start", "status": 421,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
