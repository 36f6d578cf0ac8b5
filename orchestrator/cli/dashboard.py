"""``orch dashboard``: the fleet on a local web page (read-only), JSON under /api/ for scripts."""

from __future__ import annotations

import typer

from orchestrator.cli.app import app, say
from orchestrator.errors import UsageError


@app.command()
def dashboard(port: int = typer.Option(8421, help="Local port on 127.0.0.1 (the next free one if taken).")):
    """A local web page of every instance, its spend and its runs' loss curves; reads the ledger and
    changes nothing. JSON for scripts: /api/instances, /api/instances/NAME, /api/spend, /api/runs."""
    from orchestrator.views import dashboard as board

    if not 1024 <= port <= 65535:
        raise UsageError(f"--port must be between 1024 and 65535, not {port}")

    def announce(url: str) -> None:
        print(f"orch dashboard: {url}  (read-only; Ctrl-C to stop)", flush=True)

    board.serve(port, announce)
    say("orch dashboard: stopped")
