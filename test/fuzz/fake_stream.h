/*
 * fake_stream.h
 *	  stream.c faked for the fuzz targets (fake_stream.c): a server that
 *	  answers whatever the input says.
 */
#ifndef RL_FUZZ_FAKE_STREAM_H
#define RL_FUZZ_FAKE_STREAM_H

extern void fake_stream_start(const uint8_t *data, size_t size, size_t reads_of, bool closes);

#endif							/* RL_FUZZ_FAKE_STREAM_H */
