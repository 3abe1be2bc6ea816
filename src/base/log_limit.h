/*
 * log_limit.h
 *	  At most one failure line per class per retry_interval in each backend.
 */
#ifndef RL_LOG_LIMIT_H
#define RL_LOG_LIMIT_H

extern bool log_limit_allow(const char *line_class, int64 *held_back);

#endif							/* RL_LOG_LIMIT_H */
