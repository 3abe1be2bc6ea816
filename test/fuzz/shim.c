/*
 * shim.c
 *	  The few parts of a PostgreSQL backend that the fuzz targets' source files
 *	  use, outside a server: memory contexts and palloc over malloc, StringInfo,
 *	  ereport and PG_TRY, assertions, and settings (strings with their hooks).
 *
 * Each palloc'd chunk is its own malloc of the exact size asked, so that
 * AddressSanitizer sees a read one byte past it. A chunk is recorded with its
 * context, so that deleting the context frees it as PostgreSQL would: what a
 * source leaves in a short-lived context is no leak, and what it keeps in a
 * long-lived one is counted (shim_end refuses unbounded growth). An ERROR
 * jumps back to the nearest PG_TRY; one raised without an errcode (elog,
 * for what cannot happen) is a finding, as is a failed assertion.
 */
#include "postgres.h"

#include <stdio.h>
#include <stdlib.h>

#include "access/xact.h"
#include "lib/stringinfo.h"
#include "miscadmin.h"
#include "nodes/memnodes.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "shim.h"

/*
 * Memory that contexts living across inputs may hold before it counts as a
 * leak: the sources keep a few strings and reply buffers trimmed to 64 kB, so
 * a leak of a few bytes per input passes this within a minute's run.
 */
#define SHIM_LONG_LIVED_MAX (1024 * 1024)
#define SHIM_MAX_CONTEXTS 32
#define SHIM_MAX_SETTINGS 8

/* The backend's globals that the sources read. */
MemoryContext TopMemoryContext = NULL;
MemoryContext CurrentMemoryContext = NULL;
volatile sig_atomic_t ProcDiePending = false;
sigjmp_buf *PG_exception_stack = NULL;
ErrorContextCallback *error_context_stack = NULL;
char	   *GUC_check_errmsg_string = NULL;
char	   *GUC_check_errdetail_string = NULL;
char	   *GUC_check_errhint_string = NULL;

/* One palloc'd chunk and the context it belongs to. */
typedef struct ShimChunk
{
	void	   *pointer;
	Size		size;
	MemoryContext context;
} ShimChunk;

static ShimChunk *chunks = NULL;
static int	chunk_count = 0;
static int	chunk_room = 0;
static MemoryContext contexts[SHIM_MAX_CONTEXTS];
static int	context_count = 0;
static MemoryContext input_context = NULL;

/* The ereport under way: its level, errcode (0: none given) and message. */
static int	error_level = 0;
static int	error_code = 0;
static char error_message[256];

/* A string setting defined by DefineCustomStringVariable, as guc.c keeps it. */
typedef struct ShimSetting
{
	const char *name;
	char	  **value;
	GucStringCheckHook check;
	GucStringAssignHook assign;
	void	   *extra;
} ShimSetting;

static ShimSetting settings[SHIM_MAX_SETTINGS];
static int	setting_count = 0;

/* Reports a finding and aborts: libFuzzer keeps the input that did it. */
void
shim_fail(const char *format,...)
{
	va_list		args;

	va_start(args, format);
	fprintf(stderr, "FUZZ FINDING: ");
	vfprintf(stderr, format, args);
	fprintf(stderr, "\n");
	va_end(args);
	abort();
}

/* A failed Assert. */
void
ExceptionalCondition(const char *conditionName, const char *errorType, const char *fileName,
					 int lineNumber)
{
	shim_fail("%s(\"%s\") at %s:%d", errorType, conditionName, fileName, lineNumber);
}

/* Creates a context (a name, a parent: what deleting a parent needs). */
static MemoryContext
context_create(MemoryContext parent, const char *name)
{
	MemoryContext context = calloc(1, sizeof(MemoryContextData));

	if (context == NULL || context_count == SHIM_MAX_CONTEXTS)
		shim_fail("too many memory contexts");
	context->type = T_AllocSetContext;
	context->parent = parent;
	context->name = name;
	contexts[context_count++] = context;
	return context;
}

