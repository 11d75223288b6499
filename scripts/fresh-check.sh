#!/usr/bin/env bash
# The README's two commands on a minimal Debian 12, as a new user runs them:
# debootstrap --variant=minbase makes a bookworm root from the mirror this
# machine's apt uses, the tracked tree (git ls-files: no build directories) is
# copied in, and inside a chroot, as root, run
#   1. the main command (README "Quick start": install-deps, build, train, sample);
#   2. the test command (scripts/test.sh), or with --quick only its release
#      configure + build + ctest (no sanitizer or fuzz stages), for CI.
# A package that install-deps.sh forgets fails here, not on a user's machine.
# After a pass it rewrites scripts/fresh-check.sha256, the hashes of the set-up
# files it checked; scripts/test.sh reruns the quick check when they change.
#
#   scripts/fresh-check.sh [--quick] [--keep DIR] [--cache DIR]
#   scripts/fresh-check.sh --stamp-current   exit 0 if the stamp matches the set-up files
#
# --keep DIR: build the root in DIR and leave it there; a DIR that already holds
# one is reused (no debootstrap, packages already installed: a fast rerun).
# --cache DIR: where the debootstrap tarball is kept (default /var/cache/dsc-fresh).
# Needs root (debootstrap, mount, chroot). /usr/local/cuda, when present, is
# bound read-only so the CUDA parts build as on the host.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
stamp_file=$repo/scripts/fresh-check.sha256

