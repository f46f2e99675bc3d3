/*-------------------------------------------------------------------------
 *
 * notify.h
 *	  The outbox notifier.  NOTIFY idem_outbox after emitting commits.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_NOTIFY_H
#define IDEM_NOTIFY_H

/* What a notification announces: outbox messages of a topic, tasks of an operation. */
typedef enum IdemNotifyChannel
{
	IDEM_NOTIFY_OUTBOX,
	IDEM_NOTIFY_TASKS
} IdemNotifyChannel;

extern const char *idem_notify_channel_name(IdemNotifyChannel channel);
extern void idem_notify_shmem_request(void);
extern void idem_notify_shmem_startup(void);
extern bool idem_notify_defer(int ntopics);
extern void idem_notify_committed(IdemNotifyChannel channel,
								  const char *const *topics, int ntopics);
extern void idem_notify_aborted(int ntopics);

#endif							/* IDEM_NOTIFY_H */