/* The contexts every target starts with. */
static void
shim_start(void)
{
	if (TopMemoryContext == NULL)
		TopMemoryContext = CurrentMemoryContext = context_create(NULL, "TopMemoryContext");
}

/* Frees a context's chunks and its children, and the context itself. */
static void
context_delete(MemoryContext context)
{
	for (;;)
	{
		MemoryContext child = NULL;

		for (int i = 0; i < context_count; i++)
			if (contexts[i]->parent == context)
				child = contexts[i];
		if (child == NULL)
			break;
		context_delete(child);
	}
	for (int i = chunk_count - 1; i >= 0; i--)
		if (chunks[i].context == context)
		{
			free(chunks[i].pointer);
			chunks[i] = chunks[--chunk_count];
		}
	for (int i = 0; i < context_count; i++)
		if (contexts[i] == context)
		{
			contexts[i] = contexts[--context_count];
			break;
		}
	free(context);
}

/* The chunk record of pointer; a finding when it was not palloc'd (or freed already). */
static ShimChunk *
chunk_of(void *pointer)
{
	for (int i = chunk_count - 1; i >= 0; i--)
		if (chunks[i].pointer == pointer)
			return &chunks[i];
	shim_fail("pfree or repalloc of a pointer palloc did not return");
}

/* Allocates size bytes in context, as palloc does (an impossible size is a bug). */
static void *
chunk_alloc(MemoryContext context, Size size)
{
	void	   *pointer;

	if (!AllocSizeIsValid(size))
		shim_fail("invalid memory alloc request size %zu", size);
	if (chunk_count == chunk_room)
	{
		chunk_room = chunk_room ? 2 * chunk_room : 256;
		chunks = realloc(chunks, chunk_room * sizeof(ShimChunk));
		if (chunks == NULL)
			shim_fail("out of memory");
	}
	pointer = malloc(size);
	if (pointer == NULL && size > 0)
		shim_fail("out of memory");
	chunks[chunk_count++] = (ShimChunk) {pointer, size, context};
	return pointer;
}

/* A context: only its parent and name matter here. */
MemoryContext
AllocSetContextCreateInternal(MemoryContext parent, const char *name, Size minContextSize,
							  Size initBlockSize, Size maxBlockSize)
{
	return context_create(parent, name);
}

/* Allocates in a context. */
void *
MemoryContextAlloc(MemoryContext context, Size size)
{
	return chunk_alloc(context, size);
}

/* Allocates zeroed memory in a context. */
void *
MemoryContextAllocZero(MemoryContext context, Size size)
{
	return memset(chunk_alloc(context, size), 0, size);
}

/* Allocates in the current context. */
void *
palloc(Size size)
{
	return chunk_alloc(CurrentMemoryContext, size);
}

/* Allocates zeroed memory in the current context. */
void *
palloc0(Size size)
{
	return MemoryContextAllocZero(CurrentMemoryContext, size);
}

/* Frees a chunk; a pointer palloc did not return is a finding. */
void
pfree(void *pointer)
{
	ShimChunk  *chunk = chunk_of(pointer);

	free(chunk->pointer);
	*chunk = chunks[--chunk_count];
}

/* Moves the chunk, always: a pointer kept to the old one is then caught. */
void *
repalloc(void *pointer, Size size)
{
	ShimChunk  *chunk = chunk_of(pointer);
	MemoryContext context = chunk->context;
	Size		old_size = chunk->size;
	void	   *moved = chunk_alloc(context, size);

	memcpy(moved, pointer, Min(old_size, size));
	pfree(pointer);
	return moved;
}

/* A copy of a string in a context. */
char *
MemoryContextStrdup(MemoryContext context, const char *string)
{
	Size		length = strlen(string) + 1;

	return memcpy(chunk_alloc(context, length), string, length);
}

/* A copy of a string in the current context. */
char *
pstrdup(const char *string)
{
	return MemoryContextStrdup(CurrentMemoryContext, string);
}

