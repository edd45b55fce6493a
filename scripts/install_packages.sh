#!/usr/bin/env bash
# Installs the Debian packages named as arguments that are not installed yet (as root, or through
# sudo). Usage: scripts/install_packages.sh LABEL PACKAGE...  (LABEL prefixes the messages)
set -euo pipefail
label=$1; shift
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "$label: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "$label: all packages present ($*)"
fi
