"""A minimal OpenAI-compatible HTTP endpoint on 127.0.0.1, in front of the agent loops' trajectories.

One endpoint per event loop of an agent loop worker (``endpoint_for_running_loop``), started by the first
``openai_agent`` trajectory on it, on a free port of 127.0.0.1 only, with a random token made when it
starts: a request without ``Authorization: Bearer <token>`` is answered 401. Each trajectory has its own
base url, ``http://127.0.0.1:<port>/t/<trajectory id>/v1``; the routes under it are ``POST
/chat/completions``, ``POST /completions`` and ``GET /models``. What a call does is the trajectory's
business (``openai_agent.AgentTrajectory``); errors reach the client as OpenAI's error JSON with a message
(``EndpointError`` carries the status). HTTP/1.1 with keep-alive and Content-Length bodies, no streaming:
what the ``openai`` client sends. Standard library only (asyncio streams): no web framework to install.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import secrets
from http import HTTPStatus

logger = logging.getLogger(__name__)
MAX_BODY_BYTES = 64 << 20


class EndpointError(Exception):
    """An error for the client: HTTP ``status`` and a message (OpenAI's ``error`` object)."""

    def __init__(self, status: int, message: str, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


class OpenAIEndpoint:
    """Routes ``/t/<id>/v1/<route>`` to ``trajectories[id].handle(route, body)`` (an awaitable giving a
    JSON-able dict or raising ``EndpointError``)."""

    def __init__(self):
        self.token = secrets.token_urlsafe(32)
        self.trajectories: dict = {}
        self.server: asyncio.AbstractServer | None = None
        self.port = 0
        self.ready: asyncio.Future | None = None  # the start, awaited by every trajectory

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._connection, host="127.0.0.1", port=0)
        self.port = self.server.sockets[0].getsockname()[1]

    def base_url(self, trajectory_id: str) -> str:
        return f"http://127.0.0.1:{self.port}/t/{trajectory_id}/v1"

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, *header_lines = head.decode("latin-1").split("\r\n")
                method, path, _ = request_line.split(" ", 2)
                headers = dict(line.split(":", 1) for line in header_lines if ":" in line)
                headers = {k.strip().lower(): v.strip() for k, v in headers.items()}
                length = int(headers.get("content-length", 0))
                if length > MAX_BODY_BYTES or "chunked" in headers.get("transfer-encoding", ""):
                    await self._reply(writer, 413, _error(413, "request body too large or chunked"), close=True)
                    return
                body = await reader.readexactly(length) if length else b""
                status, payload = await self._answer(method, path, headers, body)
                close = headers.get("connection", "").lower() == "close"
                await self._reply(writer, status, payload, close)
                if close:
                    return
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
            pass  # the client went away or sent something that is not HTTP: drop the connection
        finally:
            writer.close()

    async def _answer(self, method: str, path: str, headers: dict, body: bytes) -> tuple[int, dict]:
        try:
            given = headers.get("authorization", "").removeprefix("Bearer ").strip()
            if not hmac.compare_digest(given.encode(), self.token.encode()):
                raise EndpointError(401, "missing or wrong API key: use the run's token (the client's api_key)")
            parts = path.split("?", 1)[0].strip("/").split("/")
            if len(parts) < 4 or parts[0] != "t" or parts[2] != "v1":
                raise EndpointError(404, f"no route {path!r}: the routes are /t/<trajectory>/v1/...")
            trajectory = self.trajectories.get(parts[1])
            if trajectory is None:
                raise EndpointError(404, f"trajectory {parts[1]!r} is not running (finished, failed or unknown)")
            route = "/".join(parts[3:])
            if (method, route) not in (("POST", "chat/completions"), ("POST", "completions"), ("GET", "models")):
                raise EndpointError(404, f"no route {method} /v1/{route}")
            request = json.loads(body or b"{}")
            if not isinstance(request, dict):
                raise EndpointError(400, "the request body must be a JSON object")
            return 200, await trajectory.handle(route, request)
        except EndpointError as e:
            return e.status, _error(e.status, e.message, e.code)
        except json.JSONDecodeError as e:
            return 400, _error(400, f"the request body is not JSON: {e}")
        except Exception as e:  # a bug or an engine failure: the agent gets it as a 500 with the message
            logger.warning("openai endpoint: %s %s failed", method, path, exc_info=True)
            return 500, _error(500, f"{type(e).__name__}: {e}")

    @staticmethod
    async def _reply(writer: asyncio.StreamWriter, status: int, payload: dict, close: bool) -> None:
        data = json.dumps(payload).encode()
        head = (
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: {'close' if close else 'keep-alive'}\r\n\r\n"
        )
        writer.write(head.encode() + data)
        await writer.drain()


def _error(status: int, message: str, code: str | None = None) -> dict:
    kind = {401: "authentication_error", 404: "not_found_error"}.get(status, "invalid_request_error")
    return {"error": {"message": message, "type": kind if status < 500 else "server_error", "code": code}}


_ENDPOINTS: dict[asyncio.AbstractEventLoop, OpenAIEndpoint] = {}


async def endpoint_for_running_loop() -> OpenAIEndpoint:
    """The endpoint of the running event loop, started on first use (endpoints of closed loops are dropped)."""
    for old in [loop for loop in _ENDPOINTS if loop.is_closed()]:
        del _ENDPOINTS[old]
    loop = asyncio.get_running_loop()
    if loop not in _ENDPOINTS:
        endpoint = OpenAIEndpoint()
        _ENDPOINTS[loop] = endpoint  # before the await: concurrent first trajectories share it
        endpoint.ready = asyncio.ensure_future(endpoint.start())
    endpoint = _ENDPOINTS[loop]
    await asyncio.shield(endpoint.ready)
    return endpoint
