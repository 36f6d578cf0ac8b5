"""Bad input, generated (hypothesis): every bad argument or config.toml ends in one clear line and
exit code 2, never a traceback, and creates nothing.

Most examples call the CLI in this process (``orchestrator.cli.main``, as the ``orch`` script
does); a sample goes through a real ``orch`` process too."""

import json
import math
import os
import sqlite3
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator import config
from orchestrator.tasks import dataset
from orchestrator.cli import main as cli
from orchestrator.instances.lifecycle import NAME
from orchestrator.money.policy import ON_IDLE
from tests.conftest import run_orch

EXAMPLES = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
PROVIDERS = ("local", "runpod", "vastai")


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return str(dataset.synth(tmp_path_factory.mktemp("bad") / "ds", n_train=2, n_val=1))


def orch(monkeypatch, capsys, *args):
    """``orch ARGS`` in this process: (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["orch", *args])
    config._load.cache_clear()
    try:
        cli.main()
        code = 0
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def refused(code, err, needle=""):
    assert "Traceback" not in err and "internal error" not in err, err
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("orch: error: "), err
    assert needle in lines[0], (needle, err)


def nothing_created(orch_home):
    local = orch_home / "local"
    assert not local.exists() or not any(local.iterdir()), "a local instance was created"
    db = orch_home / "ledger.db"
    if db.exists():
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT count(*) FROM instances").fetchone()[0] == 0, "a ledger row was written"


# -- what bad looks like --------------------------------------------------------------------------------
bad_names = st.text(max_size=60).filter(lambda s: not NAME.match(s) and "\x00" not in s)
not_a_number = st.text(min_size=1, max_size=12).filter(
    lambda s: "\x00" not in s and not _number(s) and not s.startswith("-"))
nan_or_inf = st.sampled_from(["nan", "inf", "-inf", "NaN"])


def _number(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def outside(low, high, integers=True):
    """Numbers (as the user would type them) outside [low, high]."""
    if integers:
        return st.one_of(st.integers(max_value=low - 1), st.integers(min_value=high + 1)).map(str)
    return st.one_of(st.floats(max_value=low, exclude_max=True), st.floats(min_value=high, exclude_min=True),
                     nan_or_inf).map(str)


# (option, bad values, needs --data, what the one line names)
NUMBERS = [
    ("--disk", outside(1, 20_000), False, "--disk"),
    ("--gpus", outside(1, 16), False, "--gpus"),
    ("--bid", st.one_of(st.floats(max_value=0), st.floats(min_value=1000), nan_or_inf).map(str), False, "--bid"),
    ("--idle-minutes", st.one_of(st.floats(max_value=0), st.floats(min_value=100_000, exclude_min=True),
                                 nan_or_inf).map(str), False, "--idle-minutes"),
    ("--max-hours", outside(0, 100_000, integers=False), False, "--max-hours"),
    ("--rebuild-cost", st.one_of(st.floats(max_value=0, exclude_max=True), st.floats(min_value=1e6),
                                 nan_or_inf).map(str), False, "--rebuild-cost"),
    ("--ssh-timeout", st.one_of(st.floats(max_value=0), st.floats(min_value=1440, exclude_min=True),
                                nan_or_inf).map(str), False, "--ssh-timeout"),
    ("--on-idle", st.text(max_size=12).filter(lambda s: s not in ON_IDLE and "\x00" not in s), False, "--on-idle"),
    ("--epochs", outside(1, 100_000), True, "--epochs"),
    ("--imgsz", outside(32, 8192), True, "--imgsz"),
    ("--batch", st.one_of(st.just(0), st.integers(max_value=-2)).map(str), True, "--batch"),
    ("--save-period", st.integers(max_value=0).map(str), True, "--save-period"),
]
INTEGER_OPTIONS = ("--disk", "--gpus", "--epochs", "--imgsz", "--batch", "--save-period")


@st.composite
def bad_numbers(draw):
    option, values, data, needle = draw(st.sampled_from(NUMBERS))
    if draw(st.booleans()) and option != "--on-idle":
        value = draw(not_a_number)  # not a number at all: the parser says which option
        needle = f"'{option}'"
    else:
        value = draw(values)
    return option, value, data, needle


# -- the properties -------------------------------------------------------------------------------------
@EXAMPLES
@given(name=bad_names)
def test_bad_names_are_refused(orch_home, monkeypatch, capsys, name):
    code, _, err = orch(monkeypatch, capsys, "up", "--cpu", "--", name)
    refused(code, err, "invalid name")
    nothing_created(orch_home)


@EXAMPLES
@given(case=bad_numbers())
def test_bad_numbers_are_refused(orch_home, monkeypatch, capsys, ds, case):
    option, value, data, needle = case
    code, _, err = orch(monkeypatch, capsys, "up", "numbers", "--cpu", f"{option}={value}",
                        *(["--data", ds] if data else []))
    refused(code, err, needle)
    nothing_created(orch_home)


@EXAMPLES
@given(provider=st.text(max_size=20).filter(lambda s: s not in PROVIDERS and "\x00" not in s))
def test_unknown_providers_are_refused(orch_home, monkeypatch, capsys, provider):
    code, _, err = orch(monkeypatch, capsys, "up", "prov", "--cpu", f"--provider={provider}")
    refused(code, err, "unknown provider")
    nothing_created(orch_home)


odd = st.text(min_size=1, max_size=30).filter(lambda s: "\x00" not in s and s.strip())


@EXAMPLES
@given(case=st.one_of(
    st.tuples(st.just("--gpu"), odd, st.just("exclude")),  # with --cpu: never a valid pair
    st.tuples(st.just("--train-arg"), odd.filter(lambda s: "=" not in s), st.just("--train-arg")),
    st.tuples(st.just("--push-to"), odd.filter(lambda s: not s.startswith("hf://")), st.just("--push-to")),
    st.tuples(st.just("--data"), odd.filter(lambda s: not s.startswith("hf://") and not os.path.exists(s)),
              st.just("")),
))
def test_odd_strings_are_refused(orch_home, monkeypatch, capsys, ds, case):
    option, value, needle = case
    data = ["--data", ds] if option in ("--train-arg", "--push-to") else []
    code, _, err = orch(monkeypatch, capsys, "up", "strings", "--cpu", f"{option}={value}", *data)
    refused(code, err, needle)
    nothing_created(orch_home)


def toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return json.dumps(v, ensure_ascii=False)


scalars = st.one_of(st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=True, allow_infinity=True),
                    st.text(max_size=12), st.lists(st.integers(), max_size=3))
top_keys = st.sampled_from(["default_provider", "ssh_timeout_minutes", "offers_cache_seconds", "database_url",
                            "spot_margin", "no_such_key"])
policy_keys = st.sampled_from(["idle_minutes", "on_idle", "max_hours", "rebuild_cost", "bogus"])
local_keys = st.sampled_from(["price_per_hour", "stopped_price_per_hour"])


@st.composite
def configs(draw):
    """A config.toml: any text at all, or settings orch knows with values of every kind."""
    if draw(st.integers(0, 4)) == 0:
        return draw(st.text(max_size=80))
    lines = [f"{k} = {toml_value(draw(scalars))}" for k in draw(st.lists(top_keys, max_size=3, unique=True))]
    if draw(st.booleans()):
        lines.append("[policy]")
        lines += [f"{k} = {toml_value(draw(scalars))}" for k in draw(st.lists(policy_keys, max_size=2, unique=True))]
    if draw(st.booleans()):
        lines.append("[providers.local]")
        lines += [f"{k} = {toml_value(draw(scalars))}" for k in draw(st.lists(local_keys, max_size=2, unique=True))]
    return "\n".join(lines) + "\n"


@EXAMPLES
@given(text=configs())
def test_any_config_toml_is_read_or_refused_in_one_line(orch_home, monkeypatch, capsys, text):
    orch_home.mkdir(mode=0o700, parents=True, exist_ok=True)
    (orch_home / "config.toml").write_text(text)
    code, _, err = orch(monkeypatch, capsys, "status")
    assert "Traceback" not in err and "internal error" not in err, (text, err)
    assert code in (0, 2), (text, err)
    if code == 2:
        refused(code, err)
    nothing_created(orch_home)


# A config.toml sure to be wrong for `orch up` (each a value orch must refuse before renting).
wrong_for_up = st.one_of(
    st.tuples(st.just("ssh_timeout_minutes"), st.one_of(st.floats(max_value=0.04), st.floats(min_value=1441),
                                                        st.text(max_size=5), st.booleans())),
    st.tuples(st.just("spot_margin"), st.one_of(st.floats(max_value=0, exclude_max=True), st.floats(min_value=11))),
    st.tuples(st.just("default_provider"), st.text(max_size=10).filter(lambda s: s not in PROVIDERS)),
    st.tuples(st.just("database_url"), st.text(min_size=1, max_size=20).filter(lambda s: "://" not in s)),
    st.tuples(st.just("[policy] idle_minutes"), st.one_of(st.floats(max_value=0), st.floats(min_value=100_001))),
    st.tuples(st.just("[policy] on_idle"), st.text(max_size=10).filter(lambda s: s not in ON_IDLE)),
    st.tuples(st.just("[providers.local] price_per_hour"), st.one_of(
        st.floats(max_value=0, exclude_max=True), st.just(float("nan")), st.text(max_size=5), st.booleans())),
)


def wrong_config(key: str, value) -> str:
    section, _, key = key.rpartition(" ")
    return f"{section}\n{key} = {toml_value(value)}\n"


@EXAMPLES
@given(case=wrong_for_up)
def test_a_wrong_config_creates_nothing(orch_home, monkeypatch, capsys, case):
    orch_home.mkdir(mode=0o700, parents=True, exist_ok=True)
    (orch_home / "config.toml").write_text(wrong_config(*case))
    code, _, err = orch(monkeypatch, capsys, "up", "cfg", "--cpu")
    refused(code, err)
    nothing_created(orch_home)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(args=st.one_of(
    bad_names.map(lambda n: ["up", "--cpu", "--", n]),
    bad_numbers().filter(lambda c: not c[2]).map(lambda c: ["up", "real", "--cpu", f"{c[0]}={c[1]}"]),
    st.text(min_size=1, max_size=10).filter(lambda s: s not in PROVIDERS and "\x00" not in s)
      .map(lambda p: ["up", "real", "--cpu", f"--provider={p}"]),
))
def test_a_real_orch_process_refuses_the_same_way(orch_home, args):
    proc = run_orch(*args)
    refused(proc.returncode, proc.stderr)
    nothing_created(orch_home)


# -- inputs that were accepted and could not work (issue 42) ----------------------------------------------
TASK = "name: t\nresources: {cpu: true}\nrun: echo hi\n"
ACCEPTED_BEFORE = {
    # name: (task file text or None, the arguments after `orch`, what the one line says)
    "env value with a NUL": (TASK + 'env: {A: "x\\0y"}\n', ["run", "-f", "{task}"], "holds a NUL"),
    "--env value with a NUL": (None, ["run", "x", "--cpu", "--env", "A=x\0y", "--", "true"], "holds a NUL"),
    "--max-cost nan": (None, ["run", "x", "--cpu", "--max-cost", "nan", "--", "true"], "--max-cost"),
    "--retries -1": (None, ["run", "x", "--cpu", "--retries", "-1", "--", "true"], "--retries"),
    "--max-hours inf": (None, ["run", "x", "--cpu", "--max-hours", "inf", "--", "true"], "--max-hours"),
    "a file's run and a command after --": (TASK, ["run", "-f", "{task}", "--", "echo"], "not both"),
    "a command after -- is no name": (None, ["run", "--cpu", "--", "echo", "hi"], "needs a name"),
    "nothing after --": (None, ["run", "x", "--cpu", "--"], "nothing after --"),  # was '--data needs a dataset'
    "--cpu --spot": (None, ["run", "x", "--cpu", "--spot", "--", "true"], "spot"),
    "cpu and spot in a file": ("name: t\nresources: {cpu: true, spot: true}\nrun: echo hi\n", ["run", "-f", "{task}"],
                               "spot"),
    "5,000 nested [ in env": (TASK + "env: {A: " + "[" * 5000 + "]" * 5000 + "}\n", ["run", "-f", "{task}"],
                              "nested deeper"),
    "workdir of a user with no home": (TASK + "workdir: ~nouser-orch-test/x\n", ["run", "-f", "{task}"], "workdir"),
    "a NUL in a file's workdir": (TASK + 'workdir: "a\\0b"\n', ["run", "-f", "{task}"], "workdir"),
    "a NUL in --workdir": (None, ["run", "x", "--cpu", "--workdir", "a\0b", "--", "true"], "workdir"),
}


@pytest.mark.parametrize("case", sorted(ACCEPTED_BEFORE))
def test_what_cannot_work_is_refused_before_anything_is_made(orch_home, monkeypatch, capsys, tmp_path, case):
    """Each of these was accepted (a job row, attempts that crashed, an internal error, a job named
    `echo`): one line, exit 2, and nothing made, not even the ledger."""
    text, args, needle = ACCEPTED_BEFORE[case]
    task = tmp_path / "t.yaml"
    if text is not None:
        task.write_text(text)
    code, _, err = orch(monkeypatch, capsys, *[a.replace("{task}", str(task)) for a in args])
    refused(code, err, needle)
    assert not (orch_home / "ledger.db").exists(), "the ledger was created"
    nothing_created(orch_home)


@pytest.mark.parametrize("args", [["status", "a\n"], ["status", "../x"], ["cost", "a\n"], ["protect", "A"],
                                  ["unprotect", "../x"], ["jobs", "show", "../../victim"], ["jobs", "cancel", "A"],
                                  ["jobs", "logs", "a\n"]])
def test_an_invalid_name_is_refused_before_the_ledger_is_opened(orch_home, monkeypatch, capsys, args):
    code, _, err = orch(monkeypatch, capsys, *args)
    refused(code, err, "invalid name")
    assert not (orch_home / "ledger.db").exists(), "the ledger was created"


# -- a typo in config.toml (a new user's): refused by name, with the key meant ----------------------------
TYPOS = {
    # what config.toml says: the key named, the key meant
    "[providers.local]\nprise_per_hour = 2\n": ("prise_per_hour", "price_per_hour"),
    "[providers.local]\nstoped_price_per_hour = 1\n": ("stoped_price_per_hour", "stopped_price_per_hour"),
    "[providers.lcoal]\nprice_per_hour = 2\n": ("lcoal", "local"),
    "ssh_timout_minutes = 5\n": ("ssh_timout_minutes", "ssh_timeout_minutes"),
    "[policy]\nidle_minute = 5\n": ("idle_minute", "idle_minutes"),
    "[budget]\ndaily = 5\n": ("daily", "daily_usd"),
    "[notify]\nevent = []\n": ("event", "events"),
}
TYPO_COMMANDS = {
    "run": ["run", "x", "--provider", "local", "--cpu", "--max-cost", "1", "--", "true"],
    "up": ["up", "box", "--cpu"],
    "schedule add": ["schedule", "add", "nightly", "-f", "{task}", "--cron", "@daily", "--max-cost", "1"],
}


@pytest.mark.parametrize("command", sorted(TYPO_COMMANDS))
@pytest.mark.parametrize("text", sorted(TYPOS))
def test_a_mistyped_setting_is_named_with_the_one_meant(orch_home, monkeypatch, capsys, tmp_path, text, command):
    """`prise_per_hour = 2` was read as no price at all: every run cost $0 to --max-cost and the
    budget. Now one line names the key and the nearest one orch knows, exit 2, nothing made."""
    orch_home.mkdir(mode=0o700, parents=True, exist_ok=True)
    (orch_home / "config.toml").write_text(text)
    task = tmp_path / "t.yaml"
    task.write_text(TASK)
    code, _, err = orch(monkeypatch, capsys, *[a.replace("{task}", str(task)) for a in TYPO_COMMANDS[command]])
    typo, meant = TYPOS[text]
    refused(code, err, f"{typo!r}")
    assert f"did you mean {meant!r}" in err, err
    nothing_created(orch_home)
    if (orch_home / "ledger.db").exists():
        with sqlite3.connect(orch_home / "ledger.db") as conn:
            assert conn.execute("SELECT (SELECT count(*) FROM jobs) + (SELECT count(*) FROM schedules)").fetchone() \
                == (0,)


# -- --allow-secret names one of orch's own credentials, or is refused by the command that was typed ----
ALLOW_COMMANDS = {
    "orch run": ["run", "x", "--cpu", "--dry-run", "{allow}", "--", "true"],
    "orch exec": ["exec", "box", "{allow}", "--", "true"],
    "orch schedule add": ["schedule", "add", "nightly", "-f", "{task}", "--cron", "@daily", "{allow}"],
}
ALLOW_NAMES = {  # the name given: what the one line says after the command's own label
    "MY_PLAIN_SECRET": "--allow-secret MY_PLAIN_SECRET: not one of orch's own credentials",
    "RUNPOD_API_KY": "(did you mean 'RUNPOD_API_KEY'?)",
    "ORCH_HOME": "--allow-secret ORCH_HOME: an ORCH_ variable",
}


@pytest.mark.parametrize("name", sorted(ALLOW_NAMES))
@pytest.mark.parametrize("command", sorted(ALLOW_COMMANDS))
def test_allow_secret_of_a_name_that_is_no_credential_is_refused_by_its_own_command(orch_home, monkeypatch, capsys,
                                                                                   tmp_path, command, name):
    """`--allow-secret MY_PLAIN_SECRET` acted as `--secret` (a typo of a provider key's name was then
    a secret of its own, read from the shell), and its refusals said `orch run:` under `orch exec`
    and `orch schedule add`. Now one line, labelled with the command typed, exit 2, nothing stored."""
    monkeypatch.setenv("MY_PLAIN_SECRET", "plain-value")
    monkeypatch.setenv("RUNPOD_API_KY", "typo-value")
    task = tmp_path / "t.yaml"
    task.write_text(TASK)
    args = [a.replace("{task}", str(task)) for a in ALLOW_COMMANDS[command]]
    at = args.index("{allow}")
    code, _, err = orch(monkeypatch, capsys, *args[:at], "--allow-secret", name, *args[at + 1:])
    refused(code, err, f"orch: error: {command}: ")
    assert ALLOW_NAMES[name] in err, err
    nothing_created(orch_home)
    assert not (orch_home / "schedule-secrets").exists(), "nothing kept for a schedule"