# The files that decide what a fresh machine needs; a change to any of them
# makes scripts/test.sh run the quick check again.
setup_hashes() {
  (cd "$repo" && ls -1 scripts/install-deps.sh CMakeLists.txt cmake/* tests/CMakeLists.txt \
    bench/CMakeLists.txt tests/fuzz/CMakeLists.txt | LC_ALL=C sort | xargs sha256sum)
}

mode=full
keep=""
cache=/var/cache/dsc-fresh
while [ $# -gt 0 ]; do
  case $1 in
  --quick) mode=quick ;;
  --keep) keep=${2:?--keep needs a directory}; shift ;;
  --cache) cache=${2:?--cache needs a directory}; shift ;;
  --stamp-current)
    if [ -f "$stamp_file" ] && diff <(setup_hashes) "$stamp_file" >/dev/null; then exit 0; fi
    if [ -f "$stamp_file" ]; then
      echo "changed since the last fresh check: $(diff <(setup_hashes) "$stamp_file" |
        awk '/^[<>]/ {print $3}' | sort -u | tr '\n' ' ')"
    else
      echo "no stamp ($stamp_file)"
    fi
    exit 1 ;;
  -h | --help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
  *) echo "fresh-check: unknown argument '$1' (see --help)" >&2; exit 1 ;;
  esac
  shift
done
if [ "$(id -u)" -ne 0 ]; then
  echo "fresh-check: needs root (debootstrap, mount, chroot): sudo $0 $*" >&2
  exit 1
fi

# ---- phases: each timed; a failure names its phase ----
phase=setup
phase_t0=$(date +%s)
t_start=$phase_t0
timings=()
begin() { # NAME
  phase=$1
  phase_t0=$(date +%s)
  echo "=== fresh-check: $phase"
}
end() {
  local s=$(($(date +%s) - phase_t0))
  timings+=("$(printf '%-14s %5d s' "$phase" "$s")")
  echo "=== fresh-check: $phase took $s s"
}

root=""
mounts=()
cleanup() {
  local rc=$?
  # Unmount in reverse order; a mount still busy is detached lazily rather
  # than left behind holding the host's /dev or /sys.
  local i
  for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do
    umount -R "${mounts[i]}" 2>/dev/null || umount -R -l "${mounts[i]}" 2>/dev/null ||
      echo "fresh-check: could not unmount ${mounts[i]}" >&2
  done
  if [ -n "$root" ] && [ -z "$keep" ] && [ -d "$root" ]; then
    # Only after every mount is gone: rm -rf must never reach the host's /dev.
    if ! grep -q " $root/" /proc/self/mounts; then rm -rf "$root"; fi
  fi
  if [ $rc -ne 0 ]; then
    echo "=== fresh-check: FAILED in phase '$phase' after $(($(date +%s) - phase_t0)) s (exit $rc)" >&2
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- the mirror this machine's apt uses (deb822 .sources first, then sources.list) ----
mirror=""
for f in /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] || continue
  mirror=$(awk '/^URIs:/ && !/security/ {print $2; exit}' "$f")
  [ -n "$mirror" ] && break
done
if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
  mirror=$(awk '$1 == "deb" && !/security/ {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' \
    /etc/apt/sources.list)
fi
if [ -z "$mirror" ]; then
  echo "fresh-check: no Debian mirror in /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list" >&2
  exit 1
fi
echo "fresh-check: mirror $mirror, mode $mode"

# The README's main command: the first ```sh block after "## Quick start".
main_cmd=$(awk '/^## Quick start/ {q = 1} q && /^```sh/ {s = 1; next} s && /^```/ {exit} s {print}' \
  "$repo/README.md")
if [ -z "$main_cmd" ]; then
  echo "fresh-check: README.md has no sh block under '## Quick start'" >&2
  exit 1
fi

# ---- phase: debootstrap (the packages cached as a tarball) ----
begin debootstrap
if ! command -v debootstrap >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends debootstrap
fi
if [ -n "$keep" ]; then
  mkdir -p "$keep"
  root=$(cd "$keep" && pwd)
else
  root=$(mktemp -d /var/tmp/dsc-fresh.XXXXXX)
fi
if [ -f "$root/etc/debian_version" ] && [ -x "$root/usr/bin/apt-get" ]; then
  echo "fresh-check: reusing the root in $root"
else
  mkdir -p "$cache"
  tarball=$cache/bookworm-minbase.tar.gz
  if [ ! -s "$tarball" ]; then
    tmp_root=$(mktemp -d /var/tmp/dsc-fresh-tar.XXXXXX)
    debootstrap --variant=minbase --make-tarball="$tarball.part" bookworm "$tmp_root" "$mirror"
    mv "$tarball.part" "$tarball"
    rm -rf "$tmp_root"
  fi
  debootstrap --variant=minbase --unpack-tarball="$tarball" bookworm "$root" "$mirror"
fi
# apt inside sees the suites this machine's apt sees (updates, security).
rm -f "$root/etc/apt/sources.list"
cp /etc/apt/sources.list.d/*.sources "$root/etc/apt/sources.list.d/" 2>/dev/null || true
[ -f /etc/apt/sources.list ] && cp /etc/apt/sources.list "$root/etc/apt/sources.list"
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
# What the Debian installer writes and debootstrap does not (Open MPI looks
# up the host's name).
[ -s "$root/etc/hosts" ] || printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\tlocalhost ip6-localhost ip6-loopback\n' \
  "$(cat "$root/etc/hostname" 2>/dev/null || echo debian)" >"$root/etc/hosts"
# A machine behind a TLS-inspecting proxy trusts its CA inside too (pip
# reaches PyPI over https); ca-certificates, installed by install-deps.sh,
# adds what is in /usr/local/share/ca-certificates.
if compgen -G '/usr/local/share/ca-certificates/*.crt' >/dev/null; then
  mkdir -p "$root/usr/local/share/ca-certificates"
  cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
fi
end

# ---- phase: copy the tree ----
begin copy
stamp_now=$(setup_hashes)
rm -rf "$root/root/dsc"
mkdir -p "$root/root/dsc"
# Tracked and new (not ignored) files: what a clone would have plus work in
# progress; a tracked file deleted in the worktree is left out.
(cd "$repo" && git ls-files -z --cached --others --exclude-standard |
  while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
  tar --null -T - -cf -) | tar -xf - -C "$root/root/dsc"
echo "fresh-check: $(cd "$root/root/dsc" && find . -type f | wc -l) files in $root/root/dsc"
end

# ---- mounts ----
mount_at() { # TARGET MOUNT-ARGS...
  local target=$1
  shift
  mkdir -p "$target"
  mount "$@" "$target"
  mounts+=("$target")
}
mount_at "$root/proc" -t proc proc
mount_at "$root/sys" --rbind /sys
mount --make-rslave "$root/sys"
mount_at "$root/dev" --rbind /dev
mount --make-rslave "$root/dev"
if [ -d /usr/local/cuda ]; then
  # At the path it has here (/usr/local/cuda-13.0, with /usr/local/cuda a
  # link to it, as the toolkit's packages install it): the toolkit's
  # ld.so.conf entry names that path.
  cuda=$(readlink -f /usr/local/cuda)
  mount_at "$root$cuda" --bind "$cuda"
  mount -o remount,bind,ro "$root$cuda"
  if [ "$cuda" != /usr/local/cuda ]; then
    if [ -d "$root/usr/local/cuda" ] && [ ! -L "$root/usr/local/cuda" ]; then
      rmdir "$root/usr/local/cuda" # an empty mount point an earlier check made
    fi
    ln -sfn "$cuda" "$root/usr/local/cuda"
  fi
  # NVRTC dlopens libnvrtc-builtins by name: the toolkit's ld.so.conf entry
  # (not part of the bound tree) comes along, or every NVRTC compile fails.
  for f in /etc/ld.so.conf.d/*; do
    grep -q cuda "$f" 2>/dev/null && cp "$f" "$root/etc/ld.so.conf.d/"
  done
  chroot "$root" /sbin/ldconfig
fi

in_root() { # COMMAND (bash -c, in the tree, with a clean environment)
  chroot "$root" /usr/bin/env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 TERM=dumb DSC_IN_FRESH_CHECK=1 ${FUZZ_SECONDS:+FUZZ_SECONDS=$FUZZ_SECONDS} \
    /bin/bash -c "cd /root/dsc && $1"
}

# ---- phase: the main command ----
begin main-command
echo "$main_cmd"
in_root "$main_cmd"
end

# ---- phase: the test command ----
if [ "$mode" = quick ]; then
  begin test-release
  in_root "scripts/test.sh --release-only"
else
  begin test-command
  in_root "scripts/test.sh"
fi
end

# A pass: the set-up files as they were copied are the ones now checked.
printf '%s\n' "$stamp_now" >"$stamp_file"
phase=done
echo "=== fresh-check: passed ($mode), $(($(date +%s) - t_start)) s in all"
printf '  %s\n' "${timings[@]}"
echo "fresh-check: wrote $stamp_file"
