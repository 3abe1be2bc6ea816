/*
 * observe.h
 *	  The observation layer: what the engine reports goes to the statistics,
 *	  the top subjects, the health lines and the decision log; the shared
 *	  memory of the first two.
 */
#ifndef RL_OBSERVE_H
#define RL_OBSERVE_H

extern void observe_init(bool preloaded);
extern Size observe_shmem_size(void);
extern void observe_shmem_request(void);
extern void observe_shmem_init(void);

#endif							/* RL_OBSERVE_H */
