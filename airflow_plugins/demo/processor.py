"""A payment processor to test against: Stripe's PaymentIntents API, as Stripe documents it.

A stand-in at the boundary (a real Stripe account cannot be reached from here), on 127.0.0.1,
driven by the official ``stripe`` SDK with its ``api_base`` pointed here. It honours Stripe's
idempotency keys, never deduplicates on content, can check fencing tokens (Kleppmann's fencing
design), records every charge, and injects faults for the tests; ``PaymentProcessor`` gives
the rules and the faults.

Run it alone: ``python -m airflow_plugins.demo.processor --port 8765 [--check-tokens]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import secrets
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

KEY_TTL_S = 24 * 3600.0
FAULT_MODES = frozenset({"timeout_after_commit", "error_500", "declined", "malformed", "down"})
DECLINING_PAYMENT_METHOD = "pm_card_chargeDeclined"

Answer = tuple[int, dict[str, Any]]


@dataclasses.dataclass
class Fault:
    """One injected fault: ``mode`` for the next ``times`` matching requests (None: all).

    ``customers`` limits it to intents whose ``metadata[customer]`` is one of them.
    """

    mode: str
    times: int | None = 1
    customers: frozenset[str] | None = None
    delay: float = 5.0

    def matches(self, customer: str | None) -> bool:
        """Whether this fault applies to a request for ``customer``."""
        if self.times is not None and self.times <= 0:
            return False
        return self.customers is None or customer in self.customers


class Faults:
    """The faults the processor injects, consumed as matching requests arrive."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []

    def add(
        self,
        mode: str,
        *,
        times: int | None = 1,
        customers: list[str] | None = None,
        delay: float = 5.0,
    ) -> None:
        """Injects ``mode`` for the next ``times`` requests (for ``customers`` only, if given).

        Raises:
            ValueError: an unknown mode.
        """
        if mode not in FAULT_MODES:
            raise ValueError(f"unknown fault mode {mode!r}; one of {sorted(FAULT_MODES)}")
        chosen = None if customers is None else frozenset(customers)
        with self._lock:
            self._faults.append(Fault(mode, times, chosen, float(delay)))

    def clear(self) -> None:
        """Removes every fault."""
        with self._lock:
            self._faults.clear()

    def take(self, customer: str | None, modes: frozenset[str]) -> Fault | None:
        """The first fault of ``modes`` matching the request, counted as used."""
        with self._lock:
            for fault in self._faults:
                if fault.mode in modes and fault.matches(customer):
                    if fault.times is not None:
                        fault.times -= 1
                    return fault
        return None


@dataclasses.dataclass
class _Saved:
    params: dict[str, str]
    path: str
    created: float
    answer: Answer | None = None  # None while the first request is executing


@dataclasses.dataclass
class _Reply:
    answer: Answer
    replayed: bool = False
    delay: float = 0.0
    malformed: bool = False
    drop: bool = False


def _fence_of(headers: Any) -> tuple[str, int] | None:
    """The request's (lease key, fencing token), when it carries both as it should."""
    lease_key, raw = headers.get("X-Lease-Key"), headers.get("X-Fencing-Token")
    try:
        return None if lease_key is None else (str(lease_key), int(raw or ""))
    except ValueError:
        return None


def _error(status: int, type_: str, message: str, code: str | None = None, **extra: Any) -> Answer:
    body: dict[str, Any] = {"type": type_, "message": message, **extra}
    if code is not None:
        body["code"] = code
    return status, {"error": body}


