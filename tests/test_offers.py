"""orch offers, cost per job, up --cheapest and orch trial, against the fake RunPod and Vast.ai APIs
through the real SDKs (and, for the trial, a real local instance training LibreYOLO)."""

from __future__ import annotations

import getpass
import json
import math
import time

import pytest

from bench.offers import DelayedRunPod, DelayedVast, config_toml
from orchestrator import gpus
from orchestrator.money import offers
from orchestrator.provider import HOURS_PER_MONTH
from tests.conftest import needs_torch, run_orch
from tests.fakes.runpod_api import FakeRunPod
from tests.fakes.vast_api import FakeVast, _offer

HF_DATA = "hf://acme/birds/birds.tar"  # a dataset named, not fetched: estimates only match on it


@pytest.fixture
def fakes(tmp_path, orch_home, monkeypatch):
    """Both fakes, and orch's config pointing at them (ssh as this user, quick polls)."""
    with FakeRunPod(tmp_path / "runpod") as runpod, FakeVast(tmp_path) as vast:
        monkeypatch.setenv("RUNPOD_API_BASE_URL", runpod.url)
        write_config(orch_home, runpod, vast)
        yield runpod, vast


def write_config(home, runpod, vast, top: str = "", vast_extra: dict | None = None, vast_key: bool = True) -> None:
    vast_settings = {"server_url": vast.url, "ssh_user": getpass.getuser(), "poll_seconds": 0.05,
                     **({"api_key": vast.key} if vast_key else {}), **(vast_extra or {})}
    lines = [top, "[providers.runpod]"] + [f"{k} = {json.dumps(v)}" for k, v in runpod.settings().items()]
    lines += ["[providers.vastai]"] + [f"{k} = {json.dumps(v)}" for k, v in vast_settings.items()]
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    (home / "config.toml").write_text("\n".join(lines) + "\n")
    (home / "config.toml").chmod(0o600)  # it holds keys


def orch_json(*args, check=0):
    proc = run_orch("offers", "--json", *args, check=check)
    return json.loads(proc.stdout), proc


def _open():
    from orchestrator.instances.lifecycle import Orch

    return Orch.open(say=lambda m: None)


def search(**query):
    job = query.pop("job", None)
    return offers.search(_open(), offers.Query(**query), job)


