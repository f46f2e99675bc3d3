/*-------------------------------------------------------------------------
 *
 * worker.h
 *	  The cleanup background worker.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_WORKER_H
#define IDEM_WORKER_H

extern void idem_worker_define_gucs(void);
extern void idem_worker_init(void);
extern void idem_worker_shmem_request(void);
extern void idem_worker_shmem_startup(void);

#endif							/* IDEM_WORKER_H */
