"""Run on the instance: start one LibreYOLO training from the run.json that orch uploaded.

Single device: LibreYOLO's own CLI in this process. Several GPUs or a hub push: the Python API,
which is the only way to pass a device list or callbacks, under the ``__main__`` guard that its
per-GPU workers need when they re-import this file. A node of a group: the Python API too, run by
torchrun (LibreYOLO reads LOCAL_RANK/RANK/WORLD_SIZE itself), the only way to pass ``sync_bn``.
"""
import json
import sys


def cli(argv):
    from libreyolo.cli import entrypoint

    sys.argv = ["libreyolo", "train", *argv]
    return entrypoint()


def build(kwargs):
    """The model to train. ``pretrained=false`` builds random weights with no download, the way
    LibreYOLO's CLI does, so an offline instance can train from scratch through the API too."""
    model = kwargs.pop("model")
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
    callbacks = []
    if spec.get("push_to"):
        # A class from a module beside this file, not exec'd source: LibreYOLO pickles callbacks
        # for its GPU workers, which import it by name.
        from hub_push import OrchHubPush

        callbacks.append(OrchHubPush(spec["push_to"]))
    kwargs = dict(spec["kwargs"])
    build(kwargs).train(callbacks=callbacks, **kwargs)
    return 0


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    sys.exit(api(spec) if spec.get("mode") == "api" else cli(spec["argv"]))
