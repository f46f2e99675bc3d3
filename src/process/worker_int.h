/*-------------------------------------------------------------------------
 *
 * worker_int.h
 *	  What the cleanup worker (worker.c) and its launcher (launcher.c)
 *	  share.  The launcher's settings and the per-database status.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_WORKER_INT_H
#define IDEM_WORKER_INT_H

#include "nodes/pg_list.h"
#include "utils/guc.h"

/* A database the launcher visits in a round. */
typedef struct IdemDatabase
{
	Oid			oid;
	NameData	name;
} IdemDatabase;

/* GUC variables the launcher reads */
extern int	idem_cleanup_interval;
extern char *idem_cleanup_databases;
extern int	idem_cleanup_database_timeout;

extern bool idem_check_cleanup_databases(char **newval, void **extra, GucSource source);
extern void idem_worker_status_record_error(Oid datid, const char *error);
extern void idem_worker_status_forget_others(List *databases);
extern void idem_worker_reload_config_if_asked(void);

#endif							/* IDEM_WORKER_INT_H */
