/*
 * group.c
 *	  Several checks (a tenant's and a user's, say) taken in one atomic step,
 *	  all granted or none charged: what rl_consume_all decides.
 *
 * Redis runs every check in one script call, which is atomic only when every
 * key lives on one node: in Redis Cluster, in one hash slot. So the subjects of
 * one call must share a hash tag: write related subjects as "tenant/user", whose
 * tag is "tenant" (subject.c). Checks that could not be atomic there are refused.
 *
 * While Redis cannot answer, each check's fail mode decides and the group is
 * still all or nothing: any 'closed' check denies the whole group, 'local'
 * checks take from their local buckets and give back what they took if a later
 * one is short.
 */
#include "prelude.h"

#include "base/clock.h"
#include "engine/decide.h"
#include "engine/group.h"
#include "policy/placement.h"
#include "engine/observer.h"
#include "policy/subject.h"
#include "redis/breaker.h"

/* The checks of one call. */
typedef struct Group
{
	int			count;
	DecisionRequest *requests;
	Decision   *decisions;
	bool	   *fixed;			/* decided without a bucket (decision_fixed): not in Redis */
	int			asked;			/* checks that go to Redis */
	int64		round_trip_us;	/* of the last call to Redis; -1: none */
	int64		retry_after_ms; /* Redis did not answer: until its node is tried again */
} Group;

/*
 * Runs every check that needs a bucket in one call of the group script (KEYS:
 * each check's keys; ARGV: the clock, then each check's algorithm tag and
 * numbers); true with their decisions filled when Redis answered. A group
 * with a request id (its first check carries it) is made once per id
 * (lua/once.lua), remembered beside its first asked check's key (the checks
 * share a slot) for that check's policy's replay_window.
 */
static int
group_target(const Group *group)
{
	int			target = -1;

	for (int i = 0; i < group->count; i++)
	{
		const DecisionRequest *request = &group->requests[i];

		if (group->fixed[i])
			continue;
		placement_refuse_split(&request->policy, "rl_consume_all");
		if (target >= 0 && request->target != target)
			ereport(ERROR,
					(errhidestmt(true),
					 errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("the checks of one rl_consume_all must be decided in one Redis"),
					 errdetail("Policy \"%s\" decides in another region's Redis than the checks before it.",
							   request->policy.name),
					 errhint("Group only policies with the same region_mode and home_region.")));
		target = request->target;
	}
	return Max(target, 0);
}

static bool
group_redis(Group *group, RedisFailure *failure)
{
	bool		answered;
	const char **keys = palloc((1 + LIMIT_MAX_KEYS * group->asked) * sizeof(char *));
	const char **args = palloc((2 + (1 + LIMIT_MAX_ARGS) * group->asked) * sizeof(char *));
	const char *request_id = group->requests[0].request_id;
	const char *once_key = NULL;
	int64		once_ms = 0;
	RedisCall	call = {0};
	int			n = 0;

	args[call.nargs++] = clock_test_ms();
	for (int i = 0; i < group->count; i++)
	{
		const DecisionRequest *request = &group->requests[i];
		const LimitParams *params = &request->policy.bucket;
		const LimitOps *ops = limit_ops(params);
		LimitCall	part = {0};

		if (group->fixed[i])
			continue;
		ops->group_part(params, decision_key(request), request->cost, request_at_ms(request),
						&part);
		if (request_id != NULL && once_key == NULL)
		{
			once_key = psprintf("%s:request:%s", decision_key(request), request_id);
			once_ms = request->policy.replay_window_ms;
		}
		memcpy(&keys[call.nkeys], part.keys, part.nkeys * sizeof(char *));
		call.nkeys += part.nkeys;
		args[call.nargs++] = psprintf("%d", part.tag != 0 ? part.tag : ops->tag);
		memcpy(&args[call.nargs], part.args, part.nargs * sizeof(char *));
		call.nargs += part.nargs;
		n++;
	}
	call.script = limit_group_script();
	call.target = group_target(group);
	call.nresults = 4 * n;
	if (once_key != NULL)
	{
		call.script = call.script->once;
		keys[call.nkeys++] = once_key;
		args[call.nargs++] = psprintf(INT64_FORMAT, once_ms);
		call.nresults++;
	}
	call.keys = keys;
	call.args = args;
	call.results = palloc(call.nresults * sizeof(long long));
	answered = redis_run_scripts(&call, 1, 0, failure);
	group->round_trip_us = call.round_trip_us;
	group->retry_after_ms = call.retry_after_ms;
	if (!answered)
		return false;
	*failure = call.failure;
	if (!call.answered)
		return false;
	if (once_key != NULL && call.results[4 * n] != 0 && call.results[4 * n] != 1)
		return redis_fail(failure, REDIS_FAILURE_PROTOCOL, "unexpected reply");
	n = 0;
	for (int i = 0; i < group->count; i++)
	{
		if (group->fixed[i])
			continue;
		if (!decision_from_reply(&call.results[4 * n++], false, &group->decisions[i], failure))
			return false;
		if (once_key != NULL && call.results[call.nresults - 1] == 1)
			group->decisions[i].source = DECISION_SOURCE_REPLAY;
	}
	return true;
}

