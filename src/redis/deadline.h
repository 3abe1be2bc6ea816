/*
 * deadline.h
 *	  How long a call may wait for Redis: this session's deadlines, and the
 *	  server's own.
 */
#ifndef RL_DEADLINE_H
#define RL_DEADLINE_H

extern int	deadline_connect_timeout_ms;
extern int	deadline_command_timeout_ms;

extern void deadline_init(void);
extern Size deadline_shmem_size(void);
extern void deadline_shmem_init(void);
extern int	deadline_server_connect_timeout_ms(void);
extern int	deadline_server_command_timeout_ms(void);
extern int64 deadline_for_calls_us(int ncalls, int command_timeout_ms);

#endif							/* RL_DEADLINE_H */
