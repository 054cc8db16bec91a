/*
 * An NCCL-style logger for hosts that are not NCCL (the demo, the tests): prints
 * "NCCL <LEVEL> <message>" to stderr for levels up to the one NCCL_DEBUG names
 * (WARN when unset), like NCCL's own logger does. Variadic, so it has to be C.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

void nccl_net_fabric_host_logger(int level, unsigned long flags, const char* file, int line,
                                 const char* fmt, ...) {
  static const char* names[] = {"NONE", "VERSION", "WARN", "INFO", "ABORT", "TRACE"};
  const char* env = getenv("NCCL_DEBUG");
  int max = 2;
  if (env && strcasecmp(env, "INFO") == 0) max = 3;
  if (env && strcasecmp(env, "TRACE") == 0) max = 5;
  if (level > max || level < 0 || level > 5) return;
  char text[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  (void)flags;
  (void)file;
  (void)line;
  fprintf(stderr, "NCCL %s %s\n", names[level], text);
}
