#!/bin/sh
# Installs the Debian packages the build and the tests need, when missing.
set -eu
PKGS="build-essential pkg-config libnng-dev libmsgpack-dev libh2o-evloop-dev libjansson-dev \
check clang libclang-rt-14-dev unicode-data bzip2 libssl-dev zlib1g-dev curl jq"
missing=""
for p in $PKGS; do
    dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
# node and npm may come from elsewhere than Debian; install them only when absent.
command -v node >/dev/null 2>&1 || missing="$missing nodejs"
command -v npm >/dev/null 2>&1 || missing="$missing npm"
if [ -n "$missing" ]; then
    echo "memra deps: installing:$missing"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    # shellcheck disable=SC2086
    $SUDO apt-get install -y -qq $missing >/dev/null
fi
# npm packages used by the reference tools in tests (tests/node).
# Re-run npm install whenever package.json changed since the last install.
if [ -f tests/node/package.json ]; then
    want=$(cksum < tests/node/package.json)
    have=$(cat tests/node/node_modules/.memra-stamp 2>/dev/null || true)
    if [ "$want" != "$have" ]; then
        echo "memra deps: npm install in tests/node"
        (cd tests/node && npm install --no-audit --no-fund --silent)
        echo "$want" > tests/node/node_modules/.memra-stamp
    fi
fi
