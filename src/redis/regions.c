/*
 * regions.c
 *	  ratelimit.region, the region this server decides in, and
 *	  ratelimit.regions, every region's Redis: "name=url name=url ...".
 *
 * A policy whose budget spans regions (policy.h) names its home region; a
 * call for it goes to that region's Redis, a target of the pipeline. This
 * server's own region is target 0, ratelimit.redis_url itself, whatever the
 * list says for it; every other region listed is the target of its place in
 * the list. Both settings belong to the server (the configuration file or
 * ALTER SYSTEM): a session that could point a region elsewhere would escape
 * its budget, and the URLs may carry passwords.
 */
#include "prelude.h"

#include <ctype.h>

#include "utils/guc.h"

#include "base/secret.h"
#include "redis/regions.h"
#include "redis/url.h"

typedef struct Region
{
	char		name[REGION_NAME_LEN];
	char	   *url;			/* malloc'd; NULL while the list does not name it */
} Region;

/*
 * What check_regions parsed, for assign_regions: one malloc'd block (guc.c
 * frees an extra with free()), the URLs in text after the entries.
 */
typedef struct ParsedRegions
{
	int			count;
	char		names[REGIONS_MAX][REGION_NAME_LEN];
	int			url_offsets[REGIONS_MAX];
	char		text[FLEXIBLE_ARRAY_MEMBER];
} ParsedRegions;

static char *region_setting = NULL;
static char *regions_setting = NULL;

/*
 * The regions this backend was told of, each in the slot of its target for
 * the backend's life: a reload that reorders or drops entries never sends a
 * region's calls (a reservation's refund at rollback) to another's Redis.
 */
static Region regions[REGIONS_MAX];
static int	nslots = 0;
static uint32 regions_changes = 0;

/*
 * The names the list gives now, slot or not: the split shares count them, so
 * that a region without a slot here never makes the others' shares larger.
 */
static char listed[REGIONS_MAX][REGION_NAME_LEN];
static int	nlisted = 0;

/* A region's name: letters, digits, '_', '-', '.', 1 to 63 bytes. */
static bool
region_name_valid(const char *name, int length)
{
	if (length < 1 || length >= REGION_NAME_LEN)
		return false;
	for (int i = 0; i < length; i++)
		if (!isalnum((unsigned char) name[i]) && name[i] != '_' && name[i] != '-' && name[i] != '.')
			return false;
	return true;
}

static bool
check_region(char **newval, void **extra, GucSource source)
{
	if (*newval != NULL && (*newval)[0] != '\0' && !region_name_valid(*newval, strlen(*newval)))
	{
		GUC_check_errdetail("A region's name is 1 to 63 letters, digits, '_', '-' or '.'.");
		return false;
	}
	return true;
}

/*
 * Parses "name=url ..." into out (its text room as long as text); false with
 * a problem that never quotes a URL (it may hold a password). *password: some
 * URL holds one.
 */
static bool
parse_regions(const char *text, ParsedRegions *out, bool *password, const char **problem)
{
	const char *p = text;
	int			used = 0;

	out->count = 0;
	*password = false;
	for (;;)
	{
		const char *start,
				   *equals;
		int			length;
		RedisUrl	url;
		const char *url_problem;
		char	   *value;

		while (*p == ' ' || *p == '\t' || *p == '\n' || *p == ',')
			p++;
		if (*p == '\0')
			return true;
		start = p;
		while (*p != '\0' && *p != ' ' && *p != '\t' && *p != '\n')
			p++;
		length = p - start;
		equals = memchr(start, '=', length);
		if (equals == NULL || !region_name_valid(start, equals - start))
		{
			*problem = "Each entry is name=url, the name 1 to 63 letters, digits, '_', '-' or '.'.";
			return false;
		}
		if (out->count == REGIONS_MAX)
		{
			*problem = "At most 8 regions.";
			return false;
		}
		for (int i = 0; i < out->count; i++)
			if (strlen(out->names[i]) == (size_t) (equals - start) &&
				memcmp(out->names[i], start, equals - start) == 0)
			{
				*problem = "A region is named twice.";
				return false;
			}
		memcpy(out->names[out->count], start, equals - start);
		out->names[out->count][equals - start] = '\0';
		value = out->text + used;
		memcpy(value, equals + 1, length - (equals - start) - 1);
		value[length - (equals - start) - 1] = '\0';
		out->url_offsets[out->count++] = used;
		used += length - (equals - start);
		if (!redis_url_parse(value, &url, &url_problem))
		{
			*problem = "A region's URL is not a Redis URL (see ratelimit.redis_url).";
			return false;
		}
		*password |= url.password != NULL;
	}
}

