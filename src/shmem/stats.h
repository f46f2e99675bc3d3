/*-------------------------------------------------------------------------
 *
 * stats.h
 *	  Counters per (database, kind, name) in shared memory.  idem_stats.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_STATS_H
#define IDEM_STATS_H

/* The counters, in the order of the idem_stats view's columns. */
typedef enum IdemCounter
{
	IDEM_STAT_CALLS,
	IDEM_STAT_EXECUTED,
	IDEM_STAT_REPLAYED,
	IDEM_STAT_CONFLICTS,
	IDEM_STAT_IN_FLIGHT,
	IDEM_STAT_WAITS,
	IDEM_STAT_RENEWED,
	IDEM_STAT_FAILED_FINAL,
	IDEM_STAT_LEASES,
	IDEM_STAT_TAKEOVERS,
	IDEM_STAT_STALE_TOKENS,
	IDEM_STAT_RETRIES,
	IDEM_STAT_OUTBOX_EMITTED,
	IDEM_STAT_OUTBOX_ACKED,
	IDEM_STAT_INBOX_DUPLICATES,
	IDEM_STAT_CLEANUP_DELETED,
	IDEM_STAT_NCOUNTERS
} IdemCounter;

/* What a row of idem_stats counts for, its kind column. */
typedef enum IdemStatKind
{
	IDEM_KIND_NONE,				/* the "(other)" row */
	IDEM_KIND_OPERATION,
	IDEM_KIND_TOPIC,
	IDEM_KIND_CONSUMER
} IdemStatKind;

extern void idem_stats_define_gucs(void);
extern void idem_stats_init(void);
extern void idem_stats_shmem_request(void);
extern void idem_stats_shmem_startup(void);
/*
 * What idem_stats_visit hands over for each entry.  Its database (InvalidOid
 * for a cluster-wide one), name and kind (NULL for an operation), its
 * counters, and when they were last reset.
 */
typedef void (*IdemStatsVisit) (Oid dbid, const char *name, const char *kind,
								const uint64 *counters, TimestampTz reset_at, void *arg);

extern void idem_stats_visit(IdemStatsVisit visit, void *arg);
extern void idem_stats_reset_all(void);
extern void idem_stats_count(IdemStatKind kind, const char *name, IdemCounter counter, int64 n);
extern void idem_stats_count_at_commit(IdemStatKind kind, const char *name, IdemCounter counter,
									   int64 n);

#endif							/* IDEM_STATS_H */
