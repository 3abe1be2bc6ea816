/*
 * args.h
 *	  SQL arguments in, SQL values out: what every function of this layer
 *	  shares to read a (policy, subject, cost) call and to return a decision.
 */
#ifndef RL_ARGS_H
#define RL_ARGS_H

#include "fmgr.h"

#include "engine/decision.h"

extern void args_request(FunctionCallInfo fcinfo, LimitMode mode, DecisionRequest *request);
extern const Policy *args_policy_subject(FunctionCallInfo fcinfo, DecisionRequest *request);
extern int	args_array(FunctionCallInfo fcinfo, int argno, Oid type, const char *what,
					   Datum **values);
/*
 * A result row filled column by column, by name: the columns a function
 * returns differ between the extension's SQL versions, and until ALTER
 * EXTENSION UPDATE an older version's row type is the one to fill.
 */
typedef struct ArgsRow
{
	TupleDesc	desc;
	Datum	   *values;
	bool	   *nulls;			/* every column NULL until it is set */
} ArgsRow;

extern void args_row_start(ArgsRow *row, TupleDesc desc);
extern void args_row_set(ArgsRow *row, const char *column, Oid type, Datum value);
/* rl_decision's columns before 0.10 (which adds waited_ms). */
#define ARGS_DECISION_COLUMNS 8

extern void args_take_options(FunctionCallInfo fcinfo, int first, DecisionRequest *request);
extern void args_decision_values(const Decision *decision, TupleDesc desc, int first,
								 Datum *values, bool *nulls);
extern Datum args_decision_datum(FunctionCallInfo fcinfo, const Decision *decision);

#endif							/* RL_ARGS_H */
