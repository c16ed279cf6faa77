#!/usr/bin/env bash
# Runs every test of Spool: gofmt, vet, staticcheck, promtool over the alert rules in deploy/, the
# race-enabled test suite, and a short fuzz pass over every decoder. Starts a throwaway PostgreSQL
# cluster (installing PostgreSQL with apt when it is missing) and exports TEST_DATABASE_URL for
# the tests that need it; stops and removes it on exit. Installs netcat and Chromium with apt when
# they are missing (the seed-002 nc checks, the dashboard tests).
#
# Environment:
#   TEST_DATABASE_URL  use this database instead of starting a throwaway cluster (PostgreSQL tests
#                      always run: the script sets SPOOL_TEST_REQUIRE_PG=1, so they fail, never
#                      skip, without a database; tests that restart PostgreSQL start their own)
#   FUZZTIME           time per fuzz target (default 10s)
#   GOTESTFLAGS        extra flags for go test (e.g. -run=Conformance)
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZTIME=${FUZZTIME:-10s}
log() { printf '\n=== %s\n' "$*"; }

pg_tmp=""
pg_bin=""
promtool_tmp=""
cleanup() {
	if [ -n "$promtool_tmp" ]; then rm -rf "$promtool_tmp"; fi
	if [ -n "$pg_tmp" ] && [ -d "$pg_tmp" ]; then
		as_pg "$pg_bin/pg_ctl" -D "$pg_tmp/data" -m immediate stop >/dev/null 2>&1 || true
		rm -rf "$pg_tmp"
	fi
}
trap cleanup EXIT

