"""Run on the instance: start one LibreYOLO training from the run.json that orch uploaded.

Single device: LibreYOLO's own CLI in this process. Several GPUs or a hub push: the Python API,
which is the only way to pass a device list or callbacks, under the ``__main__`` guard that its
per-GPU workers need when they re-import this file.
"""
import json
import sys


def cli(argv):
    from libreyolo.cli import entrypoint

    sys.argv = ["libreyolo", "train", *argv]
    return entrypoint()


def api(spec):
    from libreyolo import LibreYOLO

    callbacks = []
    if spec.get("push_source"):
        scope = {}
        exec(compile(spec["push_source"], "orch_push", "exec"), scope)
        callbacks.append(scope["orch_hub_push"])
    kwargs = dict(spec["kwargs"])
    model = LibreYOLO(kwargs.pop("model"))
    model.train(callbacks=callbacks, **kwargs)
    return 0


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    sys.exit(api(spec) if spec.get("mode") == "api" else cli(spec["argv"]))
