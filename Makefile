# foliod — build, test, install.  Plain GNU make.
#
#   make            build foliod, the nbdkit plugin, tests and benches
#   make run        install missing packages, build, start foliod (default config)
#   make check      install missing packages, build, run every test
#   make check-asan / check-valgrind   the same tests under ASan+UBSan / valgrind
#   make check-tsan the unit tests under ThreadSanitizer (build-tsan)
#   make check-layout  no cycle between files of src/, no call up a room
#   make check-vm   the Linux kernel nbd client test alone (qemu guest)
#   make check-vm-systemd   foliod under a real systemd (qemu guest)
#   make check-vm-ublk   the ublk front end in a qemu guest (backports kernel)
#   make check-vm-pmem   foliod in a qemu guest on an emulated NVDIMM, reset
#   make ceph-up / ceph-down   a one-node Ceph cluster in CEPH_DIR (rbd:)
#   make check-crash  the kill -9 loops on a pmem and an ssd store, ROUNDS
#                     (1000) rounds each, the upgrade loop (ROUNDS
#                     upgrades under a writing client, pmem and ram
#                     stores), and the fault model
#                     (test-fault-model) over ROUNDS seeds (make check: 40)
#                     and under the real foliod (test-fault-file-real,
#                     test-fault-nbd-real below its nbd remote) and
#                     nbdkit's folio filter (test-fault-filter-real)
#                     over ROUNDS/10 seeds each (make check: 3, 2, 3),
#                     and over foliod's librbd calls
#                     (test-fault-rbd-real) ROUNDS/40 (make check: 2)
#   make fuzz       the protocol fuzzer (clang, libFuzzer) for FUZZ_SECONDS
#   make fuzz-coverage   what of src/server/ the fuzzer's corpus reaches
#   make analyze    cppcheck, clang-tidy and gcc -fanalyzer over src/, plugins/
#   make install    PREFIX=/usr/local DESTDIR=
#   make deb        Debian packages in build-deb/; make check-deb tests them
#
# BUILD selects the output directory, so that several builds (default,
# sanitizer) live side by side: make BUILD=build-asan SAN=1.  SAN=1 is
# ASan+UBSan, SAN=thread ThreadSanitizer (the two cannot be combined).

BUILD   ?= build
PREFIX  ?= /usr/local
DESTDIR ?=
SAN     ?=

# The version foliod and the plugin report: the newest vX.Y.Z tag of the
# git tree (git describe: 0.2.0, or 0.2.0-3-gabc1234 past it) or, outside
# a git tree or before the first tag, VERSION_BASE.  VERSION=... overrides.
VERSION_BASE = 0.1.0
ifeq ($(origin VERSION),undefined)
VERSION := $(or $(patsubst v%,%,$(shell git describe --tags --match 'v[0-9]*' \
             2>/dev/null)),$(VERSION_BASE))
endif

CC      ?= cc
CFLAGS  ?= -O2 -g
WARN     = -Wall -Wextra -Wno-unused-parameter -Wshadow -Wformat=2
WARN    += -Wmissing-prototypes -Wstrict-prototypes -Wvla
# make WERROR=1 (CI): any warning fails the build.
ifeq ($(WERROR),1)
WARN    += -Werror
endif
ALLCFLAGS = -std=gnu11 $(WARN) -fPIC -pthread -Iinclude -Isrc $(CFLAGS) \
            $(shell pkg-config --cflags libnbd 2>/dev/null)
LDLIBS_CORE = -pthread $(shell pkg-config --libs libnbd 2>/dev/null || echo -lnbd) \
              $(shell pkg-config --libs libpmem2 zlib 2>/dev/null || echo -lpmem2 -lz)
