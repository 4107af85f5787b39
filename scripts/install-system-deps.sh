#!/usr/bin/env bash
# Debian packages the test suites need (and the image build: docker.io, debootstrap). Idempotent; uses sudo when not root.
set -euo pipefail
need=()
command -v prometheus >/dev/null || need+=(prometheus)
command -v promtool >/dev/null || need+=(prometheus)
command -v openssl >/dev/null || need+=(openssl)
# The image build and the container tests: a Docker daemon (scripts/start-dockerd.sh starts it) unless
# one already answers, and debootstrap for the Debian-made Python base (scripts/build-base-image.sh).
if ! docker info >/dev/null 2>&1; then
  command -v dockerd >/dev/null || [[ -x /usr/sbin/dockerd ]] || need+=(docker.io)
fi
command -v debootstrap >/dev/null || [[ -x /usr/sbin/debootstrap ]] || need+=(debootstrap)
if ((${#need[@]})); then
  sudo=""; [[ $(id -u) -eq 0 ]] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  # --no-install-recommends keeps the package's service scripts and web UI extras out.
  $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
# The package may start a system Prometheus on :9090; the tests run their own on free ports.
if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
  ${sudo:-} systemctl stop prometheus || true
fi
echo "system deps: docker $(docker version --format '{{.Server.Version}}' 2>/dev/null || echo '(daemon not running)'), prometheus $(prometheus --version 2>&1 | head -1 | awk '{print $3}'), $(openssl version)"
