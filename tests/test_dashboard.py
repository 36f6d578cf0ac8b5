"""`orch dashboard`: a test ledger rendered in a real headless Chromium (Debian's, driven by
Playwright through executable_path), and the JSON under /api/."""

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone

import pytest

from tests.conftest import ROOT

CHROMIUM = next((p for p in ("/usr/lib/chromium/chromium-headless-shell", "/usr/bin/chromium-headless-shell",
                             "/usr/lib/chromium/chromium", "/usr/bin/chromium") if os.path.exists(p)), None)


def build(ledger, name, provider, price, stopped, timeline, **fields):
    """An instance whose events happened at the given times (what the ledger holds afterwards)."""
    from orchestrator.ledger.ledger import Event, Instance, new_id

    with ledger.session() as s:
        inst = Instance(id=new_id(), name=name, provider=provider, label=f"orch-x-{name}", state=timeline[-1][1],
                        price_hr=price, stopped_price_hr=stopped, created_at=timeline[0][0], **fields)
        s.add(inst)
        s.flush()
        prev = None
        for when, to in timeline:
            s.add(Event(instance_id=inst.id, from_state=prev, to_state=to, reason="test", actor="cli", at=when))
            prev = to
        s.commit()
    return inst


@pytest.fixture
def fleet(ledger, orch_home):
    now = datetime.now(timezone.utc)
    ago = lambda minutes: now - timedelta(minutes=minutes)  # noqa: E731
    big = build(ledger, "big", "vastai", 3.5, 0.07, [
        (ago(180), "requested"), (ago(179), "provisioning"), (ago(170), "ready")],
        gpu="RTX 4090", gpu_name="<img src=x onerror=alert(1)>", gpus=2)
    build(ledger, "small", "runpod", 1.0, 0.1, [
        (ago(120), "requested"), (ago(119), "provisioning"), (ago(110), "ready"), (ago(60), "stopping"),
        (ago(59), "stopped")], gpu="A40", gpu_name="A40", gpus=1)
    build(ledger, "gone", "vastai", 2.0, 0.0, [
        (ago(100), "requested"), (ago(99), "provisioning"), (ago(90), "ready"), (ago(80), "destroying"),
        (ago(79), "destroyed")], gpu="L4", gpu_name="L4", gpus=1)
    ledger.add_run(instance_id=big.id, model="yolo9-t", data="/data/x", epochs=10, started_at=ago(165),
                   state="running", run_dir="/root/runs/big")
    runs = orch_home / "runs" / "big"
    runs.mkdir(parents=True)
    (runs / "metrics.jsonl").write_text("".join(json.dumps({"epoch": ep, "train/loss": 3.0 / ep}) + "\n"
                                                for ep in range(1, 5)) + "not json\n")
    return ledger


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def board(fleet, orch_home):
    """`orch dashboard` as a user starts it; yields its URL."""
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "dashboard", "--port", str(free_port())],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = proc.stdout.readline()
        assert line.startswith("orch dashboard: http://127.0.0.1:"), (line, proc.stderr.read() if proc.poll() else "")
        yield line.split()[2]
    finally:
        proc.terminate()
        proc.wait(20)


def get(url: str, method="GET", headers=None, data=None):
    request = urllib.request.Request(url, method=method, headers=headers or {}, data=data)
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.headers, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read().decode()


def ledger_digest(home) -> str:
    return hashlib.sha256((home / "ledger.db").read_bytes()).hexdigest()


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium-headless-shell (scripts/install.sh --test)")
def test_the_page_in_a_real_browser(board, fleet):
    sync_playwright = pytest.importorskip("playwright.sync_api", reason="needs the test extra").sync_playwright

    events = len(fleet.events())
    errors = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page()
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("dialog", lambda d: errors.append(f"dialog: {d.message}"))
            response = page.goto(board)
            assert response.status == 200
            page.wait_for_load_state("load")
            assert page.title() == "orch fleet"

            rows = page.locator("#instances tr.instance")
            assert sorted(rows.evaluate_all("rs => rs.map(r => r.dataset.name)")) == ["big", "small"]
            big = page.locator('#instances tr[data-name="big"]').inner_text()
            assert "ready" in big and "vastai" in big and "$3.50" in big
            assert "2x <img src=x onerror=alert(1)>" in big  # the provider's text, shown as text
            assert page.locator("#instances img").count() == 0
            small = page.locator('#instances tr[data-name="small"]').inner_text()
            assert "stopped" in small and "runpod" in small
            assert page.locator('#ended tr[data-name="gone"]').count() == 1

            # The spend plot: a point per event in the ledger, one series per provider.
            points = page.locator("svg circle.event-point")
            assert points.count() == events == 13
            assert sorted(set(points.evaluate_all("cs => cs.map(c => c.dataset.series)"))) == ["runpod", "vastai"]
            assert points.first.bounding_box()["width"] > 0  # drawn, not just in the markup

            run = page.locator('#runs tr.run[data-instance="big"]')
            assert run.locator("circle.loss-point").count() == 4
            assert "4/10" in run.inner_text()
            assert run.locator("a.monitor").get_attribute("href") == "/monitor/big"
            assert errors == []
        finally:
            browser.close()


