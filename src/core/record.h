/*-------------------------------------------------------------------------
 *
 * record.h
 *	  The idempotency_record row.  Read through the scope index, probed
 *	  for rows committed since, written (finished), and replaced when
 *	  expired.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_RECORD_H
#define IDEM_RECORD_H

#include "datatype/timestamp.h"
#include "access/skey.h"
#include "storage/itemptr.h"
#include "utils/relcache.h"

#include "catalog.h"
#include "fingerprint.h"
#include "key.h"
#include "rowwrite.h"

/* What a record stores and a replay returns. */
typedef struct IdemResult
{
	int32		http_status;
	bool		http_isnull;
	Datum		body;			/* json, as the caller gave it */
	bool		body_isnull;
	Datum		snapshot;		/* jsonb: response_json, the order demo's */
	bool		snapshot_isnull;
	Datum		headers;		/* jsonb object of strings */
	bool		headers_isnull;
	Datum		header_list;	/* json: an object or [name, value] pairs, as given */
	bool		has_header_list;
	int64		resource_id;
	bool		resource_isnull;
} IdemResult;

/* The key's record as a read found it. */
typedef struct IdemRecord
{
	ItemPointerData tid;
	int64		id;
	bool		is_task;		/* written by idem_submit */
	bool		uncertain;		/* a task whose outcome is being reconciled */
	IdemFingerprint request_hash;
	int			fp_version;		/* request_hash's secret; 0: plain SHA-256 */
	bool		has_digest;		/* request_digest is set */
	uint8		digest[IDEM_DIGEST_LEN];	/* keyed with fp_version's secret */
	IdemStatus	status;
	bool		expired;		/* expires_at < now */
	TimestampTz created_at;
	TimestampTz updated_at;
	TimestampTz expires_at;
	IdemResult	result;			/* the stored response, copied */
	bool		written_here;	/* inserted by this transaction */
	TransactionId read_xmin;	/* the xmin of the snapshot that read it, or
								 * found nothing */
	bool		read_clean;		/* that read met no index entry of the key */
} IdemRecord;

/* What a dirty look at a key's rows found (idem_record_probe). */
typedef enum IdemProbe
{
	IDEM_PROBE_NONE,			/* no row */
	IDEM_PROBE_FOUND,			/* a row no running transaction is writing */
	IDEM_PROBE_BUSY				/* a row another transaction is still
								 * inserting or deleting */
} IdemProbe;

/*
 * A business row written in the same IdemRows as the record, before it:
 * table is an index into IdemCatalog.tables; write inserts rows->rels[1]
 * and completes the result from the row as stored (a BEFORE trigger may
 * have changed it), so that the record stores what the call answers.
 */
typedef struct IdemBusinessWrite
{
	int			table;
	void		(*write) (IdemRows *rows, void *arg, IdemResult *res);
	void	   *arg;
} IdemBusinessWrite;

/* What idem_submit writes on a new record besides its status, the task. */
typedef struct IdemTaskNew
{
	Datum		request;		/* jsonb */
	Datum		payload;		/* jsonb, or 0 for NULL */
	const Interval *ttl;		/* of the finished record; NULL: the defaults */
	const char *trace_context;	/* the submitter's W3C traceparent, or NULL */
} IdemTaskNew;

extern int	idem_ttl;
extern int	idem_failure_ttl;
extern int	idem_max_ttl;

extern void idem_record_init(void);
extern IdemStatus idem_result_make(IdemResult *res, bool http_isnull, int32 http_status,
								   bool body_isnull, Datum body, bool headers_isnull,
								   Datum headers, bool resource_isnull, int64 resource_id);
extern void idem_result_set_header_list(IdemResult *res, Datum header_list);
extern void idem_result_values(const IdemResult *res, Datum *values, bool *nulls);
extern Datum idem_result_header_list(const IdemResult *res, bool *isnull);
extern Datum idem_result_headers_of_list(Datum json_text);
extern TimestampTz idem_record_expiry(IdemStatus status, TimestampTz now, const Interval *ttl,
									  const char *operation);
extern TimestampTz idem_timestamp_plus(TimestampTz now, const Interval *ttl);
extern TimestampTz idem_plus_positive(TimestampTz now, const Interval *iv, const char *what);
extern TimestampTz idem_check_ttl(const Interval *ttl, TimestampTz now);
extern Interval *idem_ttl_arg(FunctionCallInfo fcinfo, int argno, TimestampTz now);
extern void idem_scope_scan_keys(ScanKey skey, Relation index, const IdemScope *scope);
extern bool idem_record_read(const IdemCatalog *cat, const IdemScope *scope,
							 TimestampTz now, IdemRecord *rec);
extern IdemProbe idem_record_probe(const IdemCatalog *cat, const IdemScope *scope,
									TransactionId *busy);
extern IdemRowDeletion idem_record_delete_expired(const IdemCatalog *cat, const IdemRecord *rec);
extern int64 idem_record_insert(const IdemCatalog *cat, const IdemScope *scope,
							   IdemRequestPrint *print, IdemStatus status,
							   IdemResult *res, TimestampTz now,
							   TimestampTz expires, const IdemBusinessWrite *biz,
							   const IdemTaskNew *task);

#endif							/* IDEM_RECORD_H */
