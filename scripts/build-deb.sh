#!/usr/bin/env bash
# The Debian package: target/debian/sectorcrypt_VERSION-1_amd64.deb with the binary (built with
# the `rbd` feature), its man pages (section 8), bash/zsh/fish completions and the user guide;
# cargo-deb (installed by scripts/install-test-deps.sh, or here if missing) writes it, and
# dpkg-shlibdeps declares the libraries it links (librbd1, librados2, ...).
#
#   scripts/build-deb.sh            build the package; prints its path
#   scripts/build-deb.sh --check    and then install it (dpkg -i, as root), check that
#                                   `sectorcrypt --version`, `man sectorcrypt` and the completions
#                                   work from the installed files, and remove it (dpkg -r), checking
#                                   that nothing of it is left; fails if sectorcrypt was installed
#                                   before (it would be replaced)
set -euo pipefail
cd "$(dirname "$0")/.."

command -v cargo-deb >/dev/null 2>&1 || cargo install --locked --quiet cargo-deb
cargo build --release --locked -p sectorcrypt --features rbd
assets=target/deb-assets
rm -rf "$assets"
target/release/sectorcrypt generate man "$assets/man"
gzip -9n "$assets"/man/*.8
target/release/sectorcrypt generate completions "$assets/completions"
deb=$(cargo deb --no-build --locked -p sectorcrypt --output target/debian 2>/dev/null | tail -n 1)
[ -f "$deb" ] || { echo "build-deb: cargo deb made no package" >&2; exit 1; }
echo "$deb"
[ "${1:-}" = --check ] || exit 0

fail() { echo "build-deb --check: $*" >&2; exit 1; }
if dpkg-query -W -f='${Status}' sectorcrypt 2>/dev/null | grep -q 'install ok installed'; then
  fail "a sectorcrypt package is installed already; remove it first"
fi
dpkg-deb --field "$deb" Depends | grep -q 'librbd1' || fail "the package does not depend on librbd1"
dpkg -i "$deb" >/dev/null
trap 'dpkg -r sectorcrypt >/dev/null 2>&1 || true' EXIT
version=$(/usr/bin/sectorcrypt --version)
[ "$version" = "sectorcrypt $(cargo pkgid -p sectorcrypt | sed 's/.*[#@]//')" ] || fail "--version says '$version'"
MANWIDTH=80 man sectorcrypt 2>&1 | grep -q 'sectorcrypt-serve(8)' || fail "man sectorcrypt does not list sectorcrypt-serve(8)"
MANWIDTH=80 man sectorcrypt-reencrypt >/dev/null 2>&1 || fail "man sectorcrypt-reencrypt"
bash -c 'source /usr/share/bash-completion/completions/sectorcrypt && complete -p sectorcrypt' >/dev/null ||
  fail "the bash completion does not load"
files=$(dpkg -L sectorcrypt | while read -r f; do [ -f "$f" ] && echo "$f"; done)
dpkg -r sectorcrypt >/dev/null
trap - EXIT
for f in $files; do [ ! -e "$f" ] || fail "$f is left after dpkg -r"; done
dpkg-query -W -f='${Status}' sectorcrypt 2>/dev/null | grep -q 'install ok installed' && fail "still installed"
echo "build-deb --check: $deb installs, runs, has its manual and completions, and removes cleanly"
