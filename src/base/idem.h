/*-------------------------------------------------------------------------
 *
 * idem.h
 *	  Constants of the idem extension: limits, SQLSTATEs, record statuses.
 *
 * Every module includes this; it pulls in no PostgreSQL subsystem.  Each
 * module has its own header for its types and functions.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_H
#define IDEM_H

/* Length of a lowercase hex SHA-256 digest, without the terminating NUL. */
#define IDEM_HASH_HEX_LEN		64
/* A request digest (SipHash-2-4-128 of its jsonb bytes) and its secret (1.13) */
#define IDEM_DIGEST_LEN			16
#define IDEM_DIGEST_SECRET_LEN	16

/* An idempotency key: ^[A-Za-z0-9_-]{16,128}$ */
#define IDEM_KEY_MIN_LEN		16
#define IDEM_KEY_MAX_LEN		128

/* An operation name: ^[A-Za-z0-9_.:-]{1,64}$ */
#define IDEM_OPERATION_MAX_LEN	64

/*
 * locktag_field4 of idem's advisory-style locks, telling them from user
 * advisory locks (visible in pg_locks): a key's claim, an outbox key's
 * commit order, an inbox message.
 */
#define IDEM_LOCK_CLASS_KEY		478
#define IDEM_LOCK_CLASS_OUTBOX	479
#define IDEM_LOCK_CLASS_INBOX	480
#define IDEM_LOCK_CLASS_OUTBOX_ALL	481	/* every key's commit order at once */
#define IDEM_LOCK_CLASS_TIMELINE	482	/* moving the sequences for a new timeline */

/* An outbox topic: ^[A-Za-z0-9_.:-]{1,128}$; publishers LISTEN on the channel. */
#define IDEM_TOPIC_MAX_LEN		128
#define IDEM_OUTBOX_CHANNEL		"idem_outbox"

/* Workers LISTEN here for NOTIFY idem_tasks, '<operation>' after a submit. */
#define IDEM_TASKS_CHANNEL		"idem_tasks"

/* A worker's name in a lease: 1 to 64 printable characters. */
#define IDEM_WORKER_MAX_LEN		64

/* SQLSTATEs of the protocol's own outcomes (class "IK": idempotency key). */
#define ERRCODE_IDEM_KEY_REUSED			MAKE_SQLSTATE('I','K','0','0','1')
#define ERRCODE_IDEM_IN_FLIGHT			MAKE_SQLSTATE('I','K','0','0','2')
#define ERRCODE_IDEM_NO_CLAIM			MAKE_SQLSTATE('I','K','0','0','3')
#define ERRCODE_IDEM_STALE_TOKEN		MAKE_SQLSTATE('I','K','0','0','4')
#define ERRCODE_IDEM_UNFINISHED_CLAIM	MAKE_SQLSTATE('I','K','0','0','5')
#define ERRCODE_IDEM_KEY_RUNNING		MAKE_SQLSTATE('I','K','0','0','6')
#define ERRCODE_IDEM_KEY_EXPIRED		MAKE_SQLSTATE('I','K','0','0','7')

/*
 * The status column of idempotency_record.  A record is written finished
 * (SUCCEEDED, or FAILED_FINAL for a deterministic 4xx failure) in the
 * transaction that executed.  A long flow commits PROCESSING, and between
 * attempts FAILED_RETRYABLE, until a worker finishes it.
 */
typedef enum IdemStatus
{
	IDEM_STATUS_PROCESSING,
	IDEM_STATUS_SUCCEEDED,
	IDEM_STATUS_FAILED_FINAL,
	IDEM_STATUS_FAILED_RETRYABLE,
	IDEM_STATUS_UNKNOWN			/* a value idem does not write */
} IdemStatus;

/* The status column's value of status. */
static inline const char *
idem_status_name(IdemStatus status)
{
	static const char *const names[] = {
		[IDEM_STATUS_PROCESSING] = "PROCESSING",
		[IDEM_STATUS_SUCCEEDED] = "SUCCEEDED",
		[IDEM_STATUS_FAILED_FINAL] = "FAILED_FINAL",
		[IDEM_STATUS_FAILED_RETRYABLE] = "FAILED_RETRYABLE",
		[IDEM_STATUS_UNKNOWN] = "UNKNOWN",
	};

	return names[status];
}

/* The IdemStatus of a status column value; IDEM_STATUS_UNKNOWN if none. */
static inline IdemStatus
idem_status_from_name(const char *name)
{
	for (int s = 0; s < IDEM_STATUS_UNKNOWN; s++)
		if (strcmp(name, idem_status_name((IdemStatus) s)) == 0)
			return (IdemStatus) s;
	return IDEM_STATUS_UNKNOWN;
}

/*
 * Is c a character of a name: an operation, topic or consumer
 * ([A-Za-z0-9_.:-])?  As idem_check_name (key.c) and the list of
 * idem.allowed_operations (binding.c) accept it.
 */
static inline bool
idem_name_char(char c)
{
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
		(c >= '0' && c <= '9') || c == '_' || c == '.' || c == ':' || c == '-';
}

#endif							/* IDEM_H */