# librbd (src/backing/rbd.c; Debian ships no .pc for it): only the
# binaries that pull in the rbd backing get it (--as-needed).
LDLIBS_CORE += -Wl,--as-needed -lrbd -lrados -Wl,--no-as-needed
LDLIBS_SERVER = -lev $(shell pkg-config --libs openssl 2>/dev/null || echo -lssl -lcrypto)
# The daemon alone: metrics-listen's HTTP server (src/daemon/metrics.c).
LDLIBS_DAEMON = $(shell pkg-config --libs libmicrohttpd 2>/dev/null || echo -lmicrohttpd)
# The ublk front end (src/ublk/): io_uring through liburing.
LDLIBS_UBLK = $(shell pkg-config --libs liburing 2>/dev/null || echo -luring)
ifeq ($(SAN),1)
ALLCFLAGS += -fsanitize=address,undefined -fno-omit-frame-pointer -O1
LDFLAGS   += -fsanitize=address,undefined
else ifeq ($(SAN),thread)
# TSan's lock-order detector follows at most 64 locks held by a thread:
# windows of 32 folios (32 stripes, plus the locks taken inside one).
ALLCFLAGS += -fsanitize=thread -O1 -DWINDOW_MAX=32u
LDFLAGS   += -fsanitize=thread
else ifneq ($(SAN),)
$(error SAN=$(SAN): use SAN=1 (ASan+UBSan) or SAN=thread (TSan))
endif
# The fuzzer build (make fuzz): clang, coverage for libFuzzer, ASan+UBSan,
# any UBSan report fatal so that libFuzzer sees it as a crash.
ifeq ($(FUZZ),1)
CC         = clang
ALLCFLAGS += -fsanitize=fuzzer-no-link,address,undefined \
             -fno-sanitize-recover=undefined -fno-omit-frame-pointer -O1
LDFLAGS   += -fsanitize=address,undefined
endif
# The same harness with source coverage instead (make fuzz-coverage).
ifeq ($(FUZZ),cov)
CC         = clang
ALLCFLAGS += -fprofile-instr-generate -fcoverage-mapping
LDFLAGS   += -fprofile-instr-generate
endif