class PaymentProcessor:
    """The processor's state and rules; ``start()`` serves it over HTTP on 127.0.0.1.

    What it honours, from Stripe's "Idempotent requests" page:

    - ``Idempotency-Key``: the status and body of the first request with a key are saved once
      the endpoint starts executing and replayed for 24 h, success or failure (a declined card
      too);
    - the same key with different parameters is refused with ``idempotency_error`` (400);
    - a request while the first with that key is still executing is refused with a conflict
      (409, ``idempotency_key_in_use``), and nothing is saved for it;
    - parameters that fail validation are refused before execution and nothing is saved;
    - keys expire after 24 h (the clock is injectable), then the key makes a new request.

    It never deduplicates on content: two keys with the same parameters make two charges. With
    ``check_tokens`` it is the resource of Kleppmann's fencing design: every request carrying
    ``X-Lease-Key`` must carry ``X-Fencing-Token``, and a token lower than the highest it has
    seen for that lease key is refused (409, ``stale_fencing_token``); reads advance the token
    too, so a holder's lookup shuts out every older holder. ``idempotency=False`` ignores
    idempotency keys (a processor with token checks only, or with neither).

    Every charge is recorded and listed (``GET /v1/charges``, and ``GET /_processor/charges``
    for the tests and the demo). Faults for tests, set with ``POST /_processor/faults`` or
    ``faults.add``: ``timeout_after_commit`` (charge made and saved, the answer comes after
    ``delay`` s), ``error_500`` (before execution: nothing made or saved), ``declined`` (card
    declined: saved), ``malformed`` (charge made and saved, this one answer is not JSON),
    ``down`` (the connection is dropped before anything is read); and ``stop()`` for a
    processor that refuses connections.

    Args:
        idempotency: honour ``Idempotency-Key`` (Stripe's behaviour).
        check_tokens: refuse a ``X-Fencing-Token`` lower than the highest seen per lease key.
        clock: seconds since the epoch (injectable, for key expiry).
        latency: seconds each charge takes to execute (a key is in flight meanwhile).
    """

    def __init__(
        self,
        *,
        idempotency: bool = True,
        check_tokens: bool = False,
        clock: Callable[[], float] = time.time,
        latency: float = 0.0,
    ) -> None:
        self.idempotency = idempotency
        self.check_tokens = check_tokens
        self.latency = latency
        self.faults = Faults()
        self.clock_offset = 0.0
        self._clock = clock
        self._lock = threading.Lock()
        self._keys: dict[str, _Saved] = {}
        self._tokens: dict[str, int] = {}
        self._charges: list[dict[str, Any]] = []
        self._intents: dict[str, dict[str, Any]] = {}
        self._refused: list[dict[str, Any]] = []
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    # -- serving ----------------------------------------------------------------------------

    def start(self, port: int = 0) -> str:
        """Serves on 127.0.0.1 (a free port when 0; the same port again after ``stop``)."""
        if port == 0 and self.port is not None:
            port = self.port
        server = ThreadingHTTPServer(("127.0.0.1", port), _handler_for(self))
        server.daemon_threads = True
        server.block_on_close = False  # keep-alive clients must not hold up stop()
        self._server = server
        self.port = int(server.server_address[1])
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()
        return self.url

    def stop(self) -> None:
        """Stops serving: connections are refused until ``start`` again (the state is kept)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def url(self) -> str:
        """The base address to give the SDK as ``api_base``."""
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> PaymentProcessor:
        if self._server is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what tests and the demo read ---------------------------------------------------------

    def now(self) -> float:
        """The processor's clock (the injected clock plus any advance)."""
        return self._clock() + self.clock_offset

    def advance(self, seconds: float) -> None:
        """Moves the processor's clock forward (keys older than 24 h expire)."""
        self.clock_offset += seconds

    def charges(self) -> list[dict[str, Any]]:
        """Every charge the processor made, in order."""
        with self._lock:
            return [dict(c) for c in self._charges]

    def refused(self) -> list[dict[str, Any]]:
        """Requests refused for a stale fencing token."""
        with self._lock:
            return [dict(r) for r in self._refused]

    # -- the API ------------------------------------------------------------------------------

    def handle(self, method: str, path: str, params: dict[str, str], headers: Any) -> _Reply:
        """Answers one API request (the HTTP handler's whole job)."""
        stale = self._check_token(method, path, headers)
        if stale is not None:
            return _Reply(stale)
        if method == "GET":
            return _Reply(self._read(path, params))
        if method == "POST" and path == "/v1/payment_intents":
            return self._create(params, headers.get("Idempotency-Key"), _fence_of(headers))
        return _Reply(_error(404, "invalid_request_error", f"Unrecognized request URL ({path})"))

    def _check_token(self, method: str, path: str, headers: Any) -> Answer | None:
        if not self.check_tokens or not path.startswith("/v1/"):
            return None
        lease_key, raw = headers.get("X-Lease-Key"), headers.get("X-Fencing-Token")
        if lease_key is None:
            if method == "POST":
                return _error(400, "invalid_request_error", "X-Lease-Key is required here")
            return None
        try:
            token = int(raw or "")
        except ValueError:
            return _error(400, "invalid_request_error", "X-Fencing-Token must be an integer")
        with self._lock:
            return self._stale((lease_key, token))

    def _stale(self, fence: tuple[str, int] | None) -> Answer | None:
        """The refusal of a token lower than the key's highest (under ``_lock``)."""
        if not self.check_tokens or fence is None:
            return None
        lease_key, token = fence
        highest = self._tokens.get(lease_key, 0)
        if token >= highest:
            self._tokens[lease_key] = token
            return None
        self._refused.append({"lease_key": lease_key, "token": token, "highest": highest})
        return _error(
            409,
            "invalid_request_error",
            f"fencing token {token} is lower than {highest} already seen for this key",
            code="stale_fencing_token",
        )

    def _create(
        self, params: dict[str, str], key: str | None, fence: tuple[str, int] | None = None
    ) -> _Reply:
        customer = params.get("metadata[customer]")
        if self.faults.take(customer, frozenset({"down"})):
            return _Reply((0, {}), drop=True)
        if self.faults.take(customer, frozenset({"error_500"})):
            # before the endpoint starts executing: nothing made, nothing saved
            return _Reply(_error(500, "api_error", "An unknown error occurred"))
        invalid = _validate(params)
        if invalid is not None:
            return _Reply(invalid)
        if not self.idempotency or not key:
            reply = self._execute(params, customer, key, fence)
            return reply
        with self._lock:
            saved = self._keys.get(key)
            if saved is not None and self.now() - saved.created >= KEY_TTL_S:
                del self._keys[key]  # pruned after 24 h: the key makes a new request
                saved = None
            if saved is not None:
                if saved.params != params or saved.path != "/v1/payment_intents":
                    return _Reply(
                        _error(
                            400,
                            "idempotency_error",
                            "Keys for idempotent requests can only be used with the same "
                            "parameters they were first used with. Try using a key other than "
                            f"'{key}' if you meant to execute a different request.",
                        )
                    )
                if saved.answer is None:
                    return _Reply(
                        _error(
                            409,
                            "invalid_request_error",
                            "There is currently another in-progress request using this "
                            "Stripe token (probably the same idempotency key).",
                            code="idempotency_key_in_use",
                        )
                    )
                return _Reply(saved.answer, replayed=True)
            self._keys[key] = _Saved(dict(params), "/v1/payment_intents", self.now())
        try:
            reply = self._execute(params, customer, key, fence)
        except BaseException:
            with self._lock:
                self._keys.pop(key, None)
            raise
        with self._lock:
            self._keys[key].answer = reply.answer
        return reply

    def _execute(
        self,
        params: dict[str, str],
        customer: str | None,
        key: str | None,
        fence: tuple[str, int] | None = None,
    ) -> _Reply:
        if self.latency > 0:
            time.sleep(self.latency)
        declined = params.get("payment_method") == DECLINING_PAYMENT_METHOD or (
            self.faults.take(customer, frozenset({"declined"})) is not None
        )
        intent_id = "pi_" + secrets.token_hex(12)
        metadata = {k[9:-1]: v for k, v in params.items() if k.startswith("metadata[")}
        intent: dict[str, Any] = {
            "id": intent_id,
            "object": "payment_intent",
            "amount": int(params["amount"]),
            "currency": params["currency"],
            "customer": params.get("customer"),
            "description": params.get("description"),
            "metadata": metadata,
            "created": int(self.now()),
            "livemode": False,
        }
        with self._lock:
            # the token is checked again where the charge is made: a higher token may have
            # come in while this request waited (checked and charged in one step)
            stale = self._stale(fence)
            if stale is not None:
                return _Reply(stale)
            if declined:
                intent.update(status="requires_payment_method", latest_charge=None)
                self._intents[intent_id] = intent
                answer = _error(
                    402,
                    "card_error",
                    "Your card was declined.",
                    code="card_declined",
                    decline_code="generic_decline",
                    payment_intent=intent,
                )
                return _Reply(answer)
            charge_id = "ch_" + secrets.token_hex(12)
            intent.update(status="succeeded", latest_charge=charge_id)
            self._intents[intent_id] = intent
            self._charges.append(
                {
                    "id": charge_id,
                    "object": "charge",
                    "payment_intent": intent_id,
                    "amount": intent["amount"],
                    "currency": intent["currency"],
                    "customer": customer,
                    "metadata": metadata,
                    "idempotency_key": key,
                    "created": intent["created"],
                }
            )
        reply = _Reply((200, intent))
        late = self.faults.take(customer, frozenset({"timeout_after_commit"}))
        if late is not None:
            reply.delay = late.delay
        if self.faults.take(customer, frozenset({"malformed"})) is not None:
            reply.malformed = True
        return reply

    def _read(self, path: str, params: dict[str, str]) -> Answer:
        with self._lock:
            if path == "/v1/charges":
                return 200, _page(self._charges, params, "/v1/charges")
            if path == "/v1/payment_intents":
                return 200, _page(list(self._intents.values()), params, "/v1/payment_intents")
            if path == "/v1/payment_intents/search":
                found = _search(self._intents.values(), params.get("query", ""))
                if found is None:
                    return _error(400, "invalid_request_error", "unsupported search query")
                return 200, {"object": "search_result", "data": found, "has_more": False}
            if path.startswith("/v1/payment_intents/"):
                intent = self._intents.get(path.rsplit("/", 1)[1])
                if intent is None:
                    return _error(404, "invalid_request_error", "No such payment_intent")
                return 200, intent
        return _error(404, "invalid_request_error", f"Unrecognized request URL ({path})")


