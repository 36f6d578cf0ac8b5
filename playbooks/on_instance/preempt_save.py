"""A LibreYOLO training callback, imported by train_entry.py: on a spot interruption notice the
training finishes the epoch it is in, LibreYOLO writes its checkpoints (``last.pt``), and only then
does the process end, so the controller's copy taken at once holds that epoch too.

The watchdog (watchdog.py) sends SIGTERM to the training process on EC2's two-minute notice;
``arm`` makes that signal a request rather than a kill. LibreYOLO calls ``on_train_epoch_end``
after the epoch's checkpoints are written, on rank 0 only; an epoch longer than the notice loses
only itself (the previous epoch's ``last.pt`` is intact). A class in a module, as hub_push.py is:
LibreYOLO pickles callbacks for its per-GPU workers, which import it by name.
"""
import os
import signal
import sys

EXIT_CODE = 143  # what a process ended by SIGTERM reports: the controller reads a loss, and relaunches
_asked = []


def arm():
    """SIGTERM from now on asks for the end of the epoch instead of ending the process at once."""
    def asked(signum, _frame):
        if not _asked:
            print("orch: spot interruption notice: saving at the end of this epoch, then ending", file=sys.stderr,
                  flush=True)
        _asked.append(signum)

    signal.signal(signal.SIGTERM, asked)


class OrchPreemptSave:
    def on_train_epoch_end(self, event):
        if _asked:
            print(f"orch: epoch {getattr(event, 'epoch', '?')} saved in {getattr(event, 'save_dir', '?')}: ending on the "
                  "spot notice", file=sys.stderr, flush=True)
            sys.stderr.flush()
            os._exit(EXIT_CODE)

    def on_train_end(self, event):
        pass