CORE_SRCS   := $(wildcard src/store/*.c src/cache/*.c src/backing/*.c src/export/*.c src/util/*.c)
SERVER_SRCS := $(wildcard src/server/*.c)
UBLK_SRCS   := $(wildcard src/ublk/*.c)
DAEMON_SRCS := $(wildcard src/daemon/*.c)
PLUGIN_SRCS := $(wildcard plugins/folio/*.c plugins/common/*.c)
FILTER_SRCS := $(wildcard plugins/folio-filter/*.c plugins/common/*.c)
UNIT_SRCS   := $(wildcard tests/unit/test-*.c)
TESTLIB_SRCS:= $(wildcard tests/unit/lib/*.c)
TOOL_SRCS   := $(wildcard tests/tools/*.c)
FAULTFS_SRCS:= $(wildcard tests/faultfs/*.c)
BENCH_SRCS  := $(wildcard bench/*.c)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
CORE_OBJS   := $(call obj,$(CORE_SRCS))
SERVER_OBJS := $(call obj,$(SERVER_SRCS))
UBLK_OBJS   := $(call obj,$(UBLK_SRCS))
DAEMON_OBJS := $(call obj,$(DAEMON_SRCS))
PLUGIN_OBJS := $(call obj,$(PLUGIN_SRCS))
FILTER_OBJS := $(call obj,$(FILTER_SRCS))
TESTLIB_OBJS:= $(call obj,$(TESTLIB_SRCS))
UNIT_BINS   := $(patsubst tests/unit/%.c,$(BUILD)/tests/unit/%,$(UNIT_SRCS))
TOOL_BINS   := $(patsubst tests/tools/%.c,$(BUILD)/tests/tools/%,$(TOOL_SRCS))
BENCH_BINS  := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRCS))
FAULTFS_LIBS:= $(patsubst tests/faultfs/%.c,$(BUILD)/tests/faultfs/%.so,$(FAULTFS_SRCS))

CORE_LIB = $(BUILD)/libfoliod-core.a
FOLIOD   = $(BUILD)/foliod
PLUGIN   = $(BUILD)/nbdkit-folio-plugin.so
FILTER   = $(BUILD)/nbdkit-folio-filter.so

TARGETS = $(CORE_LIB) $(UNIT_BINS) $(TOOL_BINS) $(BENCH_BINS) $(FAULTFS_LIBS)
ifneq ($(DAEMON_SRCS),)
TARGETS += $(FOLIOD)
endif
ifneq ($(PLUGIN_SRCS),)
TARGETS += $(PLUGIN)
endif
ifneq ($(wildcard plugins/folio-filter/*.c),)
TARGETS += $(FILTER)
endif

# nbdkit loads only a filter built against its own version's headers (its
# struct nbdkit_filter changes between versions): the same filter again
# for another nbdkit, from that nbdkit's nbdkit-plugin-dev headers in
# NBDKIT142_INCLUDE (by default Debian 13's nbdkit 1.42, in the root that
# tests/lib-trixie.sh makes, one per package list).  Only the filter's two files see them (copied
# to a directory of their own, a system one as /usr/include is for the
# first: the root's other headers stay out, and their warnings); the
# core is the same library.  Built by "all" when the headers are there;
# tests/test-filter-nbdkit142.sh builds it itself otherwise.
NBDKIT142_INCLUDE ?= $(firstword $(wildcard /var/cache/foliod-tests/trixie-*/usr/include))
NBDKIT142_HDRS = nbdkit-common.h nbdkit-filter.h nbdkit-plugin.h nbdkit-version.h
FILTER142 = $(BUILD)/nbdkit-folio-filter-1.42.so
FILTER142_OBJS := $(patsubst %.c,$(BUILD)/obj-nbdkit142/%.o,$(FILTER_SRCS))
ifneq ($(wildcard plugins/folio-filter/*.c),)
ifneq ($(wildcard $(NBDKIT142_INCLUDE)/nbdkit-filter.h),)
TARGETS += $(FILTER142)
endif
endif

.PHONY: FORCE all deps deps-run deps-analyze run check check-unit check-layout check-integration check-asan \
        check-valgrind check-model-long check-vm check-vm-systemd check-crash bench install install-files \
        uninstall clean deb check-deb \
        fuzz fuzz-build fuzz-coverage
.PHONY: check-tsan check-tsan-unit analyze analyze-cppcheck analyze-tidy analyze-gcc

all: $(TARGETS)
ifeq ($(BUILD),build)
	@ln -sf build/foliod foliod 2>/dev/null || true
	@if [ -f $(PLUGIN) ]; then ln -sf ../../build/nbdkit-folio-plugin.so plugins/folio/nbdkit-folio-plugin.so; fi
endif

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) -MMD -MP -c -o $@ $<

$(BUILD)/obj/plugins/%.o: plugins/%.c
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) $(shell pkg-config --cflags nbdkit 2>/dev/null) -MMD -MP -c -o $@ $<

# Only the objects that print the version get it, and are rebuilt when it
# changes: $(BUILD)/VERSION is rewritten only then.
VERSION_OBJS = $(BUILD)/obj/src/daemon/cli.o $(BUILD)/obj/plugins/folio/folio.o
$(VERSION_OBJS): ALLCFLAGS += -DFOLIOD_VERSION='"$(VERSION)"'
$(VERSION_OBJS): $(BUILD)/VERSION
$(BUILD)/VERSION: FORCE
	@mkdir -p $(dir $@)
	@echo '$(VERSION)' | cmp -s - $@ || echo '$(VERSION)' > $@

$(CORE_LIB): $(CORE_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

# The filter for nbdkit 1.42 (FILTER142, above).
$(BUILD)/include-nbdkit142/%.h: $(NBDKIT142_INCLUDE)/%.h
	@mkdir -p $(dir $@)
	cp $< $@

$(BUILD)/obj-nbdkit142/%.o: %.c $(addprefix $(BUILD)/include-nbdkit142/,$(NBDKIT142_HDRS))
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) -isystem $(BUILD)/include-nbdkit142 -MMD -MP -c -o $@ $<

$(FILTER142): $(FILTER142_OBJS) $(CORE_LIB)
	$(CC) $(LDFLAGS) -shared -o $@ $(FILTER142_OBJS) $(CORE_LIB) $(LDLIBS_CORE)

# The copied headers are prerequisites of a pattern rule only: keep them.
.SECONDARY: $(addprefix $(BUILD)/include-nbdkit142/,$(NBDKIT142_HDRS))
-include $(shell find $(BUILD)/obj-nbdkit142 -name '*.d' 2>/dev/null)

$(FOLIOD): $(DAEMON_OBJS) $(SERVER_OBJS) $(UBLK_OBJS) $(CORE_LIB)
	$(CC) $(LDFLAGS) -o $@ $(DAEMON_OBJS) $(SERVER_OBJS) $(UBLK_OBJS) $(CORE_LIB) $(LDLIBS_DAEMON) $(LDLIBS_SERVER) $(LDLIBS_UBLK) $(LDLIBS_CORE)

$(PLUGIN): $(PLUGIN_OBJS) $(CORE_LIB)
	$(CC) $(LDFLAGS) -shared -o $@ $(PLUGIN_OBJS) $(CORE_LIB) $(LDLIBS_CORE)

$(FILTER): $(FILTER_OBJS) $(CORE_LIB)
	$(CC) $(LDFLAGS) -shared -o $@ $(FILTER_OBJS) $(CORE_LIB) $(LDLIBS_CORE)

# -MMD -MF: a unit test that includes a .c of src/ (test-pool-fair
# includes pool.c) is rebuilt when that file changes.
$(BUILD)/tests/unit/%: tests/unit/%.c $(TESTLIB_OBJS) $(CORE_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) -Itests/unit -MMD -MP -MF $@.d $(LDFLAGS) -o $@ $< $(TESTLIB_OBJS) $(CORE_LIB) -lcmocka $(LDLIBS_CORE)

$(BUILD)/tests/tools/%: tests/tools/%.c $(CORE_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) $(LDFLAGS) -o $@ $< $(CORE_LIB) $(LDLIBS_CORE)

# LD_PRELOAD layers for real processes (tests/faultfs/): no sanitizer, no
# core library, so that they load into any process, sanitized or not.
$(BUILD)/tests/faultfs/%.so: tests/faultfs/%.c tests/faultfs/fault-common.h
	@mkdir -p $(dir $@)
	$(CC) -std=gnu11 $(WARN) -fPIC -pthread $(CFLAGS) -shared -o $@ $< -ldl

$(BUILD)/bench/%: bench/%.c $(TESTLIB_OBJS) $(CORE_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(ALLCFLAGS) -Itests/unit $(LDFLAGS) -o $@ $< $(TESTLIB_OBJS) $(CORE_LIB) $(LDLIBS_CORE)

# The test library objects are prerequisites of pattern rules only: keep
# make from deleting them as intermediates (and relinking everything).
.SECONDARY: $(TESTLIB_OBJS)

-include $(shell find $(BUILD)/obj $(BUILD)/tests/unit -name '*.d' 2>/dev/null)

# The packages each entry point needs (scripts/install-deps SET): make run
# only what builds and runs foliod, make check the test toolchain too.
deps:
	@scripts/install-deps check
deps-run:
	@scripts/install-deps run
deps-analyze:
	@scripts/install-deps analyze

# Tests: unit tests (cmocka) then integration scripts, all through one runner
# that prints "N passed, N failed, N skipped" and fails if anything failed.
TEST_ENV = PATH=/usr/bin:$$PATH TOP=$(CURDIR) BUILD=$(abspath $(BUILD)) \
           FOLIOD=$(abspath $(FOLIOD)) PLUGIN=$(abspath $(PLUGIN)) \
           FILTER=$(abspath $(FILTER)) FILTER142=$(abspath $(FILTER142)) \
           NBDKIT142_INCLUDE=$(NBDKIT142_INCLUDE) SAN=$(SAN)

check: deps
	$(MAKE) all
	$(TEST_ENV) tests/run-tests $(UNIT_BINS) $(sort $(wildcard tests/test-*.sh))

# A one-node Ceph cluster by hand (the rbd tests start their own):
# make ceph-up prints CEPH_CONF=...; then rbd:rbd/img,ceph-conf=$CEPH_CONF.
CEPH_DIR ?= /tmp/foliod-ceph
.PHONY: ceph-up ceph-down
ceph-up:
	@tests/ceph/cluster up $(CEPH_DIR)
ceph-down:
	@tests/ceph/cluster down $(CEPH_DIR) && rm -rf $(CEPH_DIR)

check-unit: all
	$(TEST_ENV) tests/run-tests $(UNIT_BINS)

# The rooms (docs/internals.md): no cycle between the files of src/ and
# plugins/, and no call from a lower room up, read off the objects' symbols.
check-layout: all
	scripts/check-layout $(BUILD)

check-integration: all
	$(TEST_ENV) tests/run-tests $(sort $(wildcard tests/test-*.sh))

check-asan: deps
	$(MAKE) BUILD=build-asan SAN=1 all
	STORE_CRASHES=$${STORE_CRASHES:-2000} \
	  $(MAKE) BUILD=build-asan SAN=1 check-unit check-integration

# The unit tests under ThreadSanitizer (the daemon's tests run under
# ASan): the first report fails the test; tests/unit/tsan.supp says why
# each suppression is there.  The lock-order detector is on: no thread
# holds more than a window's stripes (range requests go a window at a
# time, writeback holds no stripe across its I/O), and a TSan build's
# windows are 32 folios (the detector follows at most 64 held locks).
TSAN_OPTIONS ?= halt_on_error=1:detect_deadlocks=1:suppressions=$(CURDIR)/tests/unit/tsan.supp
# test-model runs 20,000 ops (100,000 took up to 10 min under TSan here),
# the store crash simulators 2,000 power cuts each (10,000 outside TSan;
# the ssd one took more than its 900 s under TSan on a loaded machine).
check-tsan: deps
	$(MAKE) BUILD=build-tsan SAN=thread check-tsan-unit

check-tsan-unit: $(UNIT_BINS)
	$(TEST_ENV) TSAN_OPTIONS=$(TSAN_OPTIONS) MODEL_OPS=$${MODEL_OPS:-20000} \
	  STORE_CRASHES=$${STORE_CRASHES:-2000} tests/run-tests $(UNIT_BINS)

# Static analysis of src/ and plugins/: cppcheck, clang-tidy (the checks
# in .clang-tidy) and gcc -fanalyzer.  The bar is zero findings; a false
# positive is suppressed where it is, with the reason.
ANALYZE_SRCS = $(CORE_SRCS) $(SERVER_SRCS) $(UBLK_SRCS) $(DAEMON_SRCS) $(sort $(PLUGIN_SRCS) $(FILTER_SRCS))
ANALYZE_DEFS = -DFOLIOD_VERSION='"$(VERSION)"'
ANALYZE_CFLAGS = -std=gnu11 -D_GNU_SOURCE $(ANALYZE_DEFS) -Iinclude -Isrc \
  $(shell pkg-config --cflags libnbd nbdkit 2>/dev/null)
analyze: deps-analyze
	$(MAKE) analyze-cppcheck analyze-tidy analyze-gcc

analyze-cppcheck:
	cppcheck -q --std=c11 --enable=warning,performance,portability \
	  --inconclusive --error-exitcode=1 --inline-suppr \
	  --library=posix,openssl -D__CPPCHECK__ $(ANALYZE_DEFS) -Iinclude -Isrc $(ANALYZE_SRCS)

analyze-tidy:
	printf '%s\n' $(ANALYZE_SRCS) | xargs -P2 -I{} clang-tidy -quiet {} \
	  -- $(ANALYZE_CFLAGS)

analyze-gcc:
	printf '%s\n' $(ANALYZE_SRCS) | xargs -P2 -I{} $(CC) $(ALLCFLAGS) $(ANALYZE_DEFS) \
	  $(shell pkg-config --cflags nbdkit 2>/dev/null) -fanalyzer -Werror \
	  -c -o /dev/null {}

check-valgrind: deps all
	$(TEST_ENV) VALGRIND=1 tests/run-tests $(UNIT_BINS)

check-model-long: all
	MODEL_OPS=2000000 $(BUILD)/tests/unit/test-model

# The Linux kernel's nbd client in a qemu guest against foliod (tests/vm/);
# also part of "make check" as tests/test-vm.sh.
check-vm: deps
	$(MAKE) $(FOLIOD)
	$(TEST_ENV) tests/run-tests tests/test-vm.sh

# foliod under a real systemd as PID 1 in a qemu guest booted from the
# host's own root file system (tests/vm/run-systemd); also part of "make
# check" as tests/test-vm-systemd.sh.
check-vm-systemd: deps
	$(MAKE) all
	$(TEST_ENV) tests/run-tests tests/test-vm-systemd.sh

# foliod inside a qemu guest with its pmem store on ext4 -o dax over an
# emulated NVDIMM, a hard reset while writing, recovery on a second boot;
# also part of "make check" as tests/test-vm-pmem.sh.
.PHONY: check-vm-pmem
check-vm-pmem: deps
	$(MAKE) $(FOLIOD) $(BUILD)/tests/tools/nbd-acklog
	$(TEST_ENV) tests/run-tests tests/test-vm-pmem.sh

# The ublk front end in a qemu guest on bookworm-backports' kernel
# (tests/vm/bpo-kernel fetches it once); also part of "make check" as
# tests/test-vm-ublk.sh.
.PHONY: check-vm-ublk
check-vm-ublk: deps
	$(MAKE) $(FOLIOD)
	$(TEST_ENV) tests/run-tests tests/test-vm-ublk.sh

# The kill -9 loop of make check (100 rounds there) for ROUNDS rounds:
# foliod on a pmem store killed at random moments under writing clients,
# every acknowledged write checked after each restart.  PMEM_KILL_SEED=N
# replays a seed.  About 1.5 s per round.  Then ROUNDS upgrades in place
# per store under a writing client (test-daemon-upgrade.sh, 2-6 s each).
# Then the fault model (tests/unit/test-fault-model.c, docs/internals.md
# "Fault model"; make check runs seeds 0-39) over ROUNDS seeds from a
# base that differs each run (the time, printed; FAULT_SEED=N sets it,
# and replays one with FAULT_SEEDS=1).  Then the fault layer under the real
# foliod (tests/test-fault-file-real.sh; make check: seeds 0-2) over
# ROUNDS/10 seeds (two runs of 3-10 s each, ram and pmem stores) from
# the time (FAULT_REAL_SEED=N sets it), and the same for the nbd backing
# and the filter; the rbd backing's layer over ROUNDS/40 (a run against
# the Ceph cluster takes 10-20 s).
ROUNDS ?= 1000
FAULT_MODEL = $(BUILD)/tests/unit/test-fault-model
check-crash: deps
	$(MAKE) $(FOLIOD) $(PLUGIN) $(FILTER) $(FAULT_MODEL) $(FAULTFS_LIBS)
	$(TEST_ENV) PMEM_KILL_ROUNDS=$(ROUNDS) SSD_KILL_ROUNDS=$(ROUNDS) \
	  FAULT_SEEDS=$(ROUNDS) FAULT_SEED=$${FAULT_SEED:-$$(date +%s)} \
	  FAULT_REAL_SEEDS=$$(( $(ROUNDS) / 10 )) \
	  FAULT_REAL_SEED=$${FAULT_REAL_SEED:-$$(date +%s)} \
	  FAULT_NBD_SEEDS=$$(( $(ROUNDS) / 10 )) \
	  FAULT_NBD_SEED=$${FAULT_NBD_SEED:-$$(date +%s)} \
	  FAULT_FILTER_SEEDS=$$(( $(ROUNDS) / 10 )) \
	  FAULT_FILTER_SEED=$${FAULT_FILTER_SEED:-$$(date +%s)} \
	  FAULT_RBD_SEEDS=$$(( $(ROUNDS) / 40 )) \
	  FAULT_RBD_SEED=$${FAULT_RBD_SEED:-$$(date +%s)} \
	  UPGRADE_ROUNDS=$(ROUNDS) UPGRADE_RAM_ROUNDS=$(ROUNDS) \
	  TEST_TIMEOUT=$$(( $(ROUNDS) * 12 + 300 )) \
	  tests/run-tests tests/test-pmem-kill.sh tests/test-ssd-kill.sh \
	  tests/test-daemon-upgrade.sh $(FAULT_MODEL) tests/test-fault-file-real.sh \
	  tests/test-fault-nbd-real.sh tests/test-fault-filter-real.sh \
	  tests/test-fault-rbd-real.sh

# The protocol fuzzer (tests/fuzz/): the server's handshake and request
# parser under libFuzzer, ASan and UBSan, in its own build directory.
# make fuzz FUZZ_SECONDS=N runs it for N seconds on a copy of the seed
# corpus (new inputs stay in $(FUZZ_BUILD)/corpus, crash files go to
# $(FUZZ_BUILD)/) and fails if it finds a crash.
FUZZ_BUILD   ?= build-fuzz
FUZZ_SECONDS ?= 600
FUZZ_HARNESS  = $(FUZZ_BUILD)/fuzz-server

fuzz: deps
	$(MAKE) fuzz-build
	FUZZ_BUILD=$(abspath $(FUZZ_BUILD)) tests/fuzz/run-fuzz $(FUZZ_SECONDS)

fuzz-build:
	$(MAKE) BUILD=$(FUZZ_BUILD) FUZZ=1 $(FUZZ_HARNESS)

# Line and branch coverage of src/server/ by the corpus in
# $(FUZZ_BUILD)/corpus (the seeds if no run has added to it yet).
fuzz-coverage:
	$(MAKE) BUILD=$(FUZZ_BUILD)-cov FUZZ=cov $(FUZZ_BUILD)-cov/fuzz-server
	FUZZ_BUILD=$(abspath $(FUZZ_BUILD)) tests/fuzz/coverage

$(BUILD)/fuzz-server: tests/fuzz/fuzz-server.c $(SERVER_OBJS) $(TESTLIB_OBJS) \
                      $(CORE_LIB)
	$(CC) $(ALLCFLAGS) -Itests/unit/lib $(LDFLAGS) -fsanitize=fuzzer -o $@ $< \
	  $(SERVER_OBJS) $(TESTLIB_OBJS) $(CORE_LIB) $(LDLIBS_SERVER) $(LDLIBS_CORE)

# The built-in configuration is assembled into the daemon (.incbin).
$(BUILD)/obj/src/daemon/default-conf.o: conf/foliod.conf

# Benchmarks against peers: print figures, not pass/fail (see bench/*).
# make bench BENCH_SHORT=1 for a smoke run; BENCHES= to pick some.
BENCHES ?= core-bench nbd-bench scaling contention write-amp seed-workload remote-read remote-seqread pmem-bench ssd-recovery wb-stall ceph-bench filter-bench
bench: deps
	$(MAKE) all
	@rc=0; for b in $(BENCHES); do echo "== bench/$$b"; \
	  if [ $$b = core-bench ]; then $(BUILD)/bench/core-bench || rc=1; continue; fi; \
	  $(TEST_ENV) bench/$$b || { echo "bench/$$b failed"; rc=1; }; done; exit $$rc

# Only the daemon: no tests, benches or plugin (nor their packages).
run: deps-run
	$(MAKE) $(FOLIOD)
	FOLIOD=$(abspath $(FOLIOD)) scripts/run-default

# Install layout.  PREFIX=/usr gives a Debian-like system layout (/etc,
# /usr/lib/systemd/system); any other PREFIX keeps everything under it,
# except the nbdkit plugin, which always goes to nbdkit's own plugin
# directory so that "nbdkit folio ..." finds it.  Each directory can be
# overridden on the command line.
SBINDIR    ?= $(PREFIX)/sbin
MANDIR     ?= $(PREFIX)/share/man
DOCDIR     ?= $(PREFIX)/share/doc/foliod
ifeq ($(PREFIX),/usr)
SYSCONFDIR ?= /etc
UNITDIR    ?= /usr/lib/systemd/system
else
SYSCONFDIR ?= $(PREFIX)/etc
UNITDIR    ?= $(PREFIX)/lib/systemd/system
endif
PLUGINDIR  ?= $(or $(shell pkg-config --variable=plugindir nbdkit 2>/dev/null),/usr/lib/x86_64-linux-gnu/nbdkit/plugins)
FILTERDIR  ?= $(or $(shell pkg-config --variable=filterdir nbdkit 2>/dev/null),/usr/lib/x86_64-linux-gnu/nbdkit/filters)
UNITS = foliod.service foliod.socket foliod@.service
MANS  = $(wildcard man/*.[0-9])

# The units name /usr/sbin/foliod and /etc/foliod; point them at the
# installed paths.  An existing foliod.conf is never overwritten (the
# example also goes to DOCDIR); uninstall removes it only if unchanged.
# install-files installs the daemon, plugin and filter alone
# (debian/rules: no tests or benches built).
install: all install-files
install-files: $(filter $(FOLIOD) $(PLUGIN) $(FILTER),$(TARGETS))
	install -D -m 755 $(FOLIOD) $(DESTDIR)$(SBINDIR)/foliod
	if [ -f $(PLUGIN) ]; then \
	  install -D -m 755 $(PLUGIN) $(DESTDIR)$(PLUGINDIR)/nbdkit-folio-plugin.so; fi
	if [ -f $(FILTER) ]; then \
	  install -D -m 755 $(FILTER) $(DESTDIR)$(FILTERDIR)/nbdkit-folio-filter.so; fi
	for m in $(MANS); do \
	  install -D -m 644 $$m $(DESTDIR)$(MANDIR)/man$${m##*.}/$${m#man/}; done
	install -D -m 644 conf/foliod.conf $(DESTDIR)$(DOCDIR)/foliod.conf.example
	if [ -e $(DESTDIR)$(SYSCONFDIR)/foliod/foliod.conf ]; then \
	  echo "install: keeping existing $(DESTDIR)$(SYSCONFDIR)/foliod/foliod.conf"; \
	else \
	  install -D -m 644 conf/foliod.conf $(DESTDIR)$(SYSCONFDIR)/foliod/foliod.conf; fi
	for u in $(UNITS); do \
	  install -d $(DESTDIR)$(UNITDIR) && \
	  sed -e 's|/usr/sbin/foliod|$(SBINDIR)/foliod|g' \
	      -e 's|/etc/foliod|$(SYSCONFDIR)/foliod|g' systemd/$$u \
	      > $(DESTDIR)$(UNITDIR)/$$u && chmod 644 $(DESTDIR)$(UNITDIR)/$$u; done

uninstall:
	rm -f $(DESTDIR)$(SBINDIR)/foliod
	rm -f $(DESTDIR)$(PLUGINDIR)/nbdkit-folio-plugin.so
	rm -f $(DESTDIR)$(FILTERDIR)/nbdkit-folio-filter.so
	for m in $(MANS); do rm -f $(DESTDIR)$(MANDIR)/man$${m##*.}/$${m#man/}; done
	for u in $(UNITS); do rm -f $(DESTDIR)$(UNITDIR)/$$u; done
	rm -f $(DESTDIR)$(DOCDIR)/foliod.conf.example
	-rmdir $(DESTDIR)$(DOCDIR) 2>/dev/null
	if cmp -s conf/foliod.conf $(DESTDIR)$(SYSCONFDIR)/foliod/foliod.conf; then \
	  rm -f $(DESTDIR)$(SYSCONFDIR)/foliod/foliod.conf; \
	  rmdir $(DESTDIR)$(SYSCONFDIR)/foliod 2>/dev/null || true; \
	elif [ -e $(DESTDIR)$(SYSCONFDIR)/foliod/foliod.conf ]; then \
	  echo "uninstall: keeping modified $(DESTDIR)$(SYSCONFDIR)/foliod/foliod.conf"; fi

clean:
	rm -rf build build-asan build-fuzz build-fuzz-cov foliod plugins/folio/nbdkit-folio-plugin.so
	rm -rf build-tsan

# Debian packages (debian/): foliod_VERSION_amd64.deb and
# nbdkit-plugin-folio_VERSION_amd64.deb (with -dbgsym, .buildinfo and
# .changes) in build-deb/, not in ../ where dpkg-buildpackage puts them by
# default (the parent directory may hold other trees' builds); about 20 s,
# objects in build-deb-obj/.
DEB_OUT ?= build-deb
deb:
	@scripts/install-deps deb
	rm -rf $(DEB_OUT) build-deb-obj && mkdir -p $(DEB_OUT)
	@# The package builds as a fresh tree would: not with a caller's make
	@# variables (make check-asan passes SAN=1 down to the tests).
	v=$$(dpkg-parsechangelog -S Version) out=$(abspath $(DEB_OUT)); \
	  env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u SAN -u BUILD \
	  FOLIOD_DEB_OUT=$$out dpkg-buildpackage -us -uc -b \
	    --buildinfo-option=-u$$out --changes-option=-u$$out \
	    --buildinfo-file=$$out/foliod_$${v}_amd64.buildinfo \
	    --changes-file=$$out/foliod_$${v}_amd64.changes
	@ls -l $(DEB_OUT)/*.deb

# The packages' contents, lintian, and a dpkg install/remove/purge cycle
# in a scratch root; also part of make check (tests/test-deb.sh runs make
# deb itself then).
check-deb: deb
	DEB_OUT=$(abspath $(DEB_OUT)) tests/test-deb.sh
