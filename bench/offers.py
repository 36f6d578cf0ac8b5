"""Is ``orch offers`` as slow as its slowest provider, or as slow as all of them added up?

Both fake providers (tests/fakes) answer every request after an injected delay (300 ms by
default), through subclasses here: the fakes themselves have no delay knob. Each figure is the
median of --repeat fresh (uncached) answers:

- in-process: ``offers.search`` with the SDKs already imported, one provider, then both;
- CLI: ``orch offers --fresh --json`` as a user runs it, SDK imports included.

The ratio is both-providers time over the slowest single provider's; the target is <= 1.3.

    .venv/bin/python bench/offers.py [--delay 0.3] [--repeat 5] [--quick]

``--quick`` (the tests): 100 ms delays, one answer each, no target: does it still work.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.fakes.runpod_api import FakeRunPod  # noqa: E402
from tests.fakes.vast_api import FakeVast  # noqa: E402

TARGET = 1.3


class DelayedRunPod(FakeRunPod):
    delay = 0.3

    def _serve(self, req):
        time.sleep(self.delay)  # before the fake's lock: concurrent requests wait side by side
        super()._serve(req)


class DelayedVast(FakeVast):
    delay = 0.3

    def handle(self, *args, **kwargs):
        time.sleep(self.delay)
        return super().handle(*args, **kwargs)


def config_toml(runpod: FakeRunPod, vast: FakeVast) -> str:
    """orch's config.toml pointing both providers at the fakes (and caching nothing)."""
    sections = {"runpod": runpod.settings(), "vastai": {"api_key": vast.key, "server_url": vast.url}}
    lines = ["offers_cache_seconds = 0"]
    for name, settings in sections.items():
        lines.append(f"[providers.{name}]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
    return "\n".join(lines) + "\n"


def _median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay", type=float, default=0.3)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="100 ms delays, one answer each, no target (the tests)")
    args = parser.parse_args()
    if args.quick:
        args.delay, args.repeat = 0.1, 1
    DelayedRunPod.delay = DelayedVast.delay = args.delay
    tmp = Path(tempfile.mkdtemp(prefix="orch-bench-"))
    home = tmp / "orch"
    home.mkdir()
    with DelayedRunPod(tmp / "runpod") as runpod, DelayedVast(tmp) as vast:
        (home / "config.toml").write_text(config_toml(runpod, vast))
        env = {"ORCH_HOME": str(home), "RUNPOD_API_BASE_URL": runpod.url, "HOME": str(tmp)}
        os.environ.update(env)
        from orchestrator.money import offers
        from orchestrator.instances.lifecycle import Orch

        orch = Orch.open(say=lambda m: None)

        def ask(*names: str) -> None:
            answer = offers.search(orch, offers.Query(providers=list(names)), fresh=True)
            assert not answer.errors and answer.rows, answer.errors

        ask("runpod", "vastai")  # imports the SDKs, opens the ledger
        inproc = {p: _median_time(lambda p=p: ask(p), args.repeat) for p in ("runpod", "vastai")}
        inproc["both"] = _median_time(lambda: ask("runpod", "vastai"), args.repeat)

        def cli(*names: str) -> None:
            argv = [sys.executable, "-m", "orchestrator", "offers", "--fresh", "--json"]
            for n in names:
                argv += ["--provider", n]
            subprocess.run(argv, cwd=ROOT, env={**os.environ, **env}, check=True, capture_output=True)

        cli_times = {p: _median_time(lambda p=p: cli(p), args.repeat) for p in ("runpod", "vastai")}
        cli_times["both"] = _median_time(lambda: cli("runpod", "vastai"), args.repeat)
        requests = {"runpod": len(runpod.queries), "vastai": len(vast.requests)}
    ok = True
    print(f"orch offers, both fakes delayed {args.delay * 1000:.0f} ms per request, median of {args.repeat}")
    for label, t in (("in-process (SDKs warm)", inproc), ("CLI (orch offers --fresh)", cli_times)):
        slowest = max(t["runpod"], t["vastai"])
        ratio = t["both"] / slowest
        ok &= args.quick or ratio <= TARGET
        print(f"  {label:<27} runpod {t['runpod']:.3f} s  vastai {t['vastai']:.3f} s  both {t['both']:.3f} s  "
              f"sum {t['runpod'] + t['vastai']:.3f} s  ratio both/slowest {ratio:.2f} "
              f"({'ok' if ratio <= TARGET else 'over'} the {TARGET} target)")
        print(f"ratio: {ratio:.2f}x the slowest provider alone, both providers, {label}")
    print(f"  requests served: {requests}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
