"""Hunt seeds from the command line:

.venv/bin/python -m tests.sim 0:500                  # every profile, by seed
.venv/bin/python -m tests.sim 0:500 --profile ops    # one profile for every seed
.venv/bin/python -m tests.sim 123 --trace            # one seed with its full trace
.venv/bin/python -m tests.sim 0:2000 --grep one-live-run
.venv/bin/python -m tests.sim sweep --seeds 10000    # the long sweep: seeds 0..9999
"""

from __future__ import annotations

import argparse
import time
from collections import Counter, defaultdict

from tests.sim.profiles import PROFILES_BY_NAME
from tests.sim.seeds import replay_command, run_seed
from tests.sim.sweep import run_seeds


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.sim")
    parser.add_argument("seeds", help="N, A:B, or `sweep` (with --seeds N)")
    parser.add_argument("--profile", choices=sorted(PROFILES_BY_NAME))
    parser.add_argument("--workers", type=int)
    parser.add_argument("--trace", action="store_true", help="print a single seed's trace")
    parser.add_argument("--grep", default="", help="only violations whose text contains this")
    parser.add_argument(
        "--seeds", dest="count", type=int, default=10_000, help="`sweep`: seeds 0..N-1"
    )
    args = parser.parse_args()
    profile = PROFILES_BY_NAME[args.profile] if args.profile else None
    if args.seeds == "sweep":
        args.seeds = f"0:{args.count}"
    if ":" in args.seeds:
        lo, hi = (int(x) for x in args.seeds.split(":"))
        seeds = list(range(lo, hi))
    else:
        seeds = [int(args.seeds)]
    if args.trace:
        result = run_seed(seeds[0], profile, tracing=True)
        print("\n".join(result.trace))
        print(result.summary())
        return
    started = time.perf_counter()
    signatures: dict[str, list[int]] = defaultdict(list)
    failing = 0
    profiles: Counter[str] = Counter()
    for result in run_seeds(seeds, profile, args.workers):
        hits = [v for v in result.violations if args.grep in v.line()]
        if hits:
            failing += 1
            profiles[result.profile] += 1
            print(result.summary())
        for v in hits:
            where = v.subject if v.invariant == "no-escape" else ""
            signatures[f"{v.invariant} {where}".strip()].append(result.seed)
    elapsed = time.perf_counter() - started
    print(f"\n{len(seeds)} seeds in {elapsed:.1f}s; {failing} with violations {dict(profiles)}")
    for signature, hit in sorted(signatures.items(), key=lambda kv: -len(kv[1])):
        first = sorted(hit)[:6]
        print(f"  {len(hit):4d}  {signature}   e.g. seeds {first}")
    if signatures:
        print(f"replay one: {replay_command(min(min(v) for v in signatures.values()))}")


if __name__ == "__main__":
    main()
