"""Offers from every provider at once, priced alike, ranked by what the whole job costs.

Prices. Every $/hr here is the whole machine with the requested disk, running: providers that
leave the disk out of their quote (RunPod's on-demand and spot prices exclude the volume) get it
added; Vast's ``dph_total`` and the Vast provider's ``spot_hr`` (min bid + storage) include it.
"Stopped $/hr" is what the disk alone bills while the machine is stopped.

Asking. Every provider is asked in its own thread, so an answer takes about as long as the
slowest provider. A provider is asked when it is ``configured()`` (its key is in config.toml, the
environment or its SDK's key file), has a section in config.toml, or is named with ``--provider``;
other installed providers are left out, as is one that is no source of offers here (the local one
on a machine without GPUs). One that has no key or fails is
one error line and the others still answer: the answer is *partial* (``orch offers`` exits 3).
Answers are cached under ``$ORCH_HOME/cache`` for ``offers_cache_seconds`` (config.toml, default
60; 0 turns the cache off), keyed by provider, query and settings, because Vast.ai counts
searches against a daily quota. A launch (``up --cheapest``) always asks live: a bid from a
cached price is the stale-bid mistake.

Cost per job. Hours = epochs x seconds per epoch; job $ = hours x $/hr (disk included); spot rows
use the spot price. Seconds per epoch for a GPU type come, in order of trust, from:

1. ``ledger``: finished or running runs of the same model, dataset and image size on that type;
2. ``trial``: ``orch trial`` runs of the same on that type (run rows marked ``orch_trial`` in
   their args: a 1-2 epoch run's mean carries the warm-up, so the trial stores its warm figure);
3. ``scaled``: a measurement of the same model on another type (same dataset first, else another
   dataset scaled by size), scaled by orchestrator/gpus.py's relative-throughput table;
4. ``prior``: an assumed base figure per image for the model (below), scaled by the same table.

Several GPUs: each added GPU is assumed to add DDP_EFFICIENCY of one.

Several machines (`--nodes N`, ``for_nodes``): every price is the group's, N machines together;
the time is one machine's divided by 1 + e x (N - 1), where e, the share of a machine each added
node is assumed to add, is NODE_EFFICIENCY unless the user sets it (``orch offers --scaling``,
``node_scaling`` in config.toml). Across machines the network, not the GPUs, bounds it: orch does
not pretend to know e, it says which it used.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from statistics import mean
from typing import Any

from orchestrator import gpus
from orchestrator.errors import AuthError, NoCapacity, OrchError, UsageError
from orchestrator.provider import HOURS_PER_MONTH, Offer, Request, bid_with_margin
from orchestrator.text import row_json

MODES = ("spot", "on-demand", "both")
DEFAULT_CACHE_SECONDS = 60
DEFAULT_SPOT_MARGIN = 0.05
DDP_EFFICIENCY = 0.85
NODE_EFFICIENCY = 0.8  # assumed: what each added machine adds, as a share of one (settable)
TRIAL_KEY = "orch_trial"

# The prior (trust level 4), an assumption and labelled so wherever it is used: a detector of
# PRIOR_PARAMS_M million parameters trains PRIOR_IMAGES_PER_SECOND images/s at 640 px on the
# reference GPU (RTX 4090); time per image grows with the square root of the parameter count
# (dataset.checkpoint_mb's table) and with the image area. COCO's train2017 (118k images,
# 18 GB) sets BYTES_PER_IMAGE when only a dataset size is known.
PRIOR_IMAGES_PER_SECOND = 250.0
PRIOR_PARAMS_M = 2.8
BYTES_PER_IMAGE = 150e3


@dataclass
class Query:
    gpu: str | None = None
    gpus: int = 1
    min_vram: float | None = None
    max_vram: float | None = None
    mode: str = "both"
    disk_gb: int = 20
    max_price: float | None = None
    providers: list[str] | None = None
    sort: str | None = None  # "hourly" or "job"; default: job when there is a job
    # Volumes the instance mounts: only offers where every one lives are ranked (``HasVolumes.offer_reaches``).
    volumes: tuple = ()
    # A group of N machines (`--nodes N`): a provider whose groups are another product (RunPod's
    # Instant Clusters) answers with those offers.
    nodes: int = 1


@dataclass
class Workload:
    """What a job will train: enough to find measurements and to size the prior."""

    model: str
    epochs: int
    data: str | None = None  # as the user gives it to `orch up --data` (and the ledger records it)
    data_bytes: int | None = None
    images: int | None = None  # training images
    imgsz: int | None = None


@dataclass
class Estimate:
    epoch_seconds: float
    source: str  # ledger, trial, scaled or prior
    detail: str


@dataclass
class Row:
    offer: Offer
    gpu: str  # canonical
    vram_gb: float
    price_hr: float | None  # on-demand, disk included
    spot_hr: float | None  # live minimum bid, disk included
    disk_hr: float  # the requested disk while running (inside the two prices above)
    stopped_hr: float | None
    estimate: Estimate | None = None
    epochs: int | None = None

    @property
    def hours(self) -> float | None:
        if self.estimate is None or not self.epochs:
            return None
        return self.epochs * self.estimate.epoch_seconds / 3600

    def job_usd(self, spot: bool) -> float | None:
        price = self.spot_hr if spot else self.price_hr
        return None if self.hours is None or price is None else self.hours * price

    def hourly(self, mode: str) -> float | None:
        if mode == "spot":
            return self.spot_hr
        if mode == "on-demand":
            return self.price_hr
        known = [p for p in (self.price_hr, self.spot_hr) if p is not None]
        return min(known) if known else None

    def job(self, mode: str) -> float | None:
        if mode == "spot":
            return self.job_usd(True)
        if mode == "on-demand":
            return self.job_usd(False)
        known = [p for p in (self.job_usd(False), self.job_usd(True)) if p is not None]
        return min(known) if known else None

    def to_dict(self) -> dict[str, Any]:
        o = self.offer
        d = {"provider": o.provider, "offer_id": o.offer_id, "gpu": self.gpu, "gpu_name": o.gpu_name,
             "gpus": o.gpus, "vram_gb": self.vram_gb, "price_hr": _r(self.price_hr), "spot_hr": _r(self.spot_hr),
             "disk_hr": _r(self.disk_hr), "disk_gb_month": o.disk_gb_month, "stopped_hr": _r(self.stopped_hr),
             "reliability": o.reliability, "location": o.location, "stock": o.stock}
        if self.epochs:
            e = self.estimate
            d.update(epoch_seconds=_r(e.epoch_seconds, 2) if e else None, hours=_r(self.hours, 4),
                     job_usd=_r(self.job_usd(False), 4), job_spot_usd=_r(self.job_usd(True), 4),
                     source=e.source if e else None, source_detail=e.detail if e else None)
        return d


@dataclass
class Answer:
    rows: list[Row]
    errors: list[tuple[str, str]] = field(default_factory=list)
    asked: list[str] = field(default_factory=list)
    cached: dict[str, float] = field(default_factory=dict)  # provider -> age of its cached answer, s
    # Providers not asked, each with why (its key is missing: what to set; no offers here), so that
    # "no offer matches" never hides a provider that was never asked.
    skipped: list[tuple[str, str]] = field(default_factory=list)
    # Offers that match and cannot be rented now, each with why (a provider's catalog shows them in
    # stock nowhere: RunPod's): never ranked, and said, so that "no offer matches" is not a mystery.
    out_of_stock: list[tuple[str, str, str]] = field(default_factory=list)  # (provider, "GPU xN", why)

    @property
    def partial(self) -> bool:
        return bool(self.errors)

    @property
    def used_table(self) -> bool:
        return any(r.estimate and r.estimate.source in ("scaled", "prior") for r in self.rows)


def _r(x: float | None, digits: int = 6) -> float | None:
    return None if x is None else round(x, digits)


# -- asking the providers ----------------------------------------------------------------------
def check_query(query: Query, job: Workload | None = None) -> str:
    """The query's own checks (before anything is opened); returns the sort it ranks by."""
    if query.mode not in MODES:
        raise UsageError(f"mode must be one of {', '.join(MODES)}, not {query.mode!r}")
    sort = query.sort or ("job" if job else "hourly")
    if sort not in ("hourly", "job"):
        raise UsageError(f"--sort takes hourly or job, not {sort!r}")
    if sort == "job" and not job:
        raise UsageError("--sort job needs a job: --epochs N with --data or --dataset-gb")
    return sort


