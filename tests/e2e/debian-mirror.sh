#!/usr/bin/env bash
# Summary: print the Debian archive URI that this machine's own apt sources use
# Usage: bash tests/e2e/debian-mirror.sh
#
# The first enabled `deb` source, in apt's order (sources.list, then sources.list.d/*.list and
# *.sources by name), whose suites include the host's release (VERSION_CODENAME of os-release,
# e.g. bookworm; never -security or -updates) and whose URI is http(s). Both the one-line form
# (`deb [options] URI suite components`) and deb822 (`URIs:`/`Suites:`, `Enabled: no` honoured)
# are read. The end-to-end scripts take a newer release from the same mirror, so no package
# host is written in the repository. E2E_APT_ETC (default /etc/apt) and E2E_OS_RELEASE
# (default /etc/os-release) point elsewhere for tests.
set -euo pipefail
[ -n "${E2E_DEBUG:-}" ] && set -x

abort() {
  echo "debian-mirror.sh: $*" >&2
  exit 1
}

etc="${E2E_APT_ETC:-/etc/apt}"
os_release="${E2E_OS_RELEASE:-/etc/os-release}"
[ -r "$os_release" ] || abort "$os_release not readable: cannot tell this machine's Debian release"
release="$(sed -nE 's/^VERSION_CODENAME="?([a-z]+)"?$/\1/p' "$os_release" | head -n 1)"
[ -n "$release" ] || abort "no VERSION_CODENAME in $os_release: is this Debian?"

files=()
[ -f "$etc/sources.list" ] && files+=("$etc/sources.list")
for f in "$etc"/sources.list.d/*; do # apt's order: by name, whatever the extension
  case "$f" in
    *.list | *.sources) [ -f "$f" ] && files+=("$f") ;;
  esac
done
[ "${#files[@]}" -gt 0 ] || abort "no apt sources under $etc"

found=""
for f in "${files[@]}"; do
  case "$f" in
    *.sources)
      # deb822: paragraphs of `Field: value`; continuation lines start with a space.
      found="$(awk -v release="$release" '
        function flush() {
          if (!done && types ~ /(^| )deb( |$)/ && tolower(enabled) != "no" && (" " suites " ") ~ (" " release " ")) {
            n = split(uris, u, " ")
            for (i = 1; i <= n; i++) if (u[i] ~ /^https?:\/\//) { print u[i]; done = 1; exit }
          }
          types = ""; uris = ""; suites = ""; enabled = ""; last = ""
        }
        /^#/ { next }
        /^[ \t]*$/ { flush(); next }
        /^[ \t]/ { if (last == "uris") uris = uris " " $0; else if (last == "suites") suites = suites " " $0; next }
        {
          field = tolower($0); sub(/:.*/, "", field)
          value = $0; sub(/^[^:]*:[ \t]*/, "", value)
          last = field
          if (field == "types") types = value
          else if (field == "uris") uris = value
          else if (field == "suites") suites = value
          else if (field == "enabled") enabled = value
        }
        END { flush() }' "$f")"
      ;;
    *)
      found="$(sed -E 's/#.*//; s/\[[^]]*\]//' "$f" \
        | awk -v release="$release" '$1 == "deb" && $2 ~ /^https?:\/\// && $3 == release { print $2; exit }')"
      ;;
  esac
  [ -n "$found" ] && break
done
[ -n "$found" ] || abort "no enabled deb source for $release in $etc (set the mirror by hand, e.g. E2E_TRIXIE_MIRROR)"
echo "${found%/}"