def _validate(params: dict[str, str]) -> Answer | None:
    for name in ("amount", "currency"):
        if not params.get(name):
            return _error(400, "invalid_request_error", f"Missing required param: {name}.")
    if not params["amount"].isdigit() or int(params["amount"]) < 1:
        return _error(400, "invalid_request_error", "Invalid positive integer", param="amount")
    return None


def _page(rows: list[dict[str, Any]], params: dict[str, str], url: str) -> dict[str, Any]:
    limit = min(int(params.get("limit") or 10), 100)
    after = params.get("starting_after")
    start = 0
    if after:
        ids = [r["id"] for r in rows]
        start = ids.index(after) + 1 if after in ids else len(rows)
    data = rows[start : start + limit]
    return {"object": "list", "url": url, "data": data, "has_more": start + limit < len(rows)}


def _search(intents: Any, query: str) -> list[dict[str, Any]] | None:
    # Stripe's search syntax, only the form the lookup uses: metadata['name']:'value'
    if not (query.startswith("metadata['") and query.endswith("'") and "']:'" in query):
        return None
    name, value = query[len("metadata['") : -1].split("']:'", 1)
    return [i for i in intents if i["metadata"].get(name) == value]


def _admin(processor: PaymentProcessor, method: str, path: str, spec: dict[str, Any]) -> Any:
    """The tests' and the demo's side door: records, faults, the clock (None: no such page)."""
    if method == "GET" and path == "/_processor/charges":
        return processor.charges()
    if method == "GET" and path == "/_processor/refused":
        return processor.refused()
    if method == "POST" and path == "/_processor/faults":
        if spec.get("clear"):
            processor.faults.clear()
        else:
            processor.faults.add(
                spec["mode"],
                times=spec.get("times", 1),
                customers=spec.get("customers"),
                delay=spec.get("delay", 5.0),
            )
        return {"ok": True}
    if method == "POST" and path == "/_processor/clock":
        processor.advance(float(spec["advance"]))
        return {"ok": True}
    if path == "/_processor/health":
        return {"ok": True}
    return None


