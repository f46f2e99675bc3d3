/*-------------------------------------------------------------------------
 *
 * idem.h
 *	  Declarations shared by the idem extension's source files.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_H
#define IDEM_H

#include "executor/spi.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "nodes/execnodes.h"
#include "utils/guc.h"
#include "utils/jsonb.h"

/* Length of a lowercase hex SHA-256 digest, without the terminating NUL. */
#define IDEM_HASH_HEX_LEN 64

/* SQLSTATEs of the protocol's own outcomes (class "IK": idempotency key). */
#define ERRCODE_IDEM_KEY_REUSED			MAKE_SQLSTATE('I','K','0','0','1')
#define ERRCODE_IDEM_IN_FLIGHT			MAKE_SQLSTATE('I','K','0','0','2')

/* GUCs (idem.c) */
extern int	idem_wait_timeout;		/* ms a duplicate waits for an in-flight original */
extern int	idem_ttl;				/* seconds a record lives */
extern int	idem_cleanup_interval;	/* seconds between cleanup rounds, 0 = off */
extern int	idem_cleanup_batch_size;	/* rows per cleanup transaction */
extern int	idem_cleanup_max_batches;	/* per database and round, 0 = no limit */
extern int	idem_cleanup_batch_delay;	/* ms the worker pauses between batches */
extern char *idem_cleanup_databases;	/* databases to clean, empty = all */

/* jcs.c: RFC 8785 canonical JSON and SHA-256 */
extern void idem_jcs_append_jsonb(StringInfo out, Jsonb *jb);
extern void idem_jcs_append_number(StringInfo out, double d);
extern void idem_sha256_hex(const char *data, size_t len, char *hex);

/* protocol.c: input checks and SPI helpers */
extern void idem_check_not_null(FunctionCallInfo fcinfo, int argno, const char *argname);
extern void idem_check_key(const char *key, int len);
extern SPIPlanPtr idem_prepare_kept(const char *sql, int nargs, Oid *argtypes);
extern void idem_free_kept(SPIPlanPtr *plan);
extern Oid	idem_extension_schema(FunctionCallInfo fcinfo);
extern char *idem_quoted_schema(Oid nspid);

/* rowwrite.c: inserts without a plan, for the hot path */
#define IDEM_ROWS_MAX_RELS 2

typedef struct IdemRows
{
	EState	   *estate;
	int			nrels;
	ResultRelInfo *rels[IDEM_ROWS_MAX_RELS];
	TupleTableSlot *slots[IDEM_ROWS_MAX_RELS];
	bool		snapshot_pushed;	/* for the triggers */
} IdemRows;

extern void idem_rows_begin(IdemRows *rows, const Oid *relids, int nrels);
extern void idem_rows_insert(IdemRows *rows, int i, const Datum *values, const bool *nulls);
extern void idem_rows_end(IdemRows *rows);

/* cleanup.c */
extern int64 idem_cleanup_batches(Oid nspid, int batch_size, int max_batches);

/* worker.c: the cleanup background worker */
extern void idem_worker_init(void);
extern bool idem_check_cleanup_databases(char **newval, void **extra, GucSource source);

#endif							/* IDEM_H */