def search(orch, query: Query, job: Workload | None = None, fresh: bool = False) -> Answer:
    """Every asked provider's offers, normalised, filtered, estimated and ranked."""
    from orchestrator import config
    from orchestrator.provider import plugins

    sort = check_query(query, job)
    known = plugins.providers()
    names = list(dict.fromkeys(query.providers or sorted(known)))
    for name in names:
        if name not in known:
            raise UsageError(f"unknown provider {name!r} (known: {', '.join(sorted(known))})")
    answer = Answer(rows=[])
    # Built here, not in the threads: the plugin registry and Orch's provider cache are not thread-safe.
    providers = {}
    for name in names:
        try:
            provider = orch.provider(name)
        except OrchError as e:  # e.g. a setting of the wrong type: this provider only
            answer.errors.append((name, _one_line(e)))
            continue
        # Not named, no key and no section in config.toml: an installed provider the user does not use.
        if query.providers or provider.configured() or config.provider_settings(name):
            providers[name] = provider
        else:
            answer.skipped.append((name, f"no key: set {provider.missing_credentials()}"))
    ttl = float(config.get("offers_cache_seconds", DEFAULT_CACHE_SECONDS))
    request = Request(name="offers", gpus=query.gpus, disk_gb=query.disk_gb, spot=query.mode == "spot",
                      nodes=query.nodes)
    offers: list[Offer] = []
    with ThreadPoolExecutor(max_workers=max(len(providers), 1)) as pool:
        futures = {name: pool.submit(_ask, orch.home, p, request, fresh, ttl) for name, p in providers.items()}
        for name, future in futures.items():
            try:
                got, age = future.result()
            except Exception as e:  # noqa: BLE001 - one provider's failure, whatever it is, is one line
                answer.errors.append((name, _one_line(e)))
                continue
            if got is None:  # not a source of offers here (the local provider without GPUs)
                p = providers[name]
                answer.skipped.append((name, "no GPU on this machine" if p.embedded and not p.capabilities.gpu
                                       else "no source of offers"))
                continue
            answer.asked.append(name)
            if age is not None:
                answer.cached[name] = age
            offers += got
    measured = measurements(orch.ledger, job) if job else []
    for offer in offers:
        row = _row(offer, query.disk_gb)
        if offer.price_hr is None and offer.spot_hr is None and offer.stock == "none" and offer.note:
            if _fits(row, query):
                answer.out_of_stock.append((offer.provider, f"{row.gpu} x{offer.gpus}", offer.note))
            continue
        if not _wanted(row, query) or not _reaches(providers.get(offer.provider), offer, query.volumes):
            continue
        if job:
            row.epochs = job.epochs
            row.estimate = estimate(job, row.gpu, offer.gpus, measured)
        answer.rows.append(row)
    answer.rows.sort(key=lambda r: _rank(r, query.mode, sort))
    return answer


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    first = text[0] if text else ""
    if isinstance(e, OrchError):
        return first[:300] or type(e).__name__
    return f"internal error: {type(e).__name__}: {first}"[:300]


