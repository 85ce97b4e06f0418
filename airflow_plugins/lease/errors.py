"""The errors of the lease store and the sink fence."""

from __future__ import annotations


class LeaseError(Exception):
    """Base class of every error this package raises."""


class InvalidLeaseInput(LeaseError, ValueError):
    """An argument was refused before anything was written (bad key, TTL, result, ...)."""


class LeaseStoreUnavailable(LeaseError):
    """The lease store could not be reached or did not answer.

    Fail closed: no lease was taken, so the protected work must not run. Retry later.
    """


class LeaseLost(LeaseError):
    """The caller no longer holds the lease: it expired and was taken over, or was released.

    The work must stop; its writes would be refused by the sinks' fences anyway.
    """

    def __init__(self, key: str, token: int, detail: str = "") -> None:
        self.key = key
        self.token = token
        super().__init__(
            f"lease {key!r} is no longer held by token {token}" + (f": {detail}" if detail else "")
        )


class StaleToken(LeaseError):
    """A sink refused a write because a newer holder has already written under the key."""

    def __init__(self, key: str, token: int, current: int | None) -> None:
        self.key = key
        self.token = token
        self.current = current
        super().__init__(
            f"sink fence refused token {token} for {key!r}: token {current} has superseded it"
        )


class FenceBusy(LeaseError):
    """A sink's fence row stayed locked past its bound by a session the holder may not end.

    Nothing was written; the work fails closed and is retried.
    """

    def __init__(self, key: str, token: int, detail: str) -> None:
        self.key = key
        self.token = token
        super().__init__(f"sink fence of {key!r} busy for token {token}: {detail}")


class SinkNotConfigured(InvalidLeaseInput):
    """A task names a sink connection that cannot be resolved (missing, or not Postgres)."""
