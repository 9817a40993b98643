"""Command line: ``python -m mentor.lab.bench`` times ResNet-18 training steps under metric configurations.

By default it runs the article's comparison (no metrics, the naive TorchMetrics set, the optimized
set) with :func:`mentor.lab.compare.compare`, prints the table and can write the JSON;
``--list`` shows every configuration and ``--help`` every option.

Example:
    >>> main(["--list", "--profile", "smoke"])  # doctest: +ELLIPSIS
    no metrics              the training step alone
    naive                   the article's five metrics as first written: ...
    ...
    fused suite             mentor.suite.FusedMetrics: the loss mean and every score in one update per step
    0
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from mentor.lab.compare import compare
from mentor.lab.configs import DEFAULT_CONFIGS, available_configs
from mentor.lab.env import get_profile
from mentor.lab.train import build_setup


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m mentor.lab.bench [--list] [--configs A,B] [--batch N] [--image-size PX]
    [--precision fp32|bf16] [--channels-last] [--profile full|smoke] [--steps N] [--warmup N] [--rounds N]
    [--seed S] [--json out.json]``."""
    parser = argparse.ArgumentParser(prog="python -m mentor.lab.bench", description=(
        "Time ResNet-18 training steps under metric configurations (by default: no metrics, the article's "
        "naive TorchMetrics set and its optimized set), in rounds run in a seeded random order, and count "
        "syncs per step; overheads over the first configuration come with paired bootstrap intervals over "
        "rounds."))
    parser.add_argument("--list", action="store_true", help="list the configurations and exit")
    parser.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                        help="comma-separated configuration names, the first is the baseline "
                             f"(default: {','.join(DEFAULT_CONFIGS)})")
    parser.add_argument("--profile", choices=["full", "smoke"], default=None,
                        help="run profile (default: full with CUDA, smoke without)")
    parser.add_argument("--batch", type=int, help="images per step (default: the profile's)")
    parser.add_argument("--image-size", type=int, help="image height and width in pixels (default: the profile's)")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                        help="fp32, or bf16 autocast around the forward pass and the loss (default: fp32)")
    parser.add_argument("--channels-last", action="store_true", help="channels-last weights and images")
    parser.add_argument("--steps", type=int, help="timed steps per run (default: the profile's)")
    parser.add_argument("--warmup", type=int, help="untimed steps per run (default: the profile's)")
    parser.add_argument("--rounds", type=int,
                        help="rounds, each running every configuration once in a seeded random order "
                             "(default: the profile's)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the per-round random order of the configurations (default: 0)")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    from mentor.lab.data import device_batches

    for flag, value, low in (("--steps", args.steps, 1), ("--warmup", args.warmup, 0), ("--rounds", args.rounds, 1),
                             ("--batch", args.batch, 1), ("--image-size", args.image_size, 32)):
        if value is not None and value < low:
            parser.error(f"{flag} must be at least {low}, got {value}")
    # --json is checked now, not after minutes of measuring; Path("") is Path("."), the current folder
    json_path = None if args.json is None else Path(args.json)
    if args.json == "":
        parser.error("--json needs a file name, got an empty one: pass the JSON file to write, "
                     "e.g. --json results.json")
    if json_path is not None and json_path.is_dir():
        parser.error(f"--json {args.json!r} names a folder: pass a file name to write, "
                     f"e.g. --json {json_path}/results.json")
    if args.list:
        for name, config in available_configs(get_profile(args.profile)).items():
            print(f"{name:<24}{config.description}")
        return 0
    profile = get_profile(args.profile)
    profile = profile.with_(**{key: value for key, value in (("batch_size", args.batch),
                                                              ("image_size", args.image_size)) if value is not None})
    available = available_configs(profile)
    names = [name.strip() for name in args.configs.split(",") if name.strip()]
    unknown = [name for name in names if name not in available]
    if unknown or len(names) < 2 or len(set(names)) != len(names):
        parser.error(f"--configs takes two or more different names from --list, got {args.configs!r}"
                     + (f" (unknown: {', '.join(unknown)})" if unknown else ""))
    steps = args.steps if args.steps is not None else profile.steps
    warmup = args.warmup if args.warmup is not None else profile.warmup
    rounds = args.rounds if args.rounds is not None else profile.rounds
    layout = ", channels-last" if args.channels_last else ""
    print(f"profile {profile.name} on {profile.device}: batch {profile.batch_size}, "
          f"{profile.image_size} px, {args.precision}{layout}, {rounds} rounds of {warmup}+{steps} steps", flush=True)
    setup = build_setup(profile.num_classes, profile.device, precision=args.precision,
                        channels_last=args.channels_last)
    batches = device_batches(profile.batch_size, profile.image_size, profile.num_classes, profile.device)
    cmp = compare([available[name] for name in names], setup, batches, steps=steps, warmup=warmup, rounds=rounds,
                  report_every=profile.report_every, seed=args.seed)
    print(cmp.table())
    if json_path is not None:
        print(f"wrote {cmp.save_json(json_path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