def _ask(home: Path, provider, request: Request, fresh: bool, ttl: float) -> tuple[list[Offer] | None, float | None]:
    """(offers, age of the cached answer or None when asked live); (None, None): no source of offers."""
    missing = provider.missing_credentials()
    if missing:
        raise AuthError(f"no API key: set {missing}")
    path = _cache_path(home, provider, request)
    if not fresh and ttl > 0:
        cached = _read_cache(path, ttl)
        if cached is not None:
            return cached
    found = provider.offers(request)
    if found is not None and ttl > 0:
        _write_cache(path, found)
    return found, None


# -- the cache ---------------------------------------------------------------------------------
def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def _cache_path(home: Path, provider, request: Request) -> Path:
    # Settings and keys enter only as a digest: the cache file holds no secret. The environment that
    # says how to reach the provider (its key, its API address) changes what it answers.
    ident = {"provider": provider.name, "gpus": request.gpus, "disk_gb": request.disk_gb, "spot": request.spot,
             **({"nodes": request.nodes} if request.nodes > 1 else {}),
             "settings": _digest(provider.settings),
             "env": _digest({k: os.environ.get(k) for k in provider.env_keys})}
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", provider.name)
    return Path(home) / "cache" / f"offers-{safe}-{_digest(ident)[:24]}.json"


