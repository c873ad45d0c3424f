#!/usr/bin/env bash
# Prints the path of promtool, Prometheus's rule checker, which the
# monitoring tests run (test/monitoring). It comes from Debian's prometheus
# package, unpacked into a cache rather than installed: installing it would
# start a Prometheus server on the machine. A promtool on PATH is used as is.
set -euo pipefail
if command -v promtool >/dev/null; then command -v promtool; exit 0; fi
cache=${XDG_CACHE_HOME:-$HOME/.cache}/converge-tools
bin=$cache/promtool
if [ ! -x "$bin" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  # apt-get download writes to the current directory.
  (cd "$work" && { apt-get download prometheus >/dev/null 2>&1 ||
    { apt-get update -qq >/dev/null 2>&1 || true; apt-get download prometheus >/dev/null; }; })
  dpkg-deb --fsys-tarfile "$work"/prometheus_*.deb | tar -x -C "$work" ./usr/bin/promtool
  mkdir -p "$cache"
  mv "$work/usr/bin/promtool" "$bin"
fi
echo "$bin"
