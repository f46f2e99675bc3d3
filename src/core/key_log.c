/*-------------------------------------------------------------------------
 *
 * key_log.c
 *	  What a call did with its key.  Counted in idem_stats, and logged as
 *	  idem.log_outcomes asks, an execution's line at its commit.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "idem.h"
#include "key.h"
#include "stats.h"

/* idem.log_outcomes */
typedef enum
{
	LOG_OUTCOMES_OFF,
	LOG_OUTCOMES_CONFLICTS,
	LOG_OUTCOMES_ALL
} LogOutcomes;

static const struct config_enum_entry log_outcomes_options[] = {
	{"off", LOG_OUTCOMES_OFF, false},
	{"conflicts", LOG_OUTCOMES_CONFLICTS, false},
	{"all", LOG_OUTCOMES_ALL, false},
	{NULL, 0, false}
};

static int	idem_note_outcomes = LOG_OUTCOMES_OFF;

static void log_xact_callback(XactEvent event, void *arg);
static void log_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
								 SubTransactionId parentSubid, void *arg);

/* Define idem.log_outcomes, and the callbacks of the deferred log lines. */
void
idem_key_log_init(void)
{
	DefineCustomEnumVariable("idem.log_outcomes",
							 "Which calls log one line with their owner, operation, key, resource and outcome.",
							 "off; conflicts: refused keys (IK001, IK002); all: every call, "
							 "executed and replayed ones too.",
							 &idem_note_outcomes,
							 LOG_OUTCOMES_OFF,
							 log_outcomes_options,
							 PGC_SUSET,
							 0,
							 NULL, NULL, NULL);
	RegisterXactCallback(log_xact_callback, NULL);
	RegisterSubXactCallback(log_subxact_callback, NULL);
}

/*
 * The LOG lines of executions (idem.log_outcomes = all) wait for their
 * transaction's commit.  An execution that rolls back was never one.
 * A savepoint rolled back drops its lines; one released hands them up.
 * Past LOG_DEFERRED_MAX lines in one transaction, and at PREPARE
 * TRANSACTION, a line is logged at once with outcome "claimed".
 */
#define LOG_DEFERRED_MAX	10000

typedef struct DeferredLog
{
	char	   *line;			/* "owner ... resource ...", without its outcome */
	SubTransactionId subid;
	struct DeferredLog *next;
} DeferredLog;

static DeferredLog *deferred = NULL;
static int	ndeferred = 0;

static void
log_outcome_line(const char *line, const char *outcome)
{
	ereport(LOG,
			(errmsg("idem: %s outcome %s", line, outcome),
			 errhidestmt(true),
			 errhidecontext(true)));
}

/*
 * Log (at commit, with outcome) or drop (at abort, outcome NULL) the
 * transaction's deferred lines, oldest first.
 */
static void
end_deferred(const char *outcome)
{
	DeferredLog *list = NULL;

	/* the list is newest first, so reverse it */
	while (deferred != NULL)
	{
		DeferredLog *next = deferred->next;

		deferred->next = list;
		list = deferred;
		deferred = next;
	}
	for (DeferredLog *d = list; d != NULL;)
	{
		DeferredLog *next = d->next;

		if (outcome != NULL)
			log_outcome_line(d->line, outcome);
		pfree(d->line);
		pfree(d);
		d = next;
	}
	ndeferred = 0;
}

static void
log_xact_callback(XactEvent event, void *arg)
{
	if (deferred == NULL)
		return;
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_PARALLEL_COMMIT)
		end_deferred("executed");
	else if (event == XACT_EVENT_PREPARE)
		end_deferred("claimed");
	else if (event == XACT_EVENT_ABORT || event == XACT_EVENT_PARALLEL_ABORT)
		end_deferred(NULL);
}

static void
log_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					 SubTransactionId parentSubid, void *arg)
{
	DeferredLog **link = &deferred;

	if (event != SUBXACT_EVENT_ABORT_SUB && event != SUBXACT_EVENT_COMMIT_SUB)
		return;
	while (*link != NULL)
	{
		DeferredLog *d = *link;

		if (d->subid == mySubid && event == SUBXACT_EVENT_ABORT_SUB)
		{
			*link = d->next;
			pfree(d->line);
			pfree(d);
			ndeferred--;
			continue;
		}
		if (d->subid == mySubid)
			d->subid = parentSubid;
		link = &d->next;
	}
}

/*
 * Count what a call did with its key in idem_stats, and log it at LOG if
 * idem.log_outcomes asks for it: owner, operation, key, resource id,
 * outcome; an execution's line at its commit.  Only a key that passed
 * idem_check_key gets here, so the key printed is never an invalid one (it
 * holds only [A-Za-z0-9_-]).
 */
void
idem_note_outcome(const IdemScope *scope, IdemOutcomeLog outcome,
				 bool has_resource, int64 resource_id)
{
	static const char *const names[] = {
		[IDEM_LOG_EXECUTED] = "executed",
		[IDEM_LOG_REPLAYED] = "replayed",
		[IDEM_LOG_CONFLICT] = "conflict",
		[IDEM_LOG_IN_FLIGHT] = "in_flight",
		[IDEM_LOG_EXPIRED] = "expired",
	};
	char		resource[32] = "-";
	char	   *line;
	DeferredLog *d;

	/* what the call wrote counts once it commits; what it saw, at once */
	if (outcome == IDEM_LOG_EXECUTED)
		idem_stats_count_at_commit(IDEM_KIND_OPERATION, scope->operation, IDEM_STAT_EXECUTED, 1);
	else
		idem_stats_count(IDEM_KIND_OPERATION, scope->operation,
						 outcome == IDEM_LOG_REPLAYED ? IDEM_STAT_REPLAYED :
						 outcome == IDEM_LOG_IN_FLIGHT ? IDEM_STAT_IN_FLIGHT :
						 IDEM_STAT_CONFLICTS, 1);

	if (idem_note_outcomes == LOG_OUTCOMES_OFF ||
		(idem_note_outcomes == LOG_OUTCOMES_CONFLICTS &&
		 outcome != IDEM_LOG_CONFLICT && outcome != IDEM_LOG_IN_FLIGHT &&
		 outcome != IDEM_LOG_EXPIRED))
		return;
	if (has_resource)
		snprintf(resource, sizeof(resource), INT64_FORMAT, resource_id);
	line = psprintf("owner " INT64_FORMAT " operation %s key %s resource %s",
					scope->owner, scope->operation, scope->key, resource);
	if (outcome != IDEM_LOG_EXECUTED || ndeferred >= LOG_DEFERRED_MAX)
	{
		log_outcome_line(line, outcome == IDEM_LOG_EXECUTED ? "claimed" : names[outcome]);
		return;
	}
	d = MemoryContextAlloc(TopTransactionContext, sizeof(DeferredLog));
	d->line = MemoryContextStrdup(TopTransactionContext, line);
	d->subid = GetCurrentSubTransactionId();
	d->next = deferred;
	deferred = d;
	ndeferred++;
}
