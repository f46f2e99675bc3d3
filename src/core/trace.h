/*
 * idem.trace_context: the W3C trace context of the caller's request, which
 * idem_outbox_emit copies into a message's headers and idem_submit into a
 * task's record (docs/reference.md).
 */
#ifndef IDEM_TRACE_H
#define IDEM_TRACE_H

#include "postgres.h"

/* "traceparent" is 55 characters: version, trace id, parent id, flags */
#define IDEM_TRACEPARENT_LEN 55

extern void idem_trace_init(void);
extern const char *idem_trace_context(void);

#endif
