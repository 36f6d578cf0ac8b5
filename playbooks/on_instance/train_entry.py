"""Run on the instance: start one LibreYOLO training from the run.json that orch uploaded.

Single device: LibreYOLO's own CLI in this process. Several GPUs or a hub push: the Python API,
which is the only way to pass a device list or callbacks, under the ``__main__`` guard that its
per-GPU workers need when they re-import this file. A node of a group: the Python API too, run by
torchrun (LibreYOLO reads LOCAL_RANK/RANK/WORLD_SIZE itself), the only way to pass ``sync_bn``.
"""
import gc
import json
import os
import sys

LIBREYOLO_WORKERS = 8  # LibreYOLO's default number of data-loading workers
# Python's collector runs its youngest generation every 700 new objects, and each full pass walks
# every object alive: importing torch, torchvision and LibreYOLO's families makes millions, and a
# training then unpickles, deep-copies (EMA) and pickles checkpoints object by object. Fewer young
# passes, and what the imports made set aside (``settle``), took a 3-epoch CPU run of yolo9-t from
# 7.7 to 6.0 CPU-s; cycles are still collected. torchtitan and Megatron-LM tune it for the same cause.
GC_THRESHOLD = (10_000, 10, 10)


def argv_value(argv, key):
    """The value of ``key=value`` in LibreYOLO's CLI arguments, None when absent."""
    return next((a.split("=", 1)[1] for a in argv if a.startswith(f"{key}=")), None)


def usable_cpus():
    """The CPUs this process may run on: its affinity, and under a cgroup v2 CPU quota (a container
    limited with --cpus, as pods are) that quota, rounded up. os.cpu_count() is the host's count."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return cpus


def loader_workers(cpus, devices, on_cpu):
    """Data-loading workers for this host: its CPUs shared among the devices, one left to the
    training itself when it computes on the CPU, at most LibreYOLO's default. Eight workers on a
    2-CPU host only fight the training for the same cores."""
    share = cpus // max(devices, 1) - (1 if on_cpu else 0)
    return max(0, min(LIBREYOLO_WORKERS, share))


def with_workers(spec, cpus=None):
    """The spec with ``workers`` sized to this host, unless the user set it (--train-arg workers=N)."""
    cpus = usable_cpus() if cpus is None else cpus
    if spec.get("mode") == "api":
        kwargs = spec["kwargs"]
        if "workers" not in kwargs:
            device = str(kwargs.get("device", ""))
            kwargs["workers"] = loader_workers(cpus, len(device.split(",")), device == "cpu")
        return spec
    argv = spec["argv"]
    if argv_value(argv, "workers") is None:
        device = argv_value(argv, "device") or ""
        argv.append(f"workers={loader_workers(cpus, len(device.split(',')), device == 'cpu')}")
    return spec


def workers_of(spec):
    if spec.get("mode") == "api":
        return spec["kwargs"]["workers"]
    return argv_value(spec["argv"], "workers")


# The families LibreYOLO registers only once transformers is imported (models/__init__.py,
# ``_ensure_rfdetr``): RF-DETR and DINOv2.
LAZY_FAMILIES = ("rfdetr", "dinov2")


def name_map_without_lazy_families(model) -> bool:
    """Fill LibreYOLO's model-name map without importing RF-DETR and DINOv2, for a model that names
    neither. The map (cli/config.py, ``_build_name_map``) imports both, with transformers and
    torchvision's model zoo, wherever transformers is installed, as most Hugging Face images have it:
    about 1.4 s of CPU before every training, which a YOLO run never uses. Only that one build goes
    without them: loading a checkpoint still registers them when it holds one (``_ensure_rfdetr``),
    so a resumed RF-DETR ``last.pt`` loads as before. False, and nothing changed, when the model may
    be one of them or this LibreYOLO is not built the way this expects."""
    if any(family in str(model).lower() for family in LAZY_FAMILIES):
        return False
    try:
        import libreyolo.models as models
        from libreyolo.cli import config
    except ImportError:
        return False
    names, build, ensure = (getattr(config, "_CLI_NAME_TO_WEIGHTS", None), getattr(config, "_build_name_map", None),
                            getattr(models, "try_ensure_rfdetr", None))
    if not isinstance(names, dict) or names or build is None or ensure is None:
        return False
    models.try_ensure_rfdetr = lambda: None
    try:
        build()
    finally:
        models.try_ensure_rfdetr = ensure
    return True


def settle(model):
    """Import what every training of ``model`` imports (the name map, LibreYOLO's model families,
    and with them torch and torchvision), then move every object so far out of the collector's sight
    (``gc.freeze``): they live as long as the process, and each full collection walked them all again."""
    name_map_without_lazy_families(model)
    import libreyolo.models  # noqa: F401

    gc.freeze()


def cli(argv):
    settle(argv_value(argv, "model"))
    from libreyolo.cli import entrypoint

    sys.argv = ["libreyolo", "train", *argv]
    return entrypoint()


def build(kwargs):
    """The model to train. ``pretrained=false`` builds random weights with no download, the way
    LibreYOLO's CLI does, so an offline instance can train from scratch through the API too."""
    model = kwargs.pop("model")
    name_map_without_lazy_families(model)
    if kwargs.get("pretrained") is False and not kwargs.get("resume"):
        from libreyolo.cli.commands.train import _create_explicit_task_train_model
        from libreyolo.cli.config import detect_family_from_model_ref, resolve_model_name

        path = resolve_model_name(model)
        scratch = _create_explicit_task_train_model(
            family=detect_family_from_model_ref(model, path), model_path=path, task=None, resume=False,
            device="cpu" if kwargs.get("device") == "cpu" else "cuda:0",
            pretrained=False, seed=int(kwargs.get("seed", 0)))
        if scratch is not None:
            kwargs.pop("pretrained")  # already built from scratch: do not rebuild it in train()
            return scratch
    from libreyolo import LibreYOLO

    return LibreYOLO(model)


def api(spec):
    import preempt_save  # beside this file, as hub_push

    preempt_save.arm()  # a spot notice's SIGTERM: this epoch saved first, then the end
    callbacks = [preempt_save.OrchPreemptSave()]
    if spec.get("push_to"):
        # A class from a module beside this file, not exec'd source: LibreYOLO pickles callbacks
        # for its GPU workers, which import it by name.
        from hub_push import OrchHubPush

        callbacks.append(OrchHubPush(spec["push_to"]))
    kwargs = dict(spec["kwargs"])
    settle(kwargs["model"])  # build() then finds the name map made
    build(kwargs).train(callbacks=callbacks, **kwargs)
    return 0


if __name__ == "__main__":
    gc.set_threshold(*GC_THRESHOLD)
    with open(sys.argv[1]) as f:
        spec = with_workers(json.load(f))
    print(f"orch: {usable_cpus()} CPU(s) here, {workers_of(spec)} data-loading worker(s)", flush=True)
    sys.exit(api(spec) if spec.get("mode") == "api" else cli(spec["argv"]))
