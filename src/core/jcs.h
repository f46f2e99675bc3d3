/*-------------------------------------------------------------------------
 *
 * jcs.h
 *	  RFC 8785 canonical JSON text.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_JCS_H
#define IDEM_JCS_H

#include "lib/stringinfo.h"
#include "utils/jsonb.h"

extern void idem_jcs_append_jsonb(StringInfo out, Jsonb *jb);
extern void idem_jcs_append_number(StringInfo out, double d);

#endif							/* IDEM_JCS_H */
