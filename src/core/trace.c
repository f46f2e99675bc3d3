/*
 * idem.trace_context: a W3C traceparent ("00-<32 hex>-<16 hex>-<2 hex>"),
 * set by the libraries with SET LOCAL per request; empty: none.
 */
#include "postgres.h"

#include "utils/guc.h"

#include "trace.h"

static char *idem_trace_setting = NULL;

static bool
lower_hex(const char *s, int n, bool nonzero)
{
	bool		any = false;

	for (int i = 0; i < n; i++)
	{
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
		any |= s[i] != '0';
	}
	return any || !nonzero;
}

/* A traceparent of W3C Trace Context level 1: version 00 to fe, ids not all zero. */
static bool
check_trace_context(char **newval, void **extra, GucSource source)
{
	const char *v = *newval;

	if (v == NULL || v[0] == '\0')
		return true;
	if (strlen(v) != IDEM_TRACEPARENT_LEN || v[2] != '-' || v[35] != '-' || v[52] != '-' ||
		!lower_hex(v, 2, false) || strncmp(v, "ff", 2) == 0 ||
		!lower_hex(v + 3, 32, true) || !lower_hex(v + 36, 16, true) || !lower_hex(v + 53, 2, false))
	{
		GUC_check_errdetail("idem.trace_context is a W3C traceparent: 00-<32 lowercase hex digits>-<16 lowercase hex digits>-<2 hex digits>, the ids not all zeros.");
		return false;
	}
	return true;
}

/* The current trace context, or NULL when none is set. */
const char *
idem_trace_context(void)
{
	return (idem_trace_setting != NULL && idem_trace_setting[0] != '\0') ? idem_trace_setting : NULL;
}

void
idem_trace_init(void)
{
	DefineCustomStringVariable("idem.trace_context",
							   "The W3C traceparent of the request this transaction serves.",
							   "idem_outbox_emit copies it into a message's headers (\"traceparent\"), "
							   "idem_submit into the task's record; the libraries SET LOCAL it per request.",
							   &idem_trace_setting,
							   "",
							   PGC_USERSET,
							   0,
							   check_trace_context, NULL, NULL);
}