/* True when Redis denied the group and every check that was short is a shadow one. */
static bool
group_only_shadow_short(const Group *group)
{
	bool		any_short = false;

	for (int i = 0; i < group->count; i++)
	{
		const Decision *decision = &group->decisions[i];

		if (group->fixed[i] || decision->allowed || decision->retry_after_ms == 0)
			continue;
		if (group->requests[i].policy.mode != POLICY_MODE_SHADOW)
			return false;
		any_short = true;
	}
	return any_short;
}

/*
 * Decides the group by each check's fail mode (decision_by_fail_mode), all
 * or nothing: an enforced check denied (by 'closed', or by its local bucket)
 * denies the group, and what the local buckets took before it goes back.
 * Shadow checks that are denied wait for their mode; checks decided without
 * a bucket (disabled, an 'allow' override) never deny.
 */
static void
group_fail_mode(Group *group)
{
	int			denied_by = -1;
	int64		now_ms = clock_now_ms();

	/* A check that 'closed' denies denies the group before any local bucket is touched. */
	for (int i = 0; i < group->count && denied_by < 0; i++)
	{
		const DecisionRequest *request = &group->requests[i];

		if (!group->fixed[i] && request->policy.fail_mode != FAIL_MODE_OPEN &&
			request->policy.mode == POLICY_MODE_ENFORCE && !decision_local_possible(request))
			denied_by = 0;
	}
	for (int i = 0; i < group->count && denied_by < 0; i++)
	{
		const DecisionRequest *request = &group->requests[i];
		LocalKey	key;

		if (group->fixed[i])
			continue;
		key = request_local_key(request);
		decision_by_fail_mode(request, &key, request_counts_at_ms(request, now_ms),
							  group->retry_after_ms, &group->decisions[i]);
		if (!group->decisions[i].allowed && request->policy.mode == POLICY_MODE_ENFORCE)
			denied_by = i;
	}
	if (denied_by < 0)
		return;

	/* Give back what local buckets took, then deny every check. */
	for (int i = 0; i < denied_by; i++)
	{
		const DecisionRequest *request = &group->requests[i];
		Decision   *decision = &group->decisions[i];
		Decision	refund;
		LocalKey	key;

		/* Only what was taken goes back: a short bucket took nothing. */
		if (group->fixed[i] || decision->source != DECISION_SOURCE_LOCAL || !decision->allowed)
			continue;
		key = request_local_key(request);
		decision_local(request, &key, request_counts_at_ms(request, now_ms), LIMIT_REFUND,
					   &refund);
		decision->remaining = refund.remaining;
		decision->reset_after_ms = refund.reset_after_ms;
	}
	for (int i = 0; i < group->count; i++)
	{
		Decision   *decision = &group->decisions[i];

		if (decision->source == DECISION_SOURCE_LOCAL && !decision->allowed)
			continue;			/* the short local bucket keeps its own answer */
		decision->allowed = false;
		decision->source = DECISION_SOURCE_FAIL_CLOSED;
		decision->retry_after_ms = group->retry_after_ms;
		decision->reset_after_ms = decision->retry_after_ms;
	}
}

/* Asks Redis (unless its node's breaker is open), and reports the call (for the first check's policy). */
static bool
group_ask(Group *group, RedisFailure *failure)
{
	bool		answered;

	group->round_trip_us = -1;
	answered = group_redis(group, failure);
	engine_observe_redis(&group->requests[0].policy, answered, failure, group->round_trip_us);
	/* The script failed on the checks' own values: an error, never a fail mode. */
	if (!answered && decision_script_failed(&group->requests[0].policy, failure, &group->decisions[0]))
		decision_raise_script_error(&group->decisions[0]);
	return answered;
}

