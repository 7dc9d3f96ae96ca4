"""``prefixkv calibrate``: time the reference engine here and write a cost profile.

Runs the reference engine's forward pass on prefill, decode and mixed step shapes,
times each (the least of ``--repeats`` runs), fits the cost model's five
coefficients and writes them as a profile ``compare --profile FILE`` reads. Only this
subcommand imports torch.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..progress import progress
from ..sim import save_profile
from ..traces.files import check_output
from .common import positive_int
from .signals import Interrupts

__all__ = ["add_calibrate_parser", "run_calibrate"]


def add_calibrate_parser(sub: Any) -> None:
    """Add the ``calibrate`` subcommand to the ``prefixkv`` subparsers."""
    cal = sub.add_parser(
        "calibrate",
        help="time the reference engine on this machine and write a cost profile",
        description="Run the reference engine's forward pass on prefill, decode and mixed "
        "step shapes, time each (the least of --repeats runs), fit the cost model's five "
        "coefficients and write them as a profile that compare --profile FILE reads.",
    )
    cal.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        help="where to run (default: cuda when available, else cpu)",
    )
    cal.add_argument(
        "--dtype", choices=("float32", "float64"), default="float32", help="(default float32)"
    )
    m = cal.add_argument_group("the reference engine's model (its weights are random)")
    m.add_argument(
        "--num-layers", type=positive_int, default=2, metavar="N", help="layers (default 2)"
    )
    m.add_argument(
        "--num-heads",
        type=positive_int,
        default=4,
        metavar="N",
        help="attention heads, as many KV heads (default 4)",
    )
    m.add_argument(
        "--head-dim", type=positive_int, default=32, metavar="N", help="even (default 32)"
    )
    cal.add_argument(
        "--repeats",
        type=positive_int,
        default=5,
        metavar="R",
        help="timed runs per shape (the least is kept; default 5)",
    )
    cal.add_argument(
        "--quick",
        action="store_true",
        help="8 small shapes instead of 22: a rough profile in seconds",
    )
    cal.add_argument("--name", metavar="NAME", help="the profile's name (default from the device)")
    cal.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    cal.add_argument("--out", "-o", required=True, metavar="FILE", help="the profile (JSON)")


def run_calibrate(args: argparse.Namespace, interrupts: Interrupts | None = None) -> int:
    """Run ``prefixkv calibrate``; returns the exit status.

    ``--out`` is checked before torch loads; Ctrl-C before the fit writes nothing.
    """
    interrupts = interrupts or Interrupts()
    out = check_output(args.out)
    import torch  # only calibrate needs torch here

    from prefixkv.adapters.engine import EngineConfig, ModelConfig

    from ..sim.calibration import (
        DEFAULT_DECODE_SHAPES,
        DEFAULT_MIXED_SHAPES,
        DEFAULT_PREFILL_SHAPES,
        QUICK_SHAPES,
        calibrate,
    )

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = ModelConfig(
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        num_kv_heads=args.num_heads,
        head_dim=args.head_dim,
    )
    config = EngineConfig(model=model, dtype=args.dtype, device=device)
    shapes: dict[str, Any] = dict(QUICK_SHAPES) if args.quick else {}
    num_shapes = sum(
        len(shapes.get(k, default))
        for k, default in (
            ("prefill", DEFAULT_PREFILL_SHAPES),
            ("decode", DEFAULT_DECODE_SHAPES),
            ("mixed", DEFAULT_MIXED_SHAPES),
        )
    )
    bar = progress((1 + args.repeats) * num_shapes, f"calibrate on {device}", quiet=args.quiet,
                   unit="run")  # fmt: skip
    try:
        profile = calibrate(
            config, name=args.name, repeats=args.repeats, progress=bar.update, **shapes
        )
    finally:
        bar.close()
    interrupts.hold()  # the profile is measured: write it whole
    save_profile(profile, out)
    fit = profile.fit
    print(
        f"{profile.name}: {profile.device}; fit over {fit['num_samples']} step shapes, "
        f"relative error p50 {fit['relative_error_p50']:.1%}, max {fit['relative_error_max']:.1%}"
        f" -> {out}"
    )
    return interrupts.status() if interrupts.received else 0
