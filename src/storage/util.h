/*-------------------------------------------------------------------------
 *
 * util.h
 *	  fmgr and SPI helpers shared by idem's modules.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_UTIL_H
#define IDEM_UTIL_H

#include "executor/spi.h"
#include "fmgr.h"

extern void idem_check_not_null(FunctionCallInfo fcinfo, int argno, const char *argname);
extern SPIPlanPtr idem_prepare_kept(const char *sql, int nargs, Oid *argtypes);
extern void idem_free_kept(SPIPlanPtr *plan);
extern Oid	idem_function_tables_schema(FunctionCallInfo fcinfo);
extern char *idem_quoted_schema(Oid nspid);
extern bool idem_extension_row(Oid *nspid, Oid *owner);

#endif							/* IDEM_UTIL_H */
