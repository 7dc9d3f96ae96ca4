"""The K-live schedule every replay here steps an engine through (SPEC "Replay used to
check fidelity").

At most K requests are live; a request arriving while K are live first makes the
oldest one finish (decode its remaining output one token per step); after the trace
the rest finish, oldest first. A driver holds its live requests in ``live``, starts
one with ``admit(record)`` and ends the oldest with ``finish_oldest()``.

Standard library only: the oracles and recorders import it in the engines' own
environments, and the tests drive prefixkv's engine classes through the same loop.
"""

from __future__ import annotations

from collections.abc import Iterable, Sized
from typing import Any, Protocol


class KLiveDriver(Protocol):
    """What :func:`run_k_live` steps: a queue of live requests, admit, finish."""

    @property
    def live(self) -> Sized: ...

    def admit(self, rec: Any, /) -> Any: ...

    def finish_oldest(self) -> None: ...


def run_k_live(driver: KLiveDriver, trace: Iterable[Any], k: int) -> None:
    """Admit ``trace`` in order with at most ``k`` requests live, then finish the rest."""
    for rec in trace:
        while len(driver.live) >= k:
            driver.finish_oldest()
        driver.admit(rec)
    while driver.live:
        driver.finish_oldest()
