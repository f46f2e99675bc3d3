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
#include "utils/numeric.h"

extern void idem_jcs_append_jsonb(StringInfo out, Jsonb *jb);
extern void idem_jcs_append_number(StringInfo out, double d);
extern bool idem_jcs_small_integer(Numeric num, int64 *value, bool *plain);
extern double idem_jcs_numeric_double(Numeric num);
extern void idem_jcs_clear_scale(Numeric num);
extern Jsonb *idem_jcs_normal_numbers(Jsonb *jb);

#endif							/* IDEM_JCS_H */
