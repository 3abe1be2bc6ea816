/*
 * observe.h
 *	  The observation layer: what the engine reports goes to the statistics,
 *	  the health lines and the decision log.
 */
#ifndef RL_OBSERVE_H
#define RL_OBSERVE_H

extern void observe_init(bool preloaded);

#endif							/* RL_OBSERVE_H */