def _read_cache(path: Path, ttl: float) -> tuple[list[Offer], float] | None:
    try:
        data = json.loads(path.read_text())
        age = time.time() - float(data["at"])
        if not 0 <= age < ttl:
            return None
        return [Offer(**o) for o in data["offers"]], age
    except (OSError, ValueError, KeyError, TypeError):
        return None  # missing, expired or unreadable: ask the provider


def _write_cache(path: Path, offers: list[Offer]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"at": time.time(), "offers": [asdict(o) for o in offers]}, default=str))
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


# -- one row per offer -------------------------------------------------------------------------
def _row(offer: Offer, disk_gb: int) -> Row:
    disk_hr = disk_gb * (offer.disk_gb_month or 0.0) / HOURS_PER_MONTH
    add = 0.0 if offer.disk_included else disk_hr
    stopped = offer.stopped_hr
    if stopped is None:
        per_gb = offer.disk_gb_month_stopped if offer.disk_gb_month_stopped is not None else offer.disk_gb_month
        stopped = disk_gb * per_gb / HOURS_PER_MONTH if per_gb is not None else None
    return Row(offer=offer, gpu=gpus.canonical(offer.gpu_name), vram_gb=gpus.vram(offer.gpu_name, offer.vram_gb),
               price_hr=offer.price_hr + add if offer.price_hr is not None else None,
               spot_hr=offer.spot_hr + add if offer.spot_hr is not None else None,
               disk_hr=disk_hr, stopped_hr=stopped)


def _fits(row: Row, q: Query) -> bool:
    """The GPU asked for, whatever its price."""
    if row.offer.gpus != q.gpus:
        return False
    if q.gpu and not gpus.matches(q.gpu, row.offer.gpu_name):
        return False
    return q.min_vram is None or row.vram_gb >= q.min_vram


def _wanted(row: Row, q: Query) -> bool:
    if not _fits(row, q):
        return False
    if q.max_vram is not None and row.vram_gb > q.max_vram:
        return False
    price = row.hourly(q.mode)
    if price is None:
        return False  # --spot: no spot price here (or --on-demand: spot only)
    return q.max_price is None or price <= q.max_price


def _reaches(provider, offer: Offer, volumes: tuple) -> bool:
    """Whether an instance of ``offer`` can mount every one of ``volumes`` (none: any offer)."""
    if not volumes:
        return True
    from orchestrator.provider.features import HasVolumes

    return isinstance(provider, HasVolumes) and all(provider.offer_reaches(offer, v) for v in volumes)


def _rank(row: Row, mode: str, sort: str) -> tuple:
    hourly = row.hourly(mode)
    if sort == "job":
        job = row.job(mode)
        return (job is None, job if job is not None else hourly, hourly)
    return (False, hourly, row.job(mode) or 0.0)


# -- estimates ---------------------------------------------------------------------------------
@dataclass
class Measurement:
    gpu: str  # canonical
    gpus: int
    epoch_seconds: float
    trial: bool
    same_data: bool
    data_bytes: int | None
    run_id: int


def trial_marker(run) -> dict | None:
    marker = row_json(run.args, {}).get(TRIAL_KEY)
    return marker if isinstance(marker, dict) else None


def _same_data(recorded: str | None, wanted: str | None) -> bool:
    if not recorded or not wanted:
        return False
    if recorded == wanted:
        return True
    if "://" in recorded or "://" in wanted:
        return recorded.rstrip("/") == wanted.rstrip("/")
    return Path(recorded).expanduser().resolve() == Path(wanted).expanduser().resolve()


