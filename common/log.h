/* Logging to stderr with a level threshold taken from MEMRA_LOG
 * (error, warn, info, debug; default info). */
#ifndef MR_LOG_H
#define MR_LOG_H

enum mr_log_level { MR_LOG_ERROR = 0, MR_LOG_WARN, MR_LOG_INFO, MR_LOG_DEBUG };

void mr_log(enum mr_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define MR_ERROR(...) mr_log(MR_LOG_ERROR, __VA_ARGS__)
#define MR_WARN(...) mr_log(MR_LOG_WARN, __VA_ARGS__)
#define MR_INFO(...) mr_log(MR_LOG_INFO, __VA_ARGS__)
#define MR_DEBUG(...) mr_log(MR_LOG_DEBUG, __VA_ARGS__)

#endif
