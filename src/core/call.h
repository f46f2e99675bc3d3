/*-------------------------------------------------------------------------
 *
 * call.h
 *	  The preamble every entry point that claims (owner, operation, key)
 *	  shares: idem_begin, idem_run, idem_submit (call.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CALL_H
#define IDEM_CALL_H

#include "fmgr.h"
#include "utils/jsonb.h"

#include "catalog.h"
#include "fingerprint.h"
#include "key.h"

/* The request is the argument after owner, operation and key. */
#define IDEM_CALL_REQUEST_ARG	3

/* One call, once its arguments are checked. */
typedef struct IdemCall
{
	IdemScope	scope;
	IdemCatalog cat;			/* a copy, since a nested call may build the catalog again */
	TimestampTz now;			/* the transaction's start */
	Interval   *ttl;			/* the ttl argument, or NULL for idem.ttl */
	Jsonb	   *request;
	IdemRequestPrint print;		/* the request's fingerprint and digest, when asked */
} IdemCall;

extern bool idem_call_begin(IdemCall *call, FunctionCallInfo fcinfo, int required_argno,
							const char *required_name, int ttl_argno);

#endif							/* IDEM_CALL_H */
