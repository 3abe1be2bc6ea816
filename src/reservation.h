/*
 * reservation.h
 *	  Budget that follows the transaction: rl_reserve's tokens come back on rollback.
 */
#ifndef RL_RESERVATION_H
#define RL_RESERVATION_H

extern void reservation_init(void);

#endif							/* RL_RESERVATION_H */
