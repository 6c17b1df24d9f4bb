"""The HTTP/1.1 connection under the app: uvicorn's httptools (llhttp) parser, with
two changes (DECISIONS 65).

1. **An invented method still gets our answer.** llhttp knows a fixed list of
   methods; for any other token uvicorn answers a plain-text ``400 Invalid HTTP
   request received.`` and closes. Our contract is the app's RFC 9457 problem (405
   with ``Allow`` on a route, 404 elsewhere), so a message that starts with a token
   outside :data:`METHODS` is handed, with the rest of the connection, to uvicorn's
   h11 protocol, which parses any token and lets the app answer. The check runs at a
   message boundary, on whole chunks: a message pipelined behind another in the same
   chunk is llhttp's to refuse, as every other malformed request is; the requests
   before it are answered first, then the connection closes (uvicorn closed at once).

2. **A small response leaves in one send.** The ASGI cycle writes the status line and
   headers, then the body, each as a ``transport.write``: two system calls and two
   TCP segments per response. :class:`Corked` holds the head until the body follows
   in the same step of the event loop (Starlette sends both without yielding), and
   writes them as one; a head left alone (a streamed response) goes at the loop's
   next turn.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httptools
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

#: The request methods llhttp parses for us: RFC 9110's and PATCH (RFC 5789). A
#: message starting with any other token goes to h11 (it is rare, and often hostile).
METHODS = frozenset(
    {b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"CONNECT", b"OPTIONS", b"TRACE", b"PATCH"}
)
#: Longest method token we wait for while a message's first bytes trickle in; a
#: longer one is not in METHODS anyway.
METHOD_MAX = max(len(m) for m in METHODS)


class Corked(asyncio.Transport):
    """A transport that joins a write with the next one made before the event loop
    turns (a response's head and body) into one ``write``; everything else is the
    wrapped transport's."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._held is None:
            self._held = bytes(data)
            self._loop.call_soon(self._flush)
        else:
            held, self._held = self._held, None
            self._transport.write(held + bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def _flush(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            if not self._transport.is_closing():
                self._transport.write(held)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + len(self._held or b"")

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()


class HttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol on a :class:`Corked` transport, handing a message
    with a method outside :data:`METHODS` to h11 (see the module's docstring)."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._in_message = False  # llhttp began a message it has not finished
        self._first_bytes = b""  # a message's start, held until its method is whole

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(Corked(transport, self.loop))

    def on_message_begin(self) -> None:
        self._in_message = True
        super().on_message_begin()

    def on_message_complete(self) -> None:
        self._in_message = False
        super().on_message_complete()

    def data_received(self, data: bytes) -> None:
        if self._in_message or (self.cycle is not None and not self.cycle.response_complete):
            self._feed(data)  # inside a message, or pipelined behind one
            return
        data = self._first_bytes + data
        space = data.find(b" ", 0, METHOD_MAX + 1)
        if space < 0 and len(data) <= METHOD_MAX:
            self._first_bytes = data  # the method is not whole yet
            return
        self._first_bytes = b""
        if space < 0 or data[:space] not in METHODS:
            self._hand_to_h11(data)
            return
        self._feed(data)

    def _feed(self, data: bytes) -> None:
        """uvicorn's data_received, but a malformed message behind whole ones that are
        still being answered does not cut them off: they are answered (in order, as
        uvicorn answers pipelined requests), then the connection closes. uvicorn wrote
        its 400 and closed at once, so a request the app was already running (a job
        being stored) lost its answer."""
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        except httptools.HttpParserError:
            cycle = self.cycle
            if cycle is not None and not cycle.more_body and not cycle.response_complete:
                self.logger.warning(
                    "Invalid HTTP request received; closing after the ones before it."
                )
                cycle.keep_alive = False
                return
            self.logger.warning("Invalid HTTP request received.")
            self.send_400_response("Invalid HTTP request received.")

    def _hand_to_h11(self, data: bytes) -> None:
        """The rest of this connection is h11's, starting with ``data``."""
        self._unset_keepalive_if_required()
        self.connections.discard(self)
        h11 = H11Protocol(self.config, self.server_state, self.app_state, self.loop)
        self.transport.set_protocol(h11)
        h11.connection_made(self.transport)
        h11.data_received(data)
