"""The supervisor socket a bridge worker gives a virtualenv / external-python task's process."""

from __future__ import annotations

import socket
import threading

from bridge.worker.supervisor_channel import _serve


def test_an_unreadable_request_closes_the_channel_instead_of_leaving_the_child_waiting() -> None:
    ours, theirs = socket.socketpair()
    server = threading.Thread(target=_serve, args=(ours,), daemon=True)
    server.start()
    garbage = b"\xc1not msgpack"
    theirs.sendall(len(garbage).to_bytes(4, "big") + garbage)
    theirs.settimeout(10)
    assert theirs.recv(16) == b""  # the end of the stream: the child's read fails at once
    server.join(timeout=10)
    assert not server.is_alive()
    ours.close()
    theirs.close()
