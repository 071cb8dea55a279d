"""Which life of the server answered: an instance id, random per start, on every reply.

A session id means something only to the server process that handed it out.
AgentGym's servers count ids from 0 again after a restart, so a restart quick
enough that no request fails lets a client step an id that now belongs to
someone else's episode. `serve-env` starts its ids at a random number, and
also stamps every reply with `X-AgentGym-Instance`: a client that remembers
the instance its id came from sees a restart on the next reply, whatever the
ids. A request that carries the header is refused when it names another
instance, so it never reaches a session of the new life. AgentGym's own
clients send no such header and ignore it in replies.
"""

from __future__ import annotations

import secrets
from typing import Any

from agentgym_core.serve.dialects import EnvError, answer

HEADER = "X-AgentGym-Instance"
"""Reply header (and optional request header) holding the server's instance id."""
_HEADER_KEY = HEADER.lower().encode()


def new_instance() -> str:
    """A fresh instance id: 16 hex digits."""
    return secrets.token_hex(8)


def other_instance(expected: str, instance: str) -> EnvError:
    """A request meant for the server's previous life: 409, or 200 `{"error": ...}`."""
    return EnvError(
        409,
        f"this server restarted: it is instance {instance}, the request was meant for "
        f"instance {expected}; its session ids are gone (create a new one)",
        loc=["header", HEADER.lower()],
        kind="instance_mismatch",
    )


class InstanceStamp:
    """ASGI middleware: add the instance header to every reply; refuse another instance's calls.

    Args:
        app: the ASGI app to wrap.
        server: anything with `instance` (read per request: it changes when the
            server starts again) and `dialect.strict`.
    """

    def __init__(self, app: Any, server: Any) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Serve one ASGI request."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        instance = self.server.instance

        async def stamped(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                message = {**message, "headers": [*headers, (_HEADER_KEY, instance.encode())]}
            await send(message)

        expected = dict(scope.get("headers", [])).get(_HEADER_KEY)
        if expected is not None and expected.decode("latin-1") != instance:
            refusal = other_instance(expected.decode("latin-1"), instance)
            await answer(refusal, self.server.dialect.strict)(scope, receive, stamped)
            return
        await self.app(scope, receive, stamped)
