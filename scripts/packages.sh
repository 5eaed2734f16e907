# Sourced by scripts/setup.sh and scripts/fuzz.sh: ensure_packages WHO PKG... installs the Debian
# packages of the list that are missing (with sudo when not root), saying "WHO: installing ...";
# nodejs and npm count as present when their commands are (a Node.js from elsewhere).
ensure_packages() {
  local who=$1 p missing=()
  shift
  for p in "$@"; do
    case "$p" in nodejs) command -v node >/dev/null && continue;; npm) command -v npm >/dev/null && continue;; esac
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "$who: installing Debian packages: ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
