#!/usr/bin/env bash
# Prints the path of a program of Debian's prometheus package:
#
#   hack/prometheus.sh [promtool]   promtool, Prometheus's rule checker,
#                                   which the monitoring tests run
#                                   (test/monitoring)
#   hack/prometheus.sh prometheus   the server, which evaluates the chart's
#                                   alerts in the e2e soak
#                                   (test/e2e/prometheus.go)
#
# Both come from the package, unpacked into a cache rather than installed:
# installing it would start a Prometheus server on the machine. One
# download fills the cache with both; a cached one is used without asking
# the network again. A program of that name on PATH is used as is.
set -euo pipefail
name=${1:-promtool}
case $name in
  promtool | prometheus) ;;
  *) echo "hack/prometheus.sh: the prometheus package has no program $name (promtool or prometheus)" >&2; exit 2 ;;
esac
if command -v "$name" >/dev/null; then command -v "$name"; exit 0; fi
cache=${XDG_CACHE_HOME:-$HOME/.cache}/converge-tools
bin=$cache/$name
if [ ! -x "$bin" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  # apt-get download writes to the current directory. A stale index may
  # name a version the mirror no longer has: update it once and retry,
  # this time with apt-get's own error shown.
  if ! (cd "$work" && { apt-get download prometheus >/dev/null 2>&1 ||
    { apt-get update -qq >/dev/null 2>&1 || true; apt-get download prometheus >/dev/null; }; }); then
    echo "hack/prometheus.sh: cannot download Debian's prometheus package (apt-get download prometheus, above);" \
      "on a machine without it, put $name on PATH" >&2
    exit 1
  fi
  deb=$(echo "$work"/prometheus_*.deb)
  dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$work" ./usr/bin/promtool ./usr/bin/prometheus
  mkdir -p "$cache"
  # Each renamed into place whole: a run beside this one (make test's
  # monitoring tests beside its e2e build) sees an old one or a new one.
  # A partial name of this run's own (two runs at once would each
  # move the other's away).
  for p in promtool prometheus; do
    mv "$work/usr/bin/$p" "$cache/$p.partial.$$"
    mv "$cache/$p.partial.$$" "$cache/$p"
  done
  echo "hack/prometheus.sh: unpacked promtool and prometheus of $(basename "$deb") into $cache" >&2
fi
echo "$bin"
