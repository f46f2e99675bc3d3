/*-------------------------------------------------------------------------
 *
 * cleanup.h
 *	  Batch deletion of expired records.
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_CLEANUP_H
#define IDEM_CLEANUP_H

extern int64 idem_cleanup_batches(Oid nspid, int batch_size, int max_batches);

#endif							/* IDEM_CLEANUP_H */
