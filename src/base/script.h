/*
 * script.h
 *	  A Lua script as Redis runs it: its name, its body and its SHA1, all made
 *	  at build time (src/scripts.h, from lua/ by dev/embed-lua).
 */
#ifndef RL_SCRIPT_H
#define RL_SCRIPT_H

typedef struct LuaScript
{
	const char *name;
	const char *body;
	const char *sha1;			/* in hex: what EVALSHA names it by */
	/* A script marked no-writes (a shebang, Redis 7): the same without it, for older ones. */
	const struct LuaScript *plain;
	/* A take's: the same decision made once per request id (lua/once.lua). */
	const struct LuaScript *once;
} LuaScript;

/* The LuaScript of constant script_<x> of src/scripts.h (and its script_<x>_sha1). */
#define LUA_SCRIPT(script_name, constant) \
	{.name = (script_name),.body = constant,.sha1 = constant##_sha1}

/* A peek's: marked no-writes, with plain the LuaScript of its script_<x>_plain. */
#define LUA_PEEK_SCRIPT(script_name, constant, plain_script) \
	{.name = (script_name),.body = constant,.sha1 = constant##_sha1,.plain = (plain_script)}

/* A take's, with once the LuaScript of its script_<x>_once. */
#define LUA_TAKE_SCRIPT(script_name, constant, once_script) \
	{.name = (script_name),.body = constant,.sha1 = constant##_sha1,.once = (once_script)}

#endif							/* RL_SCRIPT_H */
