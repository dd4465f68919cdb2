#!/usr/bin/env bash
# Installs what rollbox needs on a Debian machine, once: OCI runtimes (runc, gVisor's runsc), image
# tools, nftables for egress allowlists, a C compiler for the exec agent, nginx for a cluster router's edge
# (docs/cluster.md), a registry and htpasswd for the image tests (docs/images.md), and a virtualenv with rollbox
# in it (python3-venv, for a Debian python3). Fast when already done.
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

stamp=".venv/.installed-$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
  echo "creating .venv"
  python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip >/dev/null
  .venv/bin/pip install -q -e '.[dev,rl,rl-adapters,harnesses,verl,ray,browser,compat,otel]'
  # NeMo Gym's sandbox provider API, for tests/rl/test_rl_nemo_gym.py: the package asks for a newer Python and a
  # training stack its sandbox layer does not use (pyproject.toml, extra `harnesses`).
  .venv/bin/pip install -q --no-deps --ignore-requires-python nemo-gym==0.7.0
  rm -f .venv/.installed-*
  touch "$stamp"
fi
