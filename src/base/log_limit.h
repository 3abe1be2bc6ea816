/*
 * log_limit.h
 *	  At most one failure line per class and interval in each backend.
 */
#ifndef RL_LOG_LIMIT_H
#define RL_LOG_LIMIT_H

extern bool log_limit_allow(const char *line_class, int64 interval_ms, int64 *held_back);

#endif							/* RL_LOG_LIMIT_H */