# -- names and units ---------------------------------------------------------------------------
@pytest.mark.parametrize("spelling, name", [
    ("RTX 4090", "RTX 4090"), ("NVIDIA GeForce RTX 4090", "RTX 4090"), ("4090", "RTX 4090"), ("rtx_4090", "RTX 4090"),
    ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("H100 SXM", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM"), ("A100 SXM4", "A100 SXM"), ("NVIDIA A100 80GB PCIe", "A100 PCIe"),
    ("RTX 4080S", "RTX 4080 SUPER"), ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"), ("RTX 6000Ada", "RTX 6000 Ada"),
    ("Tesla V100-SXM2-16GB", "V100 SXM"), ("3090 Ti", "RTX 3090 Ti"), ("Q RTX 8000", "Q RTX 8000"),
    ("A6000", "RTX A6000"), ("NVIDIA RTX A6000", "RTX A6000"),
])
def test_gpu_names_normalise(spelling, name):
    assert gpus.canonical(spelling) == name


def test_gpu_family_and_vram_units():
    assert gpus.matches("A100", "A100 SXM4") and gpus.matches("a100", "NVIDIA A100 80GB PCIe")
    assert not gpus.matches("RTX 3090", "RTX 3090 Ti")  # a known type is that type, not its family
    assert gpus.vram("RTX 4090", 24564 / 1024) == 24 and gpus.vram("H100 SXM", 81559 / 1024) == 80
    assert gpus.vram("Q RTX 8000", 47.99) == 48.0
    assert gpus.relative("RTX 4090") == 1.0 and gpus.relative("RTX 3090") < 1 < gpus.relative("H100 SXM")
    assert "datasheet" in gpus.THROUGHPUT_SOURCE


def test_offers_are_normalised_across_providers(fakes):
    runpod, vast = fakes
    vast.offers.append(_offer(1011, "H100 SXM", 2.10, gpu_ram=81559, min_bid=1.20))  # MiB, as Vast reports
    rows = search(gpu="NVIDIA GeForce RTX 4090").rows
    assert {(r.offer.provider, r.offer.offer_id) for r in rows} == {
        ("runpod", "NVIDIA GeForce RTX 4090"), ("vastai", "1001"), ("vastai", "1007")}
    assert {r.gpu for r in rows} == {"RTX 4090"} and {r.vram_gb for r in rows} == {24.0}
    for spelling in ("4090", "rtx_4090", "RTX 4090"):
        assert [(r.offer.provider, r.offer.offer_id) for r in search(gpu=spelling).rows] == \
            [(r.offer.provider, r.offer.offer_id) for r in rows]
    h100 = search(gpu="h100").rows
    assert {(r.offer.provider, r.gpu, r.vram_gb) for r in h100} == {("runpod", "H100 SXM", 80.0),
                                                                     ("vastai", "H100 SXM", 80.0)}
    assert {r.gpu for r in search(gpu="A100", gpus=2).rows} == {"A100 PCIe", "A100 SXM"}  # a family
    # RunPod's A100 SXM is in stock nowhere (its catalog shows no data center): left out. The others, one
    # offer per cloud that has them in stock (the A100 PCIe on Community Cloud only).
    assert [r.vram_gb for r in search(min_vram=48).rows if r.offer.provider == "runpod"] == [48, 48, 80, 80, 80]


def test_spot_and_on_demand_prices_include_the_disk(fakes):
    disk = 50
    rows = {(r.offer.provider, r.gpu): r for r in search(gpu="4090", gpus=2, disk_gb=disk).rows}
    rp = min((r for r in search(gpu="4090", gpus=2, disk_gb=disk).rows if r.offer.provider == "runpod"),
             key=lambda r: r.price_hr)  # the cheaper cloud
    # RunPod quotes per GPU and without the volume: orch adds it, running rate 0.10 $/GB-month.
    rp_disk = disk * 0.10 / HOURS_PER_MONTH
    assert rp.price_hr == pytest.approx(2 * 0.34 + rp_disk)
    assert rp.spot_hr is None  # RunPod removed spot pods from its API (2026-09-11): no spot price to show
    assert rp.stopped_hr == pytest.approx(disk * 0.20 / HOURS_PER_MONTH)  # stopped volumes bill double
    single = {(r.offer.provider, r.offer.offer_id): r for r in search(gpu="4090", disk_gb=disk).rows}
    vast = single["vastai", "1001"]
    # Vast's dph_total has the storage in it and the provider adds it to min_bid: not added twice.
    vast_disk = disk * 0.15 / 720  # Vast prices storage over a 720-hour month (its show_instance example)
    assert vast.price_hr == pytest.approx(0.40 + vast_disk, abs=1e-6) and vast.spot_hr == pytest.approx(0.20 + vast_disk, abs=1e-6)
    assert vast.stopped_hr == pytest.approx(vast_disk, abs=1e-6) and vast.offer.disk_gb_month == 0.15

    data, _ = orch_json("--gpu", "4090", "--disk", str(disk), "--spot", "--provider", "runpod")
    assert data["offers"] == [] and data["query"]["mode"] == "spot" and not data["partial"]  # RunPod: no spot


def test_spot_only_and_price_cap_filter_rows(fakes):
    spot = search(mode="spot", gpus=1).rows
    assert "A100 SXM" not in {r.gpu for r in spot}  # RunPod has no spot price for it
    assert [r.spot_hr for r in spot] == sorted(r.spot_hr for r in spot)
    capped = search(mode="on-demand", max_price=0.35).rows
    assert capped and all(r.price_hr <= 0.35 for r in capped)


# -- partial answers and the cache -------------------------------------------------------------
@pytest.mark.parametrize("failure, says", [("server error", "server error"), ("no key", "no API key"),
                                           ("bad setting", "spot_margin")])
def test_one_provider_failing_is_one_line_and_a_partial_answer(fakes, orch_home, failure, says):
    runpod, vast = fakes
    if failure == "no key":
        write_config(orch_home, runpod, vast, vast_key=False)
    elif failure == "bad setting":
        write_config(orch_home, runpod, vast, vast_extra={"spot_margin": "lots"})
    else:
        write_config(orch_home, runpod, vast, vast_extra={"retries": 2})
        vast.server_error(times=100)
    proc = run_orch("offers", "--gpu", "4090")
    assert proc.returncode == offers_partial_exit()
    assert "runpod" in proc.stdout and "RTX 4090" in proc.stdout  # the other one still answered
    errors = [line for line in proc.stderr.splitlines() if line.startswith("orch: ")]
    assert len(errors) == 1 and errors[0].startswith("orch: vastai: ")
    assert says in errors[0]
    data, _ = orch_json("--gpu", "4090", check=3)
    assert data["partial"] and [e["provider"] for e in data["errors"]] == ["vastai"]
    assert {r["provider"] for r in data["offers"]} == {"runpod"}


def offers_partial_exit() -> int:
    from orchestrator.cli.offers import PARTIAL

    return PARTIAL


def test_no_provider_answering_is_an_error(fakes, orch_home):
    runpod, vast = fakes
    proc = run_orch("offers", "--provider", "runpod", env={"RUNPOD_API_BASE_URL": "http://127.0.0.1:9"})
    assert proc.returncode == 1 and "no provider answered" in proc.stderr


def test_second_call_is_answered_from_the_cache(fakes):
    runpod, vast = fakes
    first, _ = orch_json()
    asked = (len(runpod.queries), len(vast.calls("POST", r"/bundles/$")))
    assert asked == (2, 1)  # RunPod's catalog: one request per cloud
    again, proc = orch_json()
    assert (len(runpod.queries), len(vast.calls("POST", r"/bundles/$"))) == asked  # no request at all
    assert again["offers"] == first["offers"] and "cached answers" in proc.stderr
    assert search(gpu="3090").rows  # GPU filters apply to the cached catalog: still no request
    assert (len(runpod.queries), len(vast.calls("POST", r"/bundles/$"))) == asked
    search(disk_gb=80)  # another disk is another price: asked
    offers.search(_open(), offers.Query(), fresh=True)
    assert (len(runpod.queries), len(vast.calls("POST", r"/bundles/$"))) == (6, 3)


def test_cache_expires(fakes, orch_home):
    runpod, vast = fakes
    write_config(orch_home, runpod, vast, top="offers_cache_seconds = 1")
    search(providers=["runpod"])
    search(providers=["runpod"])
    assert len(runpod.queries) == 2  # one catalog request per cloud
    time.sleep(1.1)  # clock: offers_cache_seconds = 1 must pass for the cached answer to expire
    search(providers=["runpod"])
    assert len(runpod.queries) == 4


def test_providers_are_asked_at_the_same_time(tmp_path, orch_home, monkeypatch):
    DelayedRunPod.delay = DelayedVast.delay = 0.5
    with DelayedRunPod(tmp_path / "runpod") as runpod, DelayedVast(tmp_path) as vast:
        monkeypatch.setenv("RUNPOD_API_BASE_URL", runpod.url)
        orch_home.mkdir(mode=0o700, parents=True, exist_ok=True)
        (orch_home / "config.toml").write_text(config_toml(runpod, vast))  # caches nothing
        (orch_home / "config.toml").chmod(0o600)
        orch = _open()
        query = offers.Query(providers=["runpod", "vastai"])
        offers.search(orch, query)  # imports the SDKs
        t = time.perf_counter()
        answer = offers.search(orch, query)
        both = time.perf_counter() - t
    assert not answer.errors and {r.offer.provider for r in answer.rows} == {"runpod", "vastai"}
    assert 0.5 <= both < 0.85  # one delay, not two


def test_local_provider_without_gpus_is_silent(orch_home):
    answer = search(providers=["local"])
    assert answer.rows == [] and answer.errors == [] and not answer.partial


# -- cost per job ------------------------------------------------------------------------------
def seed_run(ledger, gpu: str, epoch_seconds: float, gpus_n: int = 1, trial: dict | None = None,
             data: str = HF_DATA, model: str = "yolo9-t", data_bytes: int | None = None) -> None:
    inst = ledger.create_instance(name=f"m{len(ledger.runs())}", provider="runpod", label="", gpu=gpu, gpus=gpus_n,
                                  disk_gb=20)
    args = {"epochs": 100, "model": model, **({offers.TRIAL_KEY: trial} if trial else {})}
    ledger.add_run(instance_id=inst.id, model=model, data=data, epochs=100, gpu_name=gpu, state="completed",
                   mean_epoch_seconds=epoch_seconds if not trial else epoch_seconds * 1.5,
                   data_bytes=data_bytes, args=json.dumps(args))


def test_a_slower_cheaper_gpu_wins_per_job_once_measured(fakes, ledger):
    job = offers.Workload(model="yolo9-t", epochs=100, data=HF_DATA)
    seed_run(ledger, "NVIDIA GeForce RTX 4090", 60.0)  # 0.3427 $/hr on RunPod: 0.57 $ an epoch-hour
    ranked = search(providers=["runpod"], mode="on-demand", job=job).rows
    by_gpu = {r.gpu: r for r in ranked}
    assert by_gpu["RTX 4090"].estimate.source == "ledger"
    # The table says a 3090 is ~0.63 of a 4090: 95 s an epoch, dearer per job than the 4090.
    assert by_gpu["RTX 3090"].estimate.source == "scaled"
    assert by_gpu["RTX 3090"].estimate.epoch_seconds == pytest.approx(60 / gpus.relative("RTX 3090"))
    assert ranked[0].gpu == "RTX 4090"
    assert search(providers=["runpod"], mode="on-demand", job=job, sort="hourly").rows[0].gpu == "RTX 3090"

    seed_run(ledger, "RTX 3090", 80.0)  # measured: only a third slower, and a third cheaper per hour
    ranked = search(providers=["runpod"], mode="on-demand", job=job).rows
    assert [r.gpu for r in ranked[:2]] == ["RTX 3090", "RTX 4090"]
    top = ranked[0]
    assert top.estimate.source == "ledger" and top.hours == pytest.approx(100 * 80 / 3600)
    assert top.job_usd(False) == pytest.approx(top.hours * (0.22 + 20 * 0.10 / HOURS_PER_MONTH))

    data, proc = orch_json("--provider", "runpod", "--on-demand", "--epochs", "100", "--data", HF_DATA)
    assert [(r["gpu"], r["source"]) for r in data["offers"][:2]] == [("RTX 3090", "ledger"), ("RTX 4090", "ledger")]
    assert data["throughput_source"] == gpus.THROUGHPUT_SOURCE  # the others were scaled by the table
    table = run_orch("offers", "--provider", "runpod", "--on-demand", "--epochs", "100", "--data", HF_DATA, check=0)
    first = table.stdout.splitlines()[2]
    assert first.startswith("runpod") and "RTX 3090" in first and first.rstrip().endswith("ledger")
    assert "throughput table: NVIDIA/AMD datasheet" in table.stdout


def test_estimate_sources_in_order_of_trust(ledger):
    job = offers.Workload(model="yolo9-t", epochs=10, data=HF_DATA, data_bytes=2_000_000_000)
    seed_run(ledger, "RTX A6000", 50.0, trial={"epoch_seconds": 50.0, "bound": "GPU"})
    seed_run(ledger, "RTX 4090", 40.0, data="hf://acme/other/o.tar", data_bytes=1_000_000_000)
    known = offers.measurements(ledger, job)
    trial = offers.estimate(job, "RTX A6000", 1, known)
    assert trial.source == "trial" and trial.epoch_seconds == 50.0  # the warm figure, not the run's mean
    scaled = offers.estimate(job, "A100 PCIe", 1, known)  # same dataset, measured on the A6000
    assert scaled.source == "scaled" and "A6000" in scaled.detail
    assert scaled.epoch_seconds == pytest.approx(50.0 * gpus.relative("RTX A6000") / gpus.relative("A100 PCIe"))
    two = offers.estimate(job, "RTX A6000", 2, known)
    assert two.epoch_seconds == pytest.approx(50.0 / (1 + offers.DDP_EFFICIENCY)) and "x2" in two.detail

    other = offers.Workload(model="yolo9-t", epochs=10, data="hf://acme/new/n.tar", data_bytes=3_000_000_000)
    by_size = offers.estimate(other, "RTX 4090", 1, offers.measurements(ledger, other))
    assert by_size.source == "scaled" and by_size.epoch_seconds == pytest.approx(40.0 * 3)  # 3x the data

    fresh = offers.Workload(model="yolo9-s", epochs=10, data_bytes=1_500_000_000)  # nothing measured for it
    prior = offers.estimate(fresh, "RTX 4090", 1, offers.measurements(ledger, fresh))
    assert prior.source == "prior" and "assumed" in prior.detail
    assert prior.epoch_seconds == pytest.approx(10_000 * offers.prior_seconds_per_image("yolo9-s", None))
    assert offers.estimate(fresh, "Q RTX 8000", 1, []) is None  # not in the table, never measured


# -- up --cheapest -------------------------------------------------------------------------------
@pytest.mark.parametrize("provider", ["runpod", "vastai"])
def test_cheapest_launches_the_offer_it_showed(fakes, orch_home, ledger, provider):
    runpod, vast = fakes
    shown, _ = orch_json("--provider", provider, "--on-demand")
    top = shown["offers"][0]
    assert top["gpu"] == "RTX 3090"
    # This machine has no GPU: verify fails and up destroys what it rented.
    proc = run_orch("up", "box", "--provider", provider, "--cheapest", "--ssh-timeout", "1")
    assert proc.returncode != 0 and "destroying" in proc.stderr
    assert f"cheapest: {provider} RTX 3090 x1 (offer {top['offer_id']})" in proc.stderr
    inst = ledger.by_name("box", live_only=False)
    assert inst.state == "destroyed" and inst.provider == provider
    assert inst.gpu == top["gpu_name"] and gpus.canonical(inst.gpu_name) == top["gpu"]
    if provider == "runpod":
        [sent] = runpod.sent("POST", "/v2/pods")
        assert sent["gpu"]["id"] == top["offer_id"] and runpod.live() == []
    else:
        [create] = vast.calls("PUT", r"^/api/v0/asks/\d+/$")
        assert create.path == f"/api/v0/asks/{top['offer_id']}/" and create.body["price"] is None
        assert vast.live() == []


def test_cheapest_spot_bids_the_live_price_plus_the_margin(fakes, orch_home, ledger):
    runpod, vast = fakes
    write_config(orch_home, runpod, vast, top="spot_margin = 0.1")
    orch_json("--provider", "vastai", "--spot")  # cache the offers...
    next(o for o in vast.offers if o["id"] == 1009)["min_bid"] = 0.13  # ...then the market moves
    proc = run_orch("up", "box", "--provider", "vastai", "--cheapest", "--spot", "--ssh-timeout", "1")
    assert "cheapest: vastai RTX 3090 x1 (offer 1009)" in proc.stderr and "spot" in proc.stderr
    [create] = vast.calls("PUT", r"^/api/v0/asks/\d+/$")
    assert create.body["price"] == pytest.approx(math.ceil(0.13 * 1.1 * 1000 - 1e-6) / 1000)  # live, not cached
    assert ledger.by_name("box", live_only=False).state == "destroyed" and vast.live() == []
    # RunPod has no spot pods any more: refused in one line, nothing sent.
    proc = run_orch("up", "box2", "--provider", "runpod", "--cheapest", "--spot", check=2)
    assert "spot" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert runpod.inputs("podRentInterruptable") == [] and runpod.inputs("podFindAndDeployOnDemand") == []


def test_cheapest_refuses_what_it_cannot_pick(orch_home):
    proc = run_orch("up", "box", "--cheapest", "--cpu")
    assert proc.returncode == 2 and "--cheapest" in proc.stderr


# -- the CLI's edges -------------------------------------------------------------------------------
@pytest.mark.parametrize("args, needle", [
    (["--spot", "--on-demand"], "exclude each other"),
    (["--epochs", "10"], "needs the dataset"),
    (["--data", HF_DATA], "add --epochs"),
    (["--sort", "job"], "--sort job needs a job"),
    (["--provider", "nosuch"], "unknown provider"),
])
def test_offers_bad_input_is_exit_2(orch_home, args, needle):
    proc = run_orch("offers", *args)
    assert proc.returncode == 2 and needle in proc.stderr


@pytest.mark.parametrize("argv", [["offers", "--help"], ["trial", "--help"]])
def test_offers_commands_import_nothing_heavy_for_help(argv):
    import subprocess
    import sys

    code = ("import sys; from orchestrator.cli.main import main\n"
            f"sys.argv = ['orch', *{argv!r}]\ntry: main()\nexcept SystemExit: pass\n"
            "print('HEAVY', [m for m in ('runpod', 'vastai', 'torch', 'fabric') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "HEAVY []"


# -- orch trial ----------------------------------------------------------------------------------
def test_bottleneck_heuristic():
    from orchestrator.cli.offers import bottleneck

    assert bottleneck(True, [], [0.5])[0] == "host (CPU-only)"
    assert bottleneck(False, [95, 97, 90], [0.4])[0] == "GPU"
    assert bottleneck(False, [30, 35, 40], [0.95, 0.97])[0] == "host"
    assert bottleneck(False, [30, 35, 40], [0.30, 0.25])[0] == "data loader"
    assert bottleneck(False, [], [])[0] == "unknown"


def test_steps_trial_trains_on_a_copy_of_the_first_images(tmp_path, orch_home):
    import yaml

    from orchestrator.tasks import dataset
    from orchestrator.cli.offers import _subset

    data = dataset.synth(tmp_path / "birds", n_train=10, n_val=3, imgsz=32)
    part = _subset(str(data), 4, orch_home)
    info = dataset.validate(part.path, doctor=False)
    assert (part.count, part.total) == (4, 10) and info.n_images == {"train": 4, "val": 1}
    first = sorted((data / "images" / "train").iterdir())[0]
    assert (part.path / "images" / "train" / "000000.png").read_bytes() == first.read_bytes()
    assert (part.path / "labels" / "train" / "000000.txt").read_text() == \
        (data / "labels" / "train" / first.with_suffix(".txt").name).read_text()
    assert yaml.safe_load((part.path / "data.yaml").read_text())["names"] == list(info.names)
    assert _subset(str(data), 50, orch_home).count == 10  # fewer images than steps x batch: all of them


@needs_torch
def test_trial_on_a_cpu_instance_records_a_measurement(orch_home, ledger, tmp_path):
    from orchestrator.tasks import dataset

    data = dataset.synth(tmp_path / "ds", n_train=4, n_val=2, imgsz=64)
    run_orch("up", "cpubox", "--cpu", check=0)
    try:
        proc = run_orch("trial", "cpubox", "--data", data, "--epochs", "1", "--imgsz", "64", "--batch", "4",
                        "--train-arg", "workers=0", "--json", check=0)
        result = json.loads(proc.stdout)
        assert result["bound"] == "host (CPU-only)" and result["peak_vram_gb"] is None
        assert result["epoch_seconds"] > 0 and result["train_images"] == 4 and result["mode"] == "epochs"
        # Rounded to one decimal from the unrounded time: within 2 % of the rounded time's figure.
        assert result["images_per_second"] == pytest.approx(4 / result["epoch_seconds"], rel=0.02, abs=0.051)
        run = ledger.latest_run(ledger.by_name("cpubox").id)
        marker = offers.trial_marker(run)
        assert marker["epoch_seconds"] == result["epoch_seconds"] == run.mean_epoch_seconds
        assert marker["samples"] >= 1 and marker["cpu_busy_median"] is not None  # the sampler ran beside it
        assert run.peak_vram_gb is None and run.epochs == 1
        too_long = run_orch("trial", "cpubox", "--data", data, "--epochs", "3")
        assert too_long.returncode == 2 and "1 or 2 epochs" in too_long.stderr
    finally:
        run_orch("down", "cpubox", "--no-pull", "--yes")


def test_a_shared_ledgers_run_whose_args_are_not_an_object_reads_as_no_args_not_a_crash(ledger):
    """A run row on a shared ledger is input: args that are JSON but no object (``[1]``, ``"x"``,
    ``7``) read as no args, as args that are no JSON always did (the run's own columns still
    measure it), and the runs beside them still count. A list there raised AttributeError out of
    `orch offers`."""
    job = offers.Workload(model="yolo9-t", epochs=10, data=HF_DATA)
    seed_run(ledger, "RTX 4090", 40.0)
    for i, bad in enumerate(('[1]', '"x"', '7', '{', 'null')):
        inst = ledger.create_instance(name=f"bad{i}", provider="runpod", label="", gpu="RTX 3090", gpus=1, disk_gb=20)
        ledger.add_run(instance_id=inst.id, model="yolo9-t", data=HF_DATA, epochs=100, gpu_name="RTX 3090",
                       state="completed", mean_epoch_seconds=10.0, args=bad)
    known = offers.measurements(ledger, job)
    assert sorted((m.gpu, m.epoch_seconds) for m in known) == [("RTX 3090", 10.0)] * 5 + [("RTX 4090", 40.0)]