def test_the_api_answers_json_for_scripts(board, fleet):
    status, headers, body = get(board + "api/instances")
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    live = json.loads(body)
    assert sorted(d["name"] for d in live) == ["big", "small"]
    big = next(d for d in live if d["name"] == "big")
    assert big["spend_usd"] == pytest.approx(3.5 * 179 / 60, rel=0.02)  # provisioning + ready, at $3.50/hr
    assert 170 * 60 - 5 < big["uptime_s"] < 179 * 60 + 60
    assert sorted(d["name"] for d in json.loads(get(board + "api/instances?all=1")[2])) == ["big", "gone", "small"]

    detail = json.loads(get(board + "api/instances/small")[2])
    assert [e["to"] for e in detail["events"]] == ["requested", "provisioning", "ready", "stopping", "stopped"]
    assert get(board + "api/instances/nobody")[0] == 404

    spend = json.loads(get(board + "api/spend")[2])
    assert {p: len(d["points"]) for p, d in spend["providers"].items()} == {"vastai": 8, "runpod": 5}
    usd = [p["usd"] for p in spend["providers"]["vastai"]["points"]]
    assert usd == sorted(usd)  # money spent only grows

    [run] = json.loads(get(board + "api/runs")[2])
    assert run["instance"] == "big" and [c["epoch"] for c in run["loss_curve"]] == [1, 2, 3, 4]


def test_read_only_and_local_only(board, orch_home):
    before = ledger_digest(orch_home)
    port = int(board.rstrip("/").rsplit(":", 1)[1])
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        status = get(board + "api/instances", method=method, data=b"{}")[0]
        assert status in (405, 501), (method, status)
    assert get(board + "monitor/big", headers={"Sec-Fetch-Site": "cross-site"})[0] == 403
    # A plain GET (curl, another local process) starts nothing: it is offered the button that POSTs.
    status, _, body = get(board + "monitor/big")
    assert status == 200 and '<form method="post" action="/monitor/big">' in body
    # Starting the monitor is a POST from the dashboard's own origin, and only that.
    for headers in ({}, {"Origin": "http://attacker.example"}, {"Origin": f"http://127.0.0.1:{port}",
                                                                "Sec-Fetch-Site": "cross-site"}):
        assert get(board + "monitor/big", method="POST", headers=headers, data=b"")[0] == 403, headers
    # (From its own origin it tries: this fleet's instances are rows only, so the monitor cannot start.)
    mine = get(board + "monitor/big", method="POST", headers={"Origin": f"http://127.0.0.1:{port}"}, data=b"")
    assert mine[0] == 502 and "did not start" in mine[2], mine
    # A page elsewhere that points its own name at 127.0.0.1 gets nothing.
    assert get(board, headers={"Host": f"attacker.example:{port}"})[0] == 403
    for _ in range(3):
        get(board)
        get(board + "api/spend")
    assert ledger_digest(orch_home) == before

    # It listens on 127.0.0.1 only: another loopback address, or any other address, is refused.
    others = ["127.0.0.2"] + [a for a in _own_addresses() if not a.startswith("127.")]
    for address in others:
        with pytest.raises(OSError):
            socket.create_connection((address, port), timeout=3).close()


def _own_addresses() -> list[str]:
    ip = shutil.which("hostname")
    if not ip:
        return []
    out = subprocess.run([ip, "-I"], capture_output=True, text=True).stdout
    return [a for a in out.split() if ":" not in a]


def test_no_ledger_yet_shows_an_empty_fleet_and_makes_none(orch_home):
    taken = socket.socket()  # the port asked for is someone else's: the next free one is taken
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "dashboard", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        url = proc.stdout.readline().split()[2]
        assert url.startswith("http://127.0.0.1:") and int(url.rstrip("/").rsplit(":", 1)[1]) > port
        status, _, body = get(url)
        assert status == 200 and "no live instances" in body
        assert json.loads(get(url + "api/instances")[2]) == []
        assert not (orch_home / "ledger.db").exists()
    finally:
        proc.terminate()
        proc.wait(20)
        taken.close()


def test_a_bad_port_is_one_line_exit_2(orch_home):
    proc = subprocess.run([sys.executable, "-m", "orchestrator", "dashboard", "--port", "80"], capture_output=True,
                          text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "--port" in proc.stderr
