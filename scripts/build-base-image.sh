#!/usr/bin/env bash
# Makes a Python 3.11 base image from Debian bookworm packages alone (debootstrap + docker import),
# for machines that reach Debian's archive and the Python package index but no container registry.
# The Dockerfile is then built against it with --build-arg PYTHON_IMAGE=<this image> (see
# scripts/build-image.sh); users build against the official python:3.11 slim image instead.
#
#   scripts/build-base-image.sh               build and load into dockerd if not cached; prints the tag last
#   scripts/build-base-image.sh --print-image print the tag this script makes, build nothing
#
# Cache: ${LLMP_CACHE:-$HOME/.cache/llm-placement}/base-image/<key>/rootfs.tar, key = hash of this
# script (suite, packages, steps) and the CA bundle copied in, so a changed input makes a new image and
# an unchanged one is reused; the tar is re-imported when dockerd lost the image (a fresh daemon).
set -euo pipefail
suite=bookworm
# python3-venv brings ensurepip (pip + setuptools wheels from Debian), which the venv below is made with.
packages=python3,python3-venv
# The machine's bundle, not Debian's ca-certificates: it is what this machine's TLS to the package
# index verifies against (it may hold a local egress CA that Debian's bundle lacks).
bundle=${LLMP_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
[[ -r "$bundle" ]] || { echo "CA bundle $bundle not readable (set LLMP_CA_BUNDLE)" >&2; exit 1; }
key=$( (cat "$0" "$bundle"; echo "$suite $packages") | sha256sum | cut -c1-12)
image="llm-placement-base:py311-$suite-$key"
if [[ "${1:-}" == "--print-image" ]]; then
  echo "$image"
  exit 0
fi
root="${LLMP_CACHE:-$HOME/.cache/llm-placement}/base-image"
cache="$root/$key"
if docker image inspect "$image" >/dev/null 2>&1; then
  echo "base image $image: in dockerd" >&2
  echo "$image"
  exit 0
fi
mkdir -p "$root"
exec 9>"$root/.build-$key.lock"
if ! flock -n 9; then
  echo "another build of the base image $key is running; waiting for it (up to 15 min)" >&2
  flock -w 900 9 || { echo "timed out waiting for the other build" >&2; exit 1; }
fi
if [[ ! -s "$cache/rootfs.tar" ]]; then
  command -v debootstrap >/dev/null || { echo "debootstrap is required (scripts/install-system-deps.sh)" >&2; exit 1; }
  start=$(date +%s)
  echo "debootstrapping $suite ($packages) into $cache (cold: ~2-4 min, mostly downloads)" >&2
  rm -rf "$cache.tmp" && mkdir -p "$cache.tmp"
  rootfs="$cache.tmp/rootfs"
  # minbase: essential + apt only; the default mirror is Debian's own.
  debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" >"$cache.tmp/debootstrap.log" 2>&1 \
    || { tail -20 "$cache.tmp/debootstrap.log" >&2; exit 1; }
  install -D -m 0644 "$bundle" "$rootfs/etc/ssl/certs/ca-certificates.crt"
  # Like the official image, Python gets its own prefix that pip may write to: a venv on PATH, so the
  # Dockerfile's `python -m pip install` lands there and Debian's /usr/lib/python3 stays untouched
  # (no --break-system-packages, no PEP 668 marker to delete).
  chroot "$rootfs" /usr/bin/python3 -m venv /opt/python
  printf '[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' >"$rootfs/etc/pip.conf"
  # Package lists, .deb archives, docs and man pages are no part of a runtime image.
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/var/log/*.log
  find "$rootfs/opt/python" -name __pycache__ -prune -exec rm -rf {} +
  tar --numeric-owner -C "$rootfs" -cf "$cache.tmp/rootfs.tar" .
  rm -rf "$rootfs"
  rm -rf "$cache" && mv "$cache.tmp" "$cache"
  echo "base rootfs made in $(( $(date +%s) - start )) s: $(du -sh "$cache/rootfs.tar" | cut -f1)" >&2
fi
docker import \
  --change 'ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' \
  "$cache/rootfs.tar" "$image" >/dev/null
echo "base image $image: imported from $cache/rootfs.tar" >&2
echo "$image"
