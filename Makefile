# idem: PostgreSQL extension (PGXS)

MODULE_big = idem
OBJS = idem.o src/protocol.o src/jcs.o src/cleanup.o

EXTENSION = idem
DATA = idem--1.0.sql

PG_CPPFLAGS = -I$(srcdir)/src
# -Wextra without the two warnings PostgreSQL's own headers and fmgr macros raise
PG_CFLAGS = -Wall -Wextra -Werror -Wno-unused-parameter -Wno-missing-field-initializers

REGRESS = jcs jcs_numbers order cleanup security
REGRESS_OPTS = --load-extension=idem --load-extension=pgcrypto

ISOLATION = claim-race-2 claim-race-3 in-flight-timeout repeatable-read mismatch-race expired-race key-deadlock cleanup-skip-locked
ISOLATION_OPTS = --inputdir=test/isolation --outputdir=test/isolation --load-extension=idem

PG_CONFIG ?= pg_config
PGXS := $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)
