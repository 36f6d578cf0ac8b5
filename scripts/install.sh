#!/usr/bin/env bash
# Install orch for the local provider on this machine: OpenSSH's server (each local instance is a
# real sshd), a virtual environment in .venv, torch for the CPU demo, and orch itself.
#   scripts/install.sh          orch with the local provider (torch + LibreYOLO on this machine)
#   scripts/install.sh --test   also every provider SDK, the test tools and PostgreSQL
# Idempotent: a second run only checks. Sourced (`. scripts/install.sh`), it only defines its steps.
#
# Which torch: the CUDA build where an NVIDIA driver is. Elsewhere the CPU build, with a torchvision
# whose operators load beside it (LibreYOLO needs torchvision.ops), from PyTorch's CPU wheel index
# when it answers within PROBE_S (a 1.6 GB .venv, torch 0.75 GB of it), or from ORCH_TORCH_INDEX
# when that is set (taken as it is, never probed). When the index cannot be reached, PyPI: on
# aarch64 its wheels are CPU builds (about 0.7 GB); on x86_64 PyPI has no CPU torchvision (its
# wheels link libtorch_cuda: 'operator torchvision::nms does not exist' beside a CPU torch), so
# there it is the CUDA build (a 6.0 GB .venv), which runs on the CPU too. The choice is said, and
# why, and the venv's size.

CUDA_PAIR="torch==2.14.1 torchvision==0.29.1"  # the pair LibreYOLO 1.6 imports with (2.13's torchvision fails)
# PyTorch's own CPU wheel index, as pytorch.org's "Start Locally" gives it (pip, Linux, CPU).
PYTORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
PROBE_S=10  # how long that index may take to answer before PyPI is taken: the fallback comes well within 30 s

sudo_() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
has_candidate() { apt-cache policy "$1" 2>/dev/null | grep 'Candidate: [0-9]' >/dev/null; }  # not -q: no SIGPIPE under pipefail

nvidia_driver() {
  [ -e /proc/driver/nvidia/version ] || { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }
}

# The CPU pair for this machine's architecture: the same torch/torchvision minor pairing as PyPI's.
cpu_pair() {
  case "$(uname -m)" in
    aarch64|arm64) echo "torch==2.9.1 torchvision==0.24.1" ;;
    *) echo "torch==2.13.0+cpu torchvision==0.28.0+cpu" ;;
  esac
}

# PyPI's own wheels are CPU builds on aarch64 only: on x86_64 its torchvision links libtorch_cuda.
cpu_pair_on_pypi() { case "$(uname -m)" in aarch64|arm64) true ;; *) false ;; esac; }

# "cpu" or "cuda", then why: the build to try first.
torch_plan() {
  if nvidia_driver; then echo "cuda an NVIDIA driver is here"; else echo "cpu no NVIDIA driver here"; fi
}

# torch and torchvision import, and torchvision's compiled operators load (what LibreYOLO calls).
torch_works() {
  "$1" -c 'import torch, torchvision; from torchvision.ops import nms; nms(torch.zeros(1, 4), torch.zeros(1), 0.5)' \
    >/dev/null 2>&1
}

pip_() {  # $1: the venv's python, then pip's arguments
  local python=$1
  shift
  "$python" -m pip --disable-pip-version-check -q "$@"
}

# Whether a wheel index serves torch: silent and true, or false with why not on stdout (refused,
# no such host, no answer in PROBE_S: a DNS lookup that hangs is bounded too, by the thread's join).
index_answers() {  # $1: a python, $2: the index's URL
  "$1" - "$2" "$PROBE_S" <<'PY'
import sys, threading, urllib.error, urllib.request
url, limit = sys.argv[1].rstrip("/") + "/torch/", float(sys.argv[2])
why = []
def ask():
    try:
        urllib.request.urlopen(url, timeout=limit).close()
        why.append("")
    except urllib.error.HTTPError as e:
        why.append(str(e))
    except urllib.error.URLError as e:
        why.append(str(e.reason))
    except Exception as e:
        why.append(str(e) or type(e).__name__)
asker = threading.Thread(target=ask, daemon=True)
asker.start()
asker.join(limit)
reason = why[0] if why else None
if reason == "":
    sys.exit(0)
print(f"no answer in {limit:g} s" if reason is None or "timed out" in reason else reason)
sys.exit(1)
PY
}

# The index to take the CPU pair from ("pypi" for PyPI itself), then why.
torch_source() {  # $1: a python
  local why
  if [ -n "${ORCH_TORCH_INDEX:-}" ]; then
    echo "$ORCH_TORCH_INDEX ORCH_TORCH_INDEX is set"
  elif why=$(index_answers "$1" "$PYTORCH_CPU_INDEX"); then
    echo "$PYTORCH_CPU_INDEX PyTorch's CPU wheel index answers"
  else
    echo "pypi PyTorch's CPU wheel index ($PYTORCH_CPU_INDEX) cannot be reached: $why"
  fi
}

