/*-------------------------------------------------------------------------
 *
 * worker.h
 *	  The cleanup background worker.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_WORKER_H
#define IDEM_WORKER_H

#define IDEM_ERROR_LEN 256

/* What the worker did in one database since the server started. */
typedef struct IdemDbStatus
{
	Oid			datid;			/* hash key */
	NameData	datname;
	TimestampTz last_run_started;
	TimestampTz last_run_finished;	/* 0 while a run is in progress */
	int64		last_run_deleted;
	int64		total_deleted;	/* since the server started */
	int64		runs;
	TimestampTz last_error_at;	/* 0 if none since the server started */
	char		last_error[IDEM_ERROR_LEN];
} IdemDbStatus;

typedef void (*IdemWorkerStatusVisit) (const IdemDbStatus *status, void *arg);

extern void idem_worker_define_gucs(void);
extern void idem_worker_init(void);
extern void idem_worker_shmem_request(void);
extern void idem_worker_shmem_startup(void);
extern bool idem_worker_preloaded(void);
extern void idem_worker_status_visit(IdemWorkerStatusVisit visit, void *arg);

#endif							/* IDEM_WORKER_H */
