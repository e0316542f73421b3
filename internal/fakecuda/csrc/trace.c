// Driver-call tracing: with $CNNC_FAKECUDA_TRACE naming a file, every call the application
// makes into the driver appends the entry point's name and a newline to it, unbuffered (so the
// file's lines at any moment are exactly the calls made; a process may append lines of its own
// between them to mark where it is). Tests count the calls a training step makes with it.
//
// The library is compiled with -finstrument-functions: every function of it calls the hooks
// below on entry and exit. A per-thread depth counts the calls in progress, so only the
// outermost one — the call from the application — is written, under the exported name whose
// address it has (static helpers have none).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NO_TRACE __attribute__((no_instrument_function))

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int trace_fd = -1;
static __thread int depth;

NO_TRACE static void open_trace(void) {
	const char* path = getenv("CNNC_FAKECUDA_TRACE");
	if (path && *path) trace_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

// names caches the entry points' names by address (the driver has a few hundred).
#define NAMES 1024
static struct {
	void* fn;
	char name[64];
} names[NAMES];
static pthread_mutex_t names_mu = PTHREAD_MUTEX_INITIALIZER;

NO_TRACE static void write_name(void* fn) {
	size_t h = ((size_t)fn >> 4) % NAMES;
	char line[66];
	pthread_mutex_lock(&names_mu);
	for (size_t i = 0; i < NAMES; i++, h = (h + 1) % NAMES) {
		if (names[h].fn == fn) break;
		if (names[h].fn == NULL) {
			Dl_info info;
			names[h].fn = fn;
			if (dladdr(fn, &info) && info.dli_saddr == fn && info.dli_sname)
				strncpy(names[h].name, info.dli_sname, sizeof names[h].name - 1);
			break;
		}
	}
	size_t n = strlen(names[h].name);
	memcpy(line, names[h].name, n);
	pthread_mutex_unlock(&names_mu);
	if (n == 0 || strncmp(line, "cu", 2) != 0) return;
	line[n] = '\n';
	ssize_t w = write(trace_fd, line, n + 1);
	(void)w;
}

NO_TRACE void __cyg_profile_func_enter(void* fn, void* site) {
	(void)site;
	if (depth++ > 0) return;
	pthread_once(&once, open_trace);
	if (trace_fd >= 0) write_name(fn);
}

NO_TRACE void __cyg_profile_func_exit(void* fn, void* site) {
	(void)fn, (void)site;
	depth--;
}
