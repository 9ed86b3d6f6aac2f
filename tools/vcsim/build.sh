#!/bin/sh
# Build VMware's vSphere simulator for vclmgr's tests (tools/vcsim/main.go) once, from
# Debian's govmomi source, and print the binary's path. The binary is cached under
# $VCSIM_CACHE (default var/tools) by a hash of main.go, the Go version and the govmomi
# package version; a lock makes parallel test workers wait for one build.
# Needs Debian packages golang-go and golang-github-vmware-govmomi-dev (make install-dev).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cache=${VCSIM_CACHE:-$root/var/tools}
gopath=${VCSIM_GOPATH:-/usr/share/gocode}

if ! command -v go >/dev/null 2>&1; then
  echo "vcsim: 'go' not found; install Debian golang-go (make install-dev)" >&2; exit 2
fi
if [ ! -d "$gopath/src/github.com/vmware/govmomi/simulator" ]; then
  echo "vcsim: govmomi source not in $gopath; install Debian golang-github-vmware-govmomi-dev (make install-dev)" >&2
  exit 2
fi

govmomi=$(dpkg-query -W -f='${Version}' golang-github-vmware-govmomi-dev 2>/dev/null || echo unknown)
key=$( { cat "$here/main.go"; go version; echo "$govmomi"; } | sha256sum | cut -c1-16)
bin="$cache/vcsim-vclmgr-$key"
if [ ! -x "$bin" ]; then
  mkdir -p "$cache"
  exec 9>"$cache/vcsim.lock"
  flock 9
  if [ ! -x "$bin" ]; then  # another worker may have built it while we waited
    echo "vcsim: building $bin (once; about a minute)" >&2
    GO111MODULE=off GOPATH="$gopath" GOCACHE="$cache/go-build" GOENV=off GOFLAGS= \
      go build -o "$bin.tmp.$$" "$here/main.go"
    mv "$bin.tmp.$$" "$bin"
    # Older builds are garbage now (a running one keeps its unlinked file).
    find "$cache" -maxdepth 1 -name 'vcsim-vclmgr-*' ! -name "vcsim-vclmgr-$key" -delete
  fi
fi
echo "$bin"
