# idem: PostgreSQL extension (PGXS)

MODULE_big = idem
OBJS = src/shared_library_init.o \
	src/storage/util.o src/storage/identity.o src/storage/sequence.o src/storage/rowwrite.o src/storage/citus_meta.o src/storage/catalog.o src/storage/catalog_row.o \
	src/citus/citus.o \
	src/shmem/stats.o src/shmem/notify.o \
	src/core/policy.o src/core/jcs.o src/core/fingerprint.o src/core/binding.o src/core/key.o src/core/record.o src/core/record_result.o src/core/history.o \
	src/core/claim.o src/core/pending.o src/core/call.o \
	src/process/cleanup.o src/process/worker.o src/process/launcher.o \
	src/api/order.o src/api/api.o src/api/outbox.o src/api/outbox_emit.o src/api/outbox_ack.o src/api/inbox.o \
	src/api/policies.o src/api/canonical.o src/api/audit.o src/api/maintenance.o src/api/statistics.o src/api/task.o src/api/task_sessions.o src/api/task_lease.o src/api/task_holder.o

EXTENSION = idem
DATA = idem--1.13.sql idem--1.0.sql idem--1.0--1.1.sql idem--1.1--1.2.sql idem--1.2--1.3.sql idem--1.3--1.4.sql idem--1.4--1.5.sql idem--1.5--1.6.sql idem--1.6--1.7.sql idem--1.7--1.8.sql idem--1.8--1.9.sql idem--1.9--1.10.sql idem--1.10--1.11.sql idem--1.11--1.12.sql idem--1.12--1.13.sql

IDEM_SRC_DIRS = src/base src/storage src/citus src/shmem src/core src/process src/api
PG_CPPFLAGS = $(addprefix -I$(srcdir)/,$(IDEM_SRC_DIRS))
# -Wextra less unused-parameter, which PostgreSQL's own headers raise
# (bufpage.h, ilist.h).  No -Werror here: a newer compiler's new warning must
# not stop a user's make install; the test command builds with COPT=-Werror.
PG_CFLAGS = -Wall -Wextra -Wno-unused-parameter

REGRESS = jcs jcs_numbers encoding order cleanup writes api policy retention headers tasks distribute outbox inbox health stats owners operations grant hijack scripts rename tempschema security upgrade
REGRESS_OPTS = --load-extension=idem --load-extension=pgcrypto

ISOLATION = claim-race-2 claim-race-3 in-flight-timeout policy-invalidation repeatable-read mismatch-race expired-race key-deadlock cleanup-skip-locked savepoint bypass-writer api-begin-race api-handler-race api-expired-cleanup outbox-fetch-race outbox-commit-order outbox-lease-lapse outbox-ack-emit-race outbox-ack-share inbox-race stats-waits task-lease-race task-submit-race task-takeover refuse-cleanup-race
ISOLATION_OPTS = --inputdir=test/isolation --outputdir=test/isolation --load-extension=idem

# the cleanup worker, restarts, crashes, a standby: PostgreSQL::Test::Cluster (t/*.pl)
TAP_TESTS = 1

# a VPATH build (pg_buildext, debian/rules) writes src/**/*.o in the build directory
ifdef VPATH
$(shell mkdir -p $(IDEM_SRC_DIRS))
endif

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)