as_pg() {
	if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

find_pg_bin() {
	local d
	for d in /usr/lib/postgresql/*/bin; do
		[ -x "$d/initdb" ] && { echo "$d"; return 0; }
	done
	command -v initdb >/dev/null 2>&1 && { dirname "$(command -v initdb)"; return 0; }
	return 1
}

# install_packages installs Debian packages with apt (root only).
apt_updated=""
install_packages() {
	if [ "$(id -u)" != 0 ]; then
		echo "missing packages ($*) and not root: install them first" >&2
		exit 1
	fi
	log "installing $* (apt)"
	export DEBIAN_FRONTEND=noninteractive
	if [ -z "$apt_updated" ]; then apt-get update -qq; apt_updated=1; fi
	apt-get install -y -qq "$@" >/dev/null
}

start_postgres() {
	if ! pg_bin=$(find_pg_bin); then
		install_packages postgresql
		pg_bin=$(find_pg_bin)
	fi
	pg_tmp=$(mktemp -d /tmp/spool-pg.XXXXXX)
	chmod 755 "$pg_tmp"
	if [ "$(id -u)" = 0 ]; then chown postgres: "$pg_tmp"; fi
	local port
	port=$(( 20000 + RANDOM % 20000 ))
	log "starting a throwaway PostgreSQL ($pg_bin) on port $port"
	as_pg "$pg_bin/initdb" -D "$pg_tmp/data" -U spool --auth=trust -E UTF8 >/dev/null
	as_pg "$pg_bin/pg_ctl" -D "$pg_tmp/data" -l "$pg_tmp/log" -w -t 60 \
		-o "-p $port -k $pg_tmp -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=on -c synchronous_commit=on" start >/dev/null
	export TEST_DATABASE_URL="postgres://spool@127.0.0.1:$port/postgres?sslmode=disable"
	export SPOOL_TEST_PG_CTL="$pg_bin/pg_ctl"
	export SPOOL_TEST_PG_DATA="$pg_tmp/data"
	# Fail loudly if the database does not answer.
	"$pg_bin/psql" "$TEST_DATABASE_URL" -Atqc 'select 1' >/dev/null
}

if [ -z "${TEST_DATABASE_URL:-}" ]; then
	start_postgres
fi
# The end-to-end tests run the seed-002 milestone commands with the real nc too.
if ! command -v nc >/dev/null 2>&1; then
	install_packages netcat-openbsd
fi
export SPOOL_TEST_REQUIRE_NC=1
# ... and seed 002's HTTP checks with the real curl and jq.
missing=""
for tool in curl jq; do command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"; done
if [ -n "$missing" ]; then
	# shellcheck disable=SC2086
	install_packages $missing
fi
export SPOOL_TEST_REQUIRE_CURL=1
# The dashboard tests drive Debian's headless Chromium (internal/admin/ui_test.go); here they must
# run, not skip.
if ! command -v chromium >/dev/null 2>&1; then
	install_packages chromium
fi
export SPOOL_TEST_REQUIRE_CHROMIUM=1
# promtool (Debian package prometheus) tests the alert rules and the dashboard's queries in
# deploy/. The package is unpacked into a temporary directory, not installed: installing it would
# start a Prometheus server on a machine with systemd.
if ! command -v promtool >/dev/null 2>&1; then
	log "fetching promtool (Debian package prometheus, unpacked only)"
	if [ "$(id -u)" = 0 ] && [ -z "$apt_updated" ]; then apt-get update -qq; apt_updated=1; fi
	promtool_tmp=$(mktemp -d /tmp/spool-promtool.XXXXXX)
	chmod 777 "$promtool_tmp" # apt downloads as the _apt user
	(cd "$promtool_tmp" && apt-get download -qq prometheus && dpkg-deb -x prometheus_*.deb root)
	export PATH="$promtool_tmp/root/usr/bin:$PATH"
fi
export SPOOL_TEST_REQUIRE_PROMTOOL=1
# PostgreSQL tests must run here: without a database they fail instead of skipping.
export SPOOL_TEST_REQUIRE_PG=1
# As root (CI), the disk-full test mounts a small tmpfs; it must not skip there.
if [ "$(id -u)" = 0 ]; then export SPOOL_TEST_REQUIRE_MOUNT=1; fi
log "TEST_DATABASE_URL=$TEST_DATABASE_URL"

log "gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then echo "gofmt would change: $unformatted" >&2; exit 1; fi

log "go vet"
go vet ./...

log "staticcheck"
# Pinned; go run fetches it through the module proxy once and caches the build.
go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...

log "promtool: alert rules (deploy/prometheus)"
promtool check rules deploy/prometheus/spool-alerts.yml
promtool test rules deploy/prometheus/*_test.yml

log "go test -race"
# shellcheck disable=SC2086
go test -race -count=1 -timeout 30m ${GOTESTFLAGS:-} ./...

log "fuzz ($FUZZTIME per target)"
# Every Fuzz* function in the tree gets a short run.
while IFS= read -r line; do
	file=${line%%:*}
	name=$(sed -E 's/^.*func (Fuzz[A-Za-z0-9_]+).*/\1/' <<<"$line")
	pkg=./$(dirname "$file")
	echo "--- $name ($pkg)"
	corpus="$pkg/testdata/fuzz/$name"
	before=$(ls "$corpus" 2>/dev/null | sort || true)
	set +e
	out=$(go test -run='^$' -fuzz="^${name}\$" -fuzztime="$FUZZTIME" "$pkg" 2>&1)
	rc=$?
	set -e
	echo "$out"
	if [ $rc -ne 0 ]; then
		after=$(ls "$corpus" 2>/dev/null | sort || true)
		# Go 1.26's fuzz coordinator can report "context deadline exceeded" when -fuzztime ends
		# while a worker is mid-input (golang/go#75804, fixed in Go 1.27): no failing input is
		# written then. Any other failure, or a new reproducer in testdata/fuzz, fails the run.
		if grep -q 'context deadline exceeded' <<<"$out" && [ "$before" = "$after" ] &&
			! grep -q 'Failing input written' <<<"$out"; then
			echo "--- $name: ignored the fuzz coordinator's deadline race (golang/go#75804): no failing input"
		else
			exit $rc
		fi
	fi
done < <(grep -rn --include='*_test.go' -E '^func Fuzz[A-Za-z0-9_]+\(' . | sort)

log "all tests passed"
