# idem: PostgreSQL extension (PGXS)

MODULE_big = idem
OBJS = idem.o \
	src/storage/util.o src/storage/identity.o src/storage/sequence.o src/storage/rowwrite.o src/storage/citus_meta.o src/storage/catalog.o src/storage/catalog_row.o src/storage/catalog_secret.o \
	src/citus/citus.o \
	src/shmem/stats.o src/shmem/keycheck.o src/shmem/keyxids.o src/shmem/notify.o \
	src/core/policy.o src/core/redact.o src/core/jcs.o src/core/jcs_number.o src/core/jcs_normal.o src/core/sha256.o src/core/siphash.o src/core/fingerprint.o src/core/fingerprint_print.o src/core/binding.o src/core/trace.o src/core/key.o src/core/key_spelling.o src/core/key_log.o src/core/record.o src/core/record_result.o src/core/history.o \
	src/core/claim.o src/core/pending.o src/core/call.o \
	src/process/cleanup.o src/process/worker.o src/process/launcher.o \
	src/api/order.o src/api/api.o src/api/outbox.o src/api/outbox_emit.o src/api/outbox_ack.o src/api/inbox.o \
	src/api/policies.o src/api/canonical.o src/api/audit.o src/api/maintenance.o src/api/statistics.o src/api/task.o src/api/task_sessions.o src/api/task_lease.o src/api/task_holder.o src/api/task_attempt.o src/api/task_record.o src/api/task_operator.o

EXTENSION = idem
# The extension's scripts are in extension/: the install script of the
# current version is built from extension/idem.sql, the readable current
# schema (as pgvector builds sql/vector.sql); the first release's install
# script and the update scripts sit beside it, found by their names.
IDEM_DIR := $(dir $(firstword $(MAKEFILE_LIST)))
EXTVERSION := $(shell sed -n "s/^default_version = '\(.*\)'/\1/p" $(IDEM_DIR)idem.control)
DATA_built = extension/idem--$(EXTVERSION).sql
DATA = $(filter-out $(DATA_built),$(patsubst $(IDEM_DIR)%,%,$(wildcard $(IDEM_DIR)extension/idem--*.sql)))

IDEM_SRC_DIRS = src/base src/storage src/citus src/shmem src/core src/process src/api
PG_CPPFLAGS = $(addprefix -I$(srcdir)/,$(IDEM_SRC_DIRS))
# -Wextra less unused-parameter, which PostgreSQL's own headers raise
# (bufpage.h, ilist.h).  No -Werror here: a newer compiler's new warning must
# not stop a user's make install; the test command builds with COPT=-Werror.
PG_CFLAGS = -Wall -Wextra -Wno-unused-parameter

# The tests, as contrib keeps them: sql/ and expected/ at the top are
# pg_regress's (its default --inputdir); test/specs holds the isolation
# specs, their expected output in test/expected; test/t the TAP tests.
# The lists are in the order the suites run; test/lint.sh fails if a test
# file is missing from them.
REGRESS = jcs jcs_numbers encoding order cleanup writes api digest policy key_spellings redact task_lapses erasure retention headers tasks task_reconcile trace_context operator distribute outbox dead_letters inbox health stats owners operations grant hijack scripts rename tempschema security invalidation upgrade
REGRESS_OPTS = --load-extension=idem --load-extension=pgcrypto

ISOLATION = claim-race-2 claim-race-3 in-flight-timeout policy-invalidation key-spelling-race repeatable-read mismatch-race expired-race expired-wait expired-archive-race key-deadlock cleanup-skip-locked savepoint bypass-writer claim-window api-begin-race api-handler-race api-expired-cleanup outbox-fetch-race outbox-commit-order outbox-lease-lapse outbox-ack-emit-race outbox-cross-keys outbox-nack-emit-race outbox-ack-share inbox-race stats-waits task-lease-race task-submit-race task-takeover task-uncertain-race refuse-cleanup-race
ISOLATION_OPTS = --inputdir=$(srcdir)/test --outputdir=test/output_iso --load-extension=idem

# the cleanup worker, restarts, crashes, a standby: PostgreSQL::Test::Cluster
TAP_TESTS = 1
PROVE_TESTS ?= test/t/*.pl

EXTRA_CLEAN = test/output_iso

# a VPATH build (pg_buildext, debian/rules) writes src/**/*.o in the build directory
ifdef VPATH
$(shell mkdir -p $(IDEM_SRC_DIRS) extension)
endif

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

extension/idem--$(EXTVERSION).sql: extension/idem.sql
	cp $< $@
