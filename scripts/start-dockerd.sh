#!/usr/bin/env bash
# Starts a Docker daemon for the image build and the container tests when none answers, the way the
# suites start etcd: in the background, logging under the cache folder. Idempotent.
#
#   scripts/start-dockerd.sh         start if needed; prints "started <pid>" or "running" last
#   scripts/start-dockerd.sh --stop  stop the daemon this script started (its pid file), nothing else
#
# Debian's docker.io package (scripts/install-system-deps.sh) brings dockerd and its containerd; the
# package's service is not used because CI machines may have no init system running.
set -euo pipefail
dir="${LLMP_CACHE:-$HOME/.cache/llm-placement}/dockerd"
pidfile="$dir/dockerd.pid"
mkdir -p "$dir"
if [[ "${1:-}" == "--stop" ]]; then
  if [[ -s "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    pid=$(cat "$pidfile")
    kill "$pid"
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    echo "dockerd $pid stopped"
  fi
  rm -f "$pidfile"
  exit 0
fi
if docker info >/dev/null 2>&1; then
  echo "running"
  exit 0
fi
command -v dockerd >/dev/null || PATH="$PATH:/usr/sbin"
command -v dockerd >/dev/null || { echo "dockerd not found: run scripts/install-system-deps.sh" >&2; exit 1; }
exec 9>"$dir/.start.lock"
flock -w 120 9
if ! docker info >/dev/null 2>&1; then
  # setsid: the daemon outlives this script (and pytest's process group) until --stop.
  setsid dockerd >"$dir/dockerd.log" 2>&1 < /dev/null &
  echo $! >"$pidfile"
  for _ in $(seq 1 300); do
    docker info >/dev/null 2>&1 && break
    kill -0 "$(cat "$pidfile")" 2>/dev/null || { echo "dockerd exited; last lines of $dir/dockerd.log:" >&2; tail -20 "$dir/dockerd.log" >&2; exit 1; }
    sleep 0.2
  done
  docker info >/dev/null 2>&1 || { echo "dockerd did not answer within 60 s ($dir/dockerd.log)" >&2; exit 1; }
  echo "started $(cat "$pidfile")"
  exit 0
fi
echo "running"