install_torch() {  # $1: the venv's python
  local python=$1 plan kind why origin index log also=""
  plan=$(torch_plan); kind=${plan%% *}; why=${plan#* }
  if [ "$kind" = cpu ]; then
    also=", which runs on the CPU too"
    origin=$(torch_source "$python"); index=${origin%% *}
    if [ "$index" != pypi ]; then
      echo "torch: $why: the CPU build ($(cpu_pair)) from $index (${origin#* })"
      log=$(mktemp)
      # shellcheck disable=SC2046  # the pair is two words on purpose
      if pip_ "$python" install $(cpu_pair) --extra-index-url "$index" >"$log" 2>&1 && torch_works "$python"; then
        rm -f "$log"
        return
      fi
      why="the CPU build could not be had from $index: $(grep -m1 '^ERROR' "$log" || echo "its operators do not load")"
      rm -f "$log"
    elif cpu_pair_on_pypi; then
      echo "torch: $why: the CPU build ($(cpu_pair)) from PyPI (${origin#* })"
      # shellcheck disable=SC2046
      pip_ "$python" install $(cpu_pair)
      return
    else
      why="${origin#* }, and PyPI has no CPU torchvision for $(uname -m)"
      why+=" (ORCH_TORCH_INDEX=<a PyTorch CPU wheel index> gives one)"
    fi
  fi
  echo "torch: the CUDA build ($CUDA_PAIR) from PyPI$also: $why"
  # shellcheck disable=SC2086
  pip_ "$python" install $CUDA_PAIR
}

# orch itself, editable. setuptools tells every editable install to beware of folders named like
# the package in the working directory ("Editable installation."): true of every checkout, and
# nothing to act on, so that one note is filtered (only it: other warnings still show).
install_orch() {  # $1: the venv's python, then pip's arguments
  local python=$1
  shift
  PYTHONWARNINGS="ignore:Editable installation" "$python" -m pip --disable-pip-version-check -q install "$@"
}

main() {
  set -euo pipefail
  cd "$(dirname "$0")/.."
  local test_deps=0
  [ "${1:-}" = "--test" ] && test_deps=1

  local packages=()
  [ -x /usr/sbin/sshd ] || packages+=(openssh-server)
  if [ $test_deps = 1 ] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then packages+=(postgresql); fi
  # The tests' fake cloud hosts run commands through root's login shell; some log in to zsh.
  if [ $test_deps = 1 ] && ! command -v zsh >/dev/null; then packages+=(zsh); fi
  # `orch ssh-config` is tried with rsync as well as ssh and scp.
  if [ $test_deps = 1 ] && ! command -v rsync >/dev/null; then packages+=(rsync); fi
  # The dashboard's test drives Debian's headless Chromium through Playwright (never `playwright install`).
  if [ $test_deps = 1 ] && ! command -v chromium-headless-shell >/dev/null && ! command -v chromium >/dev/null; then
    # Package lists first (a fresh container has none): the small headless build where Debian has it.
    if command -v apt-get >/dev/null && ! has_candidate chromium-headless-shell; then sudo_ apt-get update -qq; fi
    if has_candidate chromium-headless-shell; then
      packages+=(chromium-headless-shell)
    else
      packages+=(chromium)
    fi
  fi
  if [ ${#packages[@]} -gt 0 ]; then
    if command -v apt-get >/dev/null; then
      echo "installing ${packages[*]} (apt)"
      sudo_ apt-get update -qq
      sudo_ env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
    else
      echo "please install: ${packages[*]}" >&2; exit 1
    fi
  fi

  local python=${PYTHON:-python3}
  [ -x .venv/bin/python ] || "$python" -m venv .venv
  .venv/bin/python -m pip --disable-pip-version-check -q install --upgrade pip >/dev/null
  if torch_works .venv/bin/python; then
    echo "torch: $(.venv/bin/python -c 'import torch; print(torch.__version__)') already installed"
  else
    install_torch .venv/bin/python
  fi
  if [ $test_deps = 1 ]; then install_orch .venv/bin/python -e '.[all]'; else install_orch .venv/bin/python -e '.[local]'; fi
  # Beam's SDK for the `orch export beam` tests: beta9 pins paramiko<4 and watchdog<5, older than what the rest
  # resolves to (see pyproject's beam extra), yet loads and decorates with the newer ones: installed without its pins.
  if [ $test_deps = 1 ]; then
    local pip=".venv/bin/python -m pip --disable-pip-version-check -q"
    $pip install --no-deps 'beam-client==0.2.233' 'beta9==0.1.291'  # pinned: installed without their own pins
    $pip install asgiref betterproto-beta9 click cloudpickle 'croniter>=3.0.3,<4' fastapi grpcio grpclib jsonschema \
      'packaging>=24' prompt-toolkit protobuf pyyaml requests rich typeguard typing-extensions uvicorn watchdog \
      websocket-client 'websockets>=13,<16'
    # The suite's modules compiled, their asserts rewritten, once here: otherwise each of the test
    # command's workers does it at its start on a fresh checkout (3.4 CPU-s each, 1.1 once cached).
    .venv/bin/python -m pytest --collect-only -q -p no:cacheprovider >/dev/null 2>&1 || true
  fi
  echo "orch installed: $(.venv/bin/orch --help >/dev/null && echo .venv/bin/orch) (.venv: $(du -sh .venv | cut -f1))"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  main "$@"
fi
