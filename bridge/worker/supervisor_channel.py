"""The task supervisor's request socket, for the process a virtualenv / external-python task starts.

Airflow runs a task in a child of its supervisor, whose request socket the child inherits; the
script ``PythonVirtualenvOperator`` / ``ExternalPythonOperator`` run in the other interpreter
reconnects to it (``reinit_supervisor_comms``) whenever that interpreter has Airflow, and asks
for a logging channel first. A bridge worker has no supervisor: without a socket the script
fails before calling the callable (``OSError: Socket operation on non-socket`` on fd 0).

``supervisor_channel`` gives it one for one ``execute``: a socket pair whose child end the script
finds in ``__AIRFLOW_SUPERVISOR_FD`` (the operator passes that variable on), answering the logging
request with a pipe drained into the worker's log, and any other request (Variables,
Connections, XComs, which the inventory refuses in such a callable) with an error. The variable
is process-wide, so these executes take turns within one worker process.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Iterator

_FD_VARIABLE = "__AIRFLOW_SUPERVISOR_FD"
_TURN = threading.Lock()
_log = logging.getLogger(__name__)


@contextlib.contextmanager
def supervisor_channel() -> Iterator[None]:
    """Within the block, a process the task starts finds a supervisor socket that answers it."""
    with _TURN:
        ours, theirs = socket.socketpair()
        theirs.set_inheritable(True)  # the operator starts its process with close_fds=False
        server = threading.Thread(target=_serve, args=(ours,), daemon=True)
        server.start()
        before = os.environ.get(_FD_VARIABLE)
        os.environ[_FD_VARIABLE] = str(theirs.fileno())
        try:
            yield
        finally:
            if before is None:
                os.environ.pop(_FD_VARIABLE, None)
            else:
                os.environ[_FD_VARIABLE] = before
            theirs.close()
            with contextlib.suppress(OSError):
                ours.shutdown(socket.SHUT_RDWR)  # ends the server's wait
            server.join(timeout=5)
            ours.close()


def _serve(sock: socket.socket) -> None:
    """Answers the requests of the processes that inherited the other end, until it closes."""
    import msgspec
    from airflow.sdk.execution_time.comms import (
        ErrorResponse,
        SentFDs,
        _RequestFrame,
        _ResponseFrame,
    )

    decoder = msgspec.msgpack.Decoder(_RequestFrame)
    while True:
        body = _read(sock)
        if body is None:
            return
        try:
            request = decoder.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            # a request we cannot read: close our end, so the child fails at once instead of
            # waiting for an answer until the activity times out (the type only: no payload)
            _log.warning("bridge: unreadable supervisor request (%s): closing", type(exc).__name__)
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            return
        kind = (request.body or {}).get("type")
        if kind == "ResendLoggingFD":
            read_end, write_end = os.pipe()
            frame = _ResponseFrame(id=request.id, body=SentFDs(fds=[]).model_dump())
            socket.send_fds(sock, [bytes(frame.as_bytes())], [write_end])
            os.close(write_end)
            threading.Thread(target=_drain, args=(read_end,), daemon=True).start()
            continue
        error = ErrorResponse(
            detail={"message": f"{kind}: a bridge worker has no task supervisor to answer it"}
        )
        sock.sendall(_ResponseFrame(id=request.id, error=error.model_dump()).as_bytes())


def _read(sock: socket.socket) -> bytes | None:
    """One length-prefixed frame, or None once the other end is closed."""
    header = _exactly(sock, 4)
    if header is None:
        return None
    return _exactly(sock, int.from_bytes(header, "big"))


def _exactly(sock: socket.socket, n: int) -> bytes | None:
    data = bytearray()
    while len(data) < n:
        try:
            chunk = sock.recv(n - len(data))
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def _drain(fd: int) -> None:
    """The child's Airflow log lines (JSON), into the worker's log."""
    with os.fdopen(fd, "rb") as lines:
        for line in lines:
            _log.info("%s", line.decode(errors="replace").rstrip())
