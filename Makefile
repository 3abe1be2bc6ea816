# ratelimit: PGXS build. The Lua scripts in lua/ are embedded in the library at build time.

EXTENSION = ratelimit
MODULE_big = ratelimit
EXTVERSION = $(shell sed -n "s/^default_version = '\(.*\)'/\1/p" $(srcdir)/ratelimit.control)
# The install script of the default version is built from sql/ratelimit.sql (edited by
# hand); the others are the older versions' full scripts and the update scripts.
DATA_built = sql/ratelimit--$(EXTVERSION).sql
DATA = $(filter-out $(DATA_built),$(patsubst $(srcdir)/%,%,$(wildcard $(srcdir)/sql/ratelimit--*.sql)))
# One folder per layer, lowest first (CONTRIBUTING.md); each may use only those before it.
OBJS = $(patsubst $(srcdir)/%.c,%.o,$(sort $(foreach layer,base algorithm redis local policy engine observe functions,$(wildcard $(srcdir)/src/$(layer)/*.c)))) src/ratelimit.o
# The build's own generated headers (src/scripts.h) before the tree's: a header left in
# the tree by another build never wins over a fresh one.
PG_CPPFLAGS = -Isrc -I$(srcdir)/src
# TLS to Redis (rediss://) with OpenSSL, as PostgreSQL itself uses it.
SHLIB_LINK = -lssl -lcrypto
PG_CFLAGS = -std=gnu11 -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers

# pg_regress runs against a private server with the library preloaded; dev/run-tests
# writes the settings file (it names the Redis that the tests start).
REGRESS = setup policy errors consume enforce subjects settings failure local transactions leases multi history modes overrides headers stats algorithms allowances roles privileges upgrade
REGRESS_CONF ?= $(srcdir)/dev/regress.conf
REGRESS_OPTS = --temp-instance=$(CURDIR)/tmp_regress --temp-config=$(REGRESS_CONF)

EXTRA_CLEAN = src/scripts.h tmp_regress tmp_check results regression.diffs regression.out

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# A build in another directory (make -f <tree>/Makefile VPATH=<tree>) needs the folders.
ifdef VPATH
$(shell mkdir -p $(sort $(dir $(OBJS))) sql)
endif

# Each script, lua/<algorithm>/<operation>.lua or lua/<name>.lua, becomes a C string
# constant in src/scripts.h, with lua/lib.lua and its algorithm's common.lua before it.
LUA_PARTS = $(wildcard $(srcdir)/lua/*.lua $(srcdir)/lua/*/*.lua)
LUA_SCRIPTS = $(sort $(filter-out $(srcdir)/lua/lib.lua $(srcdir)/lua/cells.lua $(srcdir)/lua/once.lua %/common.lua,$(LUA_PARTS)))
src/scripts.h: $(LUA_PARTS) $(srcdir)/dev/embed-lua $(srcdir)/dev/lua-script $(srcdir)/dev/lua-prune
	$(srcdir)/dev/embed-lua $(LUA_SCRIPTS) > $@.tmp && mv $@.tmp $@

$(OBJS) $(OBJS:.o=.bc): src/scripts.h

sql/ratelimit--$(EXTVERSION).sql: $(srcdir)/sql/ratelimit.sql
	cp $< $@

# PGXS does not track headers: a changed struct must rebuild every object.
$(OBJS): $(wildcard $(srcdir)/src/*.h $(srcdir)/src/*/*.h)