/* A copy of at most length bytes of a string, NUL-terminated. */
char *
pnstrdup(const char *string, Size length)
{
	char	   *copy;

	length = strnlen(string, length);
	copy = palloc(length + 1);
	memcpy(copy, string, length);
	copy[length] = '\0';
	return copy;
}

/* Starts one input: what it allocates outside long-lived contexts goes with shim_end. */
void
shim_begin(void)
{
	shim_start();
	input_context = context_create(TopMemoryContext, "fuzz input");
	CurrentMemoryContext = input_context;
}

/* Ends one input; a finding when long-lived contexts hold more than they ever should. */
void
shim_end(void)
{
	Size		kept = 0;

	CurrentMemoryContext = TopMemoryContext;
	context_delete(input_context);
	input_context = NULL;
	for (int i = 0; i < chunk_count; i++)
		kept += chunks[i].size;
	if (kept > SHIM_LONG_LIVED_MAX)
		shim_fail("memory kept across inputs grows: %zu bytes in %d chunks", kept, chunk_count);
}

/* An exact-size palloc'd copy of the input: a read past its end is caught. */
char *
shim_copy(const uint8_t *data, size_t size)
{
	return memcpy(palloc(size), data, size);
}

/* Starts an empty buffer in the current context. */
void
initStringInfo(StringInfo str)
{
	str->maxlen = 1024;
	str->data = palloc(str->maxlen);
	resetStringInfo(str);
}

/* Empties a buffer, keeping its room. */
void
resetStringInfo(StringInfo str)
{
	str->data[0] = '\0';
	str->len = 0;
	str->cursor = 0;
}

/* Makes room for needed more bytes and a NUL, doubling; a request past MaxAllocSize is a bug. */
void
enlargeStringInfo(StringInfo str, int needed)
{
	Size		wanted;
	Size		room = str->maxlen;

	if (needed < 0 || (Size) needed >= MaxAllocSize - (Size) str->len)
		shim_fail("invalid string enlargement request size: %d", needed);
	wanted = (Size) str->len + needed + 1;
	if (wanted <= room)
		return;
	while (room < wanted)
		room *= 2;
	room = Min(room, MaxAllocSize);
	str->data = repalloc(str->data, room);
	str->maxlen = (int) room;
}

/* Appends bytes, and keeps the buffer NUL-terminated. */
void
appendBinaryStringInfo(StringInfo str, const char *data, int datalen)
{
	enlargeStringInfo(str, datalen);
	memcpy(str->data + str->len, data, datalen);
	str->len += datalen;
	str->data[str->len] = '\0';
}

/* Formats into the buffer: the length first, then the text in room made for it. */
void
appendStringInfo(StringInfo str, const char *fmt,...)
{
	va_list		args;
	int			length;

	va_start(args, fmt);
	length = vsnprintf(NULL, 0, fmt, args);
	va_end(args);
	if (length < 0)
		shim_fail("appendStringInfo: bad format \"%s\"", fmt);
	enlargeStringInfo(str, length);
	va_start(args, fmt);
	vsnprintf(str->data + str->len, length + 1, fmt, args);
	va_end(args);
	str->len += length;
}

/* Starts an ereport: below ERROR nothing is reported (nor formatted). */
bool
errstart(int elevel, const char *domain)
{
	if (elevel < ERROR)
		return false;
	error_level = elevel;
	error_code = 0;
	error_message[0] = '\0';
	return true;
}

/* errstart, for a constant level of ERROR or above. */
bool
errstart_cold(int elevel, const char *domain)
{
	return errstart(elevel, domain);
}

/* Records the error's SQLSTATE. */
int
errcode(int sqlerrcode)
{
	error_code = sqlerrcode;
	return 0;
}

/* Formats the message (which checks its arguments). */
int
errmsg(const char *fmt,...)
{
	va_list		args;

	va_start(args, fmt);
	vsnprintf(error_message, sizeof(error_message), fmt, args);
	va_end(args);
	return 0;
}

