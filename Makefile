# ratelimit: PGXS build. The Lua scripts in lua/ are embedded in the library at build time.

EXTENSION = ratelimit
MODULE_big = ratelimit
DATA = $(wildcard sql/ratelimit--*.sql)
OBJS = src/ratelimit.o src/decision.o src/policy.o src/subject.o \
       src/bucket.o src/breaker.o src/local.o src/redis.o src/redis_url.o src/resp.o \
       src/secret.o src/log_privacy.o src/log_limit.o \
       src/ledger.o src/reservation.o src/lease.o src/multi.o src/trigger.o \
       src/stats.o src/decision_log.o src/headers.o
PG_CPPFLAGS = -I$(srcdir)/src
PG_CFLAGS = -std=gnu11 -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers

# pg_regress runs against a private server with the library preloaded; dev/run-tests
# writes the settings file (it names the Redis that the tests start).
REGRESS = setup policy errors consume enforce subjects settings failure local transactions leases multi history modes overrides headers stats roles privileges upgrade
REGRESS_CONF ?= $(srcdir)/dev/regress.conf
REGRESS_OPTS = --inputdir=test --temp-instance=$(CURDIR)/tmp_regress --temp-config=$(REGRESS_CONF)

EXTRA_CLEAN = src/scripts.h tmp_regress tmp_check results regression.diffs regression.out

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# Each lua/NAME.lua becomes a C string constant script_NAME in src/scripts.h.
src/scripts.h: $(wildcard lua/*.lua) dev/embed-lua
	$(srcdir)/dev/embed-lua $(sort $(wildcard $(srcdir)/lua/*.lua)) > $@.tmp && mv $@.tmp $@

src/decision.o src/decision.bc src/lease.o src/lease.bc: src/scripts.h
# PGXS does not track headers: a changed struct must rebuild every object.
$(OBJS): $(wildcard $(srcdir)/src/*.h)
