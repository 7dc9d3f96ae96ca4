"""The load flags ``compare`` and ``cluster`` share: a request-rate sweep and an SLO.

``--request-rate 1,2,4,8`` (or ``auto``) is read by :func:`request_rates`;
``--slo-ttft``, ``--slo-tpot`` and ``--slo-e2el`` (milliseconds, as ``vllm bench
serve --goodput``) by :func:`add_slo_flags`, and :func:`slo_of` turns them into the
:class:`~..sim.load.Slo` that goodput is counted under.
"""

from __future__ import annotations

import argparse

from ..sim.load import Slo
from .args import positive_float

__all__ = ["add_slo_flags", "milliseconds", "request_rates", "slo_of"]


def request_rates(text: str) -> list[float] | str:
    """``auto``, or one or more distinct rates > 0, comma-separated."""
    if text.strip().lower() == "auto":
        return "auto"
    rates = [positive_float(p.strip()) for p in text.split(",") if p.strip()]
    if not rates or len(set(rates)) != len(rates):
        raise argparse.ArgumentTypeError(
            f"want distinct request rates > 0 like 1,2,4,8, or auto, got {text!r}"
        )
    return rates


def milliseconds(text: str) -> float:
    """``500`` or ``500ms`` (milliseconds, as vllm bench serve --goodput) or ``0.5s``,
    in seconds."""
    value = text.strip().lower()
    scale = 1e-3
    if value.endswith("ms"):
        value = value[:-2]
    elif value.endswith("s"):
        value, scale = value[:-1], 1.0
    return positive_float(value) * scale


def add_slo_flags(g: argparse._ArgumentGroup) -> None:
    """``--slo-ttft``, ``--slo-tpot``, ``--slo-e2el`` in ``g``."""
    for name, what in (
        ("ttft", "time to first token"),
        ("tpot", "time per output token after the first"),
        ("e2el", "end-to-end latency"),
    ):
        g.add_argument(
            f"--slo-{name}",
            type=milliseconds,
            metavar="MS",
            help=f"an SLO bound on {what}, in milliseconds (or 0.5s); the goodput column "
            "counts requests per second that meet every bound given, as vllm bench serve "
            f"--goodput {name}:MS",
        )


def slo_of(args: argparse.Namespace) -> Slo | None:
    """The objective of the ``--slo-*`` flags, or ``None`` when none is given."""
    if args.slo_ttft is None and args.slo_tpot is None and args.slo_e2el is None:
        return None
    return Slo(ttft_s=args.slo_ttft, tpot_s=args.slo_tpot, e2e_s=args.slo_e2el)
