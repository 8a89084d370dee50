# pg_throttle — PGXS build. The version is set once, in pg_throttle.control.
EXTENSION  = pg_throttle
EXTVERSION := $(shell sed -n "s/^default_version = '\(.*\)'/\1/p" $(EXTENSION).control)

CORE_SRCS = $(sort $(wildcard src/core/*.cpp))
# The PostgreSQL boundary: src/pg and its layers (server, registry, durability, scale_out,
# the primitives acquire, rate, locks and queue; docs/design.md).
PG_SRCS   = $(sort $(wildcard src/pg/*.cpp src/pg/*/*.cpp))

MODULE_big = pg_throttle
OBJS       = $(CORE_SRCS:.cpp=.o) $(PG_SRCS:.cpp=.o)
DATA_built = $(EXTENSION)--$(EXTVERSION).sql
# The upgrade scripts from earlier versions, written by hand, and the install
# scripts of released versions whose dumps restore only into that version
# (docs/install.md, Upgrading), as they were released.
DATA       = $(wildcard src/sql/upgrade/$(EXTENSION)--*--*.sql) \
             $(wildcard src/sql/releases/$(EXTENSION)--*.sql)

REGRESS      = acquire bad_input status other_database reinstall rate locks queue queue_metrics reset cron
REGRESS_OPTS = --load-extension=pg_throttle

PG_CXXFLAGS = -std=c++17 -Wall -Wextra -Wno-register -Wno-missing-field-initializers \
              -Wno-unused-parameter -Isrc -MMD -MP -DPG_THROTTLE_VERSION='"$(EXTVERSION)"'
SHLIB_LINK  = -lstdc++
EXTRA_CLEAN = $(DATA_built) build/unit $(OBJS:.o=.d)

# The JIT bitcode step would need clang++ for the C++ sources; the module has
# nothing worth inlining into queries.
override with_llvm = no

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# The install script: the SQL sources in order, one file per family.
SQL_SRCS = src/sql/$(EXTENSION).sql src/sql/queue.sql
$(EXTENSION)--$(EXTVERSION).sql: $(SQL_SRCS) $(EXTENSION).control
	cat $(SQL_SRCS) > $@

# Header dependencies (-MMD): PGXS tracks none for C++ sources.
-include $(OBJS:.o=.d)

# Unit tests of the pure core: no server, no PostgreSQL headers.
UNIT_SRCS = $(wildcard test/unit/*_test.cpp)
build/unit: $(CORE_SRCS) $(UNIT_SRCS) $(wildcard src/core/*.hpp)
	@mkdir -p build
	$(CXX) -std=c++17 -Wall -Wextra -Werror -O1 -g -Isrc \
	  -DPG_INCLUDEDIR_SERVER='"$(shell $(PG_CONFIG) --includedir-server)"' \
	  -o $@ $(CORE_SRCS) $(UNIT_SRCS) -lgtest -lgtest_main -pthread

.PHONY: unit
unit: build/unit
	./build/unit

.PHONY: print-version
print-version:
	@echo $(EXTVERSION)

# The PGXN release: the committed tree at HEAD, less what .gitattributes marks
# export-ignore, as pg_throttle-VERSION.zip in DIST_DIR (build/ is ignored by
# git, so no zip is left in the tree). Uncommitted changes are not in it.
DIST_DIR ?= build
DIST      = $(DIST_DIR)/$(EXTENSION)-$(EXTVERSION).zip
.PHONY: dist
dist:
	@git diff --quiet HEAD -- || echo "dist: uncommitted changes are not in $(DIST)" >&2
	@mkdir -p $(DIST_DIR)
	git archive --format zip --prefix=$(EXTENSION)-$(EXTVERSION)/ -o $(DIST) HEAD
	@echo $(DIST)

# Lint: the project's clang-format and clang-tidy settings.
LINT_SRCS = $(CORE_SRCS) $(PG_SRCS) $(UNIT_SRCS)
LINT_HDRS = $(wildcard src/*/*.hpp src/pg/*/*.hpp)
.PHONY: format format-check tidy compat-check boundary-check
format:
	clang-format -i $(LINT_SRCS) $(LINT_HDRS)
format-check:
	clang-format --dry-run -Werror $(LINT_SRCS) $(LINT_HDRS)
# Every #if on the server version is in src/pg/server/compat.hpp.
compat-check:
	@! grep -rn 'PG_VERSION_NUM' src --include='*.cpp' --include='*.hpp' | grep -v '^src/pg/server/compat.hpp:'
# The C++ / PostgreSQL boundary rules (docs/design.md, "The boundary"): the pure
# core, includes pointing down, SQL entries behind call_guarded in *_sql.cpp, no
# throw, no ereport under a lock, plain shared-memory structs.
boundary-check:
	@/usr/bin/python3 scripts/boundary_check.py
# clang-tidy counts the warnings it found in system headers and suppressed
# ("N warnings generated.", one line a file): those lines are dropped, the
# findings and the exit status are kept.
tidy:
	@echo "clang-tidy: $(words $(LINT_SRCS)) files"
	@err=$$(mktemp); \
	clang-tidy --quiet $(LINT_SRCS) -- -std=c++17 -Isrc -Wno-register \
	  -DPG_THROTTLE_VERSION='"$(EXTVERSION)"' \
	  -I$(shell $(PG_CONFIG) --includedir-server) \
	  -DPG_INCLUDEDIR_SERVER='"$(shell $(PG_CONFIG) --includedir-server)"' 2>"$$err"; \
	rc=$$?; grep -v -E '^[0-9]+ warnings? generated\.$$' "$$err" >&2; rm -f "$$err"; exit $$rc

# The fault-injection soak test, longer than the one the test command runs.
SOAK_CYCLES ?= 40
.PHONY: soak
soak:
	@mkdir -p build
	/usr/bin/python3 test/soak/soak.py --cycles $(SOAK_CYCLES) --summary build/soak.json

# Benchmarks against SELECT 1 and the SQL recipes (bench/run.sh).
.PHONY: bench bench-versions bench-bound bench-real bench-sustained bench-wakeups bench-fairness
bench:
	bash bench/run.sh

# The hot paths against SELECT 1, alone (bench/hot-paths.sh, part of make bench).
.PHONY: bench-hot
bench-hot:
	bash bench/run.sh --only hot-paths

# What bounds a claim, alone (bench/queue-bound.sh, part of make bench).
bench-bound:
	bash bench/run.sh --only queue-bound

# Wake-ups at the due time: the lateness of idle LISTENing workers, alone
# (bench/wakeups.sh, part of make bench).
bench-wakeups:
	bash bench/run.sh --only wakeups

# Fair claims between tenants: small tenants' lateness behind a big one,
# oldest first against round robin, alone (bench/fairness.sh, part of make bench).
bench-fairness:
	bash bench/run.sh --only fairness

# Queues as they really run, alone (bench/queue-real.sh, part of make bench).
bench-real:
	bash bench/run.sh --only queue-real

# The queue under 30 minutes of steady load, an old snapshot in the middle (bench/sustained.sh;
# not part of make bench). BENCH_SUSTAINED_MINUTES shortens it.
bench-sustained:
	bash bench/sustained.sh

# pg_throttle spread over a three-node Citus cluster, when Citus is installed (bench/citus.py).
.PHONY: bench-citus
bench-citus:
	/usr/bin/python3 bench/citus.py

# The hot paths against SELECT 1 on PostgreSQL 15, 17 and 18 (bench/versions.sh).
bench-versions:
	bash bench/versions.sh
