/*-------------------------------------------------------------------------
 *
 * redact.h
 *	  What an operation's policy keeps out of every stored copy of an
 *	  answer: bodies, headers, a task's errors.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_REDACT_H
#define IDEM_REDACT_H

#include "utils/jsonb.h"

extern Datum idem_redact_json(const char *operation, Datum json_text);
extern Datum idem_redact_jsonb(const char *operation, Datum jsonb);
extern Datum idem_redact_headers(const char *operation, Datum jsonb);
extern Datum idem_redact_header_list(const char *operation, Datum json_text);

#endif							/* IDEM_REDACT_H */
