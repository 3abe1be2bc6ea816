/*
 * exchange.h
 *	  One exchange with Redis: commands out, replies in, one deadline.
 */
#ifndef RL_EXCHANGE_H
#define RL_EXCHANGE_H

#include "lib/stringinfo.h"

#include "redis/failure.h"
#include "redis/resp.h"
#include "redis/stream.h"

/* Handles one reply of an exchange: index is its place among the replies awaited. */
typedef void (*ExchangeReplyHandler) (int index, const RespValue *reply, void *arg);

extern StringInfo exchange_output(void);
extern bool exchange_run(RedisStream *stream, int nreplies, int64 deadline, int64 idle_us,
						 ExchangeReplyHandler handler, void *arg, RedisFailure *failure);
extern void exchange_reset(void);
extern bool exchange_left_over(void);
extern void exchange_reply_bytes(const char **start, size_t *length);

#endif							/* RL_EXCHANGE_H */
