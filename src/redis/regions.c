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

#include "redis/regions.h"
#include "redis/url.h"

typedef struct Region
{
	char		name[REGION_NAME_LEN];
	char	   *url;			/* malloc'd; NULL for this server's own region */
} Region;

static char *region_setting = NULL;
static char *regions_setting = NULL;
static Region regions[REGIONS_MAX];
static int	nregions = 0;
static uint32 regions_changes = 0;

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
 * Parses "name=url ..." into out (URLs malloc'd, for the extra guc.c keeps);
 * false with a problem that never quotes a URL (it may hold a password).
 */
static bool
parse_regions(const char *text, Region *out, int *count, const char **problem)
{
	const char *p = text;

	*count = 0;
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
		if (*count == REGIONS_MAX)
		{
			*problem = "At most 8 regions.";
			return false;
		}
		for (int i = 0; i < *count; i++)
			if (strlen(out[i].name) == (size_t) (equals - start) &&
				memcmp(out[i].name, start, equals - start) == 0)
			{
				*problem = "A region is named twice.";
				return false;
			}
		value = malloc(length - (equals - start));
		if (value == NULL)
		{
			*problem = "Out of memory.";
			return false;
		}
		memcpy(value, equals + 1, length - (equals - start) - 1);
		value[length - (equals - start) - 1] = '\0';
		memcpy(out[*count].name, start, equals - start);
		out[*count].name[equals - start] = '\0';
		out[*count].url = value;
		(*count)++;
		if (!redis_url_parse(value, &url, &url_problem))
		{
			*problem = "A region's URL is not a Redis URL (see ratelimit.redis_url).";
			return false;
		}
	}
}

static void
free_regions(Region *list, int count)
{
	for (int i = 0; i < count; i++)
		free(list[i].url);
}

static bool
check_regions(char **newval, void **extra, GucSource source)
{
	Region	   *parsed = calloc(REGIONS_MAX + 1, sizeof(Region));
	int			count = 0;
	const char *problem = NULL;

	if (parsed == NULL)
	{
		GUC_check_errcode(ERRCODE_OUT_OF_MEMORY);
		return false;
	}
	if (*newval != NULL && !parse_regions(*newval, parsed, &count, &problem))
	{
		free_regions(parsed, count);
		free(parsed);
		/* Never echo the value: it may hold passwords. */
		GUC_check_errmsg("invalid value for parameter \"ratelimit.regions\"");
		GUC_check_errdetail("%s", problem);
		GUC_check_errhint("List every region as name=redis-url, separated by spaces, e.g. 'eu=redis://10.0.1.5:6379 us=redis://10.1.1.5:6379'.");
		return false;
	}
	/* The count rides in the unused last entry's name. */
	parsed[REGIONS_MAX].name[0] = (char) count;
	*extra = parsed;
	return true;
}

/* The extra (freed by guc.c) is copied: URLs strdup'd again into TopMemoryContext-free malloc. */
static void
assign_regions(const char *newval, void *extra)
{
	Region	   *parsed = extra;

	free_regions(regions, nregions);
	nregions = parsed == NULL ? 0 : (int) parsed[REGIONS_MAX].name[0];
	for (int i = 0; i < nregions; i++)
	{
		memcpy(regions[i].name, parsed[i].name, REGION_NAME_LEN);
		regions[i].url = strdup(parsed[i].url);
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
	return nregions;
}

/* The place of a region in the list from 1, or -1. */
static int
regions_target_of_listed(const char *name)
{
	for (int i = 0; i < nregions; i++)
		if (strcmp(regions[i].name, name) == 0)
			return i + 1;
	return -1;
}

/* How many regions there are: those listed, and this server's own if it is not. */
int
regions_total(void)
{
	return nregions + (regions_own()[0] != '\0' && regions_target_of_listed(regions_own()) < 0 ? 1 : 0);
}

/*
 * The target of a region: 0 for this server's own, else its place in the
 * list from 1; -1 for a region the list does not name.
 */
int
regions_target_of(const char *name)
{
	if (strcmp(name, regions_own()) == 0)
		return 0;
	return regions_target_of_listed(name);
}

/* Makes the next calls go to target's Redis (see redis_url_current). */
void
regions_use(int target)
{
	Assert(target >= 0 && target <= nregions);
	if (target == 0)
		redis_url_use_target(0, NULL, 0);
	else
		redis_url_use_target(target, regions[target - 1].url, regions_changes);
}

/* The name of target's region ("" for target 0, this server's own Redis). */
const char *
regions_name_of(int target)
{
	if (target <= 0 || target > nregions)
		return "";
	return regions[target - 1].name;
}
