"""`orch run --dry-run` checks what the launch checks (spot where the provider has none: the same one
line, exit 2; a name whose files are there: said, and the plan shown), warns of a secret not set now (the launch refuses
it), and with no provider key shows the list prices orch ships, dated and marked as such."""

from __future__ import annotations

import json
import re
import textwrap
import tomllib
from datetime import date
from pathlib import Path

from tests.clouds import local_billing, open_orch
from tests.conftest import ROOT, run_orch


def nothing_created(orch_home: Path) -> None:
    assert local_billing(orch_home) == set()
    if (orch_home / "ledger.db").exists():
        assert open_orch().ledger.jobs() == [] and open_orch().ledger.instances() == []


def test_a_dry_run_refuses_what_the_launch_refuses_in_the_same_line(orch_home):
    taken = orch_home / "runs" / "taken"
    taken.mkdir(parents=True)
    (taken / "train.log").write_text("an earlier job's files\n")
    # A name whose files are here: the launch refuses it; the dry run plans, and says so (issue 55, 4).
    launch = run_orch("run", "taken", "--provider", "local", "--cpu", "--", "true", check=2).stderr
    assert launch.count("\n") == 1 and "already holds job taken's files" in launch and "--replace" in launch
    dry = run_orch("run", "taken", "--provider", "local", "--cpu", "--dry-run", "--", "true", check=0)
    assert f"warning: the launch would be refused: {launch.removeprefix('orch: error: ')}" in dry.stderr, dry.stderr
    assert "dry run: nothing rented, nothing recorded" in dry.stdout
    for args, says in ((("x", "--provider", "local", "--spot"), "local has no spot instances"),
                       (("x", "--provider", "local", "--cpu", "--spot"), "local has no spot instances")):
        dry = run_orch("run", *args, "--dry-run", "--", "true", check=2).stderr
        launch = run_orch("run", *args, "--", "true", check=2).stderr
        assert dry == launch and dry.count("\n") == 1 and says in dry, (args, dry, launch)
    assert [p.name for p in (orch_home / "runs").iterdir()] == ["taken"]
    nothing_created(orch_home)


def test_a_dry_run_warns_of_a_secret_not_set_now_where_the_launch_refuses_it(orch_home):
    args = ("run", "x", "--provider", "local", "--cpu", "--secret", "DRY_RUN_TOKEN", "--", "true")
    dry = run_orch(*args[:-2], "--dry-run", *args[-2:], check=0)
    assert "warning: secret DRY_RUN_TOKEN is not set in this environment" in dry.stderr
    assert "dry run: nothing rented, nothing recorded" in dry.stdout
    launch = run_orch(*args, check=2).stderr
    assert "secret DRY_RUN_TOKEN is not set" in launch and launch.count("\n") == 1
    nothing_created(orch_home)


def test_with_no_provider_key_a_dry_run_shows_dated_list_prices_marked_as_such(orch_home, tmp_path):
    from orchestrator.money import catalogue

    when, prices = catalogue.load()
    label = f"list price, {when}, not live"
    proc = run_orch("run", "x", "--gpu", "A100", "--dry-run", "--", "python", "train.py", check=0)
    listed = [line for line in proc.stdout.splitlines() if re.match(r"\s+\d+\. ", line)]
    a100 = [p for p in prices if p.gpus == 1 and "A100" in p.gpu]
    assert len(listed) == len(a100) > 0 and all(label in line for line in listed), proc.stdout
    assert f"${min(p.usd_hr for p in a100):.2f}/hr" in listed[0], "cheapest first"
    assert "no key here" in proc.stdout and "nothing rented" in proc.stdout
    # A dstack file asking for memory (gpu: 80GB) gets only GPUs with that much.
    task = tmp_path / "big.dstack.yml"
    task.write_text(textwrap.dedent("""
        type: task
        name: big
        commands: [python train.py]
        resources:
          gpu: 80GB
        """))
    proc = run_orch("run", "-f", task, "--dry-run", check=0)
    listed = [line for line in proc.stdout.splitlines() if re.match(r"\s+\d+\. ", line)]
    assert listed and all(" 80 GB " in line for line in listed), proc.stdout
    assert "with 80 GB each" in proc.stdout, "dstack's 80GB is a range of one value: exactly 80GB"
    # A range keeps both its ends (dstack's query has min_gpu_memory and max_gpu_memory).
    task.write_text(task.read_text().replace("gpu: 80GB", "gpu: 40GB..48GB"))
    proc = run_orch("run", "-f", task, "--dry-run", check=0)
    sizes = [float(m.group(1)) for m in re.finditer(r"x \S.*? (\d+(?:\.\d+)?) GB \(", proc.stdout)]
    assert sizes and all(40 <= gb <= 48 for gb in sizes) and "with 40 to 48 GB each" in proc.stdout, proc.stdout
    nothing_created(orch_home)


def test_the_catalogue_is_dated_and_every_price_has_its_public_source():
    from orchestrator import gpus
    from orchestrator.money import catalogue

    when, prices = catalogue.load()
    assert date.fromisoformat(when) <= date.today()
    assert prices
    for p in prices:
        assert p.source.startswith("https://") and p.usd_hr > 0 and p.gpus >= 1 and p.vram_gb > 0, p
        assert gpus.canonical(p.gpu) == p.gpu or gpus.lookup(p.gpu) is None, f"{p.gpu}: orch's own name for it"
    data = json.loads(Path(catalogue.__file__).with_name("catalogue.json").read_text())
    assert "not live" in catalogue.label(when) and data["what"]
    with open(ROOT / "pyproject.toml", "rb") as f:
        shipped = tomllib.load(f)["tool"]["setuptools"]["package-data"]["orchestrator"]
    assert "money/catalogue.json" in shipped, "the wheel carries it"


def test_a_group_dry_run_says_which_providers_it_leaves_out_and_where_hf_home_goes(orch_home):
    """`nodes: 2` asks only the providers that rent groups: the dry run names the others. With a
    volume, HF_HOME goes on it (the hub's downloads survive the machine): the dry run says where."""
    group = run_orch("run", "pair", "--gpu", "A100", "--nodes", "2", "--dry-run", "--", "true", check=0).stdout
    left_out = [line for line in group.splitlines() if "not asked, as they rent no group:" in line]
    assert len(left_out) == 1 and "vastai" in left_out[0], group
    one = run_orch("run", "one", "--gpu", "A100", "--dry-run", "--", "true", check=0).stdout
    assert "rent no group" not in one, one
    run_orch("volume", "create", "hub", "--provider", "local", "--size", "1")
    dry = run_orch("run", "x", "--provider", "local", "--cpu", "--volume", "hub:~/hub", "--dry-run", "--", "true",
                   check=0).stdout
    assert "volume   hub at ~/hub" in dry and "HF_HOME  ~/hub/hf: the hub's downloads stay on the volume" in dry, dry
    own = run_orch("run", "x", "--provider", "local", "--cpu", "--volume", "hub:~/hub", "--env", "HF_HOME=/cache",
                   "--dry-run", "--", "true", check=0).stdout
    assert "volume   hub at ~/hub" in own and "HF_HOME  " not in own, "a task's own HF_HOME is left as it is"
    nothing_created(orch_home)