def measurements(ledger, job: Workload) -> list[Measurement]:
    """What the ledger knows about this model's epoch time on GPUs, at this image size."""
    instances = {i.id: i for i in ledger.instances()}
    found = []
    for run in ledger.runs():
        inst = instances.get(run.instance_id)
        if run.model != job.model or inst is None or inst.cpu_only:
            continue
        if row_json(run.args, {}).get("imgsz") != job.imgsz:
            continue
        marker = trial_marker(run)
        seconds = (marker or {}).get("epoch_seconds") or run.mean_epoch_seconds
        name = run.gpu_name or inst.gpu_name or inst.gpu
        if not seconds or not name:
            continue
        found.append(Measurement(gpu=gpus.canonical(name), gpus=max(inst.gpus, 1), epoch_seconds=float(seconds),
                                 trial=marker is not None, same_data=_same_data(run.data, job.data),
                                 data_bytes=run.data_bytes, run_id=run.id or 0))
    return found


def speedup(n: int) -> float:
    return 1 + DDP_EFFICIENCY * (max(n, 1) - 1)


def estimate(job: Workload, gpu: str, n: int, known: list[Measurement]) -> Estimate | None:
    """Seconds per epoch of ``job`` on ``n`` x ``gpu``, from the most trusted source there is."""

    def on_n(m: Measurement) -> float:
        return m.epoch_seconds * speedup(m.gpus) / speedup(n)

    def count(m: Measurement) -> str:
        return "" if m.gpus == n else f", scaled from x{m.gpus} to x{n}"

    here = [m for m in known if m.same_data and m.gpu == gpu]
    for trial, source in ((False, "ledger"), (True, "trial")):
        hits = [m for m in here if m.trial == trial]
        if hits:
            hits = [m for m in hits if m.gpus == n] or hits
            what = "trial" if trial else "run"
            return Estimate(mean(on_n(m) for m in hits), source,
                            f"{len(hits)} {what}{'s' if len(hits) > 1 else ''} on {gpu}{count(hits[0])}")
    rel = gpus.relative(gpu)
    if rel is None:
        return None
    sized = bool(job.data_bytes)
    for pool in ([m for m in known if m.same_data],
                 [m for m in known if not m.same_data and m.data_bytes and sized]):
        usable = [m for m in pool if gpus.relative(m.gpu)]
        if not usable:
            continue
        m = min(usable, key=lambda m: (m.trial, -m.run_id))  # real runs first, then the latest
        ratio = gpus.relative(m.gpu) / rel
        seconds = on_n(m) * ratio
        detail = f"{'trial' if m.trial else 'run'} r{m.run_id} on {m.gpu}{count(m)}, x{ratio:.2f} by the table"
        if not m.same_data:
            size = job.data_bytes / m.data_bytes
            seconds *= size
            detail += f", x{size:.2f} for the dataset size"
        return Estimate(seconds, "scaled", detail)
    images = job.images or (job.data_bytes / BYTES_PER_IMAGE if job.data_bytes else None)
    if not images:
        return None
    per_image = prior_seconds_per_image(job.model, job.imgsz)
    return Estimate(images * per_image / rel / speedup(n), "prior",
                    f"{images:.0f} images x {per_image * 1000:.1f} ms (assumed, RTX 4090) / {rel:.2f} by the table"
                    + (f" / {speedup(n):.2f} for x{n}" if n > 1 else ""))


def node_speedup(nodes: int, efficiency: float) -> float:
    return 1 + efficiency * (max(nodes, 1) - 1)


