"""Complete text frames read straight from the bytes a websockets connection receives.

A stream's messages are small text frames, one per message. websockets parses every frame with a
generator-based parser (a frame object, a queue, the protocol's bookkeeping) before anything sees
it; for a frame that is complete, unfragmented, valid UTF-8 and within the size limit, that work
yields nothing but the text. :func:`take_text_frames` reads such frames off the front of the
received bytes (RFC 6455 §5.2: ``FIN`` set, no ``RSV`` bit, opcode 1, masked exactly when the
peer is a client, a 7- or 16-bit length) and stops at the first byte of anything else — a
fragment, a binary or control frame, a 64-bit length, invalid UTF-8, a frame over the limit, a
frame cut off by the end of the read — which websockets then parses from exactly there, so it
keeps every rule (reassembly, pings and the close handshake, 1002/1007/1009) for all of them.

This is only safe where websockets' parser waits for the first byte of a frame with nothing
buffered: :func:`parser_waits_for_a_frame` tells. The client's connection
(:class:`~airflow_provider_systemzero.stream.gateway_socket.GatewaySocket`) and the emulator's
(:class:`~airflow_provider_systemzero.emulator.websocket.EmulatorConnection`) use both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from websockets.frames import apply_mask  # type: ignore[attr-defined]  # websockets' C speedup when built
from websockets.protocol import State
from websockets.streams import StreamReader

__all__ = ["parser_waits_for_a_frame", "take_text_frames"]

#: ``FIN`` set, no ``RSV`` bit, opcode 1 (text).
_FIN_TEXT = 0x81
_MASKED = 0x80
_AT_EOF = StreamReader.at_eof.__code__


def parser_waits_for_a_frame(protocol: Any) -> bool:
    """Whether websockets' parser of ``protocol`` (a ``websockets.protocol.Protocol``) waits for
    the first byte of a frame: the connection is open, no message is being reassembled, no
    extension is in use, nothing is buffered and the parser is suspended between frames.

    :param protocol: the connection's websockets protocol.
    """
    if (
        protocol.state is not State.OPEN
        or protocol.current_size is not None
        or protocol.extensions
        or protocol.reader.buffer
        or protocol.parser_exc is not None
    ):
        return False
    waiting = protocol.parser  # the client's and the server's parse() delegate to the common one
    while (inner := getattr(waiting, "gi_yieldfrom", None)) is not None:
        waiting = inner
    return getattr(waiting, "gi_code", None) is _AT_EOF


def take_text_frames(
    data: bytes, *, masked: bool, max_size: int | None, handle: Callable[[str, int], bool]
) -> int:
    """Hand each complete text frame at the front of ``data`` to ``handle``, in order; the number
    of bytes they took (websockets reads the rest).

    :param data: bytes just received, starting at a frame boundary.
    :param masked: the frames come from a client (masked, RFC 6455 §5.3), not from a server.
    :param max_size: the largest payload accepted (``None``: no limit); a larger frame is left to
        websockets, which refuses it (1009).
    :param handle: takes one frame's text and its size in bytes; ``False`` stops after it (the next
        frames are left too).
    """
    size = len(data)
    position = 0
    while size - position >= 2:
        second = data[position + 1]
        if data[position] != _FIN_TEXT or bool(second & _MASKED) is not masked:
            break
        length = second & 0x7F
        start = position + 2
        if length == 126:
            if size - start < 2:
                break
            length = (data[start] << 8) | data[start + 1]
            start += 2
        elif length == 127:
            break  # 64-bit lengths: far beyond what a stream message needs
        mask = b""
        if masked:
            mask = data[start : start + 4]
            start += 4
        end = start + length
        if end > size or (max_size is not None and length > max_size):
            break
        payload = data[start:end]
        if masked:
            payload = apply_mask(payload, mask)
        try:
            text = payload.decode()
        except UnicodeDecodeError:
            break  # websockets closes with 1007
        position = end
        if not handle(text, length):
            break
    return position
