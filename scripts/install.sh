#!/usr/bin/env bash
# Install orch for the local provider on this machine: OpenSSH's server (each local instance is a
# real sshd), a virtual environment in .venv, torch for the CPU demo, and orch itself.
#   scripts/install.sh          orch with the local provider (torch + LibreYOLO on this machine)
#   scripts/install.sh --test   also every provider SDK, the test tools and PostgreSQL
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
test_deps=0
[ "${1:-}" = "--test" ] && test_deps=1

sudo_() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
packages=()
[ -x /usr/sbin/sshd ] || packages+=(openssh-server)
if [ $test_deps = 1 ] && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then packages+=(postgresql); fi
# The tests' fake cloud hosts run commands through root's login shell; some log in to zsh.
if [ $test_deps = 1 ] && ! command -v zsh >/dev/null; then packages+=(zsh); fi
# `orch ssh-config` is tried with rsync as well as ssh and scp.
if [ $test_deps = 1 ] && ! command -v rsync >/dev/null; then packages+=(rsync); fi
# The dashboard's test drives Debian's headless Chromium through Playwright (never `playwright install`).
has_candidate() { apt-cache policy "$1" 2>/dev/null | grep 'Candidate: [0-9]' >/dev/null; }  # not -q: no SIGPIPE under pipefail
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

python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=".venv/bin/python -m pip --disable-pip-version-check -q"
$pip install --upgrade pip >/dev/null
# torch 2.14.1 + torchvision 0.29.1 is the pair LibreYOLO 1.6 imports with (2.13's torchvision fails).
$pip install torch==2.14.1 torchvision==0.29.1
if [ $test_deps = 1 ]; then $pip install -e '.[all]'; else $pip install -e '.[local]'; fi
# Beam's SDK for the `orch export beam` tests: beta9 pins paramiko<4 and watchdog<5 that runpod 1.11 cannot
# share (see pyproject's beam extra), yet loads and decorates with the newer ones: installed without its pins.
if [ $test_deps = 1 ]; then
  $pip install --no-deps 'beam-client==0.2.233' 'beta9==0.1.291'  # pinned: installed without their own pins
  $pip install asgiref betterproto-beta9 click cloudpickle 'croniter>=3.0.3,<4' fastapi grpcio grpclib jsonschema \
    'packaging>=24' prompt-toolkit protobuf pyyaml requests rich typeguard typing-extensions uvicorn watchdog \
    websocket-client 'websockets>=13,<16'
fi
echo "orch installed: $(.venv/bin/orch --help >/dev/null && echo .venv/bin/orch)"