def check_scaling(value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise UsageError(f"the node scaling efficiency is a share of one machine, above 0 and at most 1, not {value!r}")
    return float(value)


def for_nodes(rows: list[Row], nodes: int, efficiency: float) -> list[Row]:
    """The rows priced for a group of ``nodes`` machines of each offer: every $/hr the group's,
    the time divided by the assumed speedup, which the estimate's detail states."""
    if nodes <= 1:
        return rows
    speed = node_speedup(nodes, efficiency)
    out = []
    for r in rows:
        times = lambda x: None if x is None else x * nodes  # noqa: E731
        est = r.estimate and replace(r.estimate, epoch_seconds=r.estimate.epoch_seconds / speed,
                                     detail=f"{r.estimate.detail} / {speed:.2f} for {nodes} nodes at "
                                            f"{efficiency:.0%} scaling per added node (assumed: --scaling)")
        out.append(replace(r, price_hr=times(r.price_hr), spot_hr=times(r.spot_hr), disk_hr=r.disk_hr * nodes,
                           stopped_hr=times(r.stopped_hr), estimate=est))
    return out


def prior_seconds_per_image(model: str, imgsz: int | None) -> float:
    from orchestrator.tasks.dataset import checkpoint_mb

    params_m = checkpoint_mb(model)[0] / 12.5  # its table's SGD bytes per parameter
    size = (imgsz or 640) / 640
    return math.sqrt(params_m / PRIOR_PARAMS_M) * size * size / PRIOR_IMAGES_PER_SECOND


def workload_for(model: str, epochs: int, data: str | None = None, dataset_gb: float | None = None,
                 imgsz: int | None = None, data_bytes: int | None = None) -> Workload:
    """A Workload from what the user typed; a local dataset is counted (not packed, not doctored)."""
    if not 1 <= epochs <= 100_000:
        raise UsageError(f"--epochs must be between 1 and 100000, not {epochs}")
    if dataset_gb is not None and not dataset_gb > 0:
        raise UsageError(f"--dataset-gb must be a size in GB above 0, not {dataset_gb}")
    images = None
    if data and "://" not in data:
        from orchestrator.tasks import dataset

        info = dataset.validate(Path(data).expanduser(), doctor=False)
        images, data_bytes = info.n_images.get("train"), data_bytes or info.bytes
    if dataset_gb is not None:
        data_bytes = int(dataset_gb * 1e9)
    if not data and not data_bytes:
        raise UsageError("a job estimate needs the dataset: --data PATH (or hf://...) or --dataset-gb X")
    return Workload(model=model, epochs=epochs, data=data, data_bytes=data_bytes, images=images, imgsz=imgsz)


# -- launching the winner ----------------------------------------------------------------------
def describe(row: Row, mode: str) -> str:
    spot = mode == "spot"
    price = row.spot_hr if spot else row.price_hr
    line = (f"{row.offer.provider} {row.gpu} x{row.offer.gpus} (offer {row.offer.offer_id}) at "
            f"${price:.4f}/hr {'spot' if spot else 'on-demand'}, disk included")
    if row.hours is not None:
        line += (f"; job ~{row.hours:.2f} h, ${row.job_usd(spot):.2f} "
                 f"({row.estimate.source}: {row.estimate.detail})")
    return line


def pick_cheapest(orch, request: Request, spec, providers=None) -> tuple[str, Request]:
    """The offer cheapest per job (per hour without one), asked live; the request to rent it."""
    if request.cpu:
        raise UsageError("--cheapest picks among GPU offers: drop --cpu")
    if request.offer:
        raise UsageError("--cheapest and --offer exclude each other")
    mode = "spot" if request.spot else "on-demand"
    job = None
    if spec is not None:
        job = workload_for(spec.model, spec.epochs, data=spec.data, imgsz=spec.imgsz, data_bytes=spec.data_bytes)
    query = Query(gpu=request.gpu, gpus=request.gpus, mode=mode, disk_gb=request.disk_gb, providers=providers,
                  volumes=tuple({m.volume.name: m.volume for m in request.mounts}.values()))
    answer = search(orch, query, job, fresh=True)
    for name, error in answer.errors:
        orch.say(f"      {name} not compared: {error}")
    if not answer.rows:
        raise NoCapacity(f"no {mode} offer for {request.gpus}x {request.gpu or 'any GPU'} from "
                         f"{', '.join(answer.asked) or 'any provider'}"
                         + (f" where volume {', '.join(v.name for v in query.volumes)} lives" if query.volumes else ""))
    best = answer.rows[0]
    chosen = renting(request, best)
    orch.say(f"cheapest: {describe(best, mode)}" + (f", bid {chosen.bid:.3f}" if request.spot and chosen.bid else ""))
    return best.offer.provider, chosen


def renting(request: Request, row: Row) -> Request:
    """The request that rents ``row``'s offer as it was listed (its quote: the create asks for no
    second listing), with the spot bid: the user's, else the live minimum plus ``spot_margin``."""
    from orchestrator import config

    bid = request.bid
    if request.spot and bid is None and row.offer.min_bid_per_gpu:
        bid = bid_with_margin(row.offer.min_bid_per_gpu, float(config.get("spot_margin", DEFAULT_SPOT_MARGIN)))
    return replace(request, gpu=row.offer.gpu_name, gpus=row.offer.gpus, offer=row.offer.offer_id, bid=bid,
                   quote=row.offer)

