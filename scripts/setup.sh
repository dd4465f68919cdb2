#!/usr/bin/env bash
# Installs what rollbox needs on a Debian machine, once: OCI runtimes (runc, gVisor's runsc), image
# tools, nftables for egress allowlists, a C compiler for the exec agent, nginx for a cluster router's edge
# (docs/cluster.md), a registry and htpasswd for the image tests (docs/images.md), a virtualenv with rollbox
# in it (python3-venv, for a Debian python3), and Harbor's own virtualenv (.venv-harbor: Harbor needs Python 3.12 or
# newer, docs/harbor.md). Fast when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "rollbox starts containers and mounts filesystems: run this as root (sudo $0)" >&2
  exit 1
fi

packages=(runc runsc umoci skopeo debootstrap gcc libc6-dev iproute2 nftables busybox-static python3-venv chromium nginx-light
          docker-registry apache2-utils)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# pip byte-compiles on one core; compileall, after each install, does it on every core (docs/design-notes.md, "Set-up
# time"). Like pip, it leaves as they are the few files written for other Pythons: a module left uncompiled costs
# only time at its import.
compile_venv() {
  "$1/bin/python" -m compileall -qq -j 0 "$1/lib" || true
}

stamp=".venv/.installed-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "creating .venv"
  python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip >/dev/null
  .venv/bin/pip install -q --no-compile -e '.[dev,rl,rl-adapters,harnesses,verl,ray,browser,compat,otel]'
  # NeMo Gym's sandbox provider API, for tests/rl/test_rl_nemo_gym.py: the package asks for a newer Python and a
  # training stack its sandbox layer does not use (pyproject.toml, extra `harnesses`).
  .venv/bin/pip install -q --no-compile --no-deps --ignore-requires-python nemo-gym==0.7.0
  compile_venv .venv
  rm -f .venv/.installed-*
  touch "$stamp"
fi

# Harbor needs Python 3.12 or newer: its own virtualenv, from the first such interpreter found (pyenv's too).
harbor_stamp=".venv-harbor/.installed-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ ! -f "$harbor_stamp" ]; then
  harbor_python=""
  for candidate in python3.12 python3.13 python3.14 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[2-9]*/bin/python3; do
    if "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      harbor_python="$candidate"
      break
    fi
  done
  if [ -n "$harbor_python" ]; then
    echo "creating .venv-harbor ($("$harbor_python" --version))"
    rm -rf .venv-harbor
    "$harbor_python" -m venv .venv-harbor
    .venv-harbor/bin/pip install -q --upgrade pip >/dev/null
    .venv-harbor/bin/pip install -q --no-compile -e '.[harbor]'
    compile_venv .venv-harbor
    touch "$harbor_stamp"
  else
    echo "no Python 3.12 or newer here: Harbor's tests will be skipped (docs/harbor.md)" >&2
    if [ -n "${CI:-}" ]; then exit 1; fi  # in CI they always run
  fi
fi