/* Formats the message of an elog. */
int
errmsg_internal(const char *fmt,...)
{
	va_list		args;

	va_start(args, fmt);
	vsnprintf(error_message, sizeof(error_message), fmt, args);
	va_end(args);
	return 0;
}

/* Ends an ERROR by jumping to the nearest PG_TRY; FATAL or PANIC, or no PG_TRY, is a finding. */
void
errfinish(const char *filename, int lineno, const char *funcname)
{
	if (error_level >= FATAL || PG_exception_stack == NULL)
		shim_fail("ereport(%d) at %s:%d (%s): %s", error_level, filename, lineno, funcname,
				  error_message);
	siglongjmp(*PG_exception_stack, 1);
}

/* Jumps on to the enclosing PG_TRY. */
void
pg_re_throw(void)
{
	if (PG_exception_stack == NULL)
		shim_fail("PG_RE_THROW outside PG_TRY: %s", error_message);
	siglongjmp(*PG_exception_stack, 1);
}

/* In a target's PG_CATCH: an error with an errcode is an answer; elog(ERROR) is a bug. */
void
shim_error_caught(void)
{
	if (error_code == 0 || error_code == ERRCODE_INTERNAL_ERROR)
		shim_fail("elog(ERROR), for what cannot happen, was raised: %s", error_message);
	error_level = error_code = 0;
}

/* Nothing to prepare: messages are not translated here. */
void
pre_format_elog_string(int errnumber, const char *domain)
{
}

/* A check hook's message, palloc'd (guc.c reads it before the context goes). */
char *
format_elog_string(const char *fmt,...)
{
	va_list		args;
	char	   *text = palloc(256);

	va_start(args, fmt);
	vsnprintf(text, 256, fmt, args);
	va_end(args);
	return text;
}

/* A check hook's SQLSTATE: the refusal alone matters here. */
void
GUC_check_errcode(int sqlerrcode)
{
}

/* Defines a string setting; its boot value goes through its hooks, as in guc.c. */
void
DefineCustomStringVariable(const char *name, const char *short_desc, const char *long_desc,
						   char **valueAddr, const char *bootValue, GucContext context,
						   int flags, GucStringCheckHook check_hook,
						   GucStringAssignHook assign_hook, GucShowHook show_hook)
{
	if (setting_count == SHIM_MAX_SETTINGS)
		shim_fail("too many settings");
	shim_start();
	settings[setting_count++] = (ShimSetting) {name, valueAddr, check_hook, assign_hook, NULL};
	*valueAddr = NULL;
	if (!shim_set_string_setting(name, bootValue))
		shim_fail("the boot value of %s is refused", name);
}

/* Defines an integer setting: it keeps its boot value (no target sets one). */
void
DefineCustomIntVariable(const char *name, const char *short_desc, const char *long_desc,
						int *valueAddr, int bootValue, int minValue, int maxValue,
						GucContext context, int flags, GucIntCheckHook check_hook,
						GucIntAssignHook assign_hook, GucShowHook show_hook)
{
	*valueAddr = bootValue;
}

/* No transaction ever ends outside a server: the callback is never called. */
void
RegisterXactCallback(XactCallback callback, void *arg)
{
}

/*
 * Sets a string setting as a configuration file would: the check hook may
 * refuse it (false), then the assign hook takes it. Values and extras come
 * from malloc and go with free, as guc.c has them.
 */
bool
shim_set_string_setting(const char *name, const char *value)
{
	ShimSetting *setting = NULL;
	char	   *new_value;
	void	   *extra = NULL;

	for (int i = 0; i < setting_count; i++)
		if (strcmp(settings[i].name, name) == 0)
			setting = &settings[i];
	if (setting == NULL)
		shim_fail("no setting %s", name);
	new_value = value ? strdup(value) : NULL;
	if (setting->check != NULL && !setting->check(&new_value, &extra, PGC_S_FILE))
	{
		free(new_value);
		return false;
	}
	if (setting->assign != NULL)
		setting->assign(new_value, extra);
	free(*setting->value);
	free(setting->extra);
	*setting->value = new_value;
	setting->extra = extra;
	return true;
}
