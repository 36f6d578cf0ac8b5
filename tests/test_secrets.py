"""Secrets stay secret: provider keys, HF_TOKEN and orch's private key appear in no ledger, log,
event, ``--json`` output or command line, on this machine or the instance, while real jobs run."""

import getpass
import json
import re
import secrets
import shutil
import threading

import pytest

from orchestrator.tasks import dataset
from tests.conftest import needs_torch, run_orch
from tests.clouds import configure, local_billing, open_orch, orch_proc, wait_for
from tests.fakes.hosts import command_lines
from tests.fakes.runpod_api import FakeRunPod
from tests.fakes.vast_api import FakeVast
from tests.postgres import PASSWORD, pg_server, pg_url  # noqa: F401


class CommandLines:
    """Every command line on this machine (the instances' too: local and fake ones live here)."""

    def __init__(self):
        self.seen, self.stop = set(), threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        # What `ps -ww -eo args` prints, read from /proc in this process: a `ps` every sample was
        # most of this test's CPU, and a shorter period sees more short-lived commands.
        while not self.stop.is_set():
            for _, raw in command_lines():
                self.seen.add(raw.rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace"))
            self.stop.wait(0.05)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def leaks(text: str, secret_values: dict[str, str]) -> list[str]:
    return [what for what, value in secret_values.items() if value in text]


def scan_tree(root, secret_values, skip=()) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and path not in skip:
            text = path.read_bytes().decode("latin-1")
            found += [f"{path}: {what}" for what in leaks(text, secret_values)]
    return found


@needs_torch
@pytest.mark.training
def test_secrets_never_reach_the_ledger_logs_json_or_a_command_line(orch_home, tmp_path, monkeypatch):
    hf_token = "hf_" + secrets.token_hex(16)
    with FakeRunPod(tmp_path / "runpod") as rp, FakeVast(tmp_path) as vast:
        settings = rp.settings()
        settings.pop("api_key")  # keys from the environment: config.toml holds none to excuse
        configure(orch_home, "runpod", settings)
        configure(orch_home, "vastai", {"ssh_user": getpass.getuser(), "poll_seconds": 0.05})
        env = {"HF_TOKEN": hf_token, "RUNPOD_API_KEY": rp.key, "RUNPOD_API_BASE_URL": rp.url,
               "VAST_API_KEY": vast.key, "VAST_URL": vast.url}
        monkeypatch.setenv("RUNPOD_API_BASE_URL", rp.url)
        data = ["--data", dataset.synth(tmp_path / "ds", n_train=4, n_val=2), "--epochs", "3", "--imgsz", "64",
                "--batch", "2", "--train-arg", "workers=0", "--json"]
        outputs = []
        with CommandLines() as ps:
            jobs = {"sl": orch_proc("up", "sl", "--cpu", *data, env=env),
                    "sr": orch_proc("up", "sr", "--provider", "runpod", "--cpu", *data, env=env)}
            gpu = run_orch("up", "sv", "--provider", "vastai", "--gpu", "RTX 4090", "--json", env=env)
            outputs.append(gpu.stdout + gpu.stderr)
            for name, job in jobs.items():
                out, err = job.communicate(timeout=600)
                outputs.append(out + err)
                assert job.returncode == 0, err
                assert json.loads(out)["run"]["state"] in ("starting", "running")
            reads = [orch_proc(*args, env=env) for args in (
                ["status", "sl", "--json"], ["status", "sr", "--json"], ["logs", "sl"], ["logs", "sr"],
                ["status", "--json", "--all"], ["reconcile", "--json"])]
            for proc in reads:
                outputs.append("".join(proc.communicate(timeout=120)))
                assert proc.returncode == 0, outputs[-1]

            def ended():  # each look's output is scanned too
                look = run_orch("status", "sl", "--json", env=env)
                outputs.append(look.stdout + look.stderr)
                return json.loads(look.stdout)["run"]["state"] in ("completed", "failed", "crashed")
            # The pull once the training has ended: during it, last.pt is rewritten every epoch (a second
            # here), and a pull whose three tries each meet a new one refuses it, by design.
            wait_for(ended, 300, "sl's training to end", every=1)
            pull = run_orch("pull", "sl", env=env)
            outputs.append(pull.stdout + pull.stderr)
            assert pull.returncode == 0, outputs[-1]
            on_instances = scan_tree(orch_home / "local", {"HF_TOKEN": hf_token}) + \
                scan_tree(tmp_path / "runpod", {"HF_TOKEN": hf_token})
            downs = [orch_proc("down", name, "--yes", env=env) for name in jobs]
            for proc in downs:
                outputs.append("".join(proc.communicate(timeout=120)))
                assert proc.returncode == 0, outputs[-1]
        pod_keys = {f"pod key {p.id}": p.key for p in rp.pods.values()}
        container_keys = {f"container key {i}": vast.container_key(i) for i in vast.instances}

    key_file = orch_home / "keys" / "id_ed25519"
    body = [line for line in key_file.read_text().splitlines() if line and "PRIVATE KEY" not in line]
    secret_values = {"HF_TOKEN": hf_token, "RunPod key": rp.key, "Vast key": vast.key, **pod_keys, **container_keys,
                     **{f"private key line {i}": line for i, line in enumerate(body)}}
    assert len(body) >= 3 and pod_keys and container_keys

    problems = scan_tree(orch_home, secret_values, skip={key_file})
    problems += [f"CLI output: {w}" for text in outputs for w in leaks(text, secret_values)]
    problems += [f"command line {line[:120]!r}: {w}" for line in ps.seen for w in leaks(line, secret_values)]
    problems += on_instances
    assert problems == [], problems
    assert len(ps.seen) > 50, "the command lines were not sampled"
    assert any("train_entry.py" in line for line in ps.seen), "no training ran while the command lines were read"

    ledger = orch_home / "ledger.db"
    for path in (ledger, ledger.with_name("ledger.db-wal"), ledger.with_name("ledger.db-shm"), key_file):
        if path.exists():
            assert path.stat().st_mode & 0o777 == 0o600, path
    for folder in (orch_home / "keys", orch_home / "locks"):
        assert folder.stat().st_mode & 0o777 == 0o700, folder
    assert local_billing(orch_home) == set()


def test_the_ledger_password_is_never_shown(pg_url, orch_home, monkeypatch):
    for args in (["status"], ["reconcile", "--json"], ["db", "upgrade"], ["status", "nosuch"]):
        proc = run_orch(*args)
        assert PASSWORD not in proc.stdout + proc.stderr
    unreachable = pg_url.rsplit("@", 1)[0] + "@127.0.0.1:9/nowhere"
    proc = run_orch("status", env={"ORCH_DATABASE_URL": unreachable})
    assert proc.returncode == 1 and PASSWORD not in proc.stdout + proc.stderr
    assert proc.stderr.startswith("orch: error: cannot open the ledger at ") and "***" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not any(PASSWORD in p.read_text(errors="replace") for p in orch_home.rglob("*") if p.is_file())


# -- what a command prints (issue 42) ---------------------------------------------------------------------
PRINTS = r'''
echo "401 for token=$MY_TOKEN"
printf 'b64 %s\n' "$(printf 'x%s' "$MY_TOKEN" | base64 -w0)"
python -c 'import os, urllib.parse; print("url", urllib.parse.quote(os.environ["MY_TOKEN"], safe=""))'
set -x
: "$MY_TOKEN"
sleep 1
exit 3
'''


def printed_forms(token: str) -> dict[str, str]:
    """The token as the command above prints it: as it is, base64 after one byte (the part made of
    the token's bits alone), base64 on its own, and URL-encoded in either case of hex."""
    import base64
    from urllib.parse import quote

    shifted = base64.b64encode(b"x" + token.encode()).decode()
    return {"value": token, "base64 after a byte": shifted[3:-3], "base64": base64.b64encode(token.encode()).decode(),
            "URL-encoded": quote(token, safe=""), "url-encoded": quote(token, safe="").lower()}


def test_a_secret_a_failing_command_prints_reaches_no_file_ledger_json_console_or_webhook(orch_home):
    """`echo "401 for token=$MY_TOKEN"` as the failing command: the log's last lines became the job's
    reason, and the value went into the ledger's reason and history, `jobs show --json`, the console and
    the webhook (issue 42). Now every form of it is `***` wherever it is stored, shown or posted, in the
    pulled log too; and a reaper without the value (a schedule runs without the user's environment)
    keeps no line of the log at all."""
    from tests.fakes.webhook import Hook
    from tests.test_notify import write_config

    hook = Hook()
    write_config(orch_home, f'[notify]\nwebhook_url = "{hook.url}"\nevents = ["job"]\n')
    token = "tok/" + secrets.token_hex(12) + "+Z="
    forms = printed_forms(token)
    env = {"MY_TOKEN": token}
    quiet = run_orch("run", "unheld", "--cpu", "--secret", "MY_TOKEN", "--", "bash", "-c", PRINTS, env=env, check=0)
    loud = run_orch("run", "leak", "--cpu", "--secret", "MY_TOKEN", "--wait", "--json", "--", "bash", "-c", PRINTS,
                    env=env, check=1)
    outputs = [quiet, loud] + [run_orch(*args, env=env, check=0) for args in (
        ("jobs", "show", "leak", "--json"), ("jobs", "show", "leak"), ("jobs", "logs", "leak"), ("jobs", "--json"))]
    job = json.loads(outputs[2].stdout)
    assert job["state"] == "failed" and job["exit_code"] == 3, job["reason"]
    assert "401 for token=***" in job["reason"] and "url ***" in job["reason"], job["reason"]
    pulled = (orch_home / "runs" / "leak" / "train.log").read_text()
    assert "401 for token=***" in pulled and "url ***" in pulled and "+ : ***" in pulled, pulled
    assert "401 for token=***" in outputs[4].stdout, "jobs logs shows the pulled log, the token hidden"
    assert any("401 for token=***" in text for text in hook.texts()), hook.texts()

    # The scheduled reaper holds no MY_TOKEN: the job fails all the same, and no line of its log is kept.
    for _ in range(60):
        outputs.append(run_orch("reap", check=0))
        if open_orch().ledger.job("unheld").state not in ("planned", "running", "recovering"):
            break
    unheld = open_orch().ledger.job("unheld")
    assert unheld.state == "failed" and "run exited 3" in unheld.reason, unheld.reason
    assert "last lines: (left out: this orch process does not hold MY_TOKEN" in unheld.reason, unheld.reason
    assert not (orch_home / "runs" / "unheld" / "train.log").exists()
    assert local_billing(orch_home) == set()

    problems = scan_tree(orch_home, forms)
    problems += [f"output: {w}" for p in outputs for w in leaks(p.stdout + p.stderr, forms)]
    problems += [f"webhook: {w}" for p in hook.posts for w in leaks(json.dumps(p), forms)]
    hook.close()
    assert problems == [], problems


def test_redact_hides_every_form_of_a_value():
    import base64
    from urllib.parse import quote, quote_plus

    from orchestrator.jobs.record import tail_lines
    from orchestrator.text import redact

    token = "s3cr/et+tok=en?&x y"
    for before in ("", "a", "ab", "abc"):
        for after in ("", "q", "qq"):
            for encode in (base64.b64encode, base64.urlsafe_b64encode):
                shown = encode((before + token + after).encode()).decode()
                hidden = redact(f"auth {shown} end", [token])
                assert "***" in hidden and shown[3:-3] not in hidden, (before, after, hidden)
    for shown in (quote(token, safe=""), quote_plus(token), quote(token), quote(token, safe="").lower()):
        assert redact(f"GET /?t={shown}", [token]) == "GET /?t=***", shown
    assert redact(f"{token}{token}", [token, "other"]) == "******"
    assert redact("nothing here", [token]) == "nothing here" and redact(None, [token]) is None
    assert redact(token, []) == token
    unheld = tail_lines(f"a\n{token}\nb", ["ORCH_TEST_ABSENT_SECRET"])
    assert unheld.startswith("(left out: this orch process does not hold ORCH_TEST_ABSENT_SECRET")
    assert token not in unheld


def test_a_secret_of_one_to_three_characters_is_hidden_where_it_stands_alone_not_in_every_number():
    """A secret "0" hid every 0 of the log (epoch 10 of 30: "epoch 1*** of 3***") and its hex "30"
    every 30 and "MA==" too: the log said nothing. A value that short is hidden where it stands
    alone, as a command prints a variable, and in no encoded form."""
    from orchestrator.text import redact

    assert redact("epoch 10 of 30 (3030 images), PIN=0, '0'", ["0"]) == "epoch 10 of 30 (3030 images), PIN=***, '***'"
    assert redact("mode on; online ON\non", ["on"]) == "mode ***; online ON\n***"
    assert redact("k=abc abcd xabc", ["abc"]) == "k=*** abcd xabc"
    assert redact("k=\x1b[1mab\x1b[0mc.", ["abc"]) == "k=\x1b[1m***."  # escapes between its characters too
    assert redact("k=abcd, 61626364", ["abcd"]) == "k=***, ***", "four characters and more: every form, as before"


# -- hex, escapes, reversed (issue 53, finding 6) and the pull that hides as it writes (finding 7) ---------
PRINTS_DISGUISED = r'''
printf 'hex %s\n' "$(printf %s "$MY_TOKEN" | od -An -tx1 | tr -d ' \n')"
printf 'HEX %s!\n' "$(printf %s "$MY_TOKEN" | od -An -tx1 | tr -d ' \n' | tr a-f A-F)"
python -c 'import os; t = os.environ["MY_TOKEN"]
print("colour " + "".join("\x1b[3%dm%s" % (i % 7, c) for i, c in enumerate(t)) + "\x1b[0m end")'
python -c 'import os; print("backwards", os.environ["MY_TOKEN"][::-1])'
exit 3
'''


def disguised_forms(token: str) -> dict[str, str]:
    """The token as PRINTS_DISGUISED prints it, and as it reads once the escapes are taken out."""
    coloured = "".join(f"\x1b[3{i % 7}m{c}" for i, c in enumerate(token))
    return {"value": token, "hex": token.encode().hex(), "HEX": token.encode().hex().upper(),
            "between escapes": coloured, "reversed": token[::-1]}


def test_a_secret_printed_in_hex_or_between_escape_codes_comes_home_hidden(orch_home):
    """A failing command prints its token in hex (`od`, lower and upper case), with a colour escape
    between each character (a terminal shows it whole) and reversed: each came home in clear in the
    pulled log, the job's reason and events, `jobs show` and `jobs logs` (issue 53). Now each is `***`."""
    token = "tok/" + secrets.token_hex(12) + "+Z="
    forms = disguised_forms(token)
    env = {"MY_TOKEN": token}
    outputs = [run_orch("run", "hexed", "--cpu", "--secret", "MY_TOKEN", "--wait", "--json", "--", "bash", "-c",
                        PRINTS_DISGUISED, env=env, check=1)]
    outputs += [run_orch(*args, env=env, check=0) for args in (
        ("jobs", "show", "hexed", "--json"), ("jobs", "show", "hexed"), ("jobs", "logs", "hexed"))]
    job = json.loads(outputs[1].stdout)
    assert job["state"] == "failed" and job["exit_code"] == 3, job["reason"]
    pulled = (orch_home / "runs" / "hexed" / "train.log").read_text()
    colourless = re.compile(r"\x1b\[[0-9;]*m")
    for line in ("hex ***", "HEX ***!", "colour *** end", "backwards ***"):
        assert line in colourless.sub("", pulled), pulled
        assert line in colourless.sub("", outputs[3].stdout), outputs[3].stdout
    assert "end" in pulled and "HEX ***!" in job["reason"], "only the value is hidden, not what follows it"
    problems = scan_tree(orch_home, forms)
    problems += [f"output: {w}" for p in outputs for w in leaks(p.stdout + p.stderr, forms)]
    assert problems == [], problems
    assert local_billing(orch_home) == set()


def test_a_pulled_log_is_hidden_before_it_lands_and_an_unchanged_one_is_not_pulled_again(orch_home, tmp_path):
    """The pull wrote the log home as the instance had it, then hid the secret in it: orch killed in
    between (a crash, Ctrl-C twice, the OOM killer) left the value in clear at home. And the hidden
    log no longer had the instance's size, so every look pulled it again (issue 53). Now it is
    hidden as it arrives, and the look after finds it at home as it was."""
    from tests.clouds import arrange

    arrange(open_orch(), "box")
    token = "tok/" + secrets.token_hex(12) + "+Z="
    forms = disguised_forms(token)
    env = {"MY_TOKEN": token}
    run_orch("exec", "box", "--secret", "MY_TOKEN", "--", "bash", "-c", "echo token=$MY_TOKEN; exit 3", env=env,
             check=3)
    log = orch_home / "runs" / "box" / "train.log"
    assert "token=***" in log.read_text()
    before = log.stat()
    for _ in range(2):  # `orch pull` and `orch status` look again: the log is unchanged on the instance
        run_orch("pull", "box", env=env, check=0)
        run_orch("status", "box", env=env, check=0)
    after = log.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), "an unchanged log pulled again"

    # orch killed just before, and just after, the log's rename into place: a pull into a copy of the
    # run's folder that lacks only the log, so the log is the one file it brings
    for point, left in (("pull-written", ".orch-pull-*.part"), ("pull-renamed", "train.log")):
        dest = tmp_path / point
        shutil.copytree(log.parent, dest)
        (dest / "train.log").unlink()
        killed = run_orch("pull", "box", "--dest", dest, env={**env, "ORCH_TEST_KILL_AT": point}, check=None)
        assert killed.returncode == -9, (point, killed.stdout + killed.stderr)
        assert list(dest.glob(left)), f"killed at {point} before the log was written: {list(dest.iterdir())}"
        assert scan_tree(dest, forms) == [], point
    run_orch("down", "box", "--yes", check=0)
    assert scan_tree(orch_home, forms) == [], "the instance is gone: no value anywhere at home"
    assert local_billing(orch_home) == set()


def test_a_log_hidden_as_it_arrives_hides_a_value_cut_anywhere_between_two_reads():
    """The pull hides a log chunk by chunk (``text.Redactor``): a value in every form, cut at any byte
    by the reads, is hidden all the same, and a line with no break at all too."""
    from orchestrator.text import Redactor, redact

    token = "tok/" + secrets.token_hex(8) + "+Z="
    forms = disguised_forms(token)
    log = "".join(f"{what}: {shown} end\n" for what, shown in forms.items()).encode()
    whole = redact(log.decode(), [token]).encode()
    assert not any(shown.encode() in whole for shown in forms.values()) and whole.count(b"***") == len(forms)
    for cut in range(1, len(log)):
        hiding = Redactor([token])
        assert hiding.feed(log[:cut]) + hiding.feed(log[cut:]) + hiding.end() == whole, cut
    hiding = Redactor([token])
    hiding.LINE, hiding.OVERLAP = 256, 64
    endless = b"x" * 250 + token.encode() + b"y" * 500 + token.encode()
    got = b"".join(hiding.feed(endless[i:i + 100]) for i in range(0, len(endless), 100)) + hiding.end()
    assert got == b"x" * 250 + b"***" + b"y" * 500 + b"***" and hiding.size == len(got)