static bool
check_regions(char **newval, void **extra, GucSource source)
{
	const char *text = *newval != NULL ? *newval : "";
	ParsedRegions *parsed = malloc(offsetof(ParsedRegions, text) + strlen(text) + 1);
	const char *problem = NULL;
	bool		password;

	if (parsed == NULL)
	{
		GUC_check_errcode(ERRCODE_OUT_OF_MEMORY);
		return false;
	}
	if (!parse_regions(text, parsed, &password, &problem))
	{
		free(parsed);
		/* Never echo the value: it may hold passwords. */
		GUC_check_errmsg("invalid value for parameter \"ratelimit.regions\"");
		GUC_check_errdetail("%s", problem);
		GUC_check_errhint("List every region as name=redis-url, separated by spaces, e.g. 'eu=redis://10.0.1.5:6379 us=redis://10.1.1.5:6379'.");
		return false;
	}
	if (password && !secret_source_allowed("ratelimit.regions", source))
	{
		free(parsed);
		GUC_check_errhint("Add ratelimit to shared_preload_libraries: a region's password is then read by superusers alone.");
		return false;
	}
	*extra = parsed;
	return true;
}

/* The slot of a region's name, -1 when this backend was never told of it. */
static int
slot_of(const char *name)
{
	for (int i = 0; i < nslots; i++)
		if (strcmp(regions[i].name, name) == 0)
			return i;
	return -1;
}

/*
 * The list as parsed: each region keeps its slot (a new one takes the next);
 * a region no longer listed keeps its slot without a URL. A region that finds
 * no slot (more than 8 named in this backend's life), or no memory for its
 * URL, is not listed: its policies say so.
 */
static void
assign_regions(const char *newval, void *extra)
{
	ParsedRegions *parsed = extra;

	for (int i = 0; i < nslots; i++)
	{
		free(regions[i].url);
		regions[i].url = NULL;
	}
	nlisted = parsed == NULL ? 0 : parsed->count;
	for (int i = 0; i < nlisted; i++)
		memcpy(listed[i], parsed->names[i], REGION_NAME_LEN);
	for (int i = 0; parsed != NULL && i < parsed->count; i++)
	{
		int			slot = slot_of(parsed->names[i]);

		if (slot < 0 && nslots < REGIONS_MAX)
		{
			slot = nslots++;
			strlcpy(regions[slot].name, parsed->names[i], REGION_NAME_LEN);
		}
		if (slot >= 0)
			regions[slot].url = strdup(parsed->text + parsed->url_offsets[i]);
	}
	regions_changes++;
}

void
regions_init(void)
{
	DefineCustomStringVariable("ratelimit.region",
							   "The region this server decides in; empty: none (every policy decides in ratelimit.redis_url).",
							   "A server setting: the configuration file or ALTER SYSTEM.",
							   &region_setting, "", PGC_SIGHUP, GUC_NOT_IN_SAMPLE,
							   check_region, NULL, NULL);
	DefineCustomStringVariable("ratelimit.regions",
							   "Every region's Redis, as name=url entries separated by spaces.",
							   "Only superusers can read it: the URLs may hold passwords.",
							   &regions_setting, "", PGC_SIGHUP, GUC_SUPERUSER_ONLY | GUC_NOT_IN_SAMPLE,
							   check_regions, assign_regions, NULL);
}

/* This server's region ("" when none). */
const char *
regions_own(void)
{
	return region_setting ? region_setting : "";
}

/* How many regions ratelimit.regions lists. */
int
regions_count(void)
{
	return nlisted;
}

/* The most targets in use: every slot's (regions_use refuses one no longer listed). */
int
regions_slots(void)
{
	return nslots;
}

/* The target of a listed region (its slot from 1), or -1. */
static int
regions_target_of_listed(const char *name)
{
	int			slot = slot_of(name);

	return slot >= 0 && regions[slot].url != NULL ? slot + 1 : -1;
}

/* How many regions there are: those listed, and this server's own if it is not. */
int
regions_total(void)
{
	bool		own_listed = false;

	for (int i = 0; i < nlisted; i++)
		own_listed |= strcmp(listed[i], regions_own()) == 0;
	return nlisted + (regions_own()[0] != '\0' && !own_listed ? 1 : 0);
}

/*
 * The target of a region: 0 for this server's own, else its slot from 1; -1
 * for a region the list does not name.
 */
int
regions_target_of(const char *name)
{
	if (strcmp(name, regions_own()) == 0)
		return 0;
	return regions_target_of_listed(name);
}

/*
 * Makes the next calls go to target's Redis (see redis_url_current); false,
 * sending to this server's own, when target's region is no longer listed.
 */
bool
regions_use(int target)
{
	if (target <= 0 || target > nslots || regions[target - 1].url == NULL)
	{
		redis_url_use_target(0, NULL, 0);
		return target == 0;
	}
	redis_url_use_target(target, regions[target - 1].url, regions_changes);
	return true;
}

/* The name of target's region ("" for target 0, this server's own Redis). */
const char *
regions_name_of(int target)
{
	if (target <= 0 || target > nslots)
		return "";
	return regions[target - 1].name;
}
