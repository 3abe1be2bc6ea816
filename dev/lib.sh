# Shared by dev/run-example, dev/run-tests and bench/run: install what the project needs,
# build it, and start scratch PostgreSQL and Redis servers on loopback.
# Source it from bash; every function prefixed rl_.

set -euo pipefail

RL_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RL_PG_VERSION=15
# RL_PG_BIN may name a copy of that tree (a private installation, for parallel work).
RL_PG_BIN=${RL_PG_BIN:-/usr/lib/postgresql/$RL_PG_VERSION/bin}
RL_PG_CONFIG=$RL_PG_BIN/pg_config
# The unprivileged user that runs the servers and tests (PostgreSQL refuses root).
RL_USER=${RL_USER:-postgres}
# Everything the two commands use that a minimal Debian 12 lacks (the README lists them):
# the build, the servers, the tests' tools (procps: pgrep), and the package's build.
RL_PACKAGES="build-essential postgresql-$RL_PG_VERSION postgresql-server-dev-$RL_PG_VERSION
  postgresql-contrib redis-server redis-tools libipc-run-perl perl procps pgbouncer libssl-dev
  openssl debhelper postgresql-server-dev-all fakeroot lintian"
export PATH="$RL_PG_BIN:$PATH"

rl_log() { printf '\n=== %s\n' "$*"; }

# How long each stage of a command took: rl_timed NAME ends a stage, rl_timings prints them.
rl_timings_list=()
rl_stage_start=$SECONDS
rl_timed() {
	rl_timings_list+=("$1 $((SECONDS - rl_stage_start)) s")
	rl_stage_start=$SECONDS
}
rl_timings() { echo "$(printf '%s, ' "${rl_timings_list[@]}")$SECONDS s in all"; }

# Installs the Debian packages that are missing (needs root).
rl_install_packages() {
	local missing=()
	for package in $RL_PACKAGES; do
		dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'ok installed' ||
			missing+=("$package")
	done
	if [ ${#missing[@]} -gt 0 ]; then
		rl_log "installing ${missing[*]}"
		# apt's notes (debconf without apt-utils, services it cannot start) go to a log,
		# shown only if the installation fails.
		local log
		log=$(mktemp "${TMPDIR:-/tmp}/ratelimit-apt.XXXXXX")
		if ! { apt-get update -qq &&
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
				"${missing[@]}"; } >"$log" 2>&1; then
			cat "$log" >&2
			rm -f "$log"
			return 1
		fi
		rm -f "$log"
	fi
	# The Debian package starts a system Redis where it can; ours are private, so leave it be.
}

# Builds with warnings as errors (and assertions in our code) and installs the extension.
# RL_SKIP_BUILD=1 installs the tree's build as it is, without cleaning and building it anew
# (for quick reruns). It installs it all the same: a run puts back, at its end, what was
# installed before it, which is not this tree's build.
rl_build_install() {
	if [ -n "${RL_SKIP_BUILD:-}" ]; then
		rl_log "installing ratelimit as built (RL_SKIP_BUILD)"
		make -C "$RL_ROOT" -s PG_CONFIG="$RL_PG_CONFIG" install >/dev/null
		return 0
	fi
	rl_log "building and installing ratelimit"
	make -C "$RL_ROOT" -s clean >/dev/null
	make -C "$RL_ROOT" -s PG_CONFIG="$RL_PG_CONFIG" \
		PG_CFLAGS="-std=gnu11 -Wall -Wextra -Werror -Wno-unused-parameter -Wno-missing-field-initializers ${RL_EXTRA_CFLAGS:-}"
	"$RL_ROOT/dev/check-layers" "$RL_ROOT"
	make -C "$RL_ROOT" -s PG_CONFIG="$RL_PG_CONFIG" install >/dev/null
}

# The files make install (or the package) puts into PostgreSQL's tree: the library, its
# bitcode, the control file and the SQL scripts. Prints those that exist.
rl_installed_files() {
	local lib share
	lib=$("$RL_PG_CONFIG" --pkglibdir)
	share=$("$RL_PG_CONFIG" --sharedir)/extension
	ls -d "$lib/ratelimit.so" "$lib/bitcode/ratelimit" "$lib/bitcode/ratelimit.index.bc" \
		"$share/ratelimit.control" "$share"/ratelimit--*.sql 2>/dev/null || true
}

# Saves the installed files into the archive FILE, so that a test that installs another
# build can put back exactly what it found (an empty archive when nothing was installed).
rl_save_installed() {
	rl_installed_files | tar -cPf "$1" -T -
}

# Replaces whatever is installed now with what rl_save_installed saved into FILE.
rl_restore_installed() {
	local file
	rl_installed_files | while read -r file; do rm -rf "$file"; done
	tar -xPf "$1"
}

# Runs a command as the unprivileged user (as is, when not root), from /: the caller's
# directory may be closed to that user (root's home is 0700), and PostgreSQL's programs
# complain when they cannot change back to it. Give it absolute paths.
rl_as_user() {
	if [ "$(id -u)" = 0 ]; then
		(cd / && runuser -u "$RL_USER" -- env PATH="$PATH" "$@")
	else
		"$@"
	fi
}

# Makes a scratch directory the unprivileged user owns; prints its path.
rl_scratch_dir() {
	local dir
	dir=$(mktemp -d "${TMPDIR:-/tmp}/ratelimit-$1.XXXXXX")
	chmod 755 "$dir"
	[ "$(id -u)" = 0 ] && chown "$RL_USER" "$dir"
	echo "$dir"
}

# Prints a TCP port that is free on 127.0.0.1.
rl_free_port() {
	perl -MIO::Socket::INET -e \
		'print IO::Socket::INET->new(Listen => 1, LocalAddr => "127.0.0.1", LocalPort => 0)->sockport'
}

# Starts a private redis-server on 127.0.0.1:PORT with its socket in DIR/redis.sock.
rl_start_redis() {
	local dir=$1 port=$2
	rl_as_user redis-server --port "$port" --bind 127.0.0.1 --unixsocket "$dir/redis.sock" \
		--unixsocketperm 777 --dir "$dir" --save '' --appendonly no --daemonize yes \
		--pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
	for _ in $(seq 50); do
		redis-cli -p "$port" ping >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	echo "redis-server did not start; see $dir/redis.log" >&2
	return 1
}

rl_stop_redis() {
	local dir=$1
	[ -f "$dir/redis.pid" ] && kill "$(cat "$dir/redis.pid")" 2>/dev/null || true
}

# Creates and starts a PostgreSQL cluster in DIR/pg, on a socket in DIR and PORT,
# with ratelimit preloaded; extra settings come as further arguments (lines of
# postgresql.conf).
rl_start_postgres() {
	local dir=$1 port=$2
	shift 2
	rl_as_user initdb -D "$dir/pg" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
	{
		echo "listen_addresses = ''"
		echo "unix_socket_directories = '$dir'"
		echo "port = $port"
		echo "shared_preload_libraries = 'ratelimit'"
		for line in "$@"; do echo "$line"; done
	} | rl_as_user tee -a "$dir/pg/postgresql.conf" >/dev/null
	rl_as_user pg_ctl -D "$dir/pg" -l "$dir/postgres.log" -w start >/dev/null
}

rl_stop_postgres() {
	local dir=$1
	[ -d "$dir/pg" ] && rl_as_user pg_ctl -D "$dir/pg" -m fast -w stop >/dev/null 2>&1 || true
}