/*
 * Decides the group in Redis while it answers, else by each check's fail mode.
 * A short shadow check must not stop the others: then Redis is asked again
 * without it, and its own answer is kept.
 */
static void
group_decide(Group *group)
{
	RedisFailure failure;
	bool		answered;

	if (group->asked == 0)
		return;					/* every check was decided without a bucket */
	answered = group_ask(group, &failure);
	if (answered && group_only_shadow_short(group))
	{
		Decision   *kept = palloc(group->count * sizeof(Decision));

		memcpy(kept, group->decisions, group->count * sizeof(Decision));
		for (int i = 0; i < group->count; i++)
			if (!group->fixed[i] && !kept[i].allowed && kept[i].retry_after_ms > 0)
				group->requests[i].cost = 0;
		answered = group_ask(group, &failure);
		for (int i = 0; answered && i < group->count; i++)
			if (!group->fixed[i] && !kept[i].allowed && kept[i].retry_after_ms > 0)
				group->decisions[i] = kept[i];
	}
	if (!answered)
		group_fail_mode(group);
}

/*
 * Denies the group for an enforced 'deny' override: nothing taken, nothing
 * left, and every check told to wait as long as the override (retry_ms).
 */
static void
group_denied_by_override(Group *group, int64 retry_ms)
{
	for (int i = 0; i < group->count; i++)
	{
		Decision   *decision = &group->decisions[i];

		decision->allowed = false;
		decision->remaining = 0;
		decision->retry_after_ms = retry_ms;
		decision->reset_after_ms = 0;
		decision->source = DECISION_SOURCE_OVERRIDE;
	}
}

/*
 * Raises an error unless check `last` can be taken atomically with the checks
 * before it: one script call is atomic only on one node, which in Redis
 * Cluster means one hash slot, so every subject must have the hash tag of the
 * first. Called for each check as it is read, before anything is charged.
 */
void
group_check(const DecisionRequest *requests, int last)
{
	StringInfoData first_tag;
	StringInfoData tag;

	Assert(last >= 0 && last < GROUP_MAX_CHECKS);
	if (last == 0)
		return;
	initStringInfo(&first_tag);
	initStringInfo(&tag);
	subject_hash_tag(&first_tag, requests[0].subject, requests[0].length);
	subject_hash_tag(&tag, requests[last].subject, requests[last].length);
	if (strcmp(tag.data, first_tag.data) != 0)
		ereport(ERROR,
				(errhidestmt(true),
				 errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("the checks of rl_consume_all must share one hash tag"),
				 errdetail("Check %d has another hash tag than check 1, so no single Redis node could take them atomically.",
						   last + 1),
				 errhint("Write related subjects as 'tenant/user': the part before the '/' is the hash tag.")));
	pfree(first_tag.data);
	pfree(tag.data);
}

/*
 * Decides count checked take requests (each passed to group_check) into
 * decisions, all granted or none charged. A check decided without a bucket (a
 * disabled policy, an 'allow' or 'deny' override) is not sent to Redis; an enforced
 * 'deny' denies the whole group without asking Redis, every check then
 * waiting as long as it.
 */
void
group_run(DecisionRequest *requests, Decision *decisions, int count)
{
	Group		group = {.count = count,.requests = requests,.decisions = decisions};
	int64	   *costs = palloc(count * sizeof(int64));
	int64		denied_for_ms = -1;

	group.fixed = palloc0(count * sizeof(bool));
	for (int i = 0; i < count; i++)
	{
		const Policy *policy = &requests[i].policy;

		costs[i] = requests[i].cost;
		decision_init(policy, &decisions[i]);
		group.fixed[i] = decision_fixed(policy, &decisions[i]);
		if (!group.fixed[i])
			group.asked++;
		else if (!decisions[i].allowed && policy->mode == POLICY_MODE_ENFORCE)
			denied_for_ms = Max(denied_for_ms, decisions[i].retry_after_ms);
	}
	if (denied_for_ms >= 0)
		group_denied_by_override(&group, denied_for_ms);
	else
		group_decide(&group);
	for (int i = 0; i < count; i++)
	{
		/* Fixed answers stand (a failing group may have denied them too); shadow lets a denial through. */
		if (group.fixed[i])
			(void) decision_fixed(&requests[i].policy, &decisions[i]);
		decision_shadow(&requests[i].policy, &decisions[i]);
		requests[i].cost = costs[i];
		engine_observe_decision(&requests[i], &decisions[i], costs[i]);
	}
}
