/*-------------------------------------------------------------------------
 *
 * task.h
 *	  Long flows.  Tasks leased to workers (task.c).
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_TASK_H
#define IDEM_TASK_H

extern void idem_task_init(void);
extern void idem_task_shmem_request(void);
extern void idem_task_shmem_startup(void);

#endif							/* IDEM_TASK_H */
