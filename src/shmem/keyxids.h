/*-------------------------------------------------------------------------
 *
 * keyxids.h
 *	  The newest transaction to write a record under each bucket of keys,
 *	  in shared memory.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_KEYXIDS_H
#define IDEM_KEYXIDS_H

#include "storage/lock.h"

extern void idem_keyxids_shmem_request(void);
extern void idem_keyxids_shmem_startup(void);
extern void idem_keyxids_note(const LOCKTAG *key);
extern bool idem_keyxids_settled(const LOCKTAG *key, TransactionId xmin);

#endif							/* IDEM_KEYXIDS_H */