class _Handler(BaseHTTPRequestHandler):
    """Serves one processor (set on a subclass by ``_handler_for``)."""

    processor: PaymentProcessor

    def setup(self) -> None:
        super().setup()
        # headers and body go out as separate writes: without this, Nagle's algorithm and the
        # client's delayed ACK add ~40 ms to every answer
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: the tests read the processor's records, not its log

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def _serve(self, method: str) -> None:
        url = urlsplit(self.path)
        if url.path.startswith("/_processor/"):
            self._admin(method, url.path)
            return
        params = dict(parse_qsl(url.query))
        if method == "POST":
            params = self._form()
        reply = self.processor.handle(method, url.path, params, self.headers)
        if reply.drop:
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if reply.delay:
            time.sleep(reply.delay)  # the answer comes late: the client has timed out
        status, body = reply.answer
        raw = b"<html>502 upstream</html>" if reply.malformed else json.dumps(body).encode()
        self._write(status, raw, replayed=reply.replayed)

    def _write(self, status: int, raw: bytes, *, replayed: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.send_header("Request-Id", "req_" + secrets.token_hex(8))
        if replayed:
            self.send_header("Idempotent-Replayed", "true")
        self.end_headers()
        self.wfile.write(raw)

    def _form(self) -> dict[str, str]:
        length = int(self.headers.get("Content-Length") or 0)
        text = self.rfile.read(length).decode() if length else ""
        return dict(parse_qsl(text, keep_blank_values=True))

    def _admin(self, method: str, path: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        spec = json.loads(self.rfile.read(length) or b"{}") if method == "POST" else {}
        body = _admin(self.processor, method, path, spec)
        if body is None:
            self.send_error(HTTPStatus.NOT_FOUND)
            return
        self._write(200, json.dumps(body).encode())


def _handler_for(processor: PaymentProcessor) -> type[BaseHTTPRequestHandler]:
    return type("Handler", (_Handler,), {"processor": processor})


# -- a processor in its own process (the demo, the Airflow end-to-end tests) -----------------


class ProcessorProcess:
    """The processor run as a separate OS process, read and steered over HTTP.

    Args:
        log: where the process's output goes.
        check_tokens: the token-checking processor.
        idempotency: honour idempotency keys.
        latency: seconds each charge takes at the processor (a real one's time to answer).
    """

    def __init__(
        self,
        log: Path,
        *,
        check_tokens: bool = False,
        idempotency: bool = True,
        latency: float = 0.0,
    ) -> None:
        self.log = log
        self.check_tokens = check_tokens
        self.idempotency = idempotency
        self.latency = latency
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, timeout: float = 20.0) -> str:
        """Starts it on a free port and waits until it answers; returns its base address."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        args = [sys.executable, "-m", "airflow_plugins.demo.processor", "--port", str(port)]
        if self.check_tokens:
            args.append("--check-tokens")
        if not self.idempotency:
            args.append("--no-idempotency")
        if self.latency > 0:
            args += ["--latency", str(self.latency)]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self._get("/_processor/health")
                return self.url
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the processor exited; see {self.log}") from None
                time.sleep(0.1)
        raise TimeoutError(f"the processor did not answer within {timeout} s; see {self.log}")

    def charges(self) -> list[dict[str, Any]]:
        """Every charge the processor made."""
        got: list[dict[str, Any]] = self._get("/_processor/charges")
        return got

    def _get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=10) as answer:
            return json.loads(answer.read())

    def stop(self) -> None:
        """Stops the process."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def inject_fault(url: str, mode: str, *, times: int | None = 1, delay: float = 5.0) -> None:
    """Makes the processor at ``url`` inject ``mode`` (one of ``FAULT_MODES``) into its next
    ``times`` charge requests, through its side door (``POST /_processor/faults``)."""
    if mode not in FAULT_MODES:
        raise ValueError(f"unknown fault mode {mode!r}; one of {sorted(FAULT_MODES)}")
    body = json.dumps({"mode": mode, "times": times, "delay": delay}).encode()
    request = urllib.request.Request(
        url + "/_processor/faults", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        answer.read()


def processor_charges(url: str) -> list[dict[str, Any]]:
    """Every charge made by the processor at ``url`` (its record, not the SDK's paging)."""
    with urllib.request.urlopen(url + "/_processor/charges", timeout=10) as answer:
        got: list[dict[str, Any]] = json.loads(answer.read())
    return got


def main(argv: list[str] | None = None) -> int:
    """Serves the processor until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--check-tokens", action="store_true")
    parser.add_argument("--no-idempotency", action="store_true")
    parser.add_argument(
        "--latency", type=float, default=0.0, help="seconds each charge takes (default 0)"
    )
    args = parser.parse_args(argv)
    processor = PaymentProcessor(
        idempotency=not args.no_idempotency, check_tokens=args.check_tokens, latency=args.latency
    )
    print(f"payment processor on {processor.start(args.port)}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        processor.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
